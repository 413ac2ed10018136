"""Engine throughput: rollout tokens/s at several batch sizes (our KV-cache loop vs `model.generate`),
update samples/s, and DeepSpeed's first-initialize time. Results go to docs/benchmarks/engines.md.

    .venv/bin/python benchmarks/engines.py --model tiny
    .venv/bin/python benchmarks/engines.py --model smollm2-135m --batch-sizes 8 32 --max-tokens 64 \
        --update-prompts 8 --update-micro-batch 8

Run it in a fresh process: the first DeepSpeedUpdateEngine it builds is the process's first
`deepspeed.initialize`, which is what `first initialize` reports.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

import torch

from ada_core.config import LossConfig, OptimConfig
from ada_core.engines.transformers_engine import TransformersRolloutEngine
from ada_core.models import format_prompt_ids, load_policy, resolve_model
from ada_core.protocols import SamplingParams
from ada_core.records import Group, Prompt


def make_prompts(tokenizer, count: int) -> list[Prompt]:
    prompts = [Prompt(id=f"b{i}", text=f"{(37 * i) % 900 + 10}+{(53 * i) % 90 + 5}=", answer="0") for i in range(count)]
    for p in prompts:
        p.prompt_ids = format_prompt_ids(tokenizer, p)
    return prompts


def bench_rollout(engine: TransformersRolloutEngine, prompts: list[Prompt], rows: int, max_tokens: int,
                  repeats: int) -> dict[str, float]:
    """Best-of-`repeats` tokens/s for `rows` sequences (k=4 per prompt) in one micro-batch."""
    engine.micro_batch_size = rows
    requests = [(p, 4) for p in prompts[: max(1, rows // 4)]]
    best = 0.0
    for r in range(repeats):
        start = time.perf_counter()
        out = engine.generate(requests, SamplingParams(max_tokens=max_tokens, seed=r))
        seconds = time.perf_counter() - start
        tokens = sum(s.num_tokens for group in out for s in group)
        best = max(best, tokens / seconds)
    return {"rows": rows, "tokens_per_s": best}


def bench_hf_generate(model, tokenizer, prompts: list[Prompt], rows: int, max_tokens: int, repeats: int) -> float:
    """The alternative we measured against: `model.generate` with sampling and per-step scores."""
    ids = [p.prompt_ids for p in prompts[: max(1, rows // 4)] for _ in range(4)]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention = (torch.arange(width)[None, :] >= torch.tensor([width - len(x) for x in ids])[:, None]).long()
    best = 0.0
    model.eval()
    for r in range(repeats):
        torch.manual_seed(r)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0,
                                 top_p=1.0, top_k=0, max_new_tokens=max_tokens, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
            scores = torch.stack(out.scores, dim=1).log_softmax(-1)  # the behaviour log-probs we would need
            new = out.sequences[:, width:]
            scores.gather(-1, new.unsqueeze(-1))
        seconds = time.perf_counter() - start
        tokens = int(((new != pad) | (new == tokenizer.eos_token_id)).sum())
        best = max(best, tokens / seconds)
    return best


def bench_update(model, tokenizer, prompts: list[Prompt], num_prompts: int, micro_batch: int, max_tokens: int,
                 updates: int) -> dict[str, float]:
    """First-initialize time, then samples/s and tokens/s of `updates` updates on groups of 4."""
    # transformers may already have imported deepspeed in this process; time a cold import apart.
    code = "import time; t = time.perf_counter(); import deepspeed; print(time.perf_counter() - t)"
    import_s = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout.strip().splitlines()[-1])
    from ada_core.engines.deepspeed_engine import DeepSpeedUpdateEngine

    start = time.perf_counter()
    updater = DeepSpeedUpdateEngine(model, LossConfig(), OptimConfig(lr=1e-5, warmup_steps=0, mini_batches=1,
                                    micro_batch_size=micro_batch), total_steps=updates,
                                    pad_token_id=tokenizer.pad_token_id)
    init_s = time.perf_counter() - start
    rollout = TransformersRolloutEngine(updater.module, tokenizer, micro_batch_size=256)
    subset = prompts[:num_prompts]
    seconds, samples, tokens = 0.0, 0, 0
    for step in range(updates + 1):
        out = rollout.generate([(p, 4) for p in subset], SamplingParams(max_tokens=max_tokens, seed=100 + step))
        groups = [Group(prompt=p, samples=s, advantages=[1.0, -1.0, 0.5, -0.5], pool_size=4, pool_positives=2,
                        p_hat=0.5) for p, s in zip(subset, out)]
        start = time.perf_counter()
        updater.update(groups)
        if step > 0:  # the first update warms up allocator and autograd caches
            seconds += time.perf_counter() - start
            samples += sum(len(g.samples) for g in groups)
            tokens += sum(s.num_tokens for g in groups for s in g.samples)
    return {"deepspeed_import_s": import_s, "first_initialize_s": init_s, "update_samples_per_s": samples / seconds,
            "update_tokens_per_s": tokens / seconds, "update_sequences": num_prompts * 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="model name for resolve_model, or an HF folder")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf-generate", action="store_true", help="skip the model.generate comparison")
    parser.add_argument("--update-prompts", type=int, default=32)
    parser.add_argument("--update-micro-batch", type=int, default=128)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_policy(resolve_model(args.model))
    prompts = make_prompts(tokenizer, max(max(args.batch_sizes) // 4, args.update_prompts))
    engine = TransformersRolloutEngine(model, tokenizer)
    bench_rollout(engine, prompts, min(args.batch_sizes), args.max_tokens, repeats=1)  # warm-up
    result = {
        "model": args.model, "params": sum(p.numel() for p in model.parameters()), "max_tokens": args.max_tokens,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
        "rollout": [],
    }
    for rows in args.batch_sizes:
        row = bench_rollout(engine, prompts, rows, args.max_tokens, args.repeats)
        if not args.no_hf_generate:
            row["hf_generate_tokens_per_s"] = bench_hf_generate(model, tokenizer, prompts, rows, args.max_tokens,
                                                                args.repeats)
        result["rollout"].append(row)
        print(json.dumps(row), flush=True)
    result["update"] = bench_update(model, tokenizer, prompts, args.update_prompts, args.update_micro_batch,
                                    args.max_tokens, args.updates)
    print(json.dumps(result["update"]), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
