"""GPU check: rollout tokens/s and a bf16 ZeRO-2 PPO update, on the tiny model and a SmolLM2-135M-shaped Llama.

For each model: build it (the tiny one with `build_tiny` into a temp dir; the 135M one from a LlamaConfig
alone, random weights, no files needed), wrap it in `DeepSpeedUpdateEngine` (which moves it to the
accelerator and, with bf16, casts it), time `TransformersRolloutEngine.generate` on the shared module,
then update on Groups built from those generations with random +-1 advantages, a few steps of
generate-then-update as in training. One JSON summary is printed last on stdout (after DeepSpeed's own
log lines) and written to $OUT/gpu_check.json when OUT is set. Exit status 1 if any model failed, gave a
non-finite loss or left its weights unchanged.

On a lent H200 (Python 3.12, torch CUDA, transformers present; deepspeed, pydantic and hjson travel as
wheels in .whl/, carry [".whl"]), from the repo root; ada_core is imported from it, not installed:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; python3 benchmarks/gpu_check.py

Dry run on CPU (same code path, tiny sizes; DeepSpeed's bf16 mode runs on its CPU accelerator too):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gpu_check.py --device cpu --small

The 135M model has no tokenizer of its own: it reuses the tiny model's (its ids are valid embeddings,
and its eos id is the model's eos). A random 49,152-way model almost never draws that eos, so its rows
run the full `max_tokens`, which makes its tokens/s a fixed-length measurement.

Imports only torch, transformers, tokenizers and ada_core's models, engines, config, losses, records,
protocols and metrics (pulling in pydantic and deepspeed): nothing from ada_core.rl.rewards, ada_core.data,
prefect or mlflow, which the GPU machine lacks (DeepSpeed tries mlflow inside a try/except only).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ada_core from the repo root, installed or not

import torch  # noqa: E402

# SmolLM2-135M's shape (its config.json); the weights here are random.
SMOLLM2_135M_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                          num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                          max_position_embeddings=8192, rms_norm_eps=1e-5)
FULL = dict(prompts=64, k=4, max_tokens=128, tiny_max_tokens=48, rollout_micro_batch=256, update_micro_batch=64,
            mini_batches=2, steps=3, layers=30)
# CPU dry run: 2 of the 135M model's 30 layers (bf16 matmuls are slow on CPUs without bf16 units:
# all 30 layers took ~50 s per 8-sample update on a 2-core machine, 2 layers ~12 s, ~4 s in fp32).
SMALL = dict(prompts=4, k=2, max_tokens=8, tiny_max_tokens=8, rollout_micro_batch=8, update_micro_batch=4,
             mini_batches=2, steps=2, layers=2)


def main() -> int:
    args = parse_args()
    if args.device == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"  # before deepspeed is imported: never pick up a GPU
    elif not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no GPU; use --device cpu for a dry run", file=sys.stderr)
        return 2
    sizes = {**(SMALL if args.small else FULL), **{k: v for k, v in vars(args).items() if k in FULL and v is not None}}
    started = time.perf_counter()
    summary: dict = {"env": environment(args.device), "settings": {**sizes, "precision": args.precision,
                                                                     "zero_stage": args.zero_stage, "lr": args.lr,
                                                                     "tis_cap": args.tis_cap}, "models": {}}
    from ada_core.models import build_tiny, load_policy

    with tempfile.TemporaryDirectory() as tmp:
        tiny_model, tokenizer = load_policy(build_tiny(Path(tmp) / "tiny", seed=0))
        builders = {"tiny": lambda: tiny_model, "smollm2-135m-shape": lambda: smollm2_shaped(tokenizer, sizes["layers"])}
        for name in args.models:
            log(f"== {name}")
            try:
                summary["models"][name] = check_model(builders[name](), tokenizer, name, args, sizes)
            except Exception as err:  # report and go on: one JSON summary whatever happens
                traceback.print_exc()
                summary["models"][name] = {"error": f"{type(err).__name__}: {err}"}
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    summary["total_s"] = round(time.perf_counter() - started, 2)
    summary["ok"] = all(m.get("update", {}).get("ok", False) for m in summary["models"].values())
    text = json.dumps(summary, indent=2)
    print(text)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "gpu_check.json").write_text(text + "\n")
    return 0 if summary["ok"] else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes for a quick CPU dry run")
    parser.add_argument("--models", nargs="+", choices=("tiny", "smollm2-135m-shape"),
                        default=["tiny", "smollm2-135m-shape"])
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2), default=2)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--tis-cap", type=float, default=2.0, help="loss.tis_cap for the updates (exercises TIS)")
    for key in FULL:
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=int, default=None)
    return parser.parse_args()


def environment(device: str) -> dict:
    import transformers

    env = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        env["cuda"] = torch.version.cuda
    return env


def smollm2_shaped(tokenizer, layers: int):
    """A randomly initialised Llama of SmolLM2-135M's shape (`layers` of its 30 kept), in fp32 on CPU as
    `load_policy` would give it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **{**SMOLLM2_135M_SHAPE, "num_hidden_layers": layers})
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def check_model(model, tokenizer, name: str, args, sizes: dict) -> dict:
    from ada_core import metrics as K
    from ada_core.config import LossConfig, OptimConfig
    from ada_core.engines.deepspeed_engine import DeepSpeedUpdateEngine
    from ada_core.engines.transformers_engine import TransformersRolloutEngine
    from ada_core.protocols import SamplingParams

    cuda = args.device == "cuda"
    params = sum(p.numel() for p in model.parameters())
    layers = model.config.num_hidden_layers
    max_tokens = sizes["tiny_max_tokens"] if name == "tiny" else sizes["max_tokens"]
    start = time.perf_counter()
    updater = DeepSpeedUpdateEngine(
        model, LossConfig(tis_cap=args.tis_cap),
        OptimConfig(lr=args.lr, warmup_steps=0, mini_batches=sizes["mini_batches"],
                    micro_batch_size=sizes["update_micro_batch"], zero_stage=args.zero_stage,
                    precision=args.precision),
        total_steps=sizes["steps"], pad_token_id=tokenizer.pad_token_id, seed=0)
    init_s = time.perf_counter() - start
    module = updater.module
    out: dict = {"params": params, "layers": layers, "device": str(next(module.parameters()).device),
                 "dtype": str(next(module.parameters()).dtype).replace("torch.", ""),
                 "optimizer": type(updater.optimizer).__name__, "deepspeed_init_s": round(init_s, 2)}
    log(f"{name}: {params / 1e6:.1f}M params on {out['device']} in {out['dtype']}, DeepSpeed init {init_s:.1f}s")

    rollout = TransformersRolloutEngine(module, tokenizer, micro_batch_size=sizes["rollout_micro_batch"])
    prompts = make_prompts(tokenizer, sizes["prompts"])
    requests = [(p, sizes["k"]) for p in prompts]
    rollout.generate(requests[:2], SamplingParams(max_tokens=4, seed=999))  # warm-up: kernels, allocator
    before = [p.detach().clone() for p in module.parameters()]
    advantages = torch.Generator().manual_seed(0)
    gen_s, tokens, gen_peak, steps, update_peak = [], [], 0.0, [], 0.0
    for step in range(sizes["steps"]):  # as in training: sample from the current weights, then update them
        reset_peak(cuda)
        start = time.perf_counter()
        generated = rollout.generate(requests, SamplingParams(max_tokens=max_tokens, seed=step))
        sync(cuda)
        gen_s.append(time.perf_counter() - start)
        gen_peak = max(gen_peak, peak_gib(cuda) or 0.0)
        samples = [s for group in generated for s in group]
        tokens.append(sum(s.num_tokens for s in samples))
        groups = make_groups(prompts, generated, advantages)
        reset_peak(cuda)
        start = time.perf_counter()
        metrics = updater.update(groups)
        sync(cuda)
        seconds = time.perf_counter() - start
        update_peak = max(update_peak, peak_gib(cuda) or 0.0)
        steps.append({"seconds": round(seconds, 3), "samples": len(samples),
                      "samples_per_s": round(len(samples) / seconds, 1),
                      "truncated_frac": round(sum(s.truncated for s in samples) / len(samples), 3),
                      **{k: round(v, 6) for k, v in metrics.items()}})
        log(f"{name}: step {step}: generate {tokens[-1]} tokens in {gen_s[-1]:.2f}s, update {seconds:.2f}s, "
            f"loss {metrics[K.TRAIN_LOSS]:.4f}, is_ratio max {metrics[K.UPDATE_IS_RATIO_MAX]:.4f}")
    changed = sum(int((a != b.detach()).sum()) for a, b in zip(before, module.parameters()))
    finite = all(math.isfinite(v) for s in steps for v in s.values())
    timed = steps[1:] or steps  # the first update pays one-off costs (allocator, kernel selection)
    out["rollout"] = {
        "rows": len(requests) * sizes["k"], "max_tokens": max_tokens, "micro_batch_size": sizes["rollout_micro_batch"],
        "seconds": [round(s, 3) for s in gen_s], "tokens": tokens,
        # Like the update: the first call pays one-off costs (CUDA context, kernel loading), so it is
        # reported in `seconds` but left out of the rate.
        "tokens_per_s": round(sum(tokens[1:] or tokens) / sum(gen_s[1:] or gen_s), 1),
        "peak_gib": gen_peak if cuda else None,
    }
    out["update"] = {
        "steps": steps,
        "samples_per_s": round(sum(s["samples"] for s in timed) / sum(s["seconds"] for s in timed), 1),
        "loss_finite": finite,
        "weights_changed": changed > 0,
        "weights_changed_frac": round(changed / params, 4),
        "optimizer_steps": updater.optimizer_steps,
        "peak_gib": update_peak if cuda else None,
        "ok": finite and changed > 0,
    }
    return out


def make_prompts(tokenizer, count: int):
    from ada_core.models import format_prompt_ids
    from ada_core.records import Prompt

    prompts = [Prompt(id=f"g{i}", text=f"{(37 * i) % 900 + 10}+{(53 * i) % 90 + 5}=", answer="0") for i in range(count)]
    for p in prompts:
        p.prompt_ids = format_prompt_ids(tokenizer, p)
    return prompts


def make_groups(prompts, generated, generator: torch.Generator):
    """One Group per prompt from its samples, with seeded random +-1 advantages (no verifier needed)."""
    from ada_core.records import Group

    groups = []
    for prompt, samples in zip(prompts, generated):
        signs = (torch.randint(0, 2, (len(samples),), generator=generator) * 2 - 1).tolist()
        groups.append(Group(prompt=prompt, samples=samples, advantages=[float(a) for a in signs],
                            pool_size=len(samples), pool_positives=signs.count(1), p_hat=0.5))
    return groups


def reset_peak(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(cuda: bool) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None


def sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
