"""What `compare` and `sweep` share: one MLflow parent run, one `train` subflow per variant x seed,
then the report and the registration of the best policy.

Each child is a `train` subflow run (its own task runs in the Prefect UI) and an MLflow child run
(`mlflow.parentRunId` = the parent). The report is written from the children's run directories,
logged on the parent under `report/`, and published as a Prefect markdown artifact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from ada_core import metrics as K
from flows import tracking
from flows.params import RunSettings, TrainParams, flatten_dotted
from flows.report import load_run, write_report
from flows.train import train


def child_params(settings: RunSettings, preset: str, seed: int, label: str, tracking_uri: str, parent_run_id: str,
                 group_dir: Path, extra_overrides: dict[str, Any] | None = None,
                 prompts_per_step: int | None = None) -> TrainParams:
    """The `train` parameters of one child: the group's settings plus this point's preset, seed and overrides."""
    shared = settings.model_dump(include=set(RunSettings.model_fields))
    shared["overrides"] = {**flatten_dotted(settings.overrides), **flatten_dotted(extra_overrides or {})}
    shared["tracking_uri"] = tracking_uri  # the parent's backend, whatever resolution would say later
    if prompts_per_step is not None:
        shared["prompts_per_step"] = prompts_per_step
    return TrainParams(
        **shared, preset=preset, seed=seed, variant=label, run_name=f"{label}-s{seed}",
        parent_run_id=parent_run_id, output_dir=str(group_dir / f"{label}-s{seed}"),
    )


def run_child(params: TrainParams) -> dict[str, Any]:
    return train.with_options(flow_run_name=params.run_name)(params)


def best_result(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The child with the highest final held-out avg@k (first wins a tie); None if none evaluated."""
    scored = [r for r in results if r.get("model_artifact") and not math.isnan(r["metrics"].get(K.EVAL_AVG_AT_K, math.nan))]
    return max(scored, key=lambda r: r["metrics"][K.EVAL_AVG_AT_K]) if scored else None


def finish_group(
    client: MlflowClient, parent_run_id: str, kind: str, results: list[dict[str, Any]], group_dir: Path,
    register_as: str, alias: str, label_order: list[str], reference: str | None = None,
) -> dict[str, Any]:
    """Report (MLflow artifacts + Prefect markdown artifact) and best-policy registration.

    `label_order` sets the order of rows and legend entries (runs then sort by seed).
    """
    logger = get_run_logger()
    results = sorted(results, key=lambda r: (label_order.index(r["variant"]), r["seed"]))
    runs = [load_run(r["run_dir"], label=r["variant"], seed=r["seed"]) for r in results]
    report = write_report(runs, group_dir / "report", title=f"{kind}: {group_dir.name}", reference=reference)
    client.log_artifacts(parent_run_id, str(report.directory), artifact_path="report")

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
        client.log_metric(parent_run_id, "best/eval_avg_at_k", best["metrics"][K.EVAL_AVG_AT_K])
        client.set_tag(parent_run_id, "ada.best_variant", best["variant"])
        logger.info("registered %s version %s (%s, seed %s) as @%s", register_as, version, best["variant"],
                    best["seed"], alias)

    links = "\n".join(f"- `{r['variant']}` seed {r['seed']}: MLflow run `{r['run_id']}`, dir `{r['run_dir']}`"
                      for r in results)
    model_line = (f"Best policy: `{registered['uri']}` (version {registered['version']}, {registered['variant']}, "
                  f"seed {registered['seed']})." if registered else "No evaluated checkpoint to register.")
    create_markdown_artifact(
        markdown=f"{report.markdown}\n\n{model_line}\n\nMLflow parent run `{parent_run_id}`; report files in "
                 f"`{report.directory}` and on the parent run under `report/`.\n\nChildren:\n{links}\n",
        key=f"{kind}-report",
        description=f"{kind} report: final metrics (mean ± std over seeds) and plots",
    )
    summary = {
        "parent_run_id": parent_run_id, "report_dir": str(report.directory), "registered": registered,
        "children": [{k: r[k] for k in ("variant", "preset", "seed", "run_id", "run_dir")} for r in results],
    }
    (group_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def log_group_params(client: MlflowClient, run_id: str, settings: RunSettings, **extra: Any) -> None:
    params = {k: v for k, v in settings.model_dump().items() if k != "overrides"}
    params["overrides"] = json.dumps(settings.overrides, sort_keys=True)
    params.update({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in extra.items()})
    tracking.log_params(client, run_id, params)
