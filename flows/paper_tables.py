"""`paper-tables` flow: the paper's comparison grid (arXiv 2510.04996v3), one `compare` subflow per pool.

Each pool (a name and its config overrides: the standard curated set, the hard 1-2-of-16 set) is one
`compare` run with its own MLflow parent run and report; this flow then reads every finished child's
run folder and writes Tables A, B and C (report/paper_tables.py) for all pools together: as a Prefect
markdown artifact (`paper-tables`) and as `report/paper_tables.md` on every pool's MLflow parent run.
`benchmarks/paper_tables.py` is its command line.

A pool whose folder is given in `resume` reopens that compare group: finished children are skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows import tracking
from flows.compare import compare
from flows.params import CompareParams
from report import load_run
from report.paper_tables import paper_tables_markdown

REFERENCE = "grpo"


def finished_runs(group_dir: str | Path) -> list:
    """The RunCurves of every child of a compare group folder that finished (its result.json)."""
    from ada_core.run.files import read_result

    runs = []
    for child in sorted(Path(group_dir).iterdir()):
        result = read_result(child) if child.is_dir() else None
        if result is not None:
            runs.append(load_run(child, label=result["variant"], seed=result["seed"]))
    return runs


def order_runs(runs: list, methods: list[str]) -> list:
    rank = {m: i for i, m in enumerate(methods)}
    return sorted(runs, key=lambda r: (rank.get(r.label, len(rank)), r.label, r.seed))


@flow(name="paper-tables", log_prints=True)
def paper_tables(
    methods: list[str], seeds: list[int], pools: dict[str, dict[str, Any]], steps: int | None = None,
    prompts_per_step: int | None = None, overrides: dict[str, Any] | None = None, experiment: str = "paper-tables",
    resume: dict[str, str] | None = None, tracking_uri: str | None = None,
) -> dict[str, Any]:
    """Run `methods` x `seeds` on every pool through `compare`; return the tables and each pool's summary."""
    logger = get_run_logger()
    resume = resume or {}
    unknown = set(resume) - set(pools)
    if unknown:
        raise ValueError(f"resume: no pool named {sorted(unknown)}; pools are {sorted(pools)}")
    params = {pool: CompareParams(
        variants=methods, seeds=seeds, matched_grpo=False, reference=REFERENCE, steps=steps,
        prompts_per_step=prompts_per_step, overrides={**(overrides or {}), **pool_overrides},
        experiment=experiment, resume=resume.get(pool), tracking_uri=tracking_uri,
    ) for pool, pool_overrides in pools.items()}
    for pool, p in params.items():  # every child's config before any work: a bad value fails here
        for method in methods:
            p.build(method, seeds[0])
    summaries = {}
    for pool, p in params.items():
        logger.info("pool %s: compare over %s x seeds %s", pool, methods, seeds)
        summaries[pool] = compare.with_options(flow_run_name=f"compare-{pool}")(p)
    runs_by_pool = {pool: order_runs(finished_runs(Path(s["report_dir"]).parent), methods)
                    for pool, s in summaries.items()}
    tables = paper_tables_markdown(runs_by_pool, REFERENCE, order=methods)
    uri = summaries[next(iter(summaries))]["tracking_uri"]
    client = tracking.open_client(uri)
    parents = {pool: s["parent_run_id"] for pool, s in summaries.items()}
    header = "# Paper tables\n\n" + "\n".join(
        f"- pool `{pool}`: MLflow parent run `{run_id}`, group `{Path(summaries[pool]['report_dir']).parent}`"
        for pool, run_id in parents.items()) + "\n\n"
    markdown = header + tables
    for run_id in parents.values():
        client.log_text(run_id, markdown, "report/paper_tables.md")
    create_markdown_artifact(markdown=markdown, key="paper-tables",
                             description="Tables A, B and C of the paper grid (report/paper_tables.py)")
    return {"markdown": markdown, "parents": parents, "summaries": summaries,
            "groups": {pool: str(Path(s["report_dir"]).parent) for pool, s in summaries.items()}}
