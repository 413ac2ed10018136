"""`train` flow: one variant, curation -> per-step rollout and update tasks -> evaluation -> checkpoints.

There is no second training loop: the flow calls `ada_core.trainer.setup` and then
`ada_core.trainer.run_steps` with the task-wrapped step functions (`tasks.training.TASK_STEPS`) and
MLflow callbacks, so each step shows up as `rollout-step-N` and `update-step-N` task runs.

    python -c "from flows.train import train; from flows.params import TrainParams; \
               train(TrainParams(preset='ada-balance', steps=20))"
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run

from ada_core.config import TrainConfig
from ada_core.paths import runs_dir
from ada_core.trainer import latest_checkpoint, run_steps, setup
from flows import tracking
from flows.params import TrainParams
from flows.report import RUN_INFO
from flows.runtime import quiet_task_run_logs, run_stamp, set_torch_threads
from tasks.curation import curate_for, training_config
from tasks.training import TASK_STEPS


def prepare_data(config: TrainConfig, curate: bool, curation_seed: int) -> tuple[TrainConfig, dict[str, Any]]:
    """The config to train with, and the provenance params that describe its data and start model."""
    if not curate:
        return config, {"curated": False, "dataset_hash": tracking.dataset_hash(config.data.dataset)}
    curated = curate_for(config, curation_seed)
    run_config = training_config(config, curated)
    return run_config, {
        "curated": True,
        "curated_dataset": curated["dataset"],
        "curated_prompts": curated["kept"],
        "curation_pool": curated["pool"],
        "curation_seed": curation_seed,
        "start_model": curated["model"],
        "dataset_hash": tracking.dataset_hash(str(Path(curated["dataset"]) / "prompts.jsonl")),
    }


@flow(name="train", log_prints=True)
def train(params: TrainParams = TrainParams()) -> dict[str, Any]:
    """Train one variant and log it to MLflow; returns its run id, run directory and final metrics."""
    params.config()  # first: an invalid value raises ConfigError naming the field, before any wait for a slot
    with training_slots(params.concurrency_limits):
        return train_run(params)


@contextmanager
def training_slots(names: list[str]) -> Iterator[None]:
    """Hold one slot of each Prefect global concurrency limit in `names` (none: no wait) for the whole run.

    strict: a limit that does not exist is an error, not a silent pass. A lease renewal that fails
    (a server hiccup) does not stop training; the slot is freed when the lease runs out instead.
    """
    if not names:
        yield
        return
    logger = get_run_logger()
    logger.info("waiting for a slot of %s", ", ".join(names))
    run_id = flow_run.get_id()
    holder = ConcurrencyLeaseHolder(type="flow_run", id=run_id) if run_id else None
    with concurrency(names, occupy=1, strict=True, holder=holder, raise_on_lease_renewal_failure=False):
        logger.info("holding a slot of %s", ", ".join(names))
        yield


def train_run(params: TrainParams) -> dict[str, Any]:
    config = params.config()
    logger = get_run_logger()
    set_torch_threads()
    quiet_task_run_logs()
    variant = params.variant or params.preset
    label = params.run_name or f"{variant}-s{params.seed}"
    uri = tracking.resolve_tracking_uri(params.tracking_uri)
    run_config, provenance = prepare_data(config, params.curate, params.curation_seed)
    out = Path(params.output_dir) if params.output_dir else runs_dir() / f"{label}-{run_stamp()}"
    tags = {"ada.flow": "train", "ada.variant": variant, "ada.preset": params.preset, "ada.seed": str(params.seed),
            "prefect.flow_run_id": str(flow_run.get_id() or "")}

    with tracking.tracked_run(uri, params.experiment, label, params.parent_run_id, tags) as (client, run_id):
        logger.info("MLflow run %s (%s) -> %s; run dir %s", label, run_id, uri, out)
        extra = {k: v for k, v in provenance.items() if k != "dataset_hash"}
        tracking.log_params(client, run_id, tracking.run_params(
            config, variant=variant, dataset_digest=provenance["dataset_hash"],
            extra={**extra, "preset": params.preset, "engine": params.engine, "run_dir": str(out)},
        ))
        state = setup(run_config, out)
        run_logger = tracking.RunLogger(client, run_id)
        try:
            tracking.log_params(client, run_id, {"num_params": state.num_params})
            (out / RUN_INFO).write_text(json.dumps({
                "label": variant, "preset": params.preset, "seed": params.seed, "num_params": state.num_params,
                "mlflow_run_id": run_id, "tracking_uri": uri,
            }, indent=2) + "\n")
            final = run_steps(state, TASK_STEPS, run_logger.callbacks())
        finally:
            run_logger.flush()
            state.close()
        checkpoint = latest_checkpoint(out)
        artifact = f"{tracking.checkpoint_artifact_path(checkpoint)}/hf" if checkpoint else None
        version = None
        if params.register_as and artifact:
            version = tracking.register_policy(
                client, run_id, artifact, name=params.register_as, alias=params.alias,
                tags={"variant": variant, "preset": params.preset, "seed": params.seed},
            )
    return {
        "variant": variant, "preset": params.preset, "seed": params.seed, "run_id": run_id, "run_dir": str(out),
        "tracking_uri": uri, "model_artifact": artifact, "registered_version": version, "metrics": final,
        "num_params": state.num_params,
    }
