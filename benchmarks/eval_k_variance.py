"""What a cheaper evaluation costs in power: held-out avg@k at k = 8, 4 and 2 from the same samples, over seeds.

    ADA_HOME=... .venv/bin/python benchmarks/eval_k_variance.py RUN_DIR [RUN_DIR ...] [--step 100]

Each RUN_DIR is a finished run with a checkpoint at `--step` (a paper grid's child: only its final checkpoint).
The checkpoint is copied to a scratch folder and resumed there (the run's own folder is only read), and its
held-out prompts are scored as the run's evaluation at that step scores them (`training.loop.evaluate`: the
same prompts, temperature and sampling seed, data seed + step), at eval_k samples a prompt. Copy j of prompt i
has its own seed (row_seed(seed, i, j)), so the first k copies of the k = 8 call are exactly what an evaluation
at eval_k = k draws: avg@4 and avg@2 are read from the same samples, no second call.

Printed: each run's avg@8 (and whether it equals the value its metrics logged at that step), avg@4, avg@2, then
the mean and sd over the runs for each k. Evaluation costs about k times a prompt's samples, so k = 4 halves it;
the sd columns say what that does to the seed-to-seed spread the comparisons are powered by.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ada_core import metrics as K  # noqa: E402
from ada_core.config.schema import data_seed  # noqa: E402
from ada_core.protocols import SamplingParams  # noqa: E402
from ada_core.run.files import read_metrics  # noqa: E402
from ada_core.run.resume import read_saved_config  # noqa: E402
from ada_core.training.state import setup  # noqa: E402

KS = (8, 4, 2)


def correct_matrix(run_dir: Path, step: int, scratch: Path) -> tuple[np.ndarray, float | None]:
    """[held-out prompts, 8] correct flags of the run's policy at `step`, and the avg@k its metrics logged there."""
    copy = scratch / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("generations.jsonl"))
    config = read_saved_config(copy)
    state = setup(config, copy, resume=copy)
    try:
        if state.step != step:
            raise SystemExit(f"eval_k_variance: {run_dir}: its newest checkpoint is step {state.step}, not {step}")
        cfg = state.config
        sampling = SamplingParams(temperature=cfg.eval_temperature, top_p=1.0,
                                  max_tokens=cfg.eval_max_tokens or cfg.rollout.max_tokens, seed=data_seed(cfg) + step)
        samples = state.rollout.generate_between_loads([(p, max(KS)) for p in state.eval_prompts], sampling)
        flat = [(p, s) for p, group in zip(state.eval_prompts, samples) for s in group]
        rewards = np.array([v.reward for v in state.verifier.verify([(p, s.text) for p, s in flat])])
        correct = rewards.reshape(len(state.eval_prompts), max(KS)) > cfg.sampler.positive_threshold
    finally:
        state.close()
    logged = [r[K.EVAL_AVG_AT_K] for r in read_metrics(run_dir) if r.get("step") == step and K.EVAL_AVG_AT_K in r]
    return correct, (logged[-1] if logged else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--step", type=int, default=100)
    args = parser.parse_args()
    for run in args.runs:
        if not (run / "config.yaml").is_file():
            print(f"eval_k_variance: {run}: not a run folder (no config.yaml)", file=sys.stderr)
            return 2
    values = {k: [] for k in KS}
    print("| run | avg@8 | logged avg@8 | avg@4 | avg@2 |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="eval_k_") as scratch:
        for run in args.runs:
            correct, logged = correct_matrix(run, args.step, Path(scratch))
            row = {k: float(correct[:, :k].mean()) for k in KS}
            for k in KS:
                values[k].append(row[k])
            same = "same" if logged is not None and abs(logged - row[8]) < 1e-12 else f"{logged}"
            print(f"| {run.name} | {row[8]:.4f} | {same} | {row[4]:.4f} | {row[2]:.4f} |", flush=True)
    print("\n| k | mean | sd over runs |\n|---|---|---|")
    for k in KS:
        v = np.array(values[k])
        print(f"| {k} | {v.mean():.4f} | {v.std(ddof=1) if len(v) > 1 else float('nan'):.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
