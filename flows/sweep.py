"""`sweep` flow: a grid over N, M, n, variant and seed under one MLflow parent run.

Fixed-size samplers (grpo, dapo) have no rounds, so they vary only n. prefect.yaml schedules it
weekly with `children: deployments`, so the grid spreads over the workers; from Python:

    sweep(SweepParams(variants=["ada-balance", "grpo"], N=[2, 4], M=[4], n=[4], seeds=[0, 1], steps=20))
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from flows import tracking
from flows.group import child_params, finish_group, group_folder, group_tags, log_group_params, run_children
from flows.params import SweepParams
from flows.runtime import flow, set_torch_threads
from flows.train import name_flow_run, prepare_data


@flow(name="sweep", log_prints=True)
def sweep(params: SweepParams = SweepParams()) -> dict[str, Any]:
    """Train every grid point x seed as a child run; report and register the best policy."""
    grid = params.grid()
    configs = [params.build(preset, seed, extra, group=True) for preset, _, extra in grid for seed in params.seeds]
    params.check_shared_overrides(configs)  # fail fast
    logger = get_run_logger()
    set_torch_threads()
    uri = tracking.resolve_tracking_uri(params.tracking_uri)
    group_dir, parent_run = group_folder(params, "sweep", uri)
    group = group_dir.name

    description = (f"sweep: {len(grid)} points x {len(params.seeds)} seeds over N={params.N}, M={params.M}, "
                   f"n={params.n}; the children are the nested runs, the report is under `report/`.")
    with tracking.tracked_run(uri, params.experiment, group, tags=group_tags("sweep", group),
                              run_id=parent_run, description=description) as (client, parent_id):
        name_flow_run(client.get_run(parent_id).info.run_name)  # one name in both UIs, as its children have
        logger.info("sweep %s: %d points x %d seeds; MLflow parent run %s", group, len(grid), len(params.seeds),
                    parent_id)
        log_group_params(client, parent_id, params, variants=params.variants, N=params.N, M=params.M, n=params.n,
                         seeds=params.seeds, grid=[label for _, label, _ in grid], run_dir=str(group_dir))
        if params.curate:
            prepare_data(configs[0], True, params.curation_seed)
        children = [child_params(params, preset, seed, label, uri, parent_id, group_dir, extra_overrides=extra)
                    for seed in params.seeds for preset, label, extra in grid]
        results, failures = run_children(params, children, lambda result: [], group, client, parent_id, uri)
        summary = finish_group(client, parent_id, "sweep", results, group_dir, params.register_as, params.alias,
                               label_order=[label for _, label, _ in grid], failures=failures)
    summary["tracking_uri"] = uri
    return summary
