"""`curate_dataset`: difficulty-filter a prompt pool with the model RL will start from. Cached twice.

1. Prefect's cache on the task's inputs (and source): a second call with the same inputs is a
   `Cached` task run that does no work. Its record lives in Prefect's local result storage
   ($PREFECT_HOME/storage; the demo and `make ui` put PREFECT_HOME under ADA_HOME). ADA_HOME is
   one of the inputs, so two homes never share a cache entry.
2. The curated set itself is persisted under ADA_HOME/curated/<key>/, so a fresh Prefect home (a
   worker, the demo after `make ui`) still reuses it without sampling again.

The starting model is fixed before curation, because difficulty is relative to it (DESIGN.md:
prompts the starting model solves 1-2 times in 16). With an SFT warm start, the SFT prompts are a
separate draw of the generator with every prompt of the curation pool removed, so neither the
curated training prompts nor the held-out ones were seen by SFT. Training then starts from that
exact model (`sft_steps=0`) on the curated set.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from ada_core.data import data_digest
from ada_core.paths import ada_home

CURATION_VERSION = 1  # bump when the procedure changes, so old persisted sets are not reused


def curation_key(inputs: dict[str, Any]) -> str:
    payload = json.dumps({"version": CURATION_VERSION, **inputs}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _curate_dataset(
    model: str, sft_steps: int, dataset: str, pool_size: int, k: int, ceiling: float, seed: int,
    max_tokens: int, temperature: float, positive_threshold: float, micro_batch_size: int, home: str,
    dataset_digest: str = "", keep_pass_rate: list[float] | None = None, sft: dict[str, Any] | None = None,
    shipped: bool = True,
) -> dict[str, Any]:
    """Curate (or reuse) and return {dataset, model, kept, pool, key, ...}: plain data for the cache.

    The work is one call, `ada_core.training.start.curate_for_model` (the same start-model assembly
    `setup` uses); this adds the persisted set's key and the summary that marks it complete.

    `dataset_digest` (`ada_core.data.data_digest` of `dataset`, the digest MLflow's dataset inputs
    carry) is part of both cache keys, so editing a dataset file in place curates it afresh.

    `shipped` (`sft.shipped`): where the inputs are a shipped start's recipe, curate from that start
    (`ada_core.training.shipped`); its key enters the inputs as `start`, so a set curated from the recipe on
    this machine (the key it always had) is never taken for the shipped one, nor the other way round.
    """
    from ada_core.training.start import curate_for_model
    from tasks.progress import ProgressArtifact

    inputs, start = key_inputs(model, sft_steps, dataset, pool_size, k, ceiling, seed, max_tokens, temperature,
                               positive_threshold, dataset_digest, keep_pass_rate, sft, shipped)
    key = curation_key(inputs)
    out = Path(home) / "curated" / key
    summary_file = out / "curation.json"
    if summary_file.is_file():
        return json.loads(summary_file.read_text())

    made = curate_for_model(
        model, sft_steps, dataset, pool_size, k, ceiling, seed, max_tokens, temperature, positive_threshold,
        micro_batch_size, out, sft_progress=ProgressArtifact(f"warm start (SFT) of {model}").callback(),
        progress=ProgressArtifact(f"curation of {dataset} (k={k})", "prompt").callback(), band=keep_pass_rate,
        sft=sft, shipped=start is not None,
    )
    summary = {"key": key, "dataset": str(out), **made, "inputs": inputs}
    summary_file.write_text(json.dumps(summary, indent=2) + "\n")  # last: marks the set complete
    return summary


def key_inputs(
    model: str, sft_steps: int, dataset: str, pool_size: int, k: int, ceiling: float, seed: int, max_tokens: int,
    temperature: float, positive_threshold: float, dataset_digest: str = "", keep_pass_rate: list[float] | None = None,
    sft: dict[str, Any] | None = None, shipped: bool = True, **_how: Any,
):
    """(what the curated set's key hashes, the shipped start it is curated from or None for the recipe).

    `_how` takes the inputs that change how curation runs, not what it gives (`micro_batch_size`, `home`),
    so `key_inputs(**curation_inputs(config, seed))` reads."""
    from ada_core.training.start import shipped_start_of

    inputs = dict(model=model, sft_steps=sft_steps, dataset=dataset, pool_size=pool_size, k=k, ceiling=ceiling,
                  seed=seed, max_tokens=max_tokens, temperature=temperature, positive_threshold=positive_threshold,
                  dataset_digest=dataset_digest)
    if keep_pass_rate is not None:  # only then: the sets curated by the ceiling rule keep their keys
        inputs["keep_pass_rate"] = list(keep_pass_rate)
    settings = {name: value for name, value in (sft or {}).items() if name != "shipped"}  # it picks, not makes
    if settings:  # only a warm start other than SftConfig's defaults: the sets curated before `sft` keep their keys
        inputs["sft"] = settings
    start = shipped_start_of(model, sft_steps, dataset, pool_size, seed, k, max_tokens, temperature,
                             positive_threshold, sft) if shipped else None
    if start is not None:  # only then: the sets curated from the recipe keep their keys
        inputs["start"] = start.key
    return inputs, start


curate_dataset = task(
    _curate_dataset,
    name="curate_dataset",
    task_run_name="curate-{dataset}-k{k}",
    cache_policy=INPUTS + TASK_SOURCE,
    persist_result=True,
    retries=1,
    retry_delay_seconds=2,
)


def curation_inputs(config, seed: int) -> dict[str, Any]:
    """`curate_dataset`'s inputs for a TrainConfig: its model, SFT, data and rollout settings."""
    return dict(
        model=config.model,
        sft_steps=config.sft_steps,
        dataset=config.data.dataset,
        pool_size=config.data.train_size + config.data.eval_size + config.data.val_size,
        k=config.data.curation_k,
        ceiling=config.data.pass_rate_ceiling,
        seed=seed,
        max_tokens=config.rollout.max_tokens,
        temperature=config.rollout.temperature,
        positive_threshold=config.sampler.positive_threshold,
        micro_batch_size=config.rollout.micro_batch_size,
        home=str(ada_home()),
        dataset_digest=data_digest(config.data.dataset),
        keep_pass_rate=config.data.keep_pass_rate,
        sft=sft_changes(config),
        shipped=config.sft.shipped,
    )


def sft_changes(config) -> dict[str, Any] | None:
    """The config's `sft` fields that differ from SftConfig's defaults (None when none do, or with no warm start).
    `sft.shipped` is not one: it picks a start rather than making one (`curation_inputs` passes it apart)."""
    from ada_core.config.schema import SftConfig

    if config.sft_steps == 0:
        return None
    default = SftConfig().model_dump()
    changed = {k: v for k, v in config.sft.model_dump().items() if v != default[k] and k != "shipped"}
    return changed or None


def curate_for(config, seed: int) -> dict[str, Any]:
    """Curate (or reuse) the prompt set for a TrainConfig."""
    return curate_dataset(**curation_inputs(config, seed))


def training_config(config, curated: dict[str, Any]):
    """The config training actually runs: the curated set, from the model that curated it, no second SFT."""
    train_prompts = curated["kept"] - config.data.eval_size - config.data.val_size
    if train_prompts < config.prompts_per_step:
        from ada_core.errors import DatasetError

        raise DatasetError(
            f"curation kept {curated['kept']} of {curated['pool']} prompts: after data.eval_size={config.data.eval_size} "
            f"and data.val_size={config.data.val_size} held out, {max(train_prompts, 0)} remain for prompts_per_step={config.prompts_per_step}; raise "
            "data.train_size, data.pass_rate_ceiling or data.keep_pass_rate, or lower data.eval_size or "
            "prompts_per_step"
        )
    from ada_core.config import deep_merge, validate_config

    from ada_core.config.schema import SftConfig

    settings = deep_merge(config.model_dump(), {
        "model": curated["model"], "sft_steps": 0, "data": {"dataset": curated["dataset"]},
    })
    settings["sft"] = SftConfig().model_dump()  # warm-started already: no second SFT, so no SFT settings
    return validate_config(settings)
