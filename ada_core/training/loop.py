"""The training loop, built from step functions the platform wraps as Prefect tasks.

One step: prompts -> sampler (engine + verifier) -> advantages -> update -> weight sync. Every E
steps it evaluates, every C steps it checkpoints. With `rollout.async_steps > 0` the batches are drawn
ahead on a rollout thread while the trainer updates (ada_core/training/feed.py); the loop is the same. `train` is the only loop; the Prefect flow passes
task-wrapped versions of the same step functions through `StepFunctions`, so there is no second one.

The run's state and its set-up (`RunState`, `setup`, a resume's restore) are in ada_core/training/state.py;
the run folder's files are named and read in ada_core/run/files.py.

Resume takes the newest checkpoint whose files match their manifest (ada_core/run/checkpoints.py) and
trims every per-step file (metrics.jsonl, generations.jsonl) back to its step. With `loss.kl_coef > 0`
the frozen reference policy is the run's initial weights, kept in the run folder's `reference/`
(ada_core/run/reference.py), so a resume restores the reference the run started with, not the
checkpoint's current weights.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ada_core import metrics as K
from ada_core.config import TrainConfig
from ada_core.config.schema import data_seed
from ada_core.config.applies import metrics_off
from ada_core.data.suites import suite_metrics
from ada_core.paths import bytes_under, staged
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt, RolloutBatch
from ada_core.rl.rewards import StepBudget
from ada_core.run import files
from ada_core.run.checkpoints import latest_checkpoint, mark_complete, prune_checkpoints
from ada_core.sampling import make_sampler
from ada_core.training import start_eval
from ada_core.training.feed import AsyncFeed, SyncFeed, save_ahead, staleness_metrics, token_staleness_metrics
from ada_core.training.state import CUMULATIVE, RunState, _jsonable, setup

log = logging.getLogger(__name__)


@dataclass
class StepFunctions:
    """The step functions `train` composes; the Prefect flow substitutes task-wrapped versions."""

    rollout: Callable[[RunState], RolloutBatch]
    update: Callable[[RunState, RolloutBatch], dict[str, float]]
    evaluate: Callable[[RunState], dict[str, float]]
    checkpoint: Callable[[RunState], Path]


@dataclass
class Callbacks:
    """Hooks for tracking; the flows log to MLflow through these. All optional."""

    on_step: Callable[[int, dict[str, float]], None] | None = None
    on_eval: Callable[[int, dict[str, float], list[dict[str, Any]]], None] | None = None
    on_checkpoint: Callable[[int, Path], None] | None = None


def rollout_step(state: RunState) -> RolloutBatch:
    """Draw this step's prompts and run the configured sampler over them."""
    sampler = state.sampler or make_sampler(state.config.sampler, state.config.advantage)
    verifier = StepBudget(state.verifier, state.config.verifier.step_budget_s)  # the step's verify calls share it
    r = state.config.rollout
    if state.config.sampler.carry_over:  # the stream draws its prompts as it has room (ada_core/sampling/stream_session.py)
        carry_steps = None if r.max_staleness is None else r.max_staleness - r.async_steps
        return sampler.carry_step(state.config.prompts_per_step, state.source, state.rollout, verifier,
                                  state.sampling, state.rng, number=state.drawing_step, carry_steps=carry_steps,
                                  stale=r.stale, final=state.drawing_step >= state.config.steps)
    prompts = state.source.take(state.config.prompts_per_step)
    return sampler.sample(prompts, state.rollout, verifier, state.sampling, state.rng, source=state.source)


