"""`train` flow: one variant, curation -> per-step rollout and update tasks -> evaluation -> checkpoints.

There is no second training loop: the flow calls `ada_core.training.setup` and then
`ada_core.training.run_steps` with the task-wrapped step functions (`tasks.training.TASK_STEPS`) and
MLflow callbacks, so each step shows up as `rollout-step-N` and `update-step-N` task runs.

    python -c "from flows.train import train; from flows.params import TrainParams; \
               train(TrainParams(preset='ada-balance', steps=20))"

Resume (flows/tracking/runs.py, flows/resume.py): `TrainParams(resume=<run folder or MLflow run id>)`, or a Prefect retry of
the same flow run, continues the same run folder and the same MLflow run from the newest good
checkpoint; MLflow gets each step's row once (tracking.RunLogger says how). The config is the run's
own `config.yaml` (`resume_config`): a field given explicitly that would change it is refused before
anything is written, except the short list in ada_core/run/resume.py (steps, cadences, ...), which
the MLflow run records in its `ada.resume_changes` tag.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run

from ada_core.config import TrainConfig
from ada_core.data import data_digest
from ada_core.data.hub import names_pin, parse_hub_id
from ada_core.data.prompts import hub_dataset, pin_hub_ids
from ada_core.errors import ResumeError
from ada_core.models import weights_sha256
from ada_core.paths import runs_dir
from ada_core.run.checkpoints import NoCheckpoint, latest_checkpoint
from ada_core.run.files import CONFIG, PER_STEP_FILES, RESULT, RUN_INFO, final_metrics, read_metrics, read_run_info
from ada_core.run.folder import check_run_dir
from ada_core.run.resume import differences, read_saved_config, resumed_config
from ada_core.training import run_steps, setup
from flows import resume as resuming
from flows import tracking
from flows.params import TrainParams, flatten_dotted, nest_dotted
from flows.progress import TrainProgress, chain
from flows.runtime import flow, quiet_task_run_logs, run_stamp, set_torch_threads
from tasks.curation import curate_for, training_config
from tasks.progress import ProgressArtifact
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


def check_inputs(config: TrainConfig) -> None:
    """Read the dataset once before any MLflow run or folder exists: a bad file or row, or more prompts
    per step than it holds, fails here."""
    from ada_core.data import run_split
    from ada_core.training.state import check_prompts_per_step

    train_prompts = run_split(config.data, config.seed).training
    check_prompts_per_step(config, len(train_prompts))


def curation_record(config: TrainConfig) -> dict[str, Any] | None:
    """The summary `curate_dataset` wrote beside a curated set (tasks/curation.py), when the config's
    dataset is one; None for a dataset that was not curated."""
    summary = Path(config.data.dataset) / "curation.json"
    try:
        return json.loads(summary.read_text()) if summary.is_file() else None
    except (OSError, ValueError):
        return None


def resume_config(params: TrainParams, run_dir: Path) -> tuple[TrainConfig, dict[str, tuple[Any, Any]]]:
    """The config a resumed run continues with, and what it changes: the run's own `config.yaml`, with
    every config field `params` gives explicitly laid over it and checked (ada_core/run/resume.py).

    A curated run's config names the curated set, its start model and `sft_steps: 0`; the request that
    made it named the source dataset, model and warm start, which its curation summary records. A
    resume that gives those same source values (a Prefect retry, a resumed group's child) is the same
    run; any other is refused like every other change."""
    saved = read_saved_config(run_dir)
    curation = curation_record(saved)
    given = params.model_fields_set
    if "curate" in given and params.curate != (curation is not None):
        raise ResumeError(f"resume {run_dir}: would change what the run is: curate: {curation is not None} -> "
                          f"{params.curate}. Give no other value, or start a new run in another folder.")
    if curation is not None and "curation_seed" in given and params.curation_seed != curation["inputs"]["seed"]:
        raise ResumeError(f"resume {run_dir}: would change what the run is: curation_seed: "
                          f"{curation['inputs']['seed']} -> {params.curation_seed}. Give no other value, or start a "
                          "new run in another folder.")
    asked = flatten_dotted(params.resume_overrides())
    if curation is not None:
        for key, source in (("model", "model"), ("sft_steps", "sft_steps"), ("data.dataset", "dataset")):
            if key in asked and _same_source(asked[key], curation["inputs"][source]):
                del asked[key]  # the source value curation replaced: the run's own
    config = resumed_config(run_dir, nest_dotted(asked))
    return config, differences(saved, config)


def _same_source(asked: Any, recorded: Any) -> bool:
    """A source value given again on a resume names the one curation recorded: equal, or the hub id that
    recorded pin (`org/name@<commit>`) was pinned from."""
    return asked == recorded or (isinstance(asked, str) and isinstance(recorded, str) and names_pin(asked, recorded))


def _provenance_of(config: TrainConfig) -> dict[str, Any]:
    """`prepare_data`'s provenance params for a run config read back from its folder."""
    curation = curation_record(config)
    if curation is None:
        return {"curated": False, "dataset_hash": tracking.dataset_hash(config.data.dataset)}
    return {"curated": True, "curated_dataset": config.data.dataset, "curated_prompts": curation["kept"],
            "curation_pool": curation["pool"], "curation_seed": curation["inputs"]["seed"],
            "start_model": curation["model"],
            "dataset_hash": tracking.dataset_hash(str(Path(config.data.dataset) / "prompts.jsonl"))}


def _fresh_start(out: Path) -> None:
    """A resumed run that died before its first checkpoint starts over in its folder (and MLflow run,
    which holds no metrics yet: rows are sent at checkpoints)."""
    import shutil

    for name in (*PER_STEP_FILES, "config.yaml", RUN_INFO):  # rewritten once set-up succeeds
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)


