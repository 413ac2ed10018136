"""The equal-budget comparison on `tiny`: the `compare` flow over both data regimes, with a large
held-out set, several seeds and paired differences (docs/benchmarks/equal-budget.md).

Full run (the issue's: 5 seeds, 512 held-out prompts, both regimes, every variant):

    ADA_HOME=/tmp/eq_home .venv/bin/python benchmarks/equal_budget.py

A reduced run names what it cuts, e.g. `--seeds 0 1 2 --regimes pool --steps 40`. The flow runs
embedded (SQLite MLflow store, ephemeral Prefect) like `make demo`; the report, with the paired
table and `paired.json`, lands in $ADA_HOME/runs/compare-<time>/report/.
"""

from __future__ import annotations

import argparse
import json
import time

from flows.demo import configure_environment

# Curate 4,096 arithmetic prompts with the 600-step SFT start at k = 8 (pass rate in (0, 0.875]),
# hold out 512 of the kept ones; the pool regime trains on the first 256 of the rest.
OVERRIDES = {
    "data.train_size": 3584,
    "data.eval_size": 512,
    "data.curation_k": 8,
    "eval_k": 4,
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--regimes", nargs="+", default=["pool", "fresh"])
    parser.add_argument("--variants", nargs="+", default=["grpo", "ada-balance", "ada-posterior", "ada-budget"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--pool-prompts", type=int, default=256)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--no-matched", action="store_true", help="leave out the matched-budget GRPO control")
    args = parser.parse_args(argv)
    home, prefect_mode = configure_environment()
    from flows.compare import compare  # after the environment: Prefect reads its settings on import
    from flows.params import CompareParams

    params = CompareParams(
        variants=args.variants, seeds=args.seeds, regimes=args.regimes, matched_grpo=not args.no_matched,
        steps=args.steps, pool_prompts=args.pool_prompts, overrides={**OVERRIDES, "eval_every": args.eval_every},
        experiment="equal-budget",
    )
    start = time.perf_counter()
    summary = compare(params)
    summary["minutes"] = (time.perf_counter() - start) / 60
    summary["args"] = vars(args)
    print(json.dumps({k: summary[k] for k in ("report_dir", "minutes", "args", "parent_run_id")}, indent=1))
    return summary


if __name__ == "__main__":
    main()