def update_step(state: RunState, batch: RolloutBatch) -> dict[str, float]:
    """One policy update on the batch's groups, then the weight sync, each timed.

    An engine in another process (vLLM) gets the new weights once here, as weight version
    `step + 1`; with sleep mode it also sleeps through the update (sleep and wake-up count as sync
    time). The in-process engine shares the weights: its sleep, wake-up and sync are no-ops.
    With `rollout.async_steps > 0` the weights are only written here (`time/sync_s` is that write);
    the rollout thread loads them between two batches (ada_core/training/feed.py)."""
    rollout = state.rollout
    if state.config.rollout.async_steps > 0:
        start = time.perf_counter()
        metrics = state.updater.update(batch.groups)
        metrics[K.TIME_UPDATE_S] = time.perf_counter() - start
        state.staged_weights = rollout.stage_weights(state.updater.module, version=state.step + 1)
        metrics[K.TIME_SYNC_S] = state.staged_weights.write_s
        return metrics
    start = time.perf_counter()
    rollout.sleep()
    sleep_s = time.perf_counter() - start
    start = time.perf_counter()
    metrics = state.updater.update(batch.groups)
    metrics[K.TIME_UPDATE_S] = time.perf_counter() - start
    start = time.perf_counter()
    rollout.wake_up()
    metrics.update(rollout.sync_weights(state.updater.module, version=state.step + 1))
    metrics[K.TIME_SYNC_S] = sleep_s + time.perf_counter() - start
    return metrics


def evaluate(state: RunState) -> dict[str, float]:
    """avg@k and pass@k on the held-out prompts at the eval temperature, on the validation prompts
    (`data.val_size`), and on every benchmark of `config.eval_suite` with their prompt-weighted average;
    writes sampled generations. The sampling seed is the data seed's (with the step), so the seeds of a
    comparison that share a model at a step share its score."""
    cfg = state.config
    sampling = SamplingParams(
        temperature=cfg.eval_temperature, top_p=1.0, max_tokens=cfg.eval_max_tokens or cfg.rollout.max_tokens,
        seed=data_seed(cfg) + state.step,
    )
    key = start_eval.start_eval_key(state, sampling)
    stored = start_eval.read(key) if key else None
    if stored is not None:  # the start's evaluation, as a run from the same start computed it (start_eval.py)
        metrics, kept = stored["metrics"], stored["rows"]
    else:
        avg, pass_k, rows = _score(state, state.eval_prompts, sampling)
        kept = rows[: 8 * cfg.eval_k]
        metrics = {K.EVAL_AVG_AT_K: avg, K.EVAL_PASS_AT_K: pass_k}
        if state.val_prompts:
            metrics[K.VAL_AVG_AT_K], metrics[K.VAL_PASS_AT_K], _ = _score(state, state.val_prompts, sampling)
        if state.suite:
            scores = [(bench, len(prompts), *_score(state, prompts, sampling)[:2]) for bench, prompts in state.suite]
            metrics.update(suite_metrics(scores))
        if key:
            start_eval.write(key, metrics, kept)
    with open(state.output_dir / files.GENERATIONS, "a") as fh:
        for row in kept:
            fh.write(json.dumps(row) + "\n")
    return metrics


def _score(state: RunState, prompts: list[Prompt], sampling: SamplingParams) -> tuple[float, float, list[dict]]:
    """(avg@k, pass@k, one row per sample) of `prompts` at `config.eval_k` samples each."""
    cfg, k = state.config, state.config.eval_k
    samples = state.rollout.generate_between_loads([(p, k) for p in prompts], sampling)  # seeded: no load runs meanwhile
    flat = [(p, s) for p, group in zip(prompts, samples) for s in group]
    verdicts = state.verifier.verify([(p, s.text) for p, s in flat])
    rewards = np.array([v.reward for v in verdicts], dtype=float).reshape(len(prompts), k)
    correct = rewards > cfg.sampler.positive_threshold
    rows = [
        {"step": state.step, "prompt_id": p.id, "prompt": p.text, "answer": p.answer, "completion": s.text,
         "reward": v.reward, "status": v.status.value}
        for (p, s), v in zip(flat, verdicts)
    ]
    return float(correct.mean()), float(correct.any(axis=1).mean()), rows


