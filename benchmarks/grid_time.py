"""Where a grid's time goes: every finished run of one or more ADA_HOMEs (a grid lane each), split by phase.

    .venv/bin/python benchmarks/grid_time.py HOME [HOME ...] [--by method] [--markdown FILE]

For each MLflow run with a `run_dir` (a trained run: compare children, paper grids) whose metrics.jsonl holds
`time/setup_s` and `time/eval_s` (runs from before those metrics are skipped and counted), the run's wall time
(MLflow's start to end) splits into:

- set-up (`time/setup_s`: data split, start model, engines);
- generation, reward, update (`time/generate_s`, `time/reward_s`, `time/update_s`, summed over steps), and its
  part that recomputes old and reference log-probs (`update/recompute_s`);
- the rest of the steps (sampler, metrics, ledger: `time/step_s` less the three above);
- evaluation (`time/eval_s`, summed over the run's evaluations);
- outside (the wall time less all of the above: MLflow logging, the final checkpoint, the flow's own work).

Seconds are sums over the runs; `--by method` adds one table per method label. A lane's runs follow one another,
so the sum over a lane's runs is that lane's busy time; the grid's wall time is the longest lane's.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ada_core import metrics as K  # noqa: E402
from ada_core.run.files import read_metrics  # noqa: E402
from benchmarks.lane_runs import finished_runs, missing_home  # noqa: E402

PHASES = ["set-up", "generation", "reward", "update", "  of it: old/ref log-prob recompute", "rest of steps",
          "evaluation", "outside (logging, checkpoint, flow)"]


def run_split(rows: list[dict[str, float]], wall_s: float) -> dict[str, float] | None:
    """A run's seconds by phase (PHASES), or None when its metrics predate time/setup_s and time/eval_s."""
    steps = [r for r in rows if K.TIME_STEP_S in r]
    evals = [r[K.TIME_EVAL_S] for r in rows if K.TIME_EVAL_S in r]
    setups = [r[K.TIME_SETUP_S] for r in rows if K.TIME_SETUP_S in r]
    if not steps or not setups or (not evals and any(K.EVAL_AVG_AT_K in r for r in rows)):
        return None
    total = lambda key: sum(r.get(key, 0.0) for r in steps)  # noqa: E731
    gen, reward, update = total(K.TIME_GENERATE_S), total(K.TIME_REWARD_S), total(K.TIME_UPDATE_S)
    out = {
        "set-up": sum(setups), "generation": gen, "reward": reward, "update": update,
        "  of it: old/ref log-prob recompute": total(K.UPDATE_RECOMPUTE_S),
        "rest of steps": total(K.TIME_STEP_S) - gen - reward - update, "evaluation": sum(evals),
    }
    accounted = sum(v for k, v in out.items() if not k.startswith("  "))
    out["outside (logging, checkpoint, flow)"] = max(wall_s - accounted, 0.0)
    out["wall"] = wall_s
    return out


def collect(homes: list[Path]) -> tuple[list[tuple[str, dict[str, float]]], int]:
    """(method label, split) of every finished run with the metrics, and how many runs lacked them."""
    found, skipped = [], 0
    for _, label, run, run_dir in finished_runs(homes):
        if run.info.end_time is None:
            continue
        split = run_split(read_metrics(run_dir), (run.info.end_time - run.info.start_time) / 1000)
        if split is None:
            skipped += 1
            continue
        found.append((label, split))
    return found, skipped


def table(splits: list[dict[str, float]], title: str) -> str:
    wall = sum(s["wall"] for s in splits)
    lines = [f"**{title}**: {len(splits)} runs, {wall:,.0f} s of run wall time", "",
             "| phase | seconds | share of run wall time |", "|---|---|---|"]
    for phase in PHASES:
        seconds = sum(s[phase] for s in splits)
        lines.append(f"| {phase} | {seconds:,.0f} | {seconds / wall:.0%} |" if wall > 0 else f"| {phase} | 0 | - |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("homes", nargs="+", type=Path, help="ADA_HOME folders (a grid lane each)")
    parser.add_argument("--by", choices=["method"], default=None, help="one table per method label too")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables there as well")
    args = parser.parse_args()
    if missing_home("grid_time", args.homes):
        return 2
    found, skipped = collect(args.homes)
    if not found:
        print(f"grid_time: no finished run with time/setup_s and time/eval_s under {', '.join(map(str, args.homes))}"
              f" ({skipped} without them)", file=sys.stderr)
        return 2
    parts = [table([s for _, s in found], "all runs")]
    if args.by == "method":
        by = defaultdict(list)
        for label, split in found:
            by[label].append(split)
        parts += [table(splits, label) for label, splits in sorted(by.items())]
    if skipped:
        parts.append(f"({skipped} finished runs without time/setup_s and time/eval_s left out)")
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
