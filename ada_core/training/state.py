"""A run's state and its set-up: `setup` builds a `RunState` (models, data, engines, the run folder's lock), a
fresh run from its start model, a resume from its newest good checkpoint (`_restore`); the loop
(ada_core/training/loop.py) advances it step by step.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from ada_core import metrics as K
from ada_core.config import TrainConfig
from ada_core.config.schema import data_seed
from ada_core.data import run_split
from ada_core.data.prompts import pin_hub_ids
from ada_core.data.source import PromptSource
from ada_core.data.suites import load_suite
from ada_core.engines.factory import build_rollout_engine, build_update_engine
from ada_core.engines.update_state import load_state
from ada_core.errors import ConfigError, DatasetError, ResumeError
from ada_core.models import encode_prompts, load_policy
from ada_core.protocols import RolloutEngine, SamplingParams, UpdateEngine
from ada_core.records import Prompt
from ada_core.rl.rewards import MathVerifier
from ada_core.run import files
from ada_core.run.checkpoints import CheckpointChoice, NoCheckpoint, latest_good_checkpoint
from ada_core.run.folder import RunLock, check_run_dir, claim_run_dir
from ada_core.run.ledger import Ledger
from ada_core.run.reference import keep_reference, reference_of
from ada_core.run.resume import check_resumable, checkpoint_source, read_saved_config
from ada_core.sampling import make_sampler
from ada_core.training.feed import load_ahead
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
    val_prompts: list[Prompt] = field(default_factory=list)  # data.val_size: what picks a comparison's best policy
    start_model_dir: Path | None = None  # the model a fresh run started from (None on a resume)
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
    setup_s: float | None = None  # `setup`'s wall time, until the first step's row logs it (time/setup_s)
    """`config.eval_suite`'s benchmarks with their encoded prompts (ada_core/data/suites.py); empty without one."""
    lock: RunLock | None = None
    """This process's lock on `output_dir` (ada_core/run/folder.py), released last by `close`."""
    drawing_step: int = 0
    """The step whose batch the rollout is drawing (ahead of `step` under rollout.async_steps)."""
    staged_weights: Any = None
    """rollout.async_steps: the weights the last update wrote, until the feed queues their load."""
    checkpoint_view: Any = None
    """rollout.async_steps: the rollout side's state a checkpoint of this step saves (feed.Snapshot)."""
    ahead: list = field(default_factory=list)
    """rollout.async_steps: the batches the resumed checkpoint held drawn ahead (feed.Ahead); the feed
    trains them first, on the versions they were drawn on."""

    @property
    def sampling(self) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens)

    def close(self) -> None:
        """Close every part, even when one fails to close (the first failure is raised after the rest);
        the run folder's lock last, once nothing of this run writes it."""
        parts = [self.ledger,
                 self.sampler,  # sampler.carry_over: its open requests, before the server
                 self.verifier,
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


def setup(config: TrainConfig, output_dir: str | Path, resume: str | Path | None = None,
          overwrite: bool = False, sft_progress: Callable[[int, int], None] | None = None) -> RunState:
    """Build models, data and engines; with `resume`, restore the newest good checkpoint of that run.

    `sft_progress(done, total)` is called after each step of the SFT warm start (`config.sft_steps`
    from the configured model; not when the warm-started model is cached or a checkpoint is resumed).

    `output_dir` must not hold another run (`ada_core.run.folder`): resume it, or `overwrite` to move the
    old run aside first; no other live process may be writing it, and this one holds its lock until
    `RunState.close`. A resume takes no config but the run's own: `config` may differ from the saved
    `config.yaml` only in `ada_core.run.resume.RESUMABLE`, and its data must give the prompts the
    checkpoint's cursor was saved over. Bad input (dataset, config, resume, prompts per step) raises an
    `InputError` before the folder is claimed, so nothing is written or moved.
    """
    began = time.perf_counter()
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
    train_prompts, eval_prompts, val_prompts = run_split(config.data, config.seed)
    check_prompts_per_step(config, len(train_prompts))  # before any model is loaded
    suite = load_suite(config.eval_suite, config.eval_suite_revisions) if config.eval_suite else []

    if checkpoint is not None:
        model_dir = checkpoint / "hf"
        model, tokenizer = load_policy(model_dir)
    else:
        model_dir, model, tokenizer = start_model(config.model, config.sft_steps, config.data.dataset,
                                                  train_prompts + eval_prompts + val_prompts, data_seed(config),
                                                  progress=sft_progress, sft=config.sft.model_dump())
    train_prompts, eval_prompts, skipped = _encode_within_limit(tokenizer, train_prompts, eval_prompts, config)
    if val_prompts:
        val_prompts = encode_prompts(tokenizer, val_prompts, max_tokens=config.data.max_prompt_tokens)
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
            val_prompts=val_prompts,
            start_model_dir=None if checkpoint is not None else Path(model_dir),
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
        state.setup_s = time.perf_counter() - began
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
    state.ahead = load_ahead(checkpoint)
    torch.set_rng_state(load_state(checkpoint / "torch_rng.pt"))
    state.updater.load(checkpoint / "optimizer")
    for name in files.PER_STEP_FILES:
        files.trim_jsonl(checkpoint.parents[1] / name, state.output_dir / name, state.step)
    log.info("resumed from %s at step %d", checkpoint, state.step)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _jsonable(state: Any) -> Any:
    return [_jsonable(x) for x in state] if isinstance(state, tuple | list) else state


def _python_rng(saved: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = saved
    return version, tuple(internal), gauss
