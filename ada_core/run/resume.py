"""A resume is the same run: its config is the run's own `config.yaml`, and only a short list may change.

`ada train --resume R` and the train flow's `resume` take the config R was written with. What the
caller gives besides (flags, `--set`, a config file, flow fields) is laid over it, and every field
that then differs must be one of `RESUMABLE`: how long the run goes on, how often it evaluates and
checkpoints, what it keeps, and where its servers, cluster and timeouts are. Anything else (the
algorithm, the data, the model, the seed, the ranks, the precision) would make the rest of the
run another experiment in the same `metrics.jsonl`, ledger and MLflow run, so it is refused before
anything is written, with every difference named (`sampler.name: ada -> fixed`). A hub id given as
the run was started (`org/name`, or a branch or tag) names what the run pinned (`org/name@<commit>`
in its config.yaml) and is no change: the run goes on at that commit (`keep_pins`).

`check_resumable` is the one check; `setup` runs it on every resume, the entry points run it
first so the refusal names the user's own flags before any model or data is read.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from ada_core.config import TrainConfig, deep_merge, flat_params, validate_config
from ada_core.config.applies import lookup
from ada_core.config.schema import data_seed
from ada_core.data.hub import names_pin
from ada_core.errors import ConfigError, ResumeError
from ada_core.run import files
from ada_core.run.checkpoints import latest_checkpoint

# Fields a resume may change: none of them changes what a step computes.
RESUMABLE: dict[str, str] = {
    "steps": "run longer (or stop sooner)",
    "eval_every": "evaluation cadence",
    "checkpoint_every": "checkpoint cadence",
    "checkpoint.keep_last": "checkpoints kept on disk",
    "rollout.vllm.base_url": "where the server is (a restarted one)",
    "rollout.vllm.base_urls": "where the servers are",
    "rollout.vllm.port": "the port of a launched server",
    "rollout.vllm.startup_timeout_s": "a timeout",
    "rollout.vllm.request_timeout_s": "a timeout",
    "rollout.vllm.sync_dir": "where the weight sync writes its files",
    "distributed.ray_address": "which Ray cluster runs the ranks",
    "distributed.placement_strategy": "how the ranks are spread over the cluster's nodes (a lost node)",
    "distributed.startup_timeout_s": "a timeout",
    "verifier.step_budget_s": "a timeout: how long a step's answer checking may take",
}

# Fields a run records as hub ids pinned to a commit: given unpinned on a resume, they name the same thing.
PINNED = ("model", "data.dataset")

# Why a field that often differs by accident cannot: added to the refusal.
WHY: dict[str, str] = {
    "distributed.num_ranks": "the optimizer state was saved by that many ranks; where a node is gone, resume "
                             "with them on the nodes left (distributed.placement_strategy=PACK) or add a node",
    "optim.zero_stage": "the optimizer state is laid out for that ZeRO stage",
    "optim.precision": "the weights and optimizer state were saved in that precision",
    "data.train_size": "the prompt cursor and the held-out split depend on the dataset size",
    "data.eval_size": "the held-out split depends on it",
    "data.train_pool": "the prompt cursor walks that pool",
    "seed": "the seed draws every sample (and the data, where data.seed is null)",
    "data.seed": "it draws the dataset, its split and the SFT warm start",
    "data.val_size": "the validation split is drawn from the training prompts",
    "preset": "the preset is the algorithm",
}


def read_saved_config(run_dir: str | Path) -> TrainConfig:
    """The config `run_dir` was written with (its `config.yaml`), validated."""
    path = Path(run_dir) / files.CONFIG
    if not path.is_file():
        raise ResumeError(f"resume {run_dir}: no {files.CONFIG} there, so it is not a run folder to resume")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise ResumeError(f"resume {run_dir}: {path} cannot be read ({err})") from None
    try:
        return validate_config(data if isinstance(data, dict) else {})
    except ConfigError as err:
        raise ResumeError(f"resume {run_dir}: its {files.CONFIG} no longer validates: {err}") from None


def differences(saved: TrainConfig, asked: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """Dotted field -> (saved value, asked value) for every leaf that differs."""
    before, after = flat_params(saved), flat_params(asked)
    for flat, config in ((before, saved), (after, asked)):  # None draws with the run's seed: compare what draws
        flat["data.seed"] = data_seed(config)
    return {key: (before.get(key), after.get(key)) for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)}


def check_resumable(saved: TrainConfig, asked: TrainConfig, run_dir: str | Path) -> dict[str, tuple[Any, Any]]:
    """Raise `ResumeError` listing every difference outside `RESUMABLE`; return the allowed ones."""
    diff = differences(saved, asked)
    refused = {k: v for k, v in diff.items() if k not in RESUMABLE}
    if refused:
        lines = "; ".join(f"{key}: {_show(old)} -> {_show(new)}" + (f" ({WHY[key]})" if key in WHY else "")
                          for key, (old, new) in refused.items())
        raise ResumeError(
            f"resume {run_dir}: would change what the run is: {lines}. A resume continues the run with its own "
            f"config ({Path(run_dir) / files.CONFIG}); only {', '.join(RESUMABLE)} may change. Give no other "
            "value, or start a new run in another folder."
        )
    return diff


def resumed_config(run_dir: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """The run's own config with `overrides` (nested, as `build_config` takes them) laid over it;
    `ResumeError` if that changes a field outside `RESUMABLE`, `ConfigError` if it is invalid."""
    saved = read_saved_config(run_dir)
    overrides = keep_pins(saved, overrides or {})
    asked = validate_config(deep_merge(saved.model_dump(), overrides)) if overrides else saved
    check_resumable(saved, asked, run_dir)
    return asked


def keep_pins(saved: TrainConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with each hub id in `PINNED` that names what the run pinned replaced by the run's pin.

    A run records its hub ids pinned (`org/name@<commit>`, ada_core/data/prompts.py `pin_hub_ids`);
    the request that resumes it names them as the run was started (`org/name`, a branch or tag: a
    Prefect retry, a group's child, the same command again). That is the same model and data: the run
    continues at the commits it pinned, whatever the branch names now. Another repo or commit is a change."""
    out = copy.deepcopy(overrides)
    for dotted in PINNED:
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        pinned = lookup(saved, dotted)
        if isinstance(node, dict) and isinstance(node.get(leaf), str) and names_pin(node[leaf], pinned):
            node[leaf] = pinned
    return out


