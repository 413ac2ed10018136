"""`compare` flow: GRPO against Ada-pos and Ada-balance (and `ada-est`, the budgeted `ada-posterior` and `ada-budget`) over
seeds and data regimes, plus a matched-budget GRPO control.

Per seed, each variant trains as a `train` run (a subflow, or a run of the `train` deployment on a
worker with `children: deployments`) and an MLflow child run of one parent. The matched control,
started as soon as its seed's Ada-balance run has finished, is GRPO with `prompts_per_step = matched_grpo_prompts(mean samples per step of
that seed's Ada-balance run, n)`, so both generate about the same samples a step (DESIGN.md
section 2: per-step curves flatter the sampler that spends more). The report plots every run
against steps, samples, trained tokens, wall time and FLOPs, and gives every variant's paired
difference from `reference` (same seed, same regime) with a 95% confidence interval at equal
generated samples, trained tokens, FLOPs and measured step time; the best policy is registered.

Regimes (`regimes`): `pool` reuses a fixed pool of `pool_prompts` curated training prompts over
epochs, as the paper does; `fresh` trains on prompts that never repeat. Both hold out the same
`data.eval_size` prompts for a seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from prefect import get_run_logger

from ada_core import metrics as K
from ada_core.sampling.budget import matched_grpo_prompts
from ada_core.run.files import read_metrics
from flows import fanout, tracking
from flows.group import child_params, finish_group, group_folder, group_tags, log_group_params, run_children
from flows.params import MATCHED_LABEL, CompareParams, TrainParams
from flows.runtime import flow, set_torch_threads
from flows.train import name_flow_run, prepare_data

REFERENCE = "ada-balance"
# The GRPO presets a control may coincide with: GRPO at n = 4, 8 or 16 over the group's prompts a step.
GRPO_BY_N = {4: "grpo", 8: "grpo-n8", 16: "grpo-n16"}


def control_labels(variant: str) -> tuple[str, str]:
    """The two budget-matched GRPO controls of `variant` (CompareParams.controls): by prompts, by n."""
    return f"grpo-b.{variant}", f"grpo-n.{variant}"


def control_sizes(samples_per_step: float, prompts_per_step: int) -> tuple[int, int]:
    """(prompts a step for GRPO n = 4, n for GRPO over `prompts_per_step`) that generate about
    `samples_per_step` samples a step: 447 over 32 prompts -> (112, 14)."""
    return matched_grpo_prompts(samples_per_step, 4), max(2, matched_grpo_prompts(samples_per_step / prompts_per_step, 1))


def mean_samples_per_step(run_dir: str) -> float:
    """Mean `budget/generated_samples` over a run's training steps."""
    values = [row[K.BUDGET_GENERATED_SAMPLES] for row in read_metrics(run_dir) if K.BUDGET_GENERATED_SAMPLES in row]
    if not values:
        raise ValueError(f"{run_dir}: no {K.BUDGET_GENERATED_SAMPLES} rows to match a budget to")
    return float(np.mean(values))


REGIME_OVERRIDES = {"default": {}, "pool": None, "fresh": {"data": {"train_pool": None}}}


def regime_label(regime: str, variant: str) -> str:
    return variant if regime == "default" else f"{regime}-{variant}"


def regime_overrides(params: CompareParams, regime: str) -> dict[str, Any]:
    if regime == "pool":
        return {"data": {"train_pool": params.pool_prompts}}
    return REGIME_OVERRIDES[regime]


def check_fresh(params: CompareParams, config, train_prompts: int) -> None:
    """The fresh regime needs steps x prompts_per_step distinct training prompts, so none repeats."""
    need = config.steps * config.prompts_per_step
    if train_prompts < need:
        raise ValueError(
            f"regimes: fresh needs steps x prompts_per_step = {need} training prompts, but the data has "
            f"{train_prompts}; raise data.train_size, or lower steps or prompts_per_step"
        )


