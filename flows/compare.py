"""`compare` flow: GRPO against Ada-pos and Ada-balance over seeds, plus a matched-budget GRPO control.

Per seed, each variant trains as a `train` run (a subflow, or a run of the `train` deployment on a
worker with `children: deployments`) and an MLflow child run of one parent. The matched control,
started as soon as its seed's Ada-balance run has finished, is GRPO with `prompts_per_step = matched_grpo_prompts(mean samples per step of
that seed's Ada-balance run, n)`, so both generate about the same samples a step (DESIGN.md
section 2: per-step curves flatter the sampler that spends more). The report plots every run
against steps, samples, trained tokens, wall time and FLOPs; the best policy is registered.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from prefect import flow, get_run_logger

from ada_core import metrics as K
from ada_core.budget import matched_grpo_prompts
from ada_core.trainer import read_metrics
from flows import fanout, tracking
from flows.group import child_params, finish_group, group_folder, group_tags, log_group_params, run_children
from flows.params import CompareParams, TrainParams
from flows.runtime import set_torch_threads
from flows.train import prepare_data

MATCHED_LABEL = "grpo-matched"
REFERENCE = "ada-balance"


def mean_samples_per_step(run_dir: str) -> float:
    """Mean `budget/generated_samples` over a run's training steps."""
    values = [row[K.BUDGET_GENERATED_SAMPLES] for row in read_metrics(run_dir) if K.BUDGET_GENERATED_SAMPLES in row]
    if not values:
        raise ValueError(f"{run_dir}: no {K.BUDGET_GENERATED_SAMPLES} rows to match a budget to")
    return float(np.mean(values))


@flow(name="compare", log_prints=True)
def compare(params: CompareParams = CompareParams()) -> dict[str, Any]:
    """Train every variant x seed under one MLflow parent run; report, then register the best policy."""
    # Every child's config first, so a bad value fails before any work (ConfigError names the field).
    configs = {(preset, seed): params.build(preset, seed) for seed in params.seeds for preset in params.variants}
    if params.matched_grpo:
        for seed in params.seeds:
            params.build("grpo", seed)
    logger = get_run_logger()
    set_torch_threads()
    uri = tracking.resolve_tracking_uri(params.tracking_uri)
    group_dir, parent_run = group_folder(params, "compare", uri)
    group = group_dir.name
    order = sorted(params.variants, key=lambda p: p != REFERENCE)  # the reference first: the control needs it

    with tracking.tracked_run(uri, params.experiment, group, tags=group_tags("compare"),
                             run_id=parent_run) as (client, parent_id):
        logger.info("compare %s: MLflow parent run %s at %s", group, parent_id, uri)
        log_group_params(client, parent_id, params, variants=params.variants, seeds=params.seeds,
                         matched_grpo=params.matched_grpo, register_as=params.register_as, alias=params.alias,
                         run_dir=str(group_dir))
        if params.curate:  # once up front; every child's curate_dataset is then a cache hit
            prepare_data(configs[(order[0], params.seeds[0])], True, params.curation_seed)
        children = [child_params(params, preset, seed, preset, uri, parent_id, group_dir)
                    for seed in params.seeds for preset in order]

        def matched_control(result: dict[str, Any]) -> list[TrainParams]:
            """GRPO sized to the samples per step that this seed's Ada-balance run drew: it starts once that run ends."""
            if result["variant"] != REFERENCE or not params.matched_grpo:
                return []
            seed = result["seed"]
            samples = mean_samples_per_step(result["run_dir"])
            prompts = matched_grpo_prompts(samples, params.build("grpo", seed).sampler.n)
            logger.info("seed %s: %s drew %.1f samples/step -> %s with %d prompts/step",
                        seed, REFERENCE, samples, MATCHED_LABEL, prompts)
            client.log_param(parent_id, f"matched_prompts_per_step_s{seed}", prompts)
            return [child_params(params, "grpo", seed, MATCHED_LABEL, uri, parent_id, group_dir, prompts_per_step=prompts)]

        results, failures = run_children(params, children, matched_control, group, client, parent_id, uri)
        if params.matched_grpo:  # a control with no reference never ran: say so next to its reference
            for failed in [f for f in failures if f["variant"] == REFERENCE]:
                control = child_params(params, "grpo", failed["seed"], MATCHED_LABEL, uri, parent_id, group_dir)
                failures.append(fanout.failure_record(control, None, "NOT_RUN", f"its reference {failed['run_name']} failed"))
        summary = finish_group(client, parent_id, "compare", results, group_dir, params.register_as, params.alias,
                               label_order=[*params.variants, MATCHED_LABEL], failures=failures)
    summary["tracking_uri"] = uri
    return summary
