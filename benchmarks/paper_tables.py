"""The paper's tables by one command (docs/benchmarks/testbed.md; the earlier `tiny` grid: paper-tables.md).

    ADA_HOME=/tmp/testbed_home .venv/bin/python benchmarks/paper_tables.py --profile testbed   # the grid
    .venv/bin/python benchmarks/paper_tables.py --smoke                                         # the plumbing

The grid is the `paper-tables` flow (flows/paper_tables.py): for each pool one `compare` run (its own
MLflow parent run, Prefect subflow and report) over GRPO n = 4, 8, 16, DAPO, Ada-Seq-pos,
Ada-Seq-balance and Ada-Est. Both pools come from the same raw `a+b=` prompts and the same SFT start (so
they differ only by the filter), and every seed and method of a pool starts from that model and is
scored on the same held-out set (a group's children share `data.seed`).

`--profile testbed` (the default; ada_core/config/presets.py): 5 seeds, 100 steps of 32 fresh prompts
(no prompt drawn more than twice), 1,024 held-out and 256 validation prompts, avg@8 every 20 steps:
- `standard`: the paper's band, 1-5 correct of 16 (the profile's `data.keep_pass_rate` [1/16, 5/16]);
- `hard`: the paper's hard set, 1-2 correct of 16 (`data.keep_pass_rate` [1/16, 2/16]).

`--profile tiny`: the earlier grid (docs/benchmarks/paper-tables.md): 3 seeds, 60 steps, a fixed pool of
256 prompts reused for 7.5 epochs, 512 held out at avg@4; standard = k 8, 0 < p <= 0.875.

Tables A-D (report/paper_tables.py: accuracy, step time, equal budget, steps and samples to GRPO
n = 4's final accuracy) go to `--out` (default out/paper_tables/paper_tables.md), to the Prefect
artifact `paper-tables` and to `report/paper_tables.md` on both parent runs. Each pool is read at the
last evaluation of its longest runs; a run that stopped before it is left out and named in every row
it would have entered (report/pools.py). A killed grid resumes with `--resume standard=<group folder>
hard=<group folder>` (the folders the log names); `--tables-from` writes the tables from whatever
children of those folders finished, without running anything: the header names the children that did
not finish (with their last evaluation step), and every row names the seeds it lacks.

`--save-runs FILE` (with a grid or `--tables-from`) also writes every finished run the tables read to
FILE, one JSON line each, with what identifies its start (the warm start's weight hash, the curated and
held-out sets' digests, as its MLflow run recorded them) and the machine (report/saved_runs.py);
`--tables-from-runs FILE ...` writes the tables from such files alone, without MLflow or Prefect, and
refuses (exit 2, one line on stderr) runs whose starts differ or the same run twice.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a fresh clone

# The grids themselves are the `paper-tables` deployment's defaults (its Prefect form), by profile: one definition.
from flows.params import PAPER_GRIDS, PAPER_METHODS, PAPER_PROFILE  # noqa: E402 - after the path

POOLS = list(PAPER_GRIDS[PAPER_PROFILE]["pools"])  # the pool names every grid shares
# --smoke: the flows tests' small data (two-digit sums, a 150-step SFT start, 412 prompts at k = 4),
# so within one test session the SFT start and the standard curation are cache hits; the hard band is
# 1-2 correct of 4. One seed, two methods, two steps, both pools, through the same flow.
SMOKE = {
    "methods": ["grpo", "ada-est"], "seeds": [0], "steps": 2, "prompts_per_step": 4,
    "overrides": {"data.dataset": "arithmetic:2", "data.train_size": 400, "data.eval_size": 12, "data.curation_k": 4,
                  "sft_steps": 150, "eval_every": 1, "eval_k": 2, "checkpoint_every": 0},
    # the band replaces the ceiling, so only the standard pool may set one (a field a run never reads is refused)
    "pools": {"standard": {"data.pass_rate_ceiling": 1.0}, "hard": {"data.keep_pass_rate": [0.25, 0.5]}},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one seed, two methods, two steps, both pools")
    parser.add_argument("--profile", default=PAPER_PROFILE, choices=list(PAPER_GRIDS),
                        help="the scale profile and its grid (default: the calibrated testbed)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the profile grid's")
    parser.add_argument("--methods", nargs="+", default=PAPER_METHODS)
    parser.add_argument("--pools", nargs="+", default=POOLS, choices=POOLS)
    parser.add_argument("--no-controls", action="store_true",
                        help="leave out the adaptive methods' budget-matched GRPO controls (the grid of 7 methods)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the profile's)")
    parser.add_argument("--out", type=Path, default=Path("out/paper_tables"), help="folder for paper_tables.md")
    parser.add_argument("--experiment", default="paper-tables")
    parser.add_argument("--resume", nargs="+", default=[], metavar="POOL=GROUP_DIR",
                        help="continue a killed grid: each pool's compare group folder")
    parser.add_argument("--tables-from", nargs="+", default=[], metavar="POOL=GROUP_DIR",
                        help="only write the tables from the finished children of these compare group folders "
                             "(a pool may be named more than once)")
    parser.add_argument("--save-runs", type=Path, default=None, metavar="FILE",
                        help="also write every finished run the tables read, and its start, to FILE (JSON lines)")
    parser.add_argument("--tables-from-runs", nargs="+", type=Path, default=[], metavar="FILE",
                        help="only write the tables from runs saved by --save-runs (no MLflow, no Prefect); "
                             "runs whose starts differ are refused")
    args = parser.parse_args(argv)
    if args.tables_from_runs and (args.tables_from or args.resume):
        parser.error("--tables-from-runs reads saved files only: give no --tables-from or --resume with it")
    return args


def pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"{flag} {item!r}: expected POOL=GROUP_DIR")
        pool, folder = item.split("=", 1)
        out[pool] = folder
    return out


def grid(args: argparse.Namespace) -> dict:
    """The flow's arguments for these command-line arguments."""
    if args.smoke:
        return dict(SMOKE, experiment=args.experiment, profile="tiny")
    chosen = PAPER_GRIDS[args.profile]
    return {"profile": args.profile, "methods": args.methods, "seeds": args.seeds or chosen["seeds"],
            "steps": args.steps, "prompts_per_step": None, "overrides": chosen["overrides"],
            "pools": {p: chosen["pools"][p] for p in args.pools}, "experiment": args.experiment,
            "controls": not args.no_controls}


