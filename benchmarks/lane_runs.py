"""The finished trained runs of a grid's lanes (one ADA_HOME each), for benchmarks/grid_time.py and signal_table.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path


def missing_home(script: str, homes: list[Path]) -> bool:
    """Print one line naming the first folder that is not there (the caller exits 2); False when all are."""
    for home in homes:
        if not home.is_dir():
            print(f"{script}: {home}: no such ADA_HOME folder", file=sys.stderr)
            return True
    return False


def finished_runs(homes: list[Path]) -> Iterator[tuple[str, str, object, Path]]:
    """(MLflow experiment name, method label, MLflow run, run folder) of every FINISHED run with a `run_dir` that
    holds metrics.jsonl, in every home's MLflow store."""
    from mlflow import MlflowClient

    from flows.tracking.store import default_tracking_uri

    for home in homes:
        client = MlflowClient(default_tracking_uri(home))
        for experiment in client.search_experiments():
            for run in client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'"):
                run_dir = run.data.params.get("run_dir")
                if not run_dir or not (Path(run_dir) / "metrics.jsonl").is_file():
                    continue
                label = run.data.tags.get("ada.variant") or run.data.params.get("preset") or run.info.run_name
                yield experiment.name, label, run, Path(run_dir)
