"""`evaluate` flow: avg@k and pass@k of a registered model, a run artifact or a local checkpoint.

    evaluate(EvaluateParams(model="models:/ada-policy@champion", k=8))
    evaluate(EvaluateParams(model=".ada/runs/compare-.../ada-balance-s0/checkpoints/step_000060"))
    evaluate(EvaluateParams(model="Qwen/Qwen2.5-Math-1.5B", suite="paper"))  # the paper's Table 1

The model is loaded through the same `setup` the trainer uses (no SFT, no training) and scored by
the `evaluate` task. Which prompts:

- a model the platform trained (a registered version, a `runs:/` artifact, a checkpoint in a run
  folder): that run's own held-out split, read from its run folder's config.yaml (its dataset, the
  curated set included, its sizes and seed): never a prompt it trained on, and the same prompts as
  its held-out accuracy curve (`accuracy/heldout_avg_at_k`). `eval_size` takes the first that many of them.
- `dataset` given, or any other model: the held-out split of `dataset` (default the profile's).
With a `suite` it also scores every benchmark of it (hub datasets, ada_core/data/suites.py) at the
suite's k, temperature and token limit, and logs the paper's accuracy table (markdown and an MLflow table).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.utilities.annotations import quote

from ada_core.config import ConfigError, TrainConfig, deep_merge, validate_config
from ada_core.data.hub import parse_hub_id, pin
from ada_core.data.prompts import pin_hub_ids
from ada_core.paths import runs_dir
from ada_core.run.files import CHECKPOINTS, CONFIG, read_generations, read_run_info
from ada_core.training import setup
from flows import tracking
from flows.params import EvaluateParams
from flows.runtime import flow, run_stamp, set_torch_threads
from tasks.training import evaluate as evaluate_task


def local_model_dir(model: str, tracking_uri: str, scratch: Path) -> Path | str:
    """An HF folder (or a built-in model name) for any form of `EvaluateParams.model`."""
    if model.startswith(("models:/", "runs:/", "mlflow-artifacts:/")):
        return tracking.download_model(model, tracking_uri, scratch)
    if not Path(model).expanduser().exists() and parse_hub_id(model) is not None:
        return pin(model, "model")  # a hub id, pinned to the commit it resolves to
    path = Path(model).expanduser()
    if (path / "hf" / "config.json").is_file():  # a trainer checkpoint: step_N/hf
        return path / "hf"
    return path if path.exists() else model  # an HF folder, or a name like `tiny` for resolve_model


def trained_by(model: str, client: tracking.MlflowClient) -> tuple[str | None, Path | None]:
    """The MLflow run and run folder that trained `model`, when the platform did; else (None, None)."""
    run_id = tracking.run_of_model(client, model)
    if run_id is not None:
        run_dir = client.get_run(run_id).data.params.get("run_dir")
        return run_id, Path(run_dir) if run_dir else None
    path = Path(model).expanduser().resolve()
    for folder in path.parents:  # .../<run>/checkpoints/step_N[/hf]
        if folder.name == CHECKPOINTS and (folder.parent / CONFIG).is_file():
            return read_run_info(folder.parent).get("mlflow_run_id"), folder.parent
    return None, None


def held_out_of(run_id: str | None, run_dir: Path | None, model: str) -> TrainConfig | None:
    """The training config of the run that trained `model` (its data section and seed define its held-out
    split); None when no platform run trained it."""
    if run_id is None and run_dir is None:
        return None
    if run_dir is None or not (run_dir / CONFIG).is_file():
        raise ConfigError(f"dataset: {model} was trained by MLflow run {run_id}, whose run folder {run_dir} (and "
                          f"its {CONFIG}, which defines the held-out split) is not on this machine; give `dataset` "
                          "to evaluate on other prompts")
    import yaml

    return validate_config(yaml.safe_load((run_dir / CONFIG).read_text()))


def eval_config(params: EvaluateParams, model_dir: str, trained: TrainConfig | None) -> TrainConfig:
    """The evaluation's config: the profile's, with the training run's data and seed when there is one."""
    config = params.config(model_dir)
    if trained is None or params.dataset is not None:
        return config
    if params.eval_size is not None and params.eval_size > trained.data.eval_size:
        raise ConfigError(f"eval_size: {params.eval_size} is more than the {trained.data.eval_size} prompts the run "
                          "that trained this model held out; lower it, or give `dataset` for other prompts")
    return validate_config(deep_merge(config.model_dump(), {"data": trained.data.model_dump(), "seed": trained.seed}))


