"""The update engine: PPO-clip on a step's Groups with DeepSpeed (one process: gloo on CPU, nccl on CUDA).

One `update(groups)` call is one training step:
1. Flatten the groups into sequences `prompt_ids + completion_ids`, each with its group's advantage.
2. Recompute the old-policy log-probs ONCE, with no grad, before any optimizer step (and the frozen
   reference model's, when a KL term is on). An update of ONE optimizer step (one PPO epoch, one
   mini-batch: `update_plan.old_is_current`) skips that forward: the step starts from the old policy,
   so its own log-probs, detached, are the old ones (`update/old_recomputed` 0). Their per-token gap to the rollout engine's behaviour
   log-probs, and the importance ratio exp(old - behaviour) it implies, are the off-policy guard
   metrics (`update/old_logprob_gap_*`, `update/is_ratio_*`): ~0 and ~1 with the in-process engine,
   the rollout-training mismatch with a vLLM server. `loss.tis_cap` corrects for it (losses.py).
3. For each PPO epoch, shuffle the groups (seeded) and split them by prompt into `mini_batches`
   near-equal mini-batches; each mini-batch is ONE optimizer step, its gradient accumulated over
   micro-batches of `micro_batch_size` sequences. The loss denominators (token count, sequence
   count, Dr. GRPO's length) are mini-batch totals, so the accumulated micro-batch losses sum to
   exactly the mini-batch loss. Steps 1 and 3 are `update_plan`'s, which the N-rank group
   (`rank_group.RankGroup`) shares: there each rank runs `recompute` and `train_steps` on its
   share of the plan, and the denominators span every rank's share.

The micro-batch's layout (left-padded prompts, right-padded responses) and its shared reads are in
ada_core/engines/micro_batch.py.

All log-probs (old, reference, current) are taken from logits / T at the sampling temperature T,
the convention of the rollout engines' behaviour log-probs. Old log-probs are recomputed in eval mode, as the rollout engine samples; the training forward runs
in train mode, so the ratio starts at exactly 1 only for models without dropout (Llama's default).

The LR schedule is a linear warm-up over `warmup_steps` optimizer steps (step s uses
lr * min(1, (s+1)/warmup_steps)), then constant. Weight decay applies to matrices, not to norms and
biases. An empty list of groups performs no step and returns zero metrics (importance ratios 1).

Device and precision follow DeepSpeed's accelerator (CUDA when torch sees a GPU, else CPU; the
`DS_ACCELERATOR` variable forces one): the model moves to it (and the frozen reference model, cast to the
policy's dtype), and `optim.precision=bf16` turns on
DeepSpeed's bf16 mode, which casts the shared model to bfloat16 (so the in-process rollout engine
samples in bf16 too) and keeps fp32 master weights in the optimizer.

Beside the engine: its state file and reference policy (update_state.py), how its process group
meets and on which interface (rendezvous.py).
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import time
from pathlib import Path

import torch

from ada_core.config import LossConfig, OptimConfig
from ada_core.rl.losses import effective_mask, gather_logprobs, ppo_clip_loss, token_entropy
from ada_core.engines.micro_batch import collate, distinct_sequences
from ada_core.engines.rendezvous import rendezvous_method
from ada_core.engines.update_plan import (DIAGNOSTICS, Denominators, flatten, local_steps, old_is_current,
                                          plan_update, update_metrics, zero_metrics)
from ada_core.engines.update_state import STATE_FILE, check_world_size, load_state, optimizer_state, save_state
from ada_core.protocols import UpdateEngine
from ada_core.records import Group

log = logging.getLogger(__name__)

_DIAGNOSTICS = DIAGNOSTICS


class DeepSpeedUpdateEngine(UpdateEngine):
    """PPO-clip updates of an HF causal LM wrapped in a DeepSpeed engine (ZeRO stage 0-2)."""

    def __init__(self, model, loss_cfg: LossConfig, optim_cfg: OptimConfig, total_steps: int,
                 pad_token_id: int, ref_model=None, seed: int = 0, temperature: float = 1.0,
                 max_response_len: int | None = None):
        if pad_token_id is None:
            raise ValueError("pad_token_id is None: give the tokenizer's pad (or eos) token id")
        if optim_cfg.zero_stage == 3:
            raise ValueError(
                "optim.zero_stage=3 partitions the parameters, so the in-process rollout engine and "
                "save_pretrained on `module` would see empty tensors; use stage 0, 1 or 2 here"
            )
        self.loss_cfg = loss_cfg
        self.optim_cfg = optim_cfg
        self.total_steps = total_steps  # the schedule is warm-up then constant; kept for decaying ones
        self.pad_token_id = int(pad_token_id)
        if temperature <= 0:
            raise ValueError(f"rollout.temperature must be > 0, got {temperature}")
        # Log-probs are taken at the sampling temperature, as the rollout engines report them, so the
        # PPO ratio compares like with like and starts at 1 whatever the temperature.
        self.temperature = float(temperature)
        # Dr. GRPO's constant length normaliser (the trainer passes rollout.max_tokens); None = the longest
        # response of each mini-batch, for direct use without a rollout config.
        self.max_response_len = max_response_len
        if loss_cfg.kl_coef > 0 and ref_model is None:
            raise ValueError(f"loss.kl_coef={loss_cfg.kl_coef:g} needs a reference model (ref_model): without one "
                             "the KL term would silently be off")
        self.ref_model = ref_model if loss_cfg.kl_coef > 0 else None
        self._shuffle = torch.Generator().manual_seed(seed)
        self.engine, self.optimizer, self.scheduler = _initialize(model, optim_cfg)
        if self.ref_model is not None:
            # Frozen, on the engine's device and in the policy's dtype (bf16 when DeepSpeed cast the policy).
            dtype = next(self.module.parameters()).dtype
            self.ref_model.to(device=self.engine.device, dtype=dtype).eval().requires_grad_(False)
        params = inspect.signature(self.module.forward).parameters
        self._keep_kwarg = "logits_to_keep" if "logits_to_keep" in params else None
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"  # as the rollout engine's

    @property
    def module(self):
        """The underlying HF model (shared with the rollout engine; save it with save_pretrained)."""
        return self.engine.module

    @property
    def optimizer_steps(self) -> int:
        return int(self.engine.global_steps)

    @property
    def world_size(self) -> int:
        """Data-parallel ranks this engine's process group spans (1 in the driver's own process)."""
        return int(self.engine.dp_world_size)

    def update(self, groups: list[Group]) -> dict[str, float]:
        """One training step on `groups` (see the module docstring). Returns `train/*`, `update/*` and
        `dist/*` metrics as floats; diagnostics are token-weighted means over every optimizer step,
        `train/lr` is the rate of the last step. No groups (or no completion tokens): no step, zero metrics.

        This is the one-rank path; `RankGroup.update` runs the same plan over N of these engines."""
        seqs = flatten(groups)
        if not seqs:
            return zero_metrics(lr=self._lr(), tis=self.loss_cfg.tis_cap is not None, world_size=1)
        plan = plan_update(seqs, len(groups), self._shuffle, self.optim_cfg, self.loss_cfg, world_size=1,
                           max_response_len=self.max_response_len)
        current = old_is_current(plan)
        start = time.perf_counter()
        self.recompute(seqs, old=not current)
        recompute_s = time.perf_counter() - start
        results, optimize_s = self.train_steps(local_steps(seqs, plan, rank=0), old_is_current=current)
        return update_metrics(seqs, [results], [{"recompute_s": recompute_s, "optimize_s": optimize_s}],
                              world_size=1, tis=self.loss_cfg.tis_cap is not None, old_recomputed=not current)

    def train_steps(self, steps: list[tuple[list[dict], Denominators]],
                    old_is_current: bool = False) -> tuple[list[dict[str, float]], float]:
        """Run planned optimizer steps on this rank's shares (old log-probs attached, or, with `old_is_current`,
        one step whose own forward gives them: each sequence gets its `old` from it, for the off-policy
        metrics). Returns each step's results (see `update_plan.update_metrics`) and the seconds taken."""
        if old_is_current and len(steps) != 1:
            raise ValueError(f"old_is_current needs an update of one optimizer step, not {len(steps)}")
        start = time.perf_counter()
        was_training = self.module.training
        self.module.train()
        try:
            results = [self._optimizer_step(share, denominators, old_is_current) for share, denominators in steps]
        finally:
            self.module.train(was_training)
        return results, time.perf_counter() - start

    def rollout_engine(self, tokenizer, micro_batch_size: int = 64):
        """The in-process rollout engine on this engine's module: new weights need no sync."""
        from ada_core.engines.transformers_engine import TransformersRolloutEngine

        return TransformersRolloutEngine(self.module, tokenizer, micro_batch_size=micro_batch_size)

    def close(self) -> None:
        """Nothing to release in-process (the process group lives as long as the process); the rank
        group's `close` stops its actors."""

    def save(self, directory: str | Path) -> Path:
        """Optimizer, scheduler, step counters and the shuffle RNG (HF weights are saved by the trainer),
        as tensors and plain values only (`save_state`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "optimizer": optimizer_state(self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "global_steps": self.engine.global_steps,
            "global_samples": self.engine.global_samples,
            "shuffle_rng": self._shuffle.get_state(),
            "zero_stage": self.optim_cfg.zero_stage,
            "precision": self.optim_cfg.precision,
            "world_size": self.world_size,
        }
        save_state(state, directory / STATE_FILE)
        return directory

    def load(self, directory: str | Path, every_rank: list[str | Path] | None = None) -> None:
        """Restore `save`'s state from `directory`. In a world of N ranks, `every_rank` lists the N
        ranks' folders in rank order: ZeRO picks this rank's partition from the list (and merges them
        when the partitioning changed)."""
        path = Path(directory) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no update-engine state at {path}")
        state = load_state(path)
        check_world_size(path, state.get("world_size", 1), self.world_size)
        if state["zero_stage"] != self.optim_cfg.zero_stage:
            raise ValueError(f"{path} was saved with ZeRO stage {state['zero_stage']}, but optim.zero_stage="
                             f"{self.optim_cfg.zero_stage}: resume with the same stage")
        saved_precision = state.get("precision", "fp32")  # files from before optim.precision existed
        if saved_precision != self.optim_cfg.precision:
            raise ValueError(f"{path} was saved with precision {saved_precision}, but optim.precision="
                             f"{self.optim_cfg.precision}: resume with the same precision")
        if self.optim_cfg.zero_stage == 0:  # torch's AdamW, or DeepSpeed's bf16 wrapper with its fp32 master copy
            self.optimizer.load_state_dict(state["optimizer"])
        else:  # ZeRO (and stage-1 bf16) optimizers take one state dict per rank; restore the saved fp32 master
            # weights rather than re-deriving them from the (bf16) module weights
            folders = [Path(p) for p in every_rank] if every_rank is not None else [Path(directory)]
            partitions = [state["optimizer"] if f == Path(directory) else
                          load_state(f / STATE_FILE)["optimizer"] for f in folders]
            self.optimizer.load_state_dict(partitions, load_optimizer_states=True, load_from_fp32_weights=True)
        self.scheduler.load_state_dict(state["scheduler"])
        self.engine.global_steps = state["global_steps"]
        self.engine.global_samples = state["global_samples"]
        self._shuffle.set_state(state["shuffle_rng"])

    # --- internals ----------------------------------------------------------------------------

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @torch.no_grad()
    def recompute(self, seqs: list[dict], old: bool = True) -> None:
        """Attach `old` (and `ref`) log-prob tensors to every sequence, before any optimizer step. `old=False`
        (an update of one optimizer step, `update_plan.old_is_current`): `old` is left to that step, only the
        frozen reference's run (when there is one)."""
        for s in seqs:
            s["old"], s["ref"] = None, None
        if not old and self.ref_model is None:
            return
        was_training = self.module.training
        self.module.eval()
        for start in range(0, len(seqs), self.optim_cfg.micro_batch_size):
            chunk = seqs[start : start + self.optim_cfg.micro_batch_size]
            batch = collate(chunk, self.pad_token_id, self.engine.device)
            olds = gather_logprobs(self._response_logits(self.module, batch), batch["response_ids"]) if old else None
            ref = (gather_logprobs(self._response_logits(self.ref_model, batch), batch["response_ids"])
                   if self.ref_model is not None else None)
            for row, s in enumerate(chunk):
                n = len(s["completion"])
                s["old"] = olds[row, :n].cpu() if olds is not None else None
                s["ref"] = ref[row, :n].cpu() if ref is not None else None
        self.module.train(was_training)

    def _optimizer_step(self, share: list[dict], den: Denominators, old_is_current: bool = False) -> dict[str, float]:
        """One optimizer step over this rank's share of a mini-batch, with the mini-batch's global
        denominators `den`. Returns its part of the loss, the global grad norm, the lr, the tokens it
        trained and its token-summed diagnostics."""
        cfg, mbs = self.loss_cfg, self.optim_cfg.micro_batch_size
        chunks = [share[i : i + mbs] for i in range(0, len(share), mbs)]
        # Every rank runs den.num_micro backward passes, so ZeRO's gradient reductions pair up across
        # ranks; a short share pads with zero-weight copies of its first sequence.
        chunks += [[{**share[0], "keep": False}]] * (den.num_micro - len(chunks))
        # DeepSpeed averages gradients over ranks; the world-size factor turns that average into the sum
        # of the shares' parts, i.e. the one-rank gradient (update_plan's module docstring).
        scale = float(self.world_size)
        total_loss, tokens, diag_sums = 0.0, 0.0, dict.fromkeys(_DIAGNOSTICS, 0.0)
        for i, chunk in enumerate(chunks):
            batch = collate(chunk, self.pad_token_id, self.engine.device)
            mask = effective_mask(batch["mask"], batch["advantages"], batch["truncated"], cfg) * batch["keep"][:, None]
            self.engine.set_gradient_accumulation_boundary(i == len(chunks) - 1)
            logits = self._response_logits(self.engine, batch)
            logprobs = gather_logprobs(logits, batch["response_ids"])
            if old_is_current:  # this step starts from the old policy: its own log-probs, detached, are the old ones
                old = logprobs.detach()
                for row, s in enumerate(chunk):
                    s["old"] = old[row, : len(s["completion"])].cpu()
            else:
                old = batch["old"]
            if cfg.entropy_coef > 0:
                entropy = token_entropy(logits)
            else:
                with torch.no_grad():
                    entropy = token_entropy(logits.detach())
            loss, diag = ppo_clip_loss(
                logprobs, old, batch["advantages"], mask, cfg, entropy=entropy, ref_logprobs=batch["ref"],
                behaviour_logprobs=batch["behaviour"], num_tokens=den.num_tokens, num_seqs=den.num_seqs,
                max_len=den.max_len,
            )
            self.engine.backward(loss * scale if scale != 1.0 else loss, scale_wrt_gas=False)
            total_loss += float(loss.detach())
            weight = float(mask.sum())
            tokens += weight
            for key in diag_sums:
                diag_sums[key] += diag[key] * weight
        lr = self._lr()
        own_norm = _grad_norm(self.module) if self.optim_cfg.zero_stage == 0 else None
        self.engine.step()
        ds_norm = self.engine.get_global_grad_norm()
        grad_norm = float(ds_norm) if ds_norm is not None else float(own_norm or 0.0)
        return {"loss": total_loss, "grad_norm": grad_norm, "lr": lr, "tokens": tokens, **diag_sums}

    def _response_logits(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits predicting each response token: [B, T, V]. With `optim.share_prompts`, a sequence repeated in the
        micro-batch (a group's samples that gave the same answer) is read once and its logits go to each of its
        rows, and each distinct prompt is read once: its last position's logits (predicting response token 0)
        and its KV cache go to every row of that prompt, and one more forward reads the responses on that cache.
        The gradient reaches a shared computation through the index, summed over its rows."""
        if self.optim_cfg.share_prompts and self._keep_kwarg is not None:
            repeated = distinct_sequences(batch)
            if repeated is not None:
                sub, place = repeated
                return self._logits_read(model, sub)[place]
        return self._logits_read(model, batch)

    def _logits_read(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """`_response_logits` of a batch whose rows are read as they are (each distinct prompt once, with
        `optim.share_prompts`)."""
        width = batch["response_ids"].shape[1]
        firsts, index = batch["prompt_firsts"], batch["prompt_index"]
        if not self.optim_cfg.share_prompts or len(firsts) == len(index) or self._keep_kwarg is None:
            extra = {self._keep_kwarg: width + 1} if self._keep_kwarg else {}
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        position_ids=batch["position_ids"], use_cache=False, **extra)
            logits = out.logits[:, -(width + 1) : -1, :]
        else:
            from ada_core.engines.transformers_engine import _new_cache

            prompt = batch["input_ids"].shape[1] - width
            attention, positions = batch["attention_mask"], batch["position_ids"]
            cache = _new_cache(self.module)
            first = model(input_ids=batch["input_ids"][firsts, :prompt], attention_mask=attention[firsts, :prompt],
                          position_ids=positions[firsts, :prompt], use_cache=True, **{self._cache_kwarg: cache},
                          **{self._keep_kwarg: 1}).logits[index]
            logits = first
            if width > 1:
                cache.reorder_cache(index)
                rest = model(input_ids=batch["response_ids"][:, :-1], attention_mask=attention[:, : prompt + width - 1],
                             position_ids=positions[:, prompt : prompt + width - 1], use_cache=True,
                             **{self._cache_kwarg: cache}).logits
                logits = torch.cat([first, rest], dim=1)
        return logits / self.temperature if self.temperature != 1.0 else logits


def _grad_norm(module) -> float:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def optimizer_and_config(model, optim_cfg: OptimConfig):
    """What `optim` turns into, before DeepSpeed: AdamW (decay on matrices only), the warm-up schedule
    (optimizer -> LambdaLR) and DeepSpeed's config dict."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": optim_cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=optim_cfg.lr,
    )
    warmup = optim_cfg.warmup_steps

    def schedule(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

    config = {
        "train_micro_batch_size_per_gpu": optim_cfg.micro_batch_size,
        "gradient_accumulation_steps": 1,  # we mark the accumulation boundary ourselves per mini-batch
        "gradient_clipping": optim_cfg.grad_clip,
        "zero_optimization": {"stage": optim_cfg.zero_stage},
        "bf16": {"enabled": optim_cfg.precision == "bf16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
    }
    return optimizer, schedule, config


def _initialize(model, optim_cfg: OptimConfig):
    """deepspeed.initialize in this process, AdamW with decay on matrices, warm-up LambdaLR. A rank actor
    sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (and on one machine
    ADA_DIST_RENDEZVOUS) first; alone, it is rank 0 of 1 (`rendezvous_method`: no listener).

    The process group's backend is the accelerator's own (gloo on CPU, nccl on CUDA), not a fixed one.
    """
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    init_method = rendezvous_method()
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    accelerator = get_accelerator()
    backend = accelerator.communication_backend_name()
    log.info("initialising DeepSpeed (ZeRO stage %d, %s, %s on %s)", optim_cfg.zero_stage, optim_cfg.precision,
             backend, accelerator.device_name())
    if accelerator.device_name() == "cpu" and not installed_ops.get("deepspeed_shm_comm"):
        log.warning("DeepSpeed's shm comm op was not pre-built at install (DS_BUILD_SHM_COMM=1); "
                    "init_distributed may now JIT-compile it, which takes about a minute")
    deepspeed.init_distributed(dist_backend=backend, init_method=init_method,  # a no-op when already initialised
                               rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    optimizer, schedule, config = optimizer_and_config(model, optim_cfg)
    start = time.perf_counter()
    engine, ds_optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=schedule, config=config
    )
    log.info("DeepSpeed initialised in %.1fs", time.perf_counter() - start)
    return engine, ds_optimizer, scheduler
