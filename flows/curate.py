"""`curate` flow: difficulty-filter a prompt pool with the starting model and log the curated set.

The work happens in the cached `curate_dataset` task, so running this flow before `train` or
`compare` makes their curation a cache hit. Logs an MLflow run with the inputs as params, the
kept counts as metrics and the curated set as artifacts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from ada_core.data.curation import load_curated
from ada_core.data.prompts import pin_hub_ids
from flows import tracking
from flows.params import CurateParams
from flows.runtime import run_stamp, set_torch_threads
from tasks.curation import curate_for


@flow(name="curate", log_prints=True)
def curate(params: CurateParams = CurateParams()) -> dict[str, Any]:
    """Curate (or reuse) the prompt set for `params`; returns where it is and how much was kept."""
    config = pin_hub_ids(params.config())  # first: an invalid value or a hub id not to be had fails here
    logger = get_run_logger()
    set_torch_threads()
    uri = tracking.resolve_tracking_uri(params.tracking_uri)
    with tracking.tracked_run(uri, params.experiment, f"curate-{run_stamp()}", tags={"ada.flow": "curate"}) as (
        client, run_id,
    ):
        curated = curate_for(config, params.seed)
        prompts_file = Path(curated["dataset"]) / "prompts.jsonl"
        tracking.log_params(client, run_id, {
            **{f"curation.{k}": v for k, v in curated["inputs"].items()},
            "model": config.model, "dataset": config.data.dataset, "seed": params.seed,
            "dataset_hash": tracking.dataset_hash(str(prompts_file)), "curated_dataset": curated["dataset"],
            "start_model": curated["model"],
        })
        tracking.log_metrics(client, run_id, {
            "curation/pool": curated["pool"], "curation/kept": curated["kept"],
            "curation/kept_frac": curated["kept"] / max(curated["pool"], 1),
            **{f"curation/dropped_{reason.replace('/', '_')}": count for reason, count in curated["dropped"].items()},
        }, step=0)
        client.log_artifacts(run_id, curated["dataset"], artifact_path="curated")
        tracking.log_dataset_inputs(client, run_id, curated["dataset"], {"curated": load_curated(curated["dataset"]).prompts},
                           {"ada.curated_from": config.data.dataset,
                            "ada.curated_from_digest": curated["inputs"]["dataset_digest"]})
        logger.info("kept %d of %d prompts -> %s", curated["kept"], curated["pool"], curated["dataset"])
    return {**curated, "run_id": run_id, "tracking_uri": uri}