def describe(params: TrainParams, config: TrainConfig, variant: str) -> str:
    """The MLflow run's one-paragraph Description."""
    part = " (a child of a compare/sweep run)" if params.parent_run_id else ""
    return (f"`{variant}`{part}: preset `{config.preset}`, sampler `{config.sampler.name}`, advantage "
            f"`{config.advantage.name}`, seed {config.seed}; {config.steps} steps of {config.prompts_per_step} "
            f"prompts from `{config.data.dataset}` on model `{config.model}`.")


@flow(name="train", log_prints=True)
def train(params: TrainParams = TrainParams()) -> dict[str, Any]:
    """Train one variant and log it to MLflow; returns its run id, run directory and final metrics.

    With `params.resume` (or when Prefect retries this flow run) it continues that run instead."""
    params.config()  # first: an invalid value raises ConfigError naming the field, before any wait for a slot
    with training_slots(params.concurrency_limits):
        return train_run(params)


SLOT_LEASE_S = 60.0


@contextmanager
def training_slots(names: list[str]) -> Iterator[None]:
    """Hold one slot of each Prefect global concurrency limit in `names` (none: no wait) for the whole run.

    strict: a limit that does not exist is an error, not a silent pass. A lease renewal that fails
    (a server hiccup) does not stop training; the slot is freed when the lease runs out instead. The
    lease is SLOT_LEASE_S, renewed while the run lives: a run killed without clean-up (a cancelled child
    its worker stops, a SIGKILL) frees its slot within that, not Prefect's default of 5 minutes.
    """
    if not names:
        yield
        return
    logger = get_run_logger()
    logger.info("waiting for a slot of %s", ", ".join(names))
    run_id = flow_run.get_id()
    holder = ConcurrencyLeaseHolder(type="flow_run", id=run_id) if run_id else None
    with concurrency(names, occupy=1, strict=True, holder=holder, lease_duration=SLOT_LEASE_S,
                     raise_on_lease_renewal_failure=False):
        logger.info("holding a slot of %s", ", ".join(names))
        yield


