"""Prefect flows over the tasks: curate, train, evaluate, compare, sweep.

- `train`, `curate`, `evaluate`: one run each; `compare`, `sweep`: a parent run over child train runs;
  `paper_tables`: one `compare` per pool and the paper's tables over all of them
  (`group`: the children's parameters and the parent's report; `fanout`: children as deployments).
- `params`: the flows' parameter models (Prefect's forms); `tracking`: every MLflow call;
  `resume`, `progress`, `runtime`, `demo`: crash-safe runs, progress artifacts, process settings, `make demo`.

Importing this package (any `flows.*` module) sets `ENV_DEFAULTS` first, before Prefect or MLflow
is imported, wherever the caller left them unset: telemetry off (Prefect's server heartbeat,
MLflow's usage events) and a start-up bound for Prefect's temporary API server that fits a first
start. A variable the user set (even to "true") is left as it is.

Why the bound: with no PREFECT_API_URL a flow starts a temporary server, which on a new database
runs every migration before it answers. Prefect waits `PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`
(20), counted in its 0.1 s polling sleeps, then fails with "Timed out while attempting to connect to
ephemeral Prefect API server": 4 of 4 first starts in a row did on this shared 2-core machine, 0 of
10 with 300. Servers started together on one new database also race in the migrations; the
platform's flows migrate it once first (`flows.runtime.prepare_local_prefect`). The heartbeat, when
on, writes its session row into the new database during the first API writes and logs
`database is locked`. docs/benchmarks/prefect-start.md has the runs.
"""

import os

ENV_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
}
for _key, _value in ENV_DEFAULTS.items():
    os.environ.setdefault(_key, _value)

__all__ = ["compare", "curate", "demo", "evaluate", "fanout", "group", "paper_tables", "params", "progress", "resume",
           "runtime", "sweep", "tracking", "train"]
