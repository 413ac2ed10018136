"""What `compare` and `sweep` share: one MLflow parent run, one `train` run per variant x seed,
then the report and the registration of the best policy.

Each child is a `train` flow run (its own task runs in the Prefect UI, a sub-run of the parent) and
an MLflow child run (`mlflow.parentRunId` = the parent). `children: inline` runs them as subflows in
this process, one after another; `children: deployments` submits them all to the `train` deployment
(flows/fanout.py). The report is written from the children's run directories, logged on the parent
under `report/`, and published as a Prefect markdown artifact.

A child that fails does not sink the group: the others run, and the report, the artifact and the
summary name it with a link to its flow run. The parent ends Failed only when no child succeeded.
A matched control whose reference failed is reported as not run.

A group with `resume` reopens its folder and parent run; each child is then planned by
`plan_child`, in either mode: a child that finished (its result.json) is skipped, one that started
resumes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from ada_core import metrics as K
from ada_core.paths import runs_dir
from ada_core.run.files import CONFIG, read_result
from flows import fanout, tracking
from flows import resume as resuming
from flows.params import GROUP_DATA_SEED, GroupSettings, RunSettings, TrainParams, flatten_dotted
from flows.runtime import run_stamp
from flows.tracking import links
from flows.train import resume_config, train
from report import load_run, summary_rows, write_report

FINAL_METRICS_TABLE = "report/final_metrics.json"  # the parent run's MLflow table artifact
STUDY_SEPARATOR = " @ "  # child run names: `<variant>-s<seed> @ <group>`


def child_run_name(group: str, label: str, seed: int) -> str:
    """`grpo-s0 @ compare-20261130-142501-3fa2`: the child's MLflow run name and Prefect flow run name.

    What tells children apart comes first: MLflow's runs list cuts names at about 14 characters, and
    every child of one group shares the group's name (its MLflow parent, its `ada.study` tag)."""
    return f"{label}-s{seed}{STUDY_SEPARATOR}{group}"


def child_params(settings: RunSettings, preset: str, seed: int, label: str, tracking_uri: str, parent_run_id: str,
                 group_dir: Path, extra_overrides: dict[str, Any] | None = None,
                 prompts_per_step: int | None = None) -> TrainParams:
    """The `train` parameters of one child: the group's settings plus this point's preset, seed and overrides."""
    shared = settings.model_dump(include=set(RunSettings.model_fields))
    own = settings.shared_overrides_for(settings.build(preset, seed, extra_overrides, group=True))
    shared["overrides"] = {"data.seed": GROUP_DATA_SEED, **own, **flatten_dotted(extra_overrides or {})}
    shared["tracking_uri"] = tracking_uri  # the parent's backend, whatever resolution would say later
    if prompts_per_step is not None:
        shared["prompts_per_step"] = prompts_per_step
    return TrainParams(
        **shared, preset=preset, seed=seed, variant=label, run_name=child_run_name(group_dir.name, label, seed),
        parent_run_id=parent_run_id, output_dir=str(group_dir / f"{label}-s{seed}"),
    )


def run_inline(children: list[TrainParams], follow_up: fanout.FollowUp) -> tuple[list[dict], list[dict]]:
    """Each child as a `train` subflow, in order; a child's follow-ups run right after it."""
    results, failures, queue = [], [], list(children)
    while queue:
        child, done = plan_child(queue.pop(0))
        if done is not None:
            results.append(done)
            queue[0:0] = follow_up(done)
            continue
        state = train.with_options(flow_run_name=child.run_name)(child, return_state=True)
        flow_run_id = state.state_details.flow_run_id
        if state.is_completed():
            results.append({**state.result(), "flow_run_id": str(flow_run_id)})
            queue[0:0] = follow_up(results[-1])
        else:
            get_run_logger().warning("%s ended %s: %s", child.run_name, state.type.value, state.message)
            failures.append(fanout.failure_record(child, flow_run_id, state.type.value, state.message or ""))
    return results, failures