def save_checkpoint(state: RunState) -> Path:
    """Write HF weights, optimizer, RNG states and the data cursor; atomically (tmp dir, then rename).

    Under rollout.async_steps the rollout side's state (cursor, numpy RNG, sampler) is the one after
    the batches drawn ahead of this step, and those batches are saved too (`state.checkpoint_view`, set
    by the loop; ada_core/training/feed.py), so a resume trains them as the uninterrupted run does."""
    view = state.checkpoint_view
    if state.ledger is not None:
        state.ledger.flush()  # every row up to this step is committed before the checkpoint exists
    root = state.output_dir / files.CHECKPOINTS
    final = root / f"step_{state.step:06d}"
    tmp = root / f".tmp_step_{state.step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    # A full disk: one line naming the folder and the space needed (the last checkpoint's size), and
    # the partial folder removed, so the space it took is free again and the last checkpoint resumes.
    previous = latest_checkpoint(state.output_dir)
    then = f"; free space, then resume the run (from {previous.name})" if previous else "; free space and run it again"
    with staged(tmp, f"checkpoint {final.name}", bytes_under(previous) if previous else None, then):
        tmp.mkdir(parents=True)
        state.updater.module.save_pretrained(tmp / "hf", safe_serialization=True)
        state.tokenizer.save_pretrained(tmp / "hf")
        state.updater.save(tmp / "optimizer")
        trainer_state = {
            "step": state.step,
            "totals": state.totals,
            "elapsed_s": state.elapsed_s,
            "source": view.source if view else state.source.state_dict(),
            "numpy_rng": view.numpy_rng if view else state.rng.bit_generator.state,
            "python_rng": _jsonable(random.getstate()),
            "sampler": view.sampler if view else state.sampler.state_dict(),
            "ledger": state.ledger.state_dict() if state.ledger is not None else None,
        }
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state))
        if view is not None:
            save_ahead(view.ahead, tmp)
        torch.save(torch.get_rng_state(), tmp / "torch_rng.pt")
        mark_complete(tmp)  # MANIFEST.json (sha256 of every file), then COMPLETE
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    prune_checkpoints(state.output_dir, state.config.checkpoint.keep_last, newest_good=final)
    return final


def step_metrics(state: RunState, batch: RolloutBatch, update: dict[str, float], step_s: float) -> dict[str, float]:
    """Merge the sampler's and the update's metrics with the run totals and the time split; the keys of a
    feature the run leaves off (`metrics_off`) are dropped."""
    out = dict(batch.metrics)
    out.update(update)
    # One no-grad forward over the trained tokens for the old log-probs (none when the update was one optimizer
    # step, whose own forward gave them: update/old_recomputed 0), and one more through the frozen reference
    # policy when the KL term is on.
    passes = out.get(K.UPDATE_OLD_RECOMPUTED, 1.0) + (1 if state.config.loss.kl_coef > 0 else 0)
    out[K.BUDGET_LOGPROB_TOKENS] = passes * out.get(K.BUDGET_TRAINED_TOKENS, 0.0)
    for per_step, cum in CUMULATIVE.items():
        state.totals[cum] += out.get(per_step, 0.0)
    out.update(state.totals)
    out[K.TIME_STEP_S] = step_s
    out[K.TIME_ELAPSED_S] = state.elapsed_s
    gen_s = out.get(K.TIME_GENERATE_S, 0.0)
    out[K.THROUGHPUT_GEN_TOKENS_PER_S] = out.get(K.BUDGET_GENERATED_TOKENS, 0.0) / gen_s if gen_s > 0 else 0.0
    off = metrics_off(state.config)
    return K.check_keys({k: float(v) for k, v in out.items() if k not in off})


DEFAULT_STEPS = StepFunctions(rollout=rollout_step, update=update_step, evaluate=evaluate, checkpoint=save_checkpoint)