def train_run(params: TrainParams) -> dict[str, Any]:
    config = pin_hub_ids(params.config())  # hub ids -> org/name@<commit>; one not to be had fails here
    logger = get_run_logger()
    set_torch_threads()
    quiet_task_run_logs()
    variant = params.variant or params.preset
    stamp = run_stamp()
    # A standalone run's name is unique on its own; a child's (set by compare/sweep) carries its group's.
    label = params.run_name or f"train-{variant}-s{params.seed}-{stamp}"
    uri = tracking.resolve_tracking_uri(params.tracking_uri)
    flow_run_id = str(flow_run.get_id() or "")
    target = resuming.resume_target(uri, params.experiment, params.resume, flow_run_id)
    changes: dict[str, tuple[Any, Any]] = {}
    if target is not None and (target.run_dir / CONFIG).is_file():
        out = target.run_dir
        check_run_dir(out, resume=out)  # a live writer is refused here, naming its pid
        run_config, changes = resume_config(params, out)  # the run's own config: refused before anything is written
        provenance = _provenance_of(run_config)
        requested = run_config  # what a new MLflow run's params then describe: the run as it is
    else:
        if target is not None:  # it died before its set-up wrote a config: it starts over, as asked now
            out = target.run_dir
        else:
            default = runs_dir() / (f"{label}-{stamp}" if params.run_name else label)  # the default label has the stamp
            out = Path(params.output_dir) if params.output_dir else default
            check_run_dir(out, overwrite=params.overwrite)  # before curation and before an MLflow run is opened
        if not params.curate:
            check_inputs(config)
        run_config, provenance = prepare_data(config, params.curate, params.curation_seed)
        requested = config
    # Who the run is comes from its config: on a resume, the run's own, whatever the defaults of `params` say.
    preset, seed = run_config.preset, run_config.seed
    if target is not None:
        variant = params.variant or read_run_info(out).get("label") or preset
    tags = {"ada.flow": "train", "ada.variant": variant, "ada.preset": preset, "ada.seed": str(seed),
            tracking.FLOW_RUN: flow_run_id, **tracking.process_tags(), **hub_tags(requested)}

    run_id = target.run_id if target is not None else None
    with tracking.tracked_run(uri, params.experiment, label, params.parent_run_id, tags, run_id=run_id,
                              description=describe(params, run_config, variant)) as (client, run_id):
        logger.info("MLflow run %s (%s) -> %s; run dir %s", label, run_id, uri, out)
        name_flow_run(client.get_run(run_id).info.run_name)  # a resumed run keeps its first name
        if params.parent_run_id:
            client.set_tag(run_id, tracking.STUDY, tracking.study_of(client, params.parent_run_id))
        if target is None or target.run_id is None:
            extra = {k: v for k, v in provenance.items() if k != "dataset_hash"}
            tracking.log_params(client, run_id, tracking.run_params(
                requested, variant=variant, dataset_digest=provenance["dataset_hash"],
                facts=tracking.run_facts(provenance["curated"]),
                extra={**extra, "preset": preset, "engine": run_config.rollout.engine, "run_dir": str(out)},
            ))
        if changes:
            client.set_tag(run_id, "ada.resume_changes",
                           "; ".join(f"{key}: {old} -> {new}" for key, (old, new) in changes.items()))
        state = _setup(run_config, out, target, client, run_id, logger, overwrite=params.overwrite)
        run_logger = tracking.RunLogger(client, run_id, suite_table=suite_table(run_config, config.model))
        budget = tracking.BudgetAxes(run_logger, state.totals, state.num_params)
        shown = TrainProgress(label, run_config.steps)
        try:
            tracking.log_params(client, run_id, {"num_params": state.num_params})
            if state.start_model_dir is not None:  # the start's identity: seeds of a comparison log the same one
                tracking.log_params(client, run_id, {"start_model_sha256": weights_sha256(state.start_model_dir)})
            if state.skipped_prompts:
                client.set_tag(run_id, "ada.skipped_long_prompts", str(state.skipped_prompts))
            curated_from = ({"ada.curated_from": config.data.dataset,
                             "ada.curated_from_digest": data_digest(config.data.dataset)} if params.curate else {})
            tracking.log_dataset_inputs(client, run_id, run_config.data.dataset,
                               {"training": state.source.prompts, "evaluation": state.eval_prompts,
                                **({"validation": state.val_prompts} if state.val_prompts else {})}, curated_from)
            for bench, prompts in state.suite:  # each benchmark scored: its repo, split and pinned commit
                tracking.log_dataset_inputs(client, run_id, prompts[0].meta["hub_id"], {bench.key: prompts})
            shown.start(state.step)
            (out / RUN_INFO).write_text(json.dumps({
                "label": variant, "preset": preset, "seed": seed, "num_params": state.num_params,
                "mlflow_run_id": run_id, "tracking_uri": uri,
            }, indent=2) + "\n")
            if target is not None:  # what a crash before or during a checkpoint's send left unsent
                rows = read_metrics(out)
                sent, points = run_logger.send_missing(rows), budget.send_missing(rows)
                uploaded = run_logger.upload_missing(out)
                if sent or points or uploaded:
                    logger.info("sent %d metric rows, %d budget points and checkpoints %s the crash left unsent",
                                sent, points, uploaded)
            final = run_steps(state, TASK_STEPS, chain(run_logger.callbacks(), budget.callbacks(), shown.callbacks()))
            if not final:  # resumed at its last step: nothing ran, the result is what metrics.jsonl holds
                final = final_metrics(read_metrics(out), state.step)
        finally:
            run_logger.flush()
            state.close()
        checkpoint = latest_checkpoint(out)
        artifact = f"{tracking.checkpoint_artifact_path(checkpoint)}/hf" if checkpoint else None
        version = None
        if params.register_as and artifact:
            missing = tracking.missing_files(client, run_id, checkpoint)
            if missing:  # never register a version whose files are not all in MLflow
                raise RuntimeError(f"checkpoint {checkpoint.name}: MLflow run {run_id} lacks {missing[:3]}; "
                                   "resume the run to upload it before registering")
            version = tracking.register_policy(
                client, run_id, artifact, name=params.register_as, alias=params.alias,
                tags={"variant": variant, "preset": preset, "seed": seed},
            )
    result = {
        "variant": variant, "preset": preset, "seed": seed, "run_id": run_id, "run_dir": str(out),
        "tracking_uri": uri, "model_artifact": artifact, "registered_version": version, "metrics": final,
        "num_params": state.num_params,
    }
    (out / RESULT).write_text(json.dumps(result, indent=2) + "\n")  # last: the run is finished
    return result


