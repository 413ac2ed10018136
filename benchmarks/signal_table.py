"""Why a sampler does or does not beat its control: each method's signal per step, from its runs' metrics.

    .venv/bin/python benchmarks/signal_table.py HOME [HOME ...] [--methods grpo knapsack ...] [--markdown FILE]

For every finished MLflow run with a `run_dir` under the ADA_HOMEs (a grid lane each), grouped by testbed pool
(read from the run's params; its MLflow experiment where no pool matches) and method label, the mean over its seeds
of the per-step means over steps 1-100 of:

- samples a step (`budget/generated_samples`) and prompts drawn (`sampler/prompts_drawn`);
- the effective ratio (`sampler/effective_ratio`: groups with a nonzero advantage per prompt drawn) and the
  informative groups a step it implies (ratio x prompts drawn): the groups that carry a gradient;
- the all-correct and all-wrong fractions of the prompts drawn (the zero-variance groups, by side);
- the gradient norm (`train/grad_norm`) and trained samples a step (`budget/trained_samples`);

then the held-out avg@k at the last evaluation. A method whose extra samples buy no informative groups (same
ratio, same groups) cannot beat GRPO at the same samples: this table says where each one's samples went.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ada_core import metrics as K  # noqa: E402
from ada_core.run.files import read_metrics  # noqa: E402
from benchmarks.lane_runs import finished_runs, missing_home  # noqa: E402

COLUMNS = [
    ("samples/step", K.BUDGET_GENERATED_SAMPLES),
    ("prompts drawn", K.SAMPLER_PROMPTS_DRAWN),
    ("effective ratio", K.SAMPLER_EFFECTIVE_RATIO),
    ("informative groups/step", None),
    ("all-correct frac", K.SAMPLER_ALL_CORRECT_FRAC),
    ("all-wrong frac", K.SAMPLER_ALL_WRONG_FRAC),
    ("trained samples/step", K.BUDGET_TRAINED_SAMPLES),
    ("grad norm", K.TRAIN_GRAD_NORM),
]


def run_signal(rows: list[dict[str, float]]) -> dict[str, float]:
    """One run's per-step means (COLUMNS) and its last held-out avg@k."""
    steps = [r for r in rows if K.TRAIN_LOSS in r]
    mean = lambda key: float(np.mean([r.get(key, np.nan) for r in steps])) if steps else float("nan")  # noqa: E731
    out = {name: mean(key) for name, key in COLUMNS if key is not None}
    out["informative groups/step"] = float(np.mean([r.get(K.SAMPLER_EFFECTIVE_RATIO, np.nan)
                                                    * r.get(K.SAMPLER_PROMPTS_DRAWN, np.nan) for r in steps]))
    evals = [r[K.EVAL_AVG_AT_K] for r in rows if K.EVAL_AVG_AT_K in r]
    out["final avg@k"] = evals[-1] if evals else float("nan")
    return out


def pool_of(params: dict[str, str], experiment: str) -> str:
    """The testbed pool whose overrides a run's MLflow params carry (the most specific one: `revisit` over
    `standard`, whose overrides are none), `<experiment>` where none matches: one grid's pools share its
    experiment."""
    from flows.paper_params import PAPER_GRIDS

    pools = PAPER_GRIDS["testbed"]["pools"]
    matches = [name for name, overrides in pools.items()
               if all(params.get(key) == str(value) for key, value in overrides.items())]
    return max(matches, key=lambda name: len(pools[name]), default=experiment)


def collect(homes: list[Path]) -> dict[tuple[str, str], list[dict[str, float]]]:
    found: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for experiment, label, run, run_dir in finished_runs(homes):
        found[(pool_of(run.data.params, experiment), label)].append(run_signal(read_metrics(run_dir)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("homes", nargs="+", type=Path, help="ADA_HOME folders (a grid lane each)")
    parser.add_argument("--methods", nargs="+", default=None, help="only these method labels, in this order")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table there as well")
    args = parser.parse_args()
    if missing_home("signal_table", args.homes):
        return 2
    found = collect(args.homes)
    if args.methods:
        rank = {m: i for i, m in enumerate(args.methods)}
        found = {key: runs for key, runs in found.items() if key[1] in rank}
    else:
        rank = {}
    if not found:
        print("signal_table: no finished run found", file=sys.stderr)
        return 2
    names = [name for name, _ in COLUMNS] + ["final avg@k"]
    lines = ["| pool | method | runs | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 3)]
    for (pool, label), runs in sorted(found.items(), key=lambda kv: (kv[0][0], rank.get(kv[0][1], 99), kv[0][1])):
        cells = []
        for name in names:
            value = float(np.mean([r[name] for r in runs]))
            cells.append(f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}")
        lines.append(f"| {pool} | {label} | {len(runs)} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