def check_resume_target(run_dir: str | Path) -> None:
    """Refuse `--resume run_dir` when there is nothing to resume, saying what works instead.

    Reads only names and markers; the checkpoint's files are hashed later, by `setup`."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ResumeError(f"resume {run_dir}: no such folder")
    if not run_dir.is_dir():
        raise ResumeError(f"resume {run_dir}: a file, not a run folder")
    if latest_checkpoint(run_dir) is None:
        steps = [row["step"] for row in files.read_jsonl(run_dir / files.METRICS) if "step" in row]
        where = f" (its metrics reach step {max(steps)})" if steps else ""
        if not (run_dir / files.CONFIG).is_file() and not steps:
            raise ResumeError(f"resume {run_dir}: not a run folder (no {files.CONFIG}, no checkpoint)")
        raise ResumeError(
            f"resume {run_dir}: no complete checkpoint under {run_dir / files.CHECKPOINTS}: the run stopped "
            f"before its first one{where}, so there is nothing to resume. Run it again from the start into the "
            f"same folder (`ada train --output-dir {run_dir}` with its options; the leftovers are moved aside to "
            f"{run_dir.name}.replaced-<time>)."
        )


def checkpoint_source(checkpoint: Path) -> dict[str, Any]:
    """The prompt cursor a checkpoint saved (`PromptSource.state_dict`)."""
    return json.loads((checkpoint / "trainer_state.json").read_text()).get("source") or {}


def _show(value: Any) -> str:
    return "null" if value is None else str(value)
