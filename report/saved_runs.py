"""A paper grid's finished runs saved as a small file, and the tables built again from such files.

A grid's runs live in the ADA_HOME (MLflow store and run folders) of the machine that ran them; a file
of saved runs, committed with the repository, lets a grid be completed over several sessions and its
tables rebuilt in a second on any machine, without MLflow or Prefect
(`benchmarks/paper_tables.py --save-runs FILE` and `--tables-from-runs FILE ...`).

The file is JSON lines: one line per run, in the tables' order (pool, method, seed), keys sorted, so
files merged into one (`--tables-from-runs A B --save-runs ALL`) keep every line as it was and a later
session's runs add lines. A line holds the run as the tables read it (a `report.curves.RunCurves`):
`pool`, `label` (its method), `seed`, `config` (the run's config.yaml) and `points`, column-wise
(`{"step": [0, 1, ...], key: [value or null, ...]}`, null where a step lacks the key) with only the
keys Tables A-D and their captions read (`POINT_KEYS`): the eval points, the budgets and the step
times. The derived curves (`compute/flops_cum`, `compute/step_time_cum`) and every other metric are
left out: a testbed run of 100 steps keeps about 15 kB (a whole grid of 70 runs about 1 MB) instead of
some 200 kB with every metric. Beside the run, `start` says where it started, as its MLflow run
recorded it (flows/paper_tables.py `run_start`):

- `start_model_sha256`: the warm-started weights' sha256 (the run's MLflow parameter);
- `dataset_hash`: the curated set's digest (the `dataset_hash` parameter: its prompts.jsonl's bytes);
- `heldout_digest`: the held-out set's digest (the `evaluation` dataset input, `ada_core.data.prompts_digest`);
- `mlflow_run_id` and `ran` (when the MLflow run started, UTC);

and `machine` the machine that wrote the file (the CPU model and whether it has AVX-512, from
/proc/cpuinfo) and `saved`, when (UTC). The file is written on the machine whose ADA_HOME holds the
runs, so that is the machine that ran them unless the folders were copied.

What must match to combine runs (`check_runs`), and why:

- **The warm start, across every pool.** Every pool of a grid starts from one SFT model (the pools are
  filters of the same raw draw, scored by that model), and each seed's pairing in Table C and each
  curve in Table D assume it. Other CPUs train other warm-start weights from the same seeds
  (docs/benchmarks/testbed.md, Reproducibility), so runs whose `start_model_sha256` differ never mix.
- **The curated set and the held-out set, within a pool.** A pool's runs train on one curated set and
  are scored on one held-out set; a run scored on another set, or trained from another curation, reads
  another exam. Across pools these differ by design (another band keeps other prompts and holds out
  others), so they are compared within a pool only.
- **Not the CPU, nor the date.** Two machines that share the start (its cache copied) give the same
  hash and may be combined; two that do not give different hashes, which is what is compared.
- **Nor how the engines batched their reads** (`optim.share_prompts`, the rollout engine's shared prefixes,
  `rollout.micro_batch_size`): like another CPU's kernels they change float rounding only. On the testbed,
  33 of a grid's 35 runs made with them reproduced the runs made without value for value, and two Ada runs
  parted at steps 54 and 96 by less than the seeds' spread (docs/benchmarks/testbed.md, "Where a grid's
  time goes").

A run that records no weight hash or held-out digest cannot be matched and is refused too, as is the
same (pool, method, seed) twice. A refusal is one line naming the file and line (`runs.jsonl:12`) and the
two differing values.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ada_core import metrics as K
from report.curves import RunCurves
from report.paper_tables import order_runs, paper_tables_markdown

FORMAT = "ada-saved-runs/1"
# Every point key Tables A-D and their captions read (report/paper_tables.py, pools.py, paired.py,
# convergence.py); `step` first.
POINT_KEYS = [
    "step", K.EVAL_AVG_AT_K, K.EVAL_PASS_AT_K,
    K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_TRAINED_TOKENS_CUM, K.BUDGET_GENERATED_SAMPLES, K.BUDGET_GENERATED_TOKENS,
    K.TIME_STEP_S, K.TIME_GENERATE_S, K.TIME_REWARD_S, K.TIME_UPDATE_S,
]
START_KEYS = ["start_model_sha256", "dataset_hash", "heldout_digest"]
SHARED_BY_ALL = ["start_model_sha256"]  # one warm start for every pool of a grid
SHARED_BY_POOL = ["dataset_hash", "heldout_digest"]  # one curated and one held-out set per pool
REQUIRED = ["start_model_sha256", "heldout_digest"]


class RefusedRuns(ValueError):
    """Runs that may not be combined; the message is one line naming the file and the two values."""


def machine(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    """{"cpu": the CPU model name, "avx512": whether its flags include avx512f, "vector": its AVX-512 and AMX flags
    (two Xeons that both say AVX-512 trained different starts: docs/benchmarks/testbed.md)}; None for what
    cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return {"cpu": None, "avx512": None, "vector": None}
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    names = flags.group(1).split() if flags else None
    return {"cpu": model.group(1).strip() if model else None,
            "avx512": ("avx512f" in names) if names is not None else None,
            "vector": " ".join(sorted(f for f in names if f.startswith(("avx512", "amx")))) if names is not None else None}


