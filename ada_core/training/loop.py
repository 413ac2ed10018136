"""The training loop, built from step functions the platform wraps as Prefect tasks.

One step: prompts -> sampler (engine + verifier) -> advantages -> update -> weight sync. Every E
steps it evaluates, every C steps it checkpoints. With `rollout.async_steps > 0` the batches are drawn
ahead on a rollout thread while the trainer updates (ada_core/training/feed.py); the loop is the same. `train` is the only loop; the Prefect flow passes
task-wrapped versions of the same step functions through `StepFunctions`, so there is no second one.

The run folder's files are named and read in ada_core/run/files.py.

Resume takes the newest checkpoint whose files match their manifest (ada_core/run/checkpoints.py) and
trims every per-step file (metrics.jsonl, generations.jsonl) back to its step. With `loss.kl_coef > 0`
the frozen reference policy is the run's initial weights, kept in the run folder's `reference/`
(ada_core/run/reference.py), so a resume restores the reference the run started with, not the
checkpoint's current weights.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from tqdm.auto import tqdm

from ada_core import metrics as K
from ada_core.config import TrainConfig
from ada_core.data import run_split
from ada_core.data.prompts import pin_hub_ids
from ada_core.data.source import PromptSource
from ada_core.data.suites import load_suite, suite_metrics
from ada_core.engines.deepspeed_engine import load_state
from ada_core.engines.factory import build_rollout_engine, build_update_engine
from ada_core.errors import ConfigError, DatasetError, ResumeError
from ada_core.models import encode_prompts, load_policy
from ada_core.protocols import RolloutEngine, SamplingParams, UpdateEngine
from ada_core.records import Prompt, RolloutBatch
from ada_core.rl.rewards import MathVerifier
from ada_core.run import files
from ada_core.run.checkpoints import (
    CheckpointChoice,
    NoCheckpoint,
    latest_good_checkpoint,
    mark_complete,
    prune_checkpoints,
)
from ada_core.run.folder import RunLock, check_run_dir, claim_run_dir
from ada_core.run.ledger import Ledger
from ada_core.run.reference import keep_reference, reference_of
from ada_core.run.resume import check_resumable, checkpoint_source, read_saved_config
from ada_core.sampling import make_sampler
from ada_core.training.feed import AsyncFeed, SyncFeed, staleness_metrics
from ada_core.training.start import start_model

log = logging.getLogger(__name__)

CUMULATIVE = {
    K.BUDGET_GENERATED_SAMPLES: K.BUDGET_GENERATED_SAMPLES_CUM,
    K.BUDGET_GENERATED_TOKENS: K.BUDGET_GENERATED_TOKENS_CUM,
    K.BUDGET_TRAINED_SAMPLES: K.BUDGET_TRAINED_SAMPLES_CUM,
    K.BUDGET_TRAINED_TOKENS: K.BUDGET_TRAINED_TOKENS_CUM,
    K.BUDGET_LOGPROB_TOKENS: K.BUDGET_LOGPROB_TOKENS_CUM,
}


@dataclass
class RunState:
    """Everything a run carries between steps. Built by `setup`, advanced by the step functions."""

    config: TrainConfig
    output_dir: Path
    tokenizer: Any
    rollout: RolloutEngine
    updater: UpdateEngine
    verifier: MathVerifier
    source: PromptSource
    eval_prompts: list[Prompt]
    rng: np.random.Generator
    step: int = 0
    totals: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in CUMULATIVE.values()})
    elapsed_s: float = 0.0
    num_params: int = 0
    skipped_prompts: int = 0  # longer than data.max_prompt_tokens
    resumed_from: CheckpointChoice | None = None
    sampler: Any = None
    """Built once by `setup`: the budgeted sampler keeps per-prompt history across steps (saved in checkpoints)."""
    ledger: Ledger | None = None
    suite: list[tuple[Any, list[Prompt]]] = field(default_factory=list)
    """`config.eval_suite`'s benchmarks with their encoded prompts (ada_core/data/suites.py); empty without one."""
    lock: RunLock | None = None
    """This process's lock on `output_dir` (ada_core/run/folder.py), released last by `close`."""
    drawing_step: int = 0
    """The step whose batch the rollout is drawing (ahead of `step` under rollout.async_steps)."""
    staged_weights: Any = None
    """rollout.async_steps: the weights the last update wrote, until the feed queues their load."""
    checkpoint_view: Any = None
    """rollout.async_steps: the rollout side's state a checkpoint of this step saves (feed.Snapshot)."""

    @property
    def sampling(self) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens)

    def close(self) -> None:
        """Close every part, even when one fails to close (the first failure is raised after the rest);
        the run folder's lock last, once nothing of this run writes it."""
        parts = [self.ledger, self.verifier,
                 self.rollout,  # the vLLM engine stops its server
                 self.updater,  # a rank group stops its actors (and the Ray it started)
                 self.lock]
        failure: BaseException | None = None
        for part in parts:
            if part is None:
                continue
            try:
                part.release() if part is self.lock else part.close()
            except BaseException as err:  # noqa: BLE001 - the others still close
                failure = failure or err
        if failure is not None:
            raise failure


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