def run_steps(state: RunState, steps: StepFunctions = DEFAULT_STEPS, callbacks: Callbacks | None = None) -> dict[str, float]:
    """Advance `state` to `config.steps`, evaluating and checkpointing on schedule. Returns the last metrics."""
    cfg = state.config
    callbacks = callbacks or Callbacks()
    last: dict[str, float] = {}
    metrics_path = state.output_dir / files.METRICS
    k = cfg.rollout.async_steps
    partial = cfg.rollout.partial_rollout
    bound = None
    if cfg.sampler.carry_over:  # a carried prompt's tokens are as old as rollout.max_staleness lets them be
        bound = math.inf if cfg.rollout.max_staleness is None else cfg.rollout.max_staleness
    feed = AsyncFeed(state, steps, k, partial=partial, bound=bound) if k > 0 else SyncFeed(state, steps)
    meters = state.rollout.server_meters()
    readings = [m.read() for m in meters]
    bar = tqdm(total=cfg.steps, initial=state.step, desc=f"{cfg.preset}", unit="step", dynamic_ncols=True)
    try:
        while state.step < cfg.steps:
            if state.step == 0 and cfg.eval_every > 0:
                _run_eval(state, feed, callbacks, metrics_path)
                readings = [m.read() for m in meters]
            start = time.perf_counter()
            batch, fed = feed.next_batch()
            update_start = time.perf_counter()
            update = steps.update(state, batch)
            update_end = time.perf_counter()
            update.update(fed)
            update.update(feed.after_update(update_start, update_end))
            update.update(staleness_metrics(batch, state.step, k))
            if partial:
                update.update(token_staleness_metrics(batch, state.step, k))
            step_s = time.perf_counter() - start
            state.step += 1
            state.elapsed_s += step_s
            now = [m.read() for m in meters]
            for i, (a, b) in enumerate(zip(readings, now)):
                update[K.server_idle_key(i)] = (b.empty_s - a.empty_s) / (b.at - a.at) if b.at > a.at else 0.0
            readings = now
            # Read now, every step: with rollout.async_steps they came only with a weight load that had finished
            # by the time the batch arrived, so a row had them or not by timing.
            update.update(state.rollout.server_counts())
            if state.ledger is not None:  # queued here, written by the ledger's thread
                state.ledger.record(state.step, batch.pools, {g.prompt.id for g in batch.groups})
            last = step_metrics(state, batch, update, step_s)
            if state.setup_s is not None:  # once, on the first step this process ran
                last[K.TIME_SETUP_S], state.setup_s = state.setup_s, None
            files.append_jsonl(metrics_path, {"step": state.step, **last})
            if callbacks.on_step:
                callbacks.on_step(state.step, last)
            if cfg.eval_every > 0 and (state.step % cfg.eval_every == 0 or state.step == cfg.steps):
                last.update(_run_eval(state, feed, callbacks, metrics_path))
            if state.step == cfg.steps or (cfg.checkpoint_every > 0 and state.step % cfg.checkpoint_every == 0):
                state.checkpoint_view = feed.checkpoint_view()
                try:
                    path = steps.checkpoint(state)
                finally:
                    state.checkpoint_view = None
                if callbacks.on_checkpoint:
                    callbacks.on_checkpoint(state.step, path)
            bar.update(1)
            bar.set_postfix(reward=f"{last.get(K.REWARD_MEAN, 0):.3f}", eff=f"{last.get(K.SAMPLER_EFFECTIVE_RATIO, 0):.2f}",
                            acc=f"{last.get(K.EVAL_AVG_AT_K, float('nan')):.3f}")
    except BaseException:
        feed.close(quiet=True)
        raise
    else:
        feed.close()
    finally:
        bar.close()
    return last


def _run_eval(state: RunState, feed, callbacks: Callbacks, metrics_path: Path) -> dict[str, float]:
    start = time.perf_counter()
    result = feed.evaluate()
    result[K.TIME_EVAL_S] = time.perf_counter() - start
    files.append_jsonl(metrics_path, {"step": state.step, **result})
    if callbacks.on_eval:
        callbacks.on_eval(state.step, result, files.read_generations(state.output_dir, state.step))
    return result


def train(config: TrainConfig, output_dir: str | Path, resume: str | Path | None = None,
          steps: StepFunctions = DEFAULT_STEPS, callbacks: Callbacks | None = None,
          overwrite: bool = False) -> dict[str, float]:
    """Set up, run every step, clean up. Returns the final step's metrics."""
    state = setup(config, output_dir, resume=resume, overwrite=overwrite)
    try:
        return run_steps(state, steps, callbacks)
    finally:
        state.close()