def run_record(run: RunCurves, pool: str, start: dict[str, Any], host: dict[str, Any], saved: str) -> dict[str, Any]:
    """One line of the file: the run as the tables read it, its start and the machine (module docstring)."""
    points = {key: [p.get(key) for p in run.points] for key in POINT_KEYS}
    points["step"] = [int(s) for s in points["step"]]
    points = {key: values for key, values in points.items() if any(v is not None for v in values)}
    return {"format": FORMAT, "pool": pool, "label": run.label, "seed": run.seed,
            "start": {key: start.get(key) for key in (*START_KEYS, "mlflow_run_id", "ran")},
            "machine": host, "saved": saved, "run_dir": str(run.run_dir), "config": run.config, "points": points}


def curves_of(record: dict[str, Any]) -> RunCurves:
    """A file line back as the RunCurves the tables read (`run_dir` as recorded: nothing is read from it)."""
    columns = record["points"]
    steps = columns["step"]
    points = []
    for i, step in enumerate(steps):
        point = {key: values[i] for key, values in columns.items() if key != "step" and values[i] is not None}
        point["step"] = float(step)
        points.append(point)
    return RunCurves(record["label"], int(record["seed"]), Path(record.get("run_dir") or "."), None, points,
                     config=record.get("config") or {})


def write_runs(path: str | Path, runs_by_pool: dict[str, list[RunCurves]], starts: dict[str, dict[str, Any]],
               host: dict[str, Any] | None = None, saved: str | None = None) -> Path:
    """Write the runs (pool -> runs, in the tables' order) to `path`, one JSON line each; `starts` maps a
    run's folder (str) to its start (`flows.paper_tables.run_start`). Refused (`RefusedRuns`, naming the
    run folder; nothing written) when the runs could not be read back together (`check_runs`)."""
    host = machine() if host is None else host
    saved = saved or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = Path(path)
    named = [(str(run.run_dir), run_record(run, pool, starts.get(str(run.run_dir), {}), host, saved))
             for pool, runs in runs_by_pool.items() for run in runs]
    check_runs(named)  # a refusal names the run folders
    return _write(path, [record for _, record in named])


def write_records(path: str | Path, records: list[tuple[str, dict[str, Any]]], methods: list[str] | None = None) -> Path:
    """Write records read from saved files (`read_records`, already checked) to one file, in the tables'
    order (pools as they first come, then method and seed): several sessions' files merged into one."""
    pools = list(dict.fromkeys(r["pool"] for _, r in records))
    rank = {m: i for i, m in enumerate(methods or [])}
    check_runs(records)
    ordered = sorted((r for _, r in records), key=lambda r: (
        pools.index(r["pool"]), rank.get(r["label"], len(rank)), r["label"], int(r["seed"])))
    return _write(Path(path), ordered)


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return path


class Line(str):
    """A saved file's path (it compares and groups as the path) that knows the line a record came from, so a
    refusal names `file:line`."""

    line: int

    def __new__(cls, path: str, line: int) -> "Line":
        out = super().__new__(cls, path)
        out.line = line
        return out


def _where(path: str) -> str:
    """`file:line` for a record read from a file, the run folder (or file) alone otherwise."""
    return f"{path}:{path.line}" if isinstance(path, Line) else str(path)


