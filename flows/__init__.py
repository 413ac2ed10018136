"""Prefect flows over the tasks: curate, train, evaluate, compare, sweep.

- `train`, `curate`, `evaluate`: one run each; `compare`, `sweep`: a parent run over child train runs;
  `paper_tables`: one `compare` per pool and the paper's tables over all of them
  (`group`: the children's parameters and the parent's report; `fanout`: children as deployments).
- `params`: the flows' parameter models (Prefect's forms); `tracking`: every MLflow call;
  `resume`, `progress`, `runtime`, `demo`: crash-safe runs, progress artifacts, process settings, `make demo`.
"""

__all__ = ["compare", "curate", "demo", "evaluate", "fanout", "group", "paper_tables", "params", "progress", "resume",
           "runtime", "sweep", "tracking", "train"]
