"""`evaluate` flow: avg@k and pass@k of a registered model, a run artifact or a local checkpoint.

    evaluate(EvaluateParams(model="models:/ada-policy@champion", k=8))
    evaluate(EvaluateParams(model=".ada/runs/compare-.../ada-balance-s0/checkpoints/step_000060"))

The model is loaded through the same `setup` the trainer uses (no SFT, no training) and scored by
the `evaluate` task on the held-out split of the profile's dataset (or `dataset`), so numbers
are comparable with the eval/avg_at_k curves of training runs on the same data and seed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.utilities.annotations import quote

from ada_core.paths import runs_dir
from ada_core.run.files import read_generations
from ada_core.training import setup
from flows import tracking
from flows.params import EvaluateParams
from flows.runtime import flow, run_stamp, set_torch_threads
from tasks.training import evaluate as evaluate_task


def local_model_dir(model: str, tracking_uri: str, scratch: Path) -> Path | str:
    """An HF folder (or a built-in model name) for any form of `EvaluateParams.model`."""
    if model.startswith(("models:/", "runs:/", "mlflow-artifacts:/")):
        return tracking.download_model(model, tracking_uri, scratch)
    path = Path(model).expanduser()
    if (path / "hf" / "config.json").is_file():  # a trainer checkpoint: step_N/hf
        return path / "hf"
    return path if path.exists() else model  # an HF folder, or a name like `tiny` for resolve_model


@flow(name="evaluate", log_prints=True)
def evaluate(params: EvaluateParams = EvaluateParams()) -> dict[str, Any]:
    """Score `params.model`; logs an MLflow run with the metrics and a table of sampled generations."""
    params.config("tiny")  # validate every field before downloading anything
    logger = get_run_logger()
    set_torch_threads()
    uri = tracking.resolve_tracking_uri(params.tracking_uri)
    out = runs_dir() / f"evaluate-{run_stamp()}"
    tags = {"ada.flow": "evaluate", "ada.model": params.model}
    with tracking.tracked_run(uri, params.experiment, f"evaluate-{run_stamp()}", tags=tags) as (client, run_id):
        with tempfile.TemporaryDirectory(prefix="ada-eval-") as scratch:
            model_dir = local_model_dir(params.model, uri, Path(scratch))
            config = params.config(str(model_dir))
            tracking.log_params(client, run_id, {
                "model": params.model, "k": params.k, "eval_size": config.data.eval_size,
                "dataset": config.data.dataset, "eval_temperature": config.eval_temperature, "seed": params.seed,
                "max_tokens": config.rollout.max_tokens, "engine": params.engine,
            })
            state = setup(config, out)
            try:
                metrics = evaluate_task(quote(state))
            finally:
                state.close()
        tracking.log_metrics(client, run_id, metrics, step=0)
        tracking.log_generations(client, run_id, 0, read_generations(out))
        logger.info("%s: %s", params.model, {k: round(v, 4) for k, v in metrics.items()})
    return {"run_id": run_id, "tracking_uri": uri, "metrics": metrics, "run_dir": str(out)}
