"""The run folder's files: their names, and how they are read and appended to.

    config.yaml            the validated TrainConfig
    metrics.jsonl          one line per step (and per evaluation), keys from ada_core.metrics
    generations.jsonl      sampled eval generations every E steps
    checkpoints/step_N/    ada_core.run.checkpoints
    reference/             a KL run's initial weights, its frozen reference (ada_core.run.reference)
    ledger.json            the prompt ledger's run id and database (ada_core.run.ledger)
    run_info.json          written by the flows: label, seed, num_params, the MLflow run
    result.json            the train flow's return value, written last: the run finished
    run.lock               flock'ed by the process writing the run, holds its pid (ada_core.run.folder)

Per-step files are read with `read_jsonl`, which drops the torn last line a kill can leave, and
trimmed back to a checkpoint's step on resume.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ada_core.metrics import current_names

log = logging.getLogger(__name__)

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
GENERATIONS = "generations.jsonl"
CHECKPOINTS = "checkpoints"
RUN_INFO = "run_info.json"
RESULT = "result.json"
LEDGER = "ledger.json"
LOCK = "run.lock"
REFERENCE = "reference"
PER_STEP_FILES = (METRICS, GENERATIONS)  # rows keyed by "step"; trimmed on resume




def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a jsonl file a killed process may have written: a torn last line is dropped (logged);
    a bad line before the last is an error naming the file and line."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if n == len(lines):
                log.warning("%s: dropping a torn last line %d (%s)", path, n, err.msg)
                continue
            raise ValueError(f"{path}: line {n}: not valid JSON ({err.msg})") from None
    return rows


def trim_jsonl(source: Path, target: Path, step: int) -> None:
    """Carry `source`'s rows up to `step` into `target` (the same file when resuming in place), dropping
    rows logged after the checkpoint and a torn last line; written to a temp file, then renamed."""
    if not source.exists():
        return
    rows = [row for row in read_jsonl(source) if row["step"] <= step]
    tmp = target.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(target)


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """metrics.jsonl's rows, keys as today's scheme names them (a run written before a rename reads the same)."""
    return [current_names(row) for row in read_jsonl(Path(run_dir) / METRICS)]


def final_metrics(rows: list[dict[str, Any]], step: int) -> dict[str, float]:
    """The metrics `run_steps` returns for a run that ended at `step`, from its metrics.jsonl rows: that step's
    row and its evaluation merged (what a resume that had no step left to run reports)."""
    out: dict[str, float] = {}
    for row in rows:
        if row.get("step") == step:
            out.update({k: v for k, v in row.items() if k != "step"})
    return out


def read_generations(run_dir: str | Path, step: int | None = None) -> list[dict[str, Any]]:
    """Sampled eval generations, all of them or those of one step."""
    rows = read_jsonl(Path(run_dir) / GENERATIONS)
    return rows if step is None else [r for r in rows if r["step"] == step]


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """The train flow's result when the run in `run_dir` finished, else None."""
    try:
        result = json.loads((Path(run_dir) / RESULT).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
        result["metrics"] = current_names(result["metrics"])
    return result


def read_run_info(run_dir: Path) -> dict[str, Any]:
    """What the flows wrote about the run (label, seed, num_params, MLflow run); {} when absent."""
    path = Path(run_dir) / RUN_INFO
    return json.loads(path.read_text()) if path.is_file() else {}
