"""The update engine: PPO-clip on a step's Groups with DeepSpeed (one process: gloo on CPU, nccl on CUDA).

One `update(groups)` call is one training step:
1. Flatten the groups into sequences `prompt_ids + completion_ids`, each with its group's advantage.
2. Recompute the old-policy log-probs ONCE, with no grad, before any optimizer step (and the frozen
   reference model's, when a KL term is on). Their per-token gap to the rollout engine's behaviour
   log-probs, and the importance ratio exp(old - behaviour) it implies, are the off-policy guard
   metrics (`update/old_logprob_gap_*`, `update/is_ratio_*`): ~0 and ~1 with the in-process engine,
   the rollout-training mismatch with a vLLM server. `loss.tis_cap` corrects for it (losses.py).
3. For each PPO epoch, shuffle the groups (seeded) and split them by prompt into `mini_batches`
   near-equal mini-batches; each mini-batch is ONE optimizer step, its gradient accumulated over
   micro-batches of `micro_batch_size` sequences. The loss denominators (token count, sequence
   count, longest response) are mini-batch totals, so the accumulated micro-batch losses sum to
   exactly the mini-batch loss.

Sequence layout in a micro-batch (left-padded prompts, right-padded responses), e.g. prompts of
3 and 2 tokens with responses of 2 and 3 tokens:

    [p p p r r .]      columns 0..P-1 hold the prompt, P..P+T-1 the response (P=3, T=3)
    [. p p r r r]      logits at column P-1+t predict response token t

so the response logits are the last T+1 positions minus the final one (`logits_to_keep=T+1`), and
the LM head never runs over prompt positions.

All log-probs (old, reference, current) are taken from logits / T at the sampling temperature T,
the convention of the rollout engines' behaviour log-probs. Old log-probs are recomputed in eval mode, as the rollout engine samples; the training forward runs
in train mode, so the ratio starts at exactly 1 only for models without dropout (Llama's default).

The LR schedule is a linear warm-up over `warmup_steps` optimizer steps (step s uses
lr * min(1, (s+1)/warmup_steps)), then constant. Weight decay applies to matrices, not to norms and
biases. An empty list of groups performs no step and returns zero metrics (importance ratios 1).

Device and precision follow DeepSpeed's accelerator (CUDA when torch sees a GPU, else CPU; the
`DS_ACCELERATOR` variable forces one): the model moves to it, and `optim.precision=bf16` turns on
DeepSpeed's bf16 mode, which casts the shared model to bfloat16 (so the in-process rollout engine
samples in bf16 too) and keeps fp32 master weights in the optimizer.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import time
from pathlib import Path

import torch

from ada_core import metrics as K
from ada_core.config import LossConfig, OptimConfig
from ada_core.losses import effective_mask, gather_logprobs, ppo_clip_loss, token_entropy
from ada_core.records import Group

log = logging.getLogger(__name__)

_STATE_FILE = "update_engine.pt"
# ppo_clip_loss's diagnostics, token-weighted over every optimizer step of an update.
_DIAGNOSTICS = ("clip_frac", "approx_kl", "entropy", "kl_ref", "tis_clip_frac")


class DeepSpeedUpdateEngine:
    """PPO-clip updates of an HF causal LM wrapped in a DeepSpeed engine (ZeRO stage 0-2)."""

    def __init__(self, model, loss_cfg: LossConfig, optim_cfg: OptimConfig, total_steps: int,
                 pad_token_id: int, ref_model=None, seed: int = 0, temperature: float = 1.0):
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
        self.ref_model = ref_model if (ref_model is not None and loss_cfg.kl_coef > 0) else None
        if self.ref_model is not None:
            self.ref_model.eval().requires_grad_(False)
        self._shuffle = torch.Generator().manual_seed(seed)
        self.engine, self.optimizer, self.scheduler = _initialize(model, optim_cfg)
        params = inspect.signature(self.module.forward).parameters
        self._keep_kwarg = "logits_to_keep" if "logits_to_keep" in params else None

    @property
    def module(self):
        """The underlying HF model (shared with the rollout engine; save it with save_pretrained)."""
        return self.engine.module

    @property
    def optimizer_steps(self) -> int:
        return int(self.engine.global_steps)

    def update(self, groups: list[Group]) -> dict[str, float]:
        """One training step on `groups` (see the module docstring). Returns `train/*` and `update/*`
        metrics as floats; diagnostics are token-weighted means over every optimizer step, `train/lr`
        is the rate of the last step. No groups (or no completion tokens): no step, zero metrics."""
        seqs = _flatten(groups)
        if not seqs:
            return _zero_metrics(lr=self._lr(), tis=self.loss_cfg.tis_cap is not None)
        was_training = self.module.training
        start = time.perf_counter()
        self._recompute_old(seqs)
        recompute_s = time.perf_counter() - start

        start = time.perf_counter()
        sums = dict.fromkeys(("loss", "grad_norm"), 0.0)
        token_sums = dict.fromkeys(_DIAGNOSTICS, 0.0)
        tokens_seen, steps, lr = 0.0, 0, self._lr()
        by_group: dict[int, list[dict]] = {}
        for s in seqs:
            by_group.setdefault(s["group"], []).append(s)
        self.module.train()
        try:
            for _ in range(self.optim_cfg.ppo_epochs):
                order = torch.randperm(len(groups), generator=self._shuffle).tolist()
                for chunk in _split_evenly(order, self.optim_cfg.mini_batches):
                    mini = [s for g in chunk for s in by_group.get(g, [])]
                    if not mini:
                        continue
                    loss, grad_norm, lr, diag, tokens = self._optimizer_step(mini)
                    sums["loss"] += loss
                    sums["grad_norm"] += grad_norm
                    steps += 1
                    tokens_seen += tokens
                    for key in token_sums:
                        token_sums[key] += diag[key]
        finally:
            self.module.train(was_training)
        out = {
            K.TRAIN_LOSS: sums["loss"] / max(steps, 1),
            K.TRAIN_ENTROPY: token_sums["entropy"] / max(tokens_seen, 1.0),
            K.TRAIN_CLIP_FRAC: token_sums["clip_frac"] / max(tokens_seen, 1.0),
            K.TRAIN_APPROX_KL: token_sums["approx_kl"] / max(tokens_seen, 1.0),
            K.TRAIN_GRAD_NORM: sums["grad_norm"] / max(steps, 1),
            K.TRAIN_LR: float(lr),
            K.TRAIN_KL_REF: token_sums["kl_ref"] / max(tokens_seen, 1.0),
            **_off_policy_stats(seqs),
            K.UPDATE_OPTIMIZER_STEPS: float(steps),
            K.UPDATE_RECOMPUTE_S: recompute_s,
            K.UPDATE_OPTIMIZE_S: time.perf_counter() - start,
        }
        if self.loss_cfg.tis_cap is not None:
            out[K.UPDATE_TIS_CLIP_FRAC] = token_sums["tis_clip_frac"] / max(tokens_seen, 1.0)
        return out

    def save(self, directory: str | Path) -> Path:
        """Optimizer, scheduler, step counters and the shuffle RNG (HF weights are saved by the trainer)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "global_steps": self.engine.global_steps,
            "global_samples": self.engine.global_samples,
            "shuffle_rng": self._shuffle.get_state(),
            "zero_stage": self.optim_cfg.zero_stage,
            "precision": self.optim_cfg.precision,
        }
        torch.save(state, directory / _STATE_FILE)
        return directory

    def load(self, directory: str | Path) -> None:
        path = Path(directory) / _STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no update-engine state at {path}")
        # Our own file; DeepSpeed's ZeRO optimizer state holds plain Python objects, so not weights_only.
        state = torch.load(path, map_location="cpu", weights_only=False)
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
            self.optimizer.load_state_dict([state["optimizer"]], load_optimizer_states=True, load_from_fp32_weights=True)
        self.scheduler.load_state_dict(state["scheduler"])
        self.engine.global_steps = state["global_steps"]
        self.engine.global_samples = state["global_samples"]
        self._shuffle.set_state(state["shuffle_rng"])

    # --- internals ----------------------------------------------------------------------------

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @torch.no_grad()
    def _recompute_old(self, seqs: list[dict]) -> None:
        """Attach `old` (and `ref`) log-prob tensors to every sequence, before any optimizer step."""
        was_training = self.module.training
        self.module.eval()
        for start in range(0, len(seqs), self.optim_cfg.micro_batch_size):
            chunk = seqs[start : start + self.optim_cfg.micro_batch_size]
            batch = collate(chunk, self.pad_token_id, self.engine.device)
            old = gather_logprobs(self._response_logits(self.module, batch), batch["response_ids"])
            ref = (gather_logprobs(self._response_logits(self.ref_model, batch), batch["response_ids"])
                   if self.ref_model is not None else None)
            for row, s in enumerate(chunk):
                n = len(s["completion"])
                s["old"] = old[row, :n].cpu()
                s["ref"] = ref[row, :n].cpu() if ref is not None else None
        self.module.train(was_training)

    def _optimizer_step(self, mini: list[dict]) -> tuple[float, float, float, dict[str, float], float]:
        """One optimizer step over a mini-batch. Returns (loss, grad_norm, lr, token-summed diagnostics, tokens)."""
        cfg, mbs = self.loss_cfg, self.optim_cfg.micro_batch_size
        micro = [collate(mini[i : i + mbs], self.pad_token_id, self.engine.device) for i in range(0, len(mini), mbs)]
        masks = [effective_mask(b["mask"], b["advantages"], b["truncated"], cfg) for b in micro]
        num_tokens = float(sum(m.sum() for m in masks))
        num_seqs = float(sum(int((m.sum(-1) > 0).sum()) for m in masks))  # fully masked rows don't count
        max_len = max(b["response_ids"].shape[1] for b in micro)
        total_loss, diag_sums = 0.0, dict.fromkeys(_DIAGNOSTICS, 0.0)
        for i, (batch, mask) in enumerate(zip(micro, masks)):
            self.engine.set_gradient_accumulation_boundary(i == len(micro) - 1)
            logits = self._response_logits(self.engine, batch)
            logprobs = gather_logprobs(logits, batch["response_ids"])
            if cfg.entropy_coef > 0:
                entropy = token_entropy(logits)
            else:
                with torch.no_grad():
                    entropy = token_entropy(logits.detach())
            loss, diag = ppo_clip_loss(
                logprobs, batch["old"], batch["advantages"], mask, cfg, entropy=entropy, ref_logprobs=batch["ref"],
                behaviour_logprobs=batch["behaviour"], num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len,
            )
            self.engine.backward(loss, scale_wrt_gas=False)  # denominators already span the mini-batch
            total_loss += float(loss.detach())
            weight = float(mask.sum())
            for key in diag_sums:
                diag_sums[key] += diag[key] * weight
        lr = self._lr()
        own_norm = _grad_norm(self.module) if self.optim_cfg.zero_stage == 0 else None
        self.engine.step()
        ds_norm = self.engine.get_global_grad_norm()
        grad_norm = float(ds_norm) if ds_norm is not None else float(own_norm or 0.0)
        return total_loss, grad_norm, lr, diag_sums, num_tokens

    def _response_logits(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits predicting each response token: [B, T, V]."""
        width = batch["response_ids"].shape[1]
        extra = {self._keep_kwarg: width + 1} if self._keep_kwarg else {}
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"], use_cache=False, **extra)
        logits = out.logits[:, -(width + 1) : -1, :]
        return logits / self.temperature if self.temperature != 1.0 else logits


def collate(seqs: list[dict], pad_token_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Pack sequences into left-padded prompts + right-padded responses (layout in the module docstring).

    Each seq has `prompt`, `completion` (lists of ids), `behaviour` [n], `advantage`, `truncated`, and
    optionally `old` / `ref` [n]. Returns input_ids / attention_mask / position_ids [B, P+T],
    response_ids / mask / old / ref / behaviour [B, T] (`ref` is None when absent), advantages [B],
    truncated [B] bool.
    """
    batch = len(seqs)
    width_p = max(len(s["prompt"]) for s in seqs)
    width_t = max(len(s["completion"]) for s in seqs)
    input_ids = torch.full((batch, width_p + width_t), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width_p + width_t), dtype=torch.long)
    response_mask = torch.zeros((batch, width_t))
    per_token = {key: torch.zeros((batch, width_t)) for key in ("behaviour", "old", "ref")}
    for r, s in enumerate(seqs):
        p, c = len(s["prompt"]), len(s["completion"])
        input_ids[r, width_p - p : width_p] = torch.tensor(s["prompt"], dtype=torch.long)
        input_ids[r, width_p : width_p + c] = torch.tensor(s["completion"], dtype=torch.long)
        attention[r, width_p - p : width_p + c] = 1
        response_mask[r, :c] = 1.0
        for key in per_token:
            if s.get(key) is not None:
                per_token[key][r, :c] = s[key]
    has_ref = all(s.get("ref") is not None for s in seqs)
    out = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_ids": input_ids[:, width_p:],
        "mask": response_mask,
        "behaviour": per_token["behaviour"],
        "old": per_token["old"],
        "ref": per_token["ref"] if has_ref else None,
        "advantages": torch.tensor([float(s["advantage"]) for s in seqs]),
        "truncated": torch.tensor([bool(s["truncated"]) for s in seqs]),
    }
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def _flatten(groups: list[Group]) -> list[dict]:
    """One dict per (group, sample), validated, in group order."""
    seqs = []
    for g_index, group in enumerate(groups):
        if len(group.advantages) != len(group.samples):
            raise ValueError(f"group for prompt {group.prompt.id}: {len(group.samples)} samples but "
                             f"{len(group.advantages)} advantages")
        if not group.prompt.prompt_ids:
            raise ValueError(f"group for prompt {group.prompt.id}: prompt_ids is empty")
        for s_index, sample in enumerate(group.samples):
            if len(sample.logprobs) != len(sample.completion_ids):
                raise ValueError(f"prompt {group.prompt.id} sample {s_index}: {len(sample.completion_ids)} "
                                 f"completion ids but {len(sample.logprobs)} logprobs")
            if not sample.completion_ids:
                continue  # nothing to train on
            seqs.append({
                "group": g_index,
                "prompt": list(group.prompt.prompt_ids),
                "completion": list(sample.completion_ids),
                "behaviour": torch.tensor(sample.logprobs, dtype=torch.float32),
                "advantage": float(group.advantages[s_index]),
                "truncated": bool(sample.truncated),
            })
    return seqs