def run_children(
    params: GroupSettings, children: list[TrainParams], follow_up: fanout.FollowUp, group: str,
    client: tracking.MlflowClient, parent_run_id: str, tracking_uri: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run the group's children the way `params.children` says; (results, failures).

    `follow_up(result)` returns children that may start only once that one has finished (the
    matched GRPO control after its seed's Ada-balance run).
    """
    check_resumes(children)  # before any child runs: a resumed group continues every started child as it was
    if params.children == "inline":
        return run_inline(children, follow_up)
    if tracking_uri.startswith("sqlite:"):
        get_run_logger().warning("children on workers all write the SQLite store %s; the `make ui` MLflow server "
                                 "or PostgreSQL takes concurrent writers better", tracking_uri)
    experiment_id = tracking.experiment_of(client, parent_run_id)
    return fanout.run_deployments(children, follow_up, params, group, client, experiment_id, tracking_uri, plan_child)


def check_resumes(children: list[TrainParams]) -> None:
    """Every started, unfinished child of a resumed group resumes with its own config: a group value
    that would change one (ada_core/run/resume.py) is refused, naming the child, before any child runs."""
    for child in children:
        out = Path(child.output_dir)
        if read_result(out) is None and (out / CONFIG).is_file():
            resume_config(child, out)


def plan_child(params: TrainParams) -> tuple[TrainParams, dict[str, Any] | None]:
    """A child of a resumed group: finished -> (params, its result), not rerun; started (its folder
    exists) -> params with `resume` set to that folder; else unchanged params to run from scratch."""
    out = Path(params.output_dir)
    done = read_result(out)
    if done is not None:
        get_run_logger().info("%s finished in an earlier attempt: skipped", params.run_name)
        return params, done
    if out.is_dir():
        return params.model_copy(update={"resume": str(out)}), None
    return params, None


def group_tags(kind: str, group: str) -> dict[str, str]:
    """The parent run's tags: its flow, its study (`ada.study`, which every child gets too), and the
    process and Prefect flow run that own it (flows/tracking/runs.py)."""
    from prefect.runtime import flow_run

    return {"ada.flow": kind, tracking.STUDY: group, tracking.FLOW_RUN: str(flow_run.get_id() or ""),
            **tracking.process_tags()}


def group_folder(settings: RunSettings, kind: str, uri: str) -> tuple[Path, str | None]:
    """(group folder, parent MLflow run to reopen): a new folder and None, or those of `settings.resume`,
    whose dead parent run is marked KILLED first."""
    resume = getattr(settings, "resume", None)
    if not resume:
        return runs_dir() / f"{kind}-{run_stamp()}", None
    target = resuming.resume_target(uri, settings.experiment, resume)
    return target.run_dir, target.run_id


def selection_key(results: list[dict[str, Any]]) -> str:
    """What picks the best child: final validation avg@k when every evaluated child has one (`data.val_size`), so
    the policy is not picked on the held-out set it is reported on; final held-out avg@k otherwise."""
    scored = [r for r in results if r.get("model_artifact") and K.EVAL_AVG_AT_K in r["metrics"]]
    return K.VAL_AVG_AT_K if scored and all(K.VAL_AVG_AT_K in r["metrics"] for r in scored) else K.EVAL_AVG_AT_K


def best_result(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The child with the highest `selection_key` score (first wins a tie); None if none evaluated."""
    key = selection_key(results)
    scored = [r for r in results if r.get("model_artifact") and not math.isnan(r["metrics"].get(key, math.nan))]
    return max(scored, key=lambda r: r["metrics"][key]) if scored else None


def failures_markdown(failures: list[dict[str, Any]]) -> str:
    """The report's section on children that did not finish; empty when none failed."""
    if not failures:
        return ""
    lines = [f"## Failed children ({len(failures)})", ""]
    for f in failures:
        where = f"[flow run {f['flow_run_id']}]({f['flow_run_url']})" if f.get("flow_run_url") else (
            f"flow run `{f['flow_run_id']}`" if f.get("flow_run_id") else "no flow run")
        message = " ".join(str(f["message"]).split())[:300]
        lines.append(f"- `{f['variant']}` seed {f['seed']}: **{f['state']}**, {where}: {message}")
    return "\n".join(lines) + "\n"


def finish_group(
    client: tracking.MlflowClient, parent_run_id: str, kind: str, results: list[dict[str, Any]], group_dir: Path,
    register_as: str, alias: str, label_order: list[str], reference: str | None = None,
    failures: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Report (MLflow artifacts + Prefect markdown artifact) and best-policy registration.

    `label_order` sets the order of rows and legend entries (runs then sort by seed). `failures`
    (from `run_children`) are named in the report; with no result at all, the artifact lists them
    and this raises, so the parent's flow run and MLflow run end Failed.
    """
    logger = get_run_logger()
    failures = failures or []
    failed = failures_markdown(failures)
    if failures:
        client.set_tag(parent_run_id, "ada.failed_children", str(len(failures)))
    if not results:
        create_markdown_artifact(markdown=f"# {kind}: {group_dir.name}\n\nNo child finished.\n\n{failed}",
                                 key=f"{kind}-report", description=f"{kind} report: every child failed")
        raise RuntimeError(f"{kind} {group_dir.name}: no child succeeded; " + "; ".join(
            f"{f['variant']}-s{f['seed']} {f['state']} (flow run {f['flow_run_id']}): {f['message']}" for f in failures))
    results = sorted(results, key=lambda r: (label_order.index(r["variant"]), r["seed"]))
    runs = [load_run(r["run_dir"], label=r["variant"], seed=r["seed"]) for r in results]
    report = write_report(runs, group_dir / "report", title=f"{kind}: {group_dir.name}", reference=reference)
    if failed:  # the report itself names what is missing from its table
        report_md = report.directory / "report.md"
        report_md.write_text(f"{report_md.read_text().rstrip()}\n\n{failed}")
    client.log_artifacts(parent_run_id, str(report.directory), artifact_path="report")
    rows = summary_rows(runs)  # the same table, sortable in MLflow (the run's Artifacts tab)
    client.log_table(parent_run_id, {col: [row[col] for row in rows] for col in rows[0]}, FINAL_METRICS_TABLE)

    best = best_result(results)
    registered = None
    if best is not None:
        version = tracking.register_policy(
            client, best["run_id"], best["model_artifact"], name=register_as, alias=alias,
            tags={"variant": best["variant"], "preset": best["preset"], "seed": best["seed"],
                  "eval_avg_at_k": best["metrics"][K.EVAL_AVG_AT_K], f"{kind}_run_id": parent_run_id},
        )
        registered = {"name": register_as, "version": version, "alias": alias, "variant": best["variant"],
                      "seed": best["seed"], "uri": f"models:/{register_as}@{alias}"}
        client.log_metric(parent_run_id, K.BEST_EVAL_AVG_AT_K, best["metrics"][K.EVAL_AVG_AT_K])
        client.set_tag(parent_run_id, "ada.best_variant", best["variant"])
        client.set_tag(parent_run_id, "ada.best_selected_on", selection_key(results))
        logger.info("registered %s version %s (%s, seed %s) as @%s", register_as, version, best["variant"],
                    best["seed"], alias)

    uri = client.tracking_uri
    experiment_id = tracking.experiment_of(client, parent_run_id)
    children = "\n".join(_child_line(client, uri, experiment_id, r) for r in results)
    model_line = (f"Best policy: `{registered['uri']}` (version {registered['version']}, {registered['variant']}, "
                  f"seed {registered['seed']})." if registered else "No evaluated checkpoint to register.")
    parent = links.markdown_link(parent_run_id, links.mlflow_run_url(uri, experiment_id, parent_run_id))
    plots = report.plots_markdown(lambda name: links.mlflow_artifact_url(uri, parent_run_id, f"report/{name}"),
                                  lambda name: links.mlflow_artifact_page_url(uri, experiment_id, parent_run_id, f"report/{name}"))
    create_markdown_artifact(
        markdown=f"{report.summary}\n\n{model_line}\n\nMLflow parent run {parent}, report files in "
                 f"`{report.directory}` and on the parent run under `report/`.\n\n## Children\n\n{children}\n\n"
                 f"## Plots\n\n{plots}\n\n{failed}",
        key=f"{kind}-report",
        description=f"{kind} report: final metrics (mean ± std over seeds) and plots",
    )
    summary = {
        "parent_run_id": parent_run_id, "report_dir": str(report.directory), "registered": registered,
        "children": [{k: r.get(k) for k in ("variant", "preset", "seed", "run_id", "run_dir", "flow_run_id")}
                     for r in results],
        "failures": failures,
    }
    (group_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _child_line(client: tracking.MlflowClient, uri: str, experiment_id: str, result: dict[str, Any]) -> str:
    """`- variant seed s: MLflow run <link> (<id>), <Prefect flow run link>, dir <path>` for the report."""
    run = client.get_run(result["run_id"])
    mlflow_link = links.markdown_link(run.info.run_name, links.mlflow_run_url(uri, experiment_id, result["run_id"]))
    prefect_url = run.data.tags.get(links.PREFECT_RUN_URL_TAG)
    prefect = f", {links.markdown_link('Prefect flow run', prefect_url)}" if prefect_url else ""
    return (f"- `{result['variant']}` seed {result['seed']}: MLflow run {mlflow_link} (`{result['run_id']}`){prefect}, "
            f"dir `{result['run_dir']}`")


def log_group_params(client: tracking.MlflowClient, run_id: str, settings: RunSettings, **extra: Any) -> None:
    params = {k: v for k, v in settings.model_dump().items() if k not in ("overrides", "resume")}
    params["overrides"] = json.dumps(settings.overrides, sort_keys=True)
    params.update({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in extra.items()})
    tracking.log_params(client, run_id, params)