def refuse(message: str) -> None:
    """One line on stderr and exit code 2: nothing was written."""
    print(f"paper_tables: refused: {message}", file=sys.stderr)
    raise SystemExit(2)


def tables_from_runs(args: argparse.Namespace) -> dict:
    """The tables from saved runs (report/saved_runs.py): no MLflow, no Prefect; refused before anything
    is written when the files' runs may not be combined."""
    from report.saved_runs import RefusedRuns, read_records, saved_tables_markdown, write_records

    start = time.perf_counter()
    try:
        markdown = saved_tables_markdown(args.tables_from_runs, methods=args.methods)
        records = read_records(args.tables_from_runs) if args.save_runs else []
    except RefusedRuns as err:
        refuse(str(err))
    except OSError as err:
        refuse(f"{err.filename}: {err.strerror}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.save_runs:
        write_records(args.save_runs, records, methods=args.methods)
    path = args.out / "paper_tables.md"
    path.write_text(markdown)
    info = {"tables": str(path), "minutes": round((time.perf_counter() - start) / 60, 2),
            "runs_from": [str(f) for f in args.tables_from_runs],
            **({"saved_runs": str(args.save_runs)} if args.save_runs else {})}
    print(markdown)
    print(json.dumps(info, indent=1))
    return {"markdown": markdown, **info}


def save_runs(path: Path, runs: dict[str, list]) -> None:
    """Write `runs` (pool -> RunCurves) and each one's start (its MLflow run) to `path`; refused (exit 2,
    nothing written) when they may not be combined."""
    from flows.paper_tables import run_start
    from report.saved_runs import RefusedRuns, write_runs

    clients: dict = {}
    starts = {str(r.run_dir): run_start(r.run_dir, clients) for rs in runs.values() for r in rs}
    try:
        write_runs(path, runs, starts)
    except RefusedRuns as err:
        refuse(str(err))


def run(args: argparse.Namespace) -> dict:
    """Run the grid (or only write the tables) in an environment already configured for Prefect and MLflow;
    with `--tables-from-runs`, from saved files in any environment."""
    if args.tables_from_runs:
        return tables_from_runs(args)
    from flows.paper_tables import finished_runs, order_runs, paper_tables, unfinished_children
    from flows.params import PaperTablesParams
    from report.paper_tables import paper_tables_markdown

    spec = grid(args)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.tables_from:
        groups: dict[str, list[str]] = {}
        for item in args.tables_from:  # a pool may name several groups (a grid split over processes)
            pool, folder = next(iter(pairs([item], "--tables-from").items()))
            groups.setdefault(pool, []).append(folder)
        runs = {pool: order_runs([r for folder in folders for r in finished_runs(folder)], spec["methods"])
                for pool, folders in groups.items()}
        done = {pool: sorted({(r.label, r.seed) for r in rs}) for pool, rs in runs.items()}
        unfinished = {pool: [c for folder in folders for c in unfinished_children(folder)]
                      for pool, folders in groups.items()}
        markdown = "# Paper tables (from the finished children only)\n\n" + "\n".join(
            f"- pool `{pool}`: {len(d)} runs finished: {', '.join(f'{m}-s{s}' for m, s in d)}"
            + (f"; not finished, so not read: {', '.join(unfinished[pool])}" if unfinished[pool] else "")
            for pool, d in done.items()) + "\n\n" + paper_tables_markdown(runs, order=spec["methods"])
        result = {"markdown": markdown, "groups": groups}
        if args.save_runs:  # before the tables: a refusal writes nothing
            save_runs(args.save_runs, runs)
    else:
        result = paper_tables(PaperTablesParams(**spec, resume=pairs(args.resume, "--resume")))
        if args.save_runs:  # the runs the flow's tables read: every finished child of each pool's group
            save_runs(args.save_runs, {pool: order_runs(finished_runs(folder), spec["methods"])
                                       for pool, folder in result["groups"].items()})
    path = args.out / "paper_tables.md"
    path.write_text(result["markdown"])
    info = {"tables": str(path), "minutes": round((time.perf_counter() - start) / 60, 2), "groups": result["groups"],
            **({"saved_runs": str(args.save_runs)} if args.save_runs else {})}
    print(result["markdown"])
    print(json.dumps(info, indent=1))
    return {**result, **info}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.tables_from_runs:  # saved files only: no ADA_HOME, MLflow or Prefect
        return run(args)
    from flows.demo import configure_environment

    home, prefect_mode = configure_environment()  # before Prefect is imported
    print(f"ADA_HOME={home}; Prefect: {prefect_mode}")
    return run(args)


if __name__ == "__main__":
    main()