def _split_evenly(items: list[int], parts: int) -> list[list[int]]:
    """[0..6], 3 -> [[0, 1, 2], [3, 4], [5, 6]]; never more parts than items."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def _grad_norm(module) -> float:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def _off_policy_stats(seqs: list[dict]) -> dict[str, float]:
    """Per-token |old - behaviour| (mean, max) and the importance ratio exp(old - behaviour) (mean, max)
    over every completion token, the off-policy guard metrics. The log-ratio is clamped to +-20 as in
    the loss, so one token with a near-zero behaviour probability cannot overflow the max."""
    delta = torch.cat([s["old"] - s["behaviour"] for s in seqs])
    ratio = delta.clamp(-20.0, 20.0).exp()
    return {
        K.UPDATE_OLD_LOGPROB_GAP_MEAN: float(delta.abs().mean()),
        K.UPDATE_OLD_LOGPROB_GAP_MAX: float(delta.abs().max()),
        K.UPDATE_IS_RATIO_MEAN: float(ratio.mean()),
        K.UPDATE_IS_RATIO_MAX: float(ratio.max()),
    }


def _zero_metrics(lr: float, tis: bool) -> dict[str, float]:
    """An update with nothing to train on; the importance ratios are reported as 1 (no mismatch seen)."""
    keys = (K.TRAIN_LOSS, K.TRAIN_ENTROPY, K.TRAIN_CLIP_FRAC, K.TRAIN_APPROX_KL, K.TRAIN_GRAD_NORM,
            K.TRAIN_KL_REF, K.UPDATE_OLD_LOGPROB_GAP_MEAN, K.UPDATE_OLD_LOGPROB_GAP_MAX, K.UPDATE_OPTIMIZER_STEPS,
            K.UPDATE_RECOMPUTE_S, K.UPDATE_OPTIMIZE_S) + ((K.UPDATE_TIS_CLIP_FRAC,) if tis else ())
    return {**dict.fromkeys(keys, 0.0), K.UPDATE_IS_RATIO_MEAN: 1.0, K.UPDATE_IS_RATIO_MAX: 1.0, K.TRAIN_LR: lr}


def _initialize(model, optim_cfg: OptimConfig):
    """deepspeed.initialize on one process, AdamW with decay on matrices, warm-up LambdaLR.

    The process group's backend is the accelerator's own (gloo on CPU, nccl on CUDA), not a fixed one.
    """
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
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
    deepspeed.init_distributed(dist_backend=backend)  # a no-op when already initialised
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
    start = time.perf_counter()
    engine, ds_optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=schedule, config=config
    )
    log.info("DeepSpeed initialised in %.1fs", time.perf_counter() - start)
    return engine, ds_optimizer, scheduler
