"""The model a run starts from, and the prompt set curated for it: one assembly for training and curation.

`start_model` resolves the named model, warm-starts it with SFT on a separate draw of the dataset
(every prompt in `seen` removed, `warm_start_prompts`) and loads it. `setup` calls it for a fresh
run; `curate_for_model` calls it so curation scores prompts with the very model RL starts from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ada_core.data import load_prompts, warm_start_prompts
from ada_core.models import encode_prompts, load_policy, resolve_model, sft_warm_start, weights_sha256
from ada_core.records import Prompt

Progress = Callable[[int, int], None]


def start_model(model: str, sft_steps: int, dataset: str, seen: list[Prompt], seed: int,
                progress: Progress | None = None, sft: dict[str, Any] | None = None) -> tuple[Path, Any, Any]:
    """(model folder, policy, tokenizer) a run starts from: `model` resolved, then `sft_steps` of SFT
    warm start on prompts of `dataset` outside `seen` (the RL and eval prompts) when above 0, drawn and
    ordered by `seed` (the data seed: every seed of a comparison starts from the same model). `sft` is
    the config's `sft` section as a dict (SftConfig's defaults when None)."""
    from ada_core.config.schema import SftConfig

    model_dir = resolve_model(model)
    if sft_steps > 0:
        opts = SftConfig(**(sft or {}))
        prompts = warm_start_prompts(dataset, seen, seed, size=opts.prompts, carry_slip=opts.carry_slip)
        model_dir = sft_warm_start(model_dir, prompts, steps=sft_steps, batch_size=opts.batch_size, lr=opts.lr,
                                   seed=seed, progress=progress)
    policy, tokenizer = load_policy(model_dir)
    return model_dir, policy, tokenizer


def curate_for_model(
    model: str, sft_steps: int, dataset: str, pool_size: int, k: int, ceiling: float, seed: int, max_tokens: int,
    temperature: float, positive_threshold: float, micro_batch_size: int, out_dir: str | Path,
    sft_progress: Progress | None = None, progress: Progress | None = None, band: list[float] | None = None,
    sft: dict[str, Any] | None = None, shipped: bool = True,
) -> dict[str, Any]:
    """Draw a pool of `pool_size` prompts, difficulty-filter it with the start model (`start_model` on the
    pool) and save the curated set to `out_dir`; returns {model, model_sha256, pool, kept, dropped, start}
    for its summary.

    With `shipped` (the config's `sft.shipped`) and inputs that are a shipped start's recipe
    (`shipped_start_of`), the start is that one (copied into ADA_HOME/cache/sft/) and its shipped rates
    replace the sampling: no SFT, no scoring, the same start and prompts on every CPU. `start` in the
    result says which: `recipe` or the shipped start's key.
    `sft_progress` and `progress` are `progress(done, total)` callbacks for the warm start and the scoring.
    """
    from ada_core.data import curation, prompts_digest
    from ada_core.protocols import SamplingParams
    from ada_core.rl.rewards import MathVerifier

    pool = load_prompts(dataset, size=pool_size, seed=seed)
    sampling = SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=seed)
    shipped_start = shipped_start_of(model, sft_steps, dataset, pool_size, seed, k, max_tokens, temperature,
                                     positive_threshold, sft) if shipped else None
    if shipped_start is not None:
        shipped_start.check_pool(prompts_digest(pool))
        model_dir = shipped_start.install()
        with MathVerifier() as verifier:
            result = curation.curate(pool, None, verifier, sampling, k=k, ceiling=ceiling, seed=seed,
                                     positive_threshold=positive_threshold, band=band, rates=shipped_start.rates(),
                                     rates_from=shipped_start.describe())
    else:
        from ada_core.engines.transformers_engine import TransformersRolloutEngine

        model_dir, policy, tokenizer = start_model(model, sft_steps, dataset, pool, seed, progress=sft_progress,
                                                   sft=sft)
        encode_prompts(tokenizer, pool)
        engine = TransformersRolloutEngine(policy, tokenizer, micro_batch_size=micro_batch_size)
        with MathVerifier() as verifier:
            result = curation.curate(pool, engine, verifier, sampling, k=k, ceiling=ceiling, seed=seed,
                                     positive_threshold=positive_threshold, progress=progress, band=band)
    curation.save_curated(result, out_dir)
    return {
        "model": str(model_dir),
        "model_sha256": weights_sha256(model_dir),
        "pool": len(pool),
        "kept": result.report["kept"],
        "dropped": {f"{stage['stage']}/{reason}": info["count"]
                    for stage in result.report["stages"] for reason, info in stage["dropped"].items()},
        "start": shipped_start.key if shipped_start is not None else "recipe",
    }


def shipped_start_of(model: str, sft_steps: int, dataset: str, pool_size: int, seed: int, k: int, max_tokens: int,
                     temperature: float, positive_threshold: float, sft: dict[str, Any] | None = None):
    """The shipped start (`training.shipped.ShippedStart`) whose recipe these curation inputs are, or None:
    a warm start (sft_steps > 0) of a built-in model on a generator, with every input the manifest's."""
    from ada_core.training.shipped import recipe, shipped_start_for

    if sft_steps == 0 or Path(model).expanduser().exists():  # a local folder named like a built-in model is not it
        return None
    return shipped_start_for(recipe(model, sft_steps, dataset, pool_size, seed, k, max_tokens, temperature,
                                    positive_threshold, sft))