@flow(name="compare", log_prints=True)
def compare(params: CompareParams = CompareParams()) -> dict[str, Any]:
    """Train every regime x variant x seed under one MLflow parent run; report, then register the best policy."""
    # Every child's config first, so a bad value fails before any work (ConfigError names the field).
    configs = {(regime, preset, seed): params.build(preset, seed, regime_overrides(params, regime), group=True)
               for regime in params.regimes for seed in params.seeds for preset in params.variants}
    if params.matched_grpo:
        for seed in params.seeds:
            params.build("grpo", seed, group=True)
    params.check_shared_overrides(list(configs.values()))
    logger = get_run_logger()
    set_torch_threads()
    uri = tracking.resolve_tracking_uri(params.tracking_uri)
    group_dir, parent_run = group_folder(params, "compare", uri)
    group = group_dir.name
    order = sorted(params.variants, key=lambda p: p != REFERENCE)  # the reference first: the control needs it

    description = (f"compare: {', '.join(params.variants)} over seeds {params.seeds}"
                   f"{' plus a matched-budget GRPO control' if params.matched_grpo else ''}, {params.steps} steps "
                   "each; the children are the nested runs, the report is under `report/`.")
    with tracking.tracked_run(uri, params.experiment, group, tags=group_tags("compare", group),
                              run_id=parent_run, description=description) as (client, parent_id):
        name_flow_run(client.get_run(parent_id).info.run_name)  # one name in both UIs, as its children have
        logger.info("compare %s: MLflow parent run %s at %s", group, parent_id, uri)
        log_group_params(client, parent_id, params, variants=params.variants, seeds=params.seeds,
                         matched_grpo=params.matched_grpo, register_as=params.register_as, alias=params.alias,
                         regimes=params.regimes, pool_prompts=params.pool_prompts, run_dir=str(group_dir))
        first = configs[(params.regimes[0], order[0], params.seeds[0])]
        if params.curate:  # once up front; every child's curate_dataset is then a cache hit
            run_config, provenance = prepare_data(first, True, params.curation_seed)
            train_prompts = provenance["curated_prompts"] - first.data.eval_size - first.data.val_size
        else:
            train_prompts = first.data.train_size
        if "fresh" in params.regimes:
            check_fresh(params, first, train_prompts)
        children = [child_params(params, preset, seed, regime_label(regime, preset), uri, parent_id, group_dir,
                                 extra_overrides=regime_overrides(params, regime))
                    for regime in params.regimes for seed in params.seeds for preset in order]
        reference_regime = {regime_label(regime, REFERENCE): regime for regime in params.regimes}

        def control(regime: str, seed: int, prompts: int | None = None) -> TrainParams:
            return child_params(params, "grpo", seed, regime_label(regime, MATCHED_LABEL), uri, parent_id, group_dir,
                                extra_overrides=regime_overrides(params, regime), prompts_per_step=prompts)

        control_of = {regime_label(regime, v): (regime, v) for regime in params.regimes for v in params.controls}

        def budget_controls(result: dict[str, Any]) -> list[TrainParams]:
            """GRPO by prompts and by n, sized to the samples a step this seed's run of a `controls` variant drew."""
            regime, variant = control_of[result["variant"]]
            seed = result["seed"]
            samples = mean_samples_per_step(result["run_dir"])
            base = params.build(variant, seed, regime_overrides(params, regime), group=True)
            prompts, n = control_sizes(samples, base.prompts_per_step)
            by_prompts, by_n = control_labels(variant)
            client.log_param(parent_id, f"control_prompts_{result['variant']}_s{seed}", prompts)
            client.log_param(parent_id, f"control_n_{result['variant']}_s{seed}", n)
            out = []
            if prompts != base.prompts_per_step or "grpo" not in params.variants:
                out.append(child_params(params, "grpo", seed, regime_label(regime, by_prompts), uri, parent_id,
                                        group_dir, extra_overrides=regime_overrides(params, regime),
                                        prompts_per_step=prompts))
            if GRPO_BY_N.get(n) not in params.variants:
                out.append(child_params(params, "grpo", seed, regime_label(regime, by_n), uri, parent_id, group_dir,
                                        extra_overrides={**(regime_overrides(params, regime) or {}),
                                                         "sampler": {"n": n}}))
            logger.info("%s seed %s drew %.1f samples/step: controls GRPO n = 4 over %d prompts, GRPO n = %d%s",
                        result["variant"], seed, samples, prompts, n,
                        f" (the group's {GRPO_BY_N[n]} run)" if GRPO_BY_N.get(n) in params.variants else "")
            return out

        def matched_control(result: dict[str, Any]) -> list[TrainParams]:
            """GRPO sized to the samples per step that this seed's Ada-balance run drew: it starts once that run ends."""
            controls = budget_controls(result) if result["variant"] in control_of else []
            regime = reference_regime.get(result["variant"])
            if regime is None or not params.matched_grpo:
                return controls
            seed = result["seed"]
            samples = mean_samples_per_step(result["run_dir"])
            prompts = matched_grpo_prompts(samples, params.build("grpo", seed, group=True).sampler.n)
            logger.info("%s seed %s: %s drew %.1f samples/step -> %s with %d prompts/step",
                        regime, seed, REFERENCE, samples, MATCHED_LABEL, prompts)
            key = f"matched_prompts_per_step_s{seed}" if regime == "default" else \
                f"matched_prompts_per_step_{regime}_s{seed}"
            client.log_param(parent_id, key, prompts)
            return [*controls, control(regime, seed, prompts)]

        results, failures = run_children(params, children, matched_control, group, client, parent_id, uri)
        if params.matched_grpo:  # a control with no reference never ran: say so next to its reference
            for failed in [f for f in failures if f["variant"] in reference_regime]:
                missing = control(reference_regime[failed["variant"]], failed["seed"])
                failures.append(fanout.failure_record(missing, None, "NOT_RUN", f"its reference {failed['run_name']} failed"))
        labels = [regime_label(r, v) for r in params.regimes
                  for v in [*params.variants, MATCHED_LABEL, *[c for v in params.controls for c in control_labels(v)]]]
        summary = finish_group(client, parent_id, "compare", results, group_dir, params.register_as, params.alias,
                               label_order=labels, reference=params.reference, failures=failures)
    summary["tracking_uri"] = uri
    return summary