@flow(name="evaluate", log_prints=True)
def evaluate(params: EvaluateParams = EvaluateParams()) -> dict[str, Any]:
    """Score `params.model`; logs an MLflow run with the metrics and a table of sampled generations."""
    params.config("tiny")  # validate every field before downloading anything
    logger = get_run_logger()
    set_torch_threads()
    uri = tracking.resolve_tracking_uri(params.tracking_uri)
    out = runs_dir() / f"evaluate-{run_stamp()}"
    tags = {"ada.flow": "evaluate", "ada.model": params.model}
    trained_run, trained_dir = trained_by(params.model, tracking.open_client(uri))
    trained = held_out_of(trained_run, trained_dir, params.model) if params.dataset is None else None
    eval_config(params, "tiny", trained)  # a bad eval_size fails before any download
    with tracking.tracked_run(uri, params.experiment, f"evaluate-{run_stamp()}", tags=tags) as (client, run_id):
        with tempfile.TemporaryDirectory(prefix="ada-eval-") as scratch:
            model_dir = local_model_dir(params.model, uri, Path(scratch))
            config = pin_hub_ids(eval_config(params, str(model_dir), trained))
            if not Path(model_dir).exists() and parse_hub_id(str(model_dir)) is not None:
                client.set_tag(run_id, "ada.model_revision", str(model_dir))
            source = f"held-out split of {trained_dir}" if trained is not None else "held-out split of dataset"
            tracking.log_params(client, run_id, {
                "model": params.model, "k": config.eval_k, "eval_size": params.eval_size or config.data.eval_size,
                "dataset": config.data.dataset, "eval_temperature": config.eval_temperature, "seed": config.seed,
                "max_tokens": config.eval_max_tokens or config.rollout.max_tokens, "engine": params.engine,
                "eval_prompts": source, "trained_by_run": trained_run or "", "suite": params.suite,
            })
            state = setup(config, out)
            try:
                if params.eval_size is not None and trained is not None:
                    state.eval_prompts = state.eval_prompts[: params.eval_size]
                tracking.log_dataset_inputs(client, run_id, config.data.dataset, {"evaluation": state.eval_prompts})
                eval_ids = [p.id for p in state.eval_prompts]
                metrics = evaluate_task(quote(state))
                suites = [(bench, prompts) for bench, prompts in state.suite]
            finally:
                state.close()
        tracking.log_metrics(client, run_id, metrics, step=0)
        tracking.log_generations(client, run_id, 0, read_generations(out))
        for bench, prompts in suites:  # where each benchmark came from: repo, split, commit
            tracking.log_dataset_inputs(client, run_id, prompts[0].meta["hub_id"], {bench.key: prompts})
        table = None
        if params.suite is not None:
            from ada_core.data.suites import accuracy_table, get_suite

            table = accuracy_table(get_suite(params.suite), metrics, params.model, config.eval_k,
                                   config.eval_max_tokens or config.rollout.max_tokens, config.eval_temperature)
            tracking.log_accuracy_table(client, run_id, table, metrics)
            logger.info("accuracy table:\n%s", table)
        logger.info("%s: %s", params.model, {k: round(v, 4) for k, v in metrics.items()})
    return {"run_id": run_id, "tracking_uri": uri, "metrics": metrics, "run_dir": str(out), "eval_prompt_ids": eval_ids,
            "trained_by_run": trained_run, "table": table}
