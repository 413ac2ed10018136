"""Calibration of the testbed profile: each candidate's start model, read at k = 16 (docs/benchmarks/testbed.md).

    ADA_HOME=/tmp/calib_home .venv/bin/python benchmarks/testbed_calibration.py --sample 2048
    ADA_HOME=/tmp/calib_home .venv/bin/python benchmarks/testbed_calibration.py --candidates testbed l4-exact

For each candidate (a scale profile and overrides) it warm-starts the model as a run would (the SFT draw
leaves out the sample), samples 16 answers for each of `--sample` fresh `a+b=` prompts at T = 1 and prints
one JSON line: the share of prompts at 0, 1-2, 3-5, 6-15 and 16 correct of 16, the SFT's seconds and
final loss. The learning half of a row (step-0 and final held-out avg@8 of GRPO n = 4 over 5 seeds) is the
GRPO row of the testbed grid (`benchmarks/paper_tables.py --profile testbed`) for the chosen candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a fresh clone

CANDIDATES = {
    # the `tiny` profile as the earlier paper grid used it: 2 layers, 600 SFT steps on a distinct draw
    "tiny": ("tiny", {}),
    # tiny with a stream of fresh sums (independent draws) and twice the steps
    "tiny-iid-1200": ("tiny", {"sft_steps": 1200, "sft": {"prompts": 153600}}),
    # the testbed's model and recipe with exact targets: it learns to carry, and the band empties
    "l4-exact": ("testbed", {"sft": {"carry_slip": 0.0}}),
    # the testbed's recipe stopped at 1,000 SFT steps (before the loss leaves its plateau on some draws)
    "l4-slip-1000": ("testbed", {"sft_steps": 1000}),
    "testbed": ("testbed", {}),
}


def histogram(name: str, sample: int, seed: int) -> dict:
    from ada_core.config import build_config
    from ada_core.config.schema import data_seed
    from ada_core.data import load_prompts
    from ada_core.data.curation import pass_rate_histogram, pass_rates
    from ada_core.engines.transformers_engine import TransformersRolloutEngine
    from ada_core.models import encode_prompts, weights_sha256
    from ada_core.protocols import SamplingParams
    from ada_core.rl.rewards import MathVerifier
    from ada_core.training.start import start_model

    profile, overrides = CANDIDATES[name]
    config = build_config("grpo", profile, overrides=overrides)
    pool = load_prompts(config.data.dataset, size=sample, seed=seed)
    start = time.perf_counter()
    model_dir, policy, tokenizer = start_model(config.model, config.sft_steps, config.data.dataset, pool,
                                               data_seed(config), sft=config.sft.model_dump())
    sft_s = time.perf_counter() - start
    encode_prompts(tokenizer, pool)
    engine = TransformersRolloutEngine(policy, tokenizer, micro_batch_size=config.rollout.micro_batch_size)
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=config.rollout.max_tokens, seed=seed)
    with MathVerifier() as verifier:
        rates = pass_rates(pool, engine, verifier, sampling, k=16)
    info = json.loads((Path(model_dir) / "sft.json").read_text()) if (Path(model_dir) / "sft.json").is_file() else {}
    return {"candidate": name, "model": config.model, "sft_steps": config.sft_steps, "sft": config.sft.model_dump(),
            "sample": sample, "histogram": {k: round(v, 3) for k, v in pass_rate_histogram(rates).items()},
            "sft_final_loss": info.get("final_loss"), "sft_seconds": info.get("seconds", round(sft_s, 1)),
            "weights_sha256": weights_sha256(model_dir)[:16]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--sample", type=int, default=2048, help="fresh prompts scored at k = 16")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample and its sampling")
    args = parser.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    for name in args.candidates:
        print(json.dumps(histogram(name, args.sample, args.seed)), flush=True)


if __name__ == "__main__":
    main()
