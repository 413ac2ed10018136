"""What `loss.kl_coef > 0` costs: update time and memory with the frozen reference policy against
without it, side by side in one run. Results go to docs/benchmarks/kl-cost.md.

    ADA_HOME=/tmp/ada_bench_home .venv/bin/python benchmarks/kl_cost.py --model tiny
    ADA_HOME=/tmp/ada_bench_home .venv/bin/python benchmarks/kl_cost.py --model smollm2-135m --prompts 2 \
        --max-tokens 16 --micro-batch 8 --updates 1 --pairs 1 --min-free-gib 6.5

Each measurement is a fresh process (so its peak RSS is its own), built the way a run builds its
update engine: `build_update_engine` from the profile's config with `loss.kl_coef` 0 or 0.05, the
reference loaded from the model folder (what a run with no SFT warm start keeps in `reference/`).
The processes alternate off, on, off, on (`--pairs` times), so both see the same machine load; the
ratios on/off are what to read. Each process samples the same groups (seeded, from the same
weights), runs one warm-up update, then times `--updates` updates.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def worker(args) -> dict:
    import tempfile

    import torch

    from ada_core import metrics as K
    from ada_core.config import build_config
    from ada_core.engines.factory import build_update_engine
    from ada_core.engines.transformers_engine import TransformersRolloutEngine
    from ada_core.models import format_prompt_ids, load_policy, resolve_model
    from ada_core.protocols import SamplingParams
    from ada_core.records import Group, Prompt

    torch.set_num_threads(args.threads)
    profile = "tiny" if args.model == "tiny" else "smollm2-135m"
    config = build_config("grpo", profile, overrides={
        "model": args.model, "loss": {"kl_coef": args.kl},
        "optim": {"micro_batch_size": args.micro_batch, "mini_batches": 1, "warmup_steps": 0},
        "rollout": {"max_tokens": args.max_tokens},
    })
    model_dir = resolve_model(args.model)
    model, tokenizer = load_policy(model_dir)
    rss_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    updater = build_update_engine(config, model, model_dir, tokenizer.pad_token_id, log_dir=Path(tempfile.mkdtemp()),
                                  reference_dir=model_dir if args.kl > 0 else None)
    build_s = time.perf_counter() - start
    prompts = [Prompt(id=f"b{i}", text=f"What is {(37 * i) % 900 + 10}+{(53 * i) % 90 + 5}?", answer="0")
               for i in range(args.prompts)]
    if args.model == "tiny":
        prompts = [Prompt(id=p.id, text=f"{(37 * i) % 900 + 10}+{(53 * i) % 90 + 5}=", answer="0")
                   for i, p in enumerate(prompts)]
    for p in prompts:
        p.prompt_ids = format_prompt_ids(tokenizer, p)
    rollout = TransformersRolloutEngine(updater.module, tokenizer, micro_batch_size=256)
    times, recompute, tokens = [], [], 0
    for step in range(args.updates + 1):
        out = rollout.generate([(p, 4) for p in prompts], SamplingParams(max_tokens=args.max_tokens, seed=100 + step))
        groups = [Group(prompt=p, samples=s, advantages=[1.0, -1.0, 0.5, -0.5], pool_size=4, pool_positives=2,
                        p_hat=0.5) for p, s in zip(prompts, out)]
        start = time.perf_counter()
        metrics = updater.update(groups)
        seconds = time.perf_counter() - start
        if step > 0:  # the first update warms up allocator and autograd caches
            times.append(seconds)
            recompute.append(metrics[K.UPDATE_RECOMPUTE_S])
            tokens += sum(s.num_tokens for g in groups for s in g.samples)
    ref_bytes = sum(p.numel() * p.element_size() for p in updater.ref_model.parameters()) if args.kl > 0 else 0
    return {
        "model": args.model, "kl_coef": args.kl, "params": sum(p.numel() for p in model.parameters()),
        "sequences": 4 * len(prompts), "trained_tokens_per_update": tokens / max(1, len(times)),
        "build_s": build_s, "update_s": statistics.mean(times), "recompute_s": statistics.mean(recompute),
        "kl_ref_last": metrics[K.TRAIN_KL_REF], "reference_bytes": ref_bytes,
        "rss_after_model_mib": rss_model / 1024,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def available_gib() -> float:
    with open("/proc/meminfo") as fh:
        fields = dict(line.split(":", 1) for line in fh)
    return int(fields["MemAvailable"].split()[0]) / 2**20


def wait_for_memory(gib: float, limit_s: float = 1800) -> None:
    """On a shared machine, start a worker only once `gib` GiB are available, so its peak does not
    push another job into the OOM killer."""
    deadline = time.monotonic() + limit_s
    while gib > 0 and available_gib() < gib:
        if time.monotonic() > deadline:
            sys.exit(f"fewer than {gib} GiB available for {limit_s:.0f}s; not starting a worker")
        time.sleep(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny or smollm2-135m")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per update (x 4 samples)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=128)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=2, help="off/on process pairs, alternating")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-free-gib", type=float, default=0.0,
                        help="wait until this much memory is available before each worker (shared machines)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kl", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return

    passthrough = [f"--model={args.model}", f"--prompts={args.prompts}", f"--max-tokens={args.max_tokens}",
                   f"--micro-batch={args.micro_batch}", f"--updates={args.updates}", f"--threads={args.threads}"]
    rows = []
    for pair in range(args.pairs):
        for kl in (0.0, 0.05):
            wait_for_memory(args.min_free_gib)
            done = subprocess.run([sys.executable, __file__, "--worker", f"--kl={kl}", *passthrough],
                                  capture_output=True, text=True, check=False)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"worker kl={kl} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            row = {"pair": pair, **json.loads(line.removeprefix("RESULT "))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    off = [r for r in rows if r["kl_coef"] == 0]
    on = [r for r in rows if r["kl_coef"] > 0]
    summary = {
        "model": args.model, "python": platform.python_version(),
        "update_s_off": statistics.mean(r["update_s"] for r in off),
        "update_s_on": statistics.mean(r["update_s"] for r in on),
        "time_ratio_per_pair": [b["update_s"] / a["update_s"] for a, b in zip(off, on)],
        "peak_rss_mib_off": statistics.mean(r["peak_rss_mib"] for r in off),
        "peak_rss_mib_on": statistics.mean(r["peak_rss_mib"] for r in on),
        "reference_mib": on[0]["reference_bytes"] / 2**20,
    }
    summary["rss_ratio"] = summary["peak_rss_mib_on"] / summary["peak_rss_mib_off"]
    print(json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"runs": rows, "summary": summary}, fh, indent=2)


if __name__ == "__main__":
    main()