def setup(config: TrainConfig, output_dir: str | Path, resume: str | Path | None = None,
          overwrite: bool = False) -> RunState:
    """Build models, data and engines; with `resume`, restore the newest good checkpoint of that run.

    `output_dir` must not hold another run (`ada_core.run.folder`): resume it, or `overwrite` to move the
    old run aside first; no other live process may be writing it, and this one holds its lock until
    `RunState.close`. A resume takes no config but the run's own: `config` may differ from the saved
    `config.yaml` only in `ada_core.run.resume.RESUMABLE`, and its data must give the prompts the
    checkpoint's cursor was saved over. Bad input (dataset, config, resume, prompts per step) raises an
    `InputError` before the folder is claimed, so nothing is written or moved.
    """
    output_dir = Path(output_dir)
    choice = latest_good_checkpoint(Path(resume)) if resume else None
    checkpoint = choice.path if choice is not None else None
    if resume and checkpoint is None:
        detail = "".join(f"; {p.name}: {why}" for p, why in choice.rejected)
        raise NoCheckpoint(f"--resume {resume}: no complete checkpoint under {Path(resume) / files.CHECKPOINTS}{detail}",
                           damaged=choice.damaged)
    if checkpoint is not None:  # a resume is the same run: only ada_core.run.resume.RESUMABLE may differ
        check_resumable(read_saved_config(resume), config, resume)
    if choice is not None and choice.rejected:
        log.warning("--resume %s: %s", resume, choice.describe())
    check_run_dir(output_dir, resume=resume, overwrite=overwrite)  # refuse early; claimed once inputs are read
    # A KL run's reference is its initial weights (ada_core/run/reference.py); a resume needs them whole.
    saved_reference = reference_of(Path(resume)) if checkpoint is not None and config.loss.kl_coef > 0 else None
    _seed_everything(config.seed)

    config = pin_hub_ids(config)  # hub ids -> org/name@<commit>, so config.yaml records what was read
    train_prompts, eval_prompts = run_split(config.data, config.seed)
    check_prompts_per_step(config, len(train_prompts))  # before any model is loaded
    suite = load_suite(config.eval_suite) if config.eval_suite else []

    if checkpoint is not None:
        model_dir = checkpoint / "hf"
        model, tokenizer = load_policy(model_dir)
    else:
        model_dir, model, tokenizer = start_model(config.model, config.sft_steps, config.data.dataset,
                                                  train_prompts + eval_prompts, config.seed)
    train_prompts, eval_prompts, skipped = _encode_within_limit(tokenizer, train_prompts, eval_prompts, config)
    for _, bench_prompts in suite:  # every benchmark prompt is scored, as the paper does: no length cut
        encode_prompts(tokenizer, bench_prompts)
    check_prompts_per_step(config, len(train_prompts), after_skipping=skipped)
    source = PromptSource(train_prompts, seed=config.seed)
    if checkpoint is not None:
        problem = source.mismatch(checkpoint_source(checkpoint))
        if problem is not None:
            raise ResumeError(f"resume {resume}: data.dataset {config.data.dataset}: {problem} (the dataset changed "
                              "since the run started); resume with the same data, or start a new run")
    moved, lock = claim_run_dir(output_dir, resume=resume, overwrite=overwrite)
    if moved is not None:
        log.warning("moved the run that was in %s aside to %s", output_dir, moved)

    with ExitStack() as undo:  # what a set-up that fails from here takes down again, newest first
        undo.callback(lock.release)
        reference_dir = None
        if config.loss.kl_coef > 0:
            same_run = saved_reference is not None and saved_reference.parent.resolve() == output_dir.resolve()
            reference_dir = saved_reference if same_run else keep_reference(saved_reference or model_dir, output_dir)
        updater = build_update_engine(config, model, model_dir, tokenizer.pad_token_id, log_dir=output_dir / "ranks",
                                      reference_dir=reference_dir)
        undo.callback(updater.close)
        step = _checkpoint_step(checkpoint) if checkpoint is not None else 0
        rollout = build_rollout_engine(config, model_dir, updater, tokenizer, output_dir, weight_version=step)
        undo.callback(rollout.close)
        state = RunState(
            config=config,
            output_dir=output_dir,
            tokenizer=tokenizer,
            rollout=rollout,
            updater=updater,
            verifier=MathVerifier(),
            source=source,
            eval_prompts=eval_prompts,
            rng=np.random.default_rng(config.seed),
            num_params=sum(p.numel() for p in model.parameters()),
            skipped_prompts=skipped,
            resumed_from=choice,
            sampler=make_sampler(config.sampler, config.advantage),
            suite=suite,
            lock=lock,
        )
        undo.pop_all()  # from here `state.close()` takes everything down
    try:
        (output_dir / files.CONFIG).write_text(yaml.safe_dump(config.model_dump(), sort_keys=False))
        if checkpoint is not None:
            _restore(state, checkpoint)
        state.ledger = _start_ledger(config, output_dir, checkpoint, step)
    except BaseException:
        state.close()  # a launched vLLM server must not outlive a failed set-up
        raise
    return state