def hub_tags(config: TrainConfig) -> dict[str, str]:
    """`ada.model_revision` / `ada.dataset_revision`: the `org/name@<commit>` of a (pinned) hub model or dataset."""
    tags = {}
    if parse_hub_id(config.model) is not None and not Path(config.model).exists():
        tags["ada.model_revision"] = config.model
    if hub_dataset(config.data.dataset) is not None:
        tags["ada.dataset_revision"] = config.data.dataset
    return tags


def suite_table(config: TrainConfig, model: str):
    """The markdown accuracy table of `config.eval_suite` for an evaluation's metrics (its row named `model`),
    or None without a suite."""
    if config.eval_suite is None:
        return None
    from ada_core.data.suites import accuracy_table, get_suite

    suite = get_suite(config.eval_suite)
    tokens = config.eval_max_tokens or config.rollout.max_tokens
    return lambda metrics: accuracy_table(suite, metrics, model, config.eval_k, tokens, config.eval_temperature)


def name_flow_run(name: str) -> None:
    """Give this flow run its MLflow run's name, so the two UIs list a run under one name (a standalone
    run otherwise keeps Prefect's random one). A child of compare/sweep already has it; their parents call
    this with the group's name."""
    flow_run_id = flow_run.get_id()
    if not flow_run_id or flow_run.get_name() == name:
        return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run_id, name=name)


def _setup(run_config: TrainConfig, out: Path, target, client, run_id: str, logger, overwrite: bool = False):
    """`setup`, resuming from the newest good checkpoint of `target`'s folder when it has one.

    An SFT warm start done here (curation off: with curation on, the curation task did it and
    showed its own bar) gets the same progress artifact, so the minutes before step 1 are not blank."""
    sft = ProgressArtifact(f"warm start (SFT) of {run_config.model}").callback() if run_config.sft_steps else None
    if target is None:
        return setup(run_config, out, overwrite=overwrite, sft_progress=sft)
    try:
        state = setup(run_config, out, resume=out)
    except NoCheckpoint as err:
        if err.damaged:
            raise  # every saved checkpoint is damaged: that needs a person, not a silent restart
        logger.warning("%s; starting %s over from step 0", err, out)
        _fresh_start(out)
        return setup(run_config, out, sft_progress=sft)
    choice = state.resumed_from
    if choice is not None and choice.rejected:
        logger.warning("%s", choice.describe())
        client.set_tag(run_id, "ada.rejected_checkpoints", "; ".join(f"{p.name}: {why}" for p, why in choice.rejected))
    client.set_tag(run_id, "ada.resumed_from", choice.path.name if choice and choice.path else "")
    logger.info("resumed %s at step %d", out, state.step)
    return state
