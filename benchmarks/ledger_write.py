"""Prompt-ledger write time per step against the sampler's time, at a paper-sized step (512 prompts).

For each sampler, every step runs `sampler.sample` on the simulation's Bernoulli engine (timed: the
sampler's wall time, engine and verifier included), then `Ledger.record` (timed: what the training
loop pays, building the rows and queueing them) and `Ledger.flush` (timed: the writer thread's one
batched INSERT and commit, which the loop does not wait for except before a checkpoint). Medians over
steps, as JSON on stdout. The goal: loop cost <= 2% of the step's sampler time.

    .venv/bin/python benchmarks/ledger_write.py --prompts 512 --steps 20
    .venv/bin/python benchmarks/ledger_write.py --url postgresql://postgres@127.0.0.1:5432/<db>
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.run.ledger import Ledger, shown_url
from ada_core.protocols import SamplingParams
from ada_core.data import PromptSource
from ada_core.sampling import make_sampler
from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, make_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--url", default=None, help="database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    global_mean = AdvantageConfig(name="global_mean")
    samplers = {
        "grpo n=4": make_sampler(SamplerConfig(name="fixed", n=4), AdvantageConfig(name="grpo")),
        "ada-balance M=8 N=4": make_sampler(SamplerConfig(name="ada", exit_rule="balance", M=8, N=4), global_mean),
        "ada-posterior (budget B x 4)": make_sampler(SamplerConfig(name="budgeted", allocation="posterior", M=4, N=4), global_mean),
    }
    out = {"prompts": args.prompts, "steps": args.steps, "load_before": os.getloadavg(), "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or f"sqlite:///{Path(tmp) / 'ledger.db'}"
        out["url"] = shown_url(url)
        dataset = make_prompts(4 * args.prompts, np.random.default_rng(0))
        for name, sampler in samplers.items():
            run_dir = Path(tmp) / name.replace(" ", "_").replace("/", "_")
            run_dir.mkdir()
            ledger = Ledger.start(url, run_dir, threshold=0.7)
            source = PromptSource(dataset, seed=0)
            sample_s, record_s, write_s = [], [], []
            try:
                for step in range(1, args.steps + 1):
                    t0 = time.perf_counter()
                    batch = sampler.sample(source.take(args.prompts), BernoulliEngine(), BernoulliVerifier(),
                                           SamplingParams(max_tokens=14), np.random.default_rng(step), source=source)
                    t1 = time.perf_counter()
                    ledger.record(step, batch.pools, {g.prompt.id for g in batch.groups})
                    t2 = time.perf_counter()
                    ledger.flush()
                    t3 = time.perf_counter()
                    sample_s.append(t1 - t0), record_s.append(t2 - t1), write_s.append(t3 - t2)
            finally:
                ledger.close()
            med = {k: statistics.median(v) for k, v in (("sampler_s", sample_s), ("record_s", record_s),
                                                         ("insert_commit_s", write_s))}
            med["loop_cost_pct_of_sampler"] = 100 * med["record_s"] / med["sampler_s"]
            med["insert_pct_of_sampler"] = 100 * med["insert_commit_s"] / med["sampler_s"]
            out["methods"][name] = med
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