def check_prompts_per_step(config: TrainConfig, available: int, after_skipping: int = 0) -> None:
    """`ConfigError` when a step would ask for more distinct prompts than the training set holds."""
    if config.prompts_per_step <= available:
        return
    pool = f", data.train_pool={config.data.train_pool}" if config.data.train_pool is not None else ""
    skipped = (f" after skipping {after_skipping} longer than data.max_prompt_tokens={config.data.max_prompt_tokens}"
               if after_skipping else "")
    raise ConfigError(
        f"prompts_per_step={config.prompts_per_step} exceeds the {available} training prompts of data.dataset "
        f"{config.data.dataset}{skipped} (data.train_size={config.data.train_size}, data.eval_size="
        f"{config.data.eval_size} held out{pool}): lower prompts_per_step or give the run more prompts"
    )


def _encode_within_limit(tokenizer, train: list[Prompt], evals: list[Prompt],
                         config: TrainConfig) -> tuple[list[Prompt], list[Prompt], int]:
    """Tokenise both sets, skipping prompts past `data.max_prompt_tokens`; fail if a set is left empty."""
    limit = config.data.max_prompt_tokens
    kept_train = encode_prompts(tokenizer, train, max_tokens=limit)
    kept_eval = encode_prompts(tokenizer, evals, max_tokens=limit)
    skipped = len(train) + len(evals) - len(kept_train) - len(kept_eval)
    if skipped:
        first = next(p.id for p in [*train, *evals] if not p.prompt_ids)
        log.warning("skipped %d of %d prompts longer than data.max_prompt_tokens=%d (first: %s)",
                    skipped, len(train) + len(evals), limit, first)
    for name, before, after in (("training", train, kept_train), ("evaluation", evals, kept_eval)):
        if before and not after:
            raise DatasetError(f"data.dataset {config.data.dataset}: every {name} prompt is longer than "
                               f"data.max_prompt_tokens={limit} tokens")
    return kept_train, kept_eval, skipped


