"""`paper-tables` flow: the paper's comparison grid (arXiv 2510.04996v3), one `compare` subflow per pool.

Each pool (a name and its config overrides: the standard curated set, the hard 1-2-of-16 set) is one
`compare` run with its own MLflow parent run and report; this flow then reads every finished child's
run folder and writes Tables A-D (report/paper_tables.py: accuracy, step time, equal budget, steps and
samples to GRPO n = 4's final accuracy) for all pools together, each row saying the step or budget it
is read at: as a Prefect markdown artifact (`paper-tables`) and as `report/paper_tables.md` on every
pool's MLflow parent run.
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
from flows.params import PaperTablesParams
from report import load_run
from report.paper_tables import order_runs, paper_tables_markdown

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


def unfinished_children(group_dir: str | Path) -> list[str]:
    """`ada-est-s2 (last evaluation at step 20)` for every child of a compare group folder that started and
    did not finish: the tables leave it out, and whoever reads a killed grid's tables should see it named."""
    from ada_core import metrics as K
    from ada_core.run.files import read_metrics, read_result

    out = []
    for child in sorted(p for p in Path(group_dir).iterdir() if p.is_dir() and read_result(p) is None):
        rows = read_metrics(child)
        if rows:
            steps = [row["step"] for row in rows if K.EVAL_AVG_AT_K in row]
            out.append(f"{child.name} ({f'last evaluation at step {max(steps)}' if steps else 'no evaluation'})")
    return out


def run_start(run_dir: str | Path, clients: dict | None = None) -> dict[str, Any]:
    """Where a finished child started, as its MLflow run (run_info.json names it) recorded it: the warm
    start's `start_model_sha256` (a parameter), the curated set's `dataset_hash` (a parameter), the held-out
    set's digest (its `evaluation` dataset input) as `heldout_digest`, `mlflow_run_id` and `ran` (the
    run's start, UTC). A value the run did not record, or an MLflow run that cannot be read, is None:
    report/saved_runs.py then refuses to combine the run. `clients` caches one client per tracking URI."""
    from datetime import datetime, timezone

    from mlflow.exceptions import MlflowException

    from ada_core.run.files import read_run_info

    info = read_run_info(Path(run_dir))
    run_id, uri = info.get("mlflow_run_id"), info.get("tracking_uri")
    out: dict[str, Any] = {"start_model_sha256": None, "dataset_hash": None, "heldout_digest": None,
                           "mlflow_run_id": run_id, "ran": None}
    if not run_id or not uri:
        return out
    clients = {} if clients is None else clients
    try:
        if uri not in clients:
            clients[uri] = tracking.open_client(uri)
        run = clients[uri].get_run(run_id)
    except MlflowException:
        return out
    params = run.data.params
    inputs = {({t.key: t.value for t in i.tags}).get("mlflow.data.context"): i.dataset.digest
              for i in run.inputs.dataset_inputs}
    started = datetime.fromtimestamp(run.info.start_time / 1000, timezone.utc) if run.info.start_time else None
    return {**out, "start_model_sha256": params.get("start_model_sha256"), "dataset_hash": params.get("dataset_hash"),
            "heldout_digest": inputs.get("evaluation"), "ran": started.strftime("%Y-%m-%dT%H:%M:%SZ") if started else None}


@flow(name="paper-tables", log_prints=True)
def paper_tables(params: PaperTablesParams = PaperTablesParams()) -> dict[str, Any]:
    """Run `methods` x `seeds` on every pool through `compare`; return the tables and each pool's summary.

    The defaults are the paper grid (flows/params.py `PAPER_*`, benchmarks/paper_tables.py)."""
    logger = get_run_logger()
    compares = {pool: params.compare_params(pool) for pool in params.pools}
    for pool, p in compares.items():  # every child's config before any work: a bad value fails here
        for method in params.methods:
            p.build(method, params.seeds[0])
    summaries = {}
    for pool, p in compares.items():
        logger.info("pool %s: compare over %s x seeds %s", pool, params.methods, params.seeds)
        summaries[pool] = compare(p)  # its flow run takes its MLflow parent run's name
    runs_by_pool = {pool: order_runs(finished_runs(Path(s["report_dir"]).parent), params.methods)
                    for pool, s in summaries.items()}
    tables = paper_tables_markdown(runs_by_pool, REFERENCE, order=params.methods)
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
                             description="Tables A-D of the paper grid (report/paper_tables.py)")
    return {"markdown": markdown, "parents": parents, "summaries": summaries,
            "groups": {pool: str(Path(s["report_dir"]).parent) for pool, s in summaries.items()}}