def read_records(paths: list[str | Path]) -> list[tuple[str, dict[str, Any]]]:
    """(file, record) for every line of the files, in order; each file a `Line` naming the record's line."""
    out = []
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise RefusedRuns(f"{path}:{number}: not a saved run ({err})") from None
            if record.get("format") != FORMAT:
                raise RefusedRuns(f"{path}:{number}: not a saved run of format {FORMAT} "
                                  f"(format {record.get('format')!r})")
            out.append((Line(str(path), number), record))
    return out


def check_runs(records: list[tuple[str, dict[str, Any]]]) -> None:
    """Refuse (`RefusedRuns`, one line) runs that may not be combined: a start value a run lacks, one
    that differs from the first run's (the weight hash over all pools, the curated and held-out set
    digests within a pool: the module docstring says why), or the same (pool, method, seed) twice."""
    first: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}  # (scope, key) -> the first run that set it
    seen: dict[tuple[str, str, int], str] = {}
    for path, record in records:
        name = f"pool {record['pool']}, {record['label']} seed {record['seed']}"
        start = record.get("start") or {}
        for key in REQUIRED:
            if not start.get(key):
                raise RefusedRuns(f"{_where(path)}: {name} records no {key}: its start cannot be matched, so it is not "
                                  "combined")
        ident = (record["pool"], record["label"], int(record["seed"]))
        if ident in seen:
            raise RefusedRuns(f"{_where(path)}: {name} is there twice (also in {_where(seen[ident])}): refused, "
                              "not combined")
        seen[ident] = path
        for key in (*SHARED_BY_ALL, *SHARED_BY_POOL):
            scope = ("" if key in SHARED_BY_ALL else record["pool"], key)
            if scope not in first:
                first[scope] = (path, record)
                continue
            other_path, other = first[scope]
            mine, theirs = start.get(key), (other.get("start") or {}).get(key)
            if mine != theirs:
                where = "every pool" if key in SHARED_BY_ALL else f"pool {record['pool']}"
                raise RefusedRuns(
                    f"{_where(path)}: {name} has {key} {mine}, but {_where(other_path)} ({other['label']} seed {other['seed']} of "
                    f"pool {other['pool']}) has {theirs}: runs of {where} are combined only from one start")


def read_runs(paths: list[str | Path], methods: list[str] | None = None) -> tuple[dict[str, list[RunCurves]], list]:
    """(pool -> its runs in the tables' order, the checked records) from saved files; `RefusedRuns` when
    they may not be combined (`check_runs`)."""
    records = read_records(paths)
    check_runs(records)
    runs: dict[str, list[RunCurves]] = {}
    for _, record in records:
        runs.setdefault(record["pool"], []).append(curves_of(record))
    return {pool: order_runs(rs, methods or []) for pool, rs in runs.items()}, records


def saved_tables_markdown(paths: list[str | Path], methods: list[str] | None = None, reference: str = "grpo") -> str:
    """The tables from saved files, with a header naming, per pool, the runs read and their files, and
    the start they share."""
    runs, records = read_runs(paths, methods)
    files: dict[str, list[str]] = {}
    for path, record in records:
        if path not in files.setdefault(record["pool"], []):
            files[record["pool"]].append(path)
    starts = {record["pool"]: record["start"] for _, record in records}
    machines = sorted({_machine_text(record) for _, record in records})
    lines = ["# Paper tables (from saved runs)", ""]
    if records:
        lines.append(f"- warm start `start_model_sha256` {records[0][1]['start']['start_model_sha256']}; "
                     f"saved on {'; '.join(machines)}")
    for pool, rs in runs.items():
        lines.append(f"- pool `{pool}`: {len(rs)} runs read from {', '.join(files[pool])} (held-out digest "
                     f"{starts[pool]['heldout_digest']}, curated set {starts[pool].get('dataset_hash')}): "
                     + ", ".join(f"{r.label}-s{r.seed}" for r in rs))
    return "\n".join(lines) + "\n\n" + paper_tables_markdown(runs, reference, order=methods)


def _machine_text(record: dict[str, Any]) -> str:
    host = record.get("machine") or {}
    avx = {True: "AVX-512", False: "no AVX-512"}.get(host.get("avx512"), "AVX-512 unknown")
    return f"{host.get('cpu') or 'an unknown CPU'} ({avx}), {str(record.get('saved') or '')[:10] or 'no date'}"