def rollout_step(state: RunState) -> RolloutBatch:
    """Draw this step's prompts and run the configured sampler over them."""
    sampler = state.sampler or make_sampler(state.config.sampler, state.config.advantage)
    prompts = state.source.take(state.config.prompts_per_step)
    return sampler.sample(prompts, state.rollout, state.verifier, state.sampling, state.rng, source=state.source)


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
    """avg@k and pass@k on the held-out prompts at the eval temperature, and on every benchmark of
    `config.eval_suite` with their prompt-weighted average; writes sampled generations."""
    cfg = state.config
    sampling = SamplingParams(
        temperature=cfg.eval_temperature, top_p=1.0, max_tokens=cfg.eval_max_tokens or cfg.rollout.max_tokens,
        seed=cfg.seed + state.step,
    )
    avg, pass_k, rows = _score(state, state.eval_prompts, sampling)
    with open(state.output_dir / files.GENERATIONS, "a") as fh:
        for row in rows[: 8 * cfg.eval_k]:
            fh.write(json.dumps(row) + "\n")
    metrics = {K.EVAL_AVG_AT_K: avg, K.EVAL_PASS_AT_K: pass_k}
    if state.suite:
        scores = [(bench, len(prompts), *_score(state, prompts, sampling)[:2]) for bench, prompts in state.suite]
        metrics.update(suite_metrics(scores))
    return metrics


def _score(state: RunState, prompts: list[Prompt], sampling: SamplingParams) -> tuple[float, float, list[dict]]:
    """(avg@k, pass@k, one row per sample) of `prompts` at `config.eval_k` samples each."""
    cfg, k = state.config, state.config.eval_k
    samples = state.rollout.generate([(p, k) for p in prompts], sampling)
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

    Under rollout.async_steps the rollout side's state (cursor, numpy RNG, sampler) is the one from
    just before the next step's batch was drawn (`state.checkpoint_view`, set by the loop)."""
    view = state.checkpoint_view
    if state.ledger is not None:
        state.ledger.flush()  # every row up to this step is committed before the checkpoint exists
    root = state.output_dir / files.CHECKPOINTS
    final = root / f"step_{state.step:06d}"
    tmp = root / f".tmp_step_{state.step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
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
    torch.save(torch.get_rng_state(), tmp / "torch_rng.pt")
    mark_complete(tmp)  # MANIFEST.json (sha256 of every file), then COMPLETE
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    prune_checkpoints(state.output_dir, state.config.checkpoint.keep_last, newest_good=final)
    return final


def _start_ledger(config: TrainConfig, output_dir: Path, checkpoint: Path | None, step: int) -> Ledger | None:
    """The run's prompt ledger (None when `ledger.enabled` is off); a resume continues the checkpoint's
    ledger run after its step."""
    if not config.ledger.enabled:
        return None
    saved = json.loads((checkpoint / "trainer_state.json").read_text()).get("ledger") if checkpoint else None
    run_id = saved.get("run_id") if saved else None
    same_dir = checkpoint is not None and checkpoint.parents[1].resolve() == output_dir.resolve()
    return Ledger.start(config.ledger.url, output_dir, config.sampler.positive_threshold, resume_run_id=run_id,
                        resume_step=step, resume_same_dir=same_dir)


def _checkpoint_step(checkpoint: Path) -> int:
    return int(json.loads((checkpoint / "trainer_state.json").read_text())["step"])


def _restore(state: RunState, checkpoint: Path) -> None:
    saved = json.loads((checkpoint / "trainer_state.json").read_text())
    state.step = int(saved["step"])
    state.totals.update(saved["totals"])
    state.elapsed_s = float(saved["elapsed_s"])
    state.source.load_state_dict(saved["source"])
    state.rng.bit_generator.state = saved["numpy_rng"]
    random.setstate(_python_rng(saved["python_rng"]))
    if saved.get("sampler") is not None:
        state.sampler.load_state_dict(saved["sampler"])
    torch.set_rng_state(load_state(checkpoint / "torch_rng.pt"))
    state.updater.load(checkpoint / "optimizer")
    for name in files.PER_STEP_FILES:
        files.trim_jsonl(checkpoint.parents[1] / name, state.output_dir / name, state.step)
    log.info("resumed from %s at step %d", checkpoint, state.step)


def step_metrics(state: RunState, batch: RolloutBatch, update: dict[str, float], step_s: float) -> dict[str, float]:
    """Merge the sampler's and the update's metrics with the run totals and the time split."""
    out = dict(batch.metrics)
    out.update(update)
    # One no-grad forward over the trained tokens for the old log-probs, and one more through the
    # frozen reference policy when the KL term is on.
    passes = 2 if state.config.loss.kl_coef > 0 else 1
    out[K.BUDGET_LOGPROB_TOKENS] = passes * out.get(K.BUDGET_TRAINED_TOKENS, 0.0)
    for per_step, cum in CUMULATIVE.items():
        state.totals[cum] += out.get(per_step, 0.0)
    out.update(state.totals)
    out[K.TIME_STEP_S] = step_s
    out[K.TIME_ELAPSED_S] = state.elapsed_s
    gen_s = out.get(K.TIME_GENERATE_S, 0.0)
    out[K.THROUGHPUT_GEN_TOKENS_PER_S] = out.get(K.BUDGET_GENERATED_TOKENS, 0.0) / gen_s if gen_s > 0 else 0.0
    return K.check_keys({k: float(v) for k, v in out.items()})


DEFAULT_STEPS = StepFunctions(rollout=rollout_step, update=update_step, evaluate=evaluate, checkpoint=save_checkpoint)


def run_steps(state: RunState, steps: StepFunctions = DEFAULT_STEPS, callbacks: Callbacks | None = None) -> dict[str, float]:
    """Advance `state` to `config.steps`, evaluating and checkpointing on schedule. Returns the last metrics."""
    cfg = state.config
    callbacks = callbacks or Callbacks()
    last: dict[str, float] = {}
    metrics_path = state.output_dir / files.METRICS
    k = cfg.rollout.async_steps
    feed = AsyncFeed(state, steps, k) if k > 0 else SyncFeed(state, steps)
    meters = server_meters(state.rollout)
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
            step_s = time.perf_counter() - start
            state.step += 1
            state.elapsed_s += step_s
            now = [m.read() for m in meters]
            for i, (a, b) in enumerate(zip(readings, now)):
                update[K.server_idle_key(i)] = (b.empty_s - a.empty_s) / (b.at - a.at) if b.at > a.at else 0.0
            readings = now
            if state.ledger is not None:  # queued here, written by the ledger's thread
                state.ledger.record(state.step, batch.pools, {g.prompt.id for g in batch.groups})
            last = step_metrics(state, batch, update, step_s)
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


def server_meters(rollout: RolloutEngine) -> list:
    """The occupancy meter of each server behind `rollout` (a pool's members, or the engine's own)."""
    members = getattr(rollout, "members", None)
    if members is not None:
        return [m.meter for m in members]
    meter = getattr(rollout, "meter", None)
    return [meter] if meter is not None else []


def _run_eval(state: RunState, feed, callbacks: Callbacks, metrics_path: Path) -> dict[str, float]:
    result = feed.evaluate()
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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _jsonable(state: Any) -> Any:
    return [_jsonable(x) for x in state] if isinstance(state, tuple | list) else state


def _python_rng(saved: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = saved
    return version, tuple(internal), gauss
