"""Token-level PPO-clip with dual-clip, entropy bonus, optional KL, and the aggregation modes.

Shapes: B sequences (a micro-batch), T response tokens (right-padded). `mask` is 1.0 on real
response tokens. Everything here is a pure tensor function; the update engine owns batching.

Worked example (one token, advantage +1, eps 0.2/0.28): ratio 1.5 is clipped to 1.28, so the
per-token loss is -min(1.5 * 1, 1.28 * 1) = -1.28 and the token counts as clipped.

Truncated importance sampling (`loss.tis_cap`, verl's `tis_imp_ratio_cap`): the PPO ratio is taken
against the trainer's recomputed old policy, but the tokens were drawn by the rollout engine's
behaviour policy, which differs when the engine is another implementation (vLLM, bf16 kernels).
With a cap c, each token's clipped loss is multiplied by the detached weight
min(exp(old - behaviour), c), after dual-clip and before aggregation; the entropy and KL terms are
not weighted. E.g. old - behaviour = log 3, c = 2: the token's loss counts twice.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ada_core.config import LossConfig


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log pi(label) per position. logits [B, T, V], labels [B, T] -> [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution. logits [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


K3_CLAMP = 10.0  # verl's bound on the per-token k3 KL value

# Aggregations reduce a [B, T] per-token loss to a scalar. `num_tokens` / `num_seqs` are the totals
# over the whole mini-batch, so micro-batches that accumulate gradients sum to the mini-batch loss.
Aggregation = Callable[[torch.Tensor, torch.Tensor, float, float, int], torch.Tensor]
AGGREGATIONS: dict[str, Aggregation] = {}


def register_aggregation(name: str) -> Callable[[Aggregation], Aggregation]:
    def wrap(fn: Aggregation) -> Aggregation:
        AGGREGATIONS[name] = fn
        return fn

    return wrap


@register_aggregation("token-mean")
def _token_mean(loss: torch.Tensor, mask: torch.Tensor, num_tokens: float, num_seqs: float, max_len: int):
    """Every token weighs the same across the mini-batch (DAPO, the reference run)."""
    return (loss * mask).sum() / max(num_tokens, 1.0)


@register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, num_tokens: float, num_seqs: float, max_len: int):
    """Each sequence weighs the same; tokens average within a sequence (original GRPO)."""
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.sum() / max(num_seqs, 1.0)


@register_aggregation("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, num_tokens: float, num_seqs: float, max_len: int):
    """Token sums over a constant length (Dr. GRPO): no length bias. The update engine passes
    `max_len` = rollout.max_tokens, the same every step, as Dr. GRPO, verl and TRL do."""
    return (loss * mask).sum() / (max(num_seqs, 1.0) * max(max_len, 1))


def sequence_kept(advantage: float, truncated: bool, cfg: LossConfig) -> bool:
    """Whether a sequence keeps its tokens under `mask_truncated` / `exclude_zero_adv`: the scalar
    rule behind `effective_mask`, which the update's planner uses to count global denominators."""
    if cfg.mask_truncated and truncated:
        return False
    return not (cfg.exclude_zero_adv and abs(advantage) <= 1e-8)


def effective_mask(mask: torch.Tensor, advantages: torch.Tensor, truncated: torch.Tensor | None, cfg: LossConfig) -> torch.Tensor:
    """The mask the loss and its denominator use, after the truncation and zero-advantage options.

    mask [B, T], advantages [B], truncated [B] bool -> [B, T]. A row it zeroes is fully masked and
    counts in no denominator (the rule `sequence_kept` states per sequence; docs/ALGORITHM.md).
    """
    out = mask.float()
    if cfg.mask_truncated and truncated is not None:
        out = out * (~truncated.bool()).float().unsqueeze(-1)
    if cfg.exclude_zero_adv:
        out = out * (advantages.abs() > 1e-8).float().unsqueeze(-1)
    return out


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level PPO-clip loss and its diagnostics.

    logprobs, old_logprobs [B, T]: current and old (recomputed) policy log-probs of the response tokens.
    advantages [B]: one advantage per sequence, broadcast over its tokens.
    mask [B, T]: the effective mask (see `effective_mask`).
    entropy [B, T]: optional per-token entropy for the bonus; ref_logprobs [B, T]: optional for the KL.
    behaviour_logprobs [B, T]: the rollout engine's log-probs; required when `cfg.tis_cap` is set.
    num_tokens / num_seqs / max_len: mini-batch totals for the aggregation, over every rank's share
    (default: this micro-batch's own).

    Returns (scalar loss, {"clip_frac", "approx_kl", "entropy", "kl_ref", "tis_clip_frac"}) with
    diagnostics as floats averaged over the masked tokens of this micro-batch; `tis_clip_frac` is the
    share whose importance weight hit `cfg.tis_cap` (0 when TIS is off).
    """
    mask = mask.float()
    tokens_here = float(mask.sum().item())
    num_tokens = tokens_here if num_tokens is None else num_tokens
    num_seqs = float((mask.sum(-1) > 0).sum().item()) if num_seqs is None else num_seqs  # non-empty rows
    max_len = mask.shape[1] if max_len is None else max_len
    aggregate = AGGREGATIONS[cfg.aggregation]

    adv = advantages.float().unsqueeze(-1).expand_as(logprobs)
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if cfg.dual_clip_c is not None:
        # Dual-clip: for negative advantages, bound the loss at -c * A so a huge ratio can't blow up.
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * cfg.dual_clip_c), per_token)
    tis_capped = None
    if cfg.tis_cap is not None:
        if behaviour_logprobs is None:
            raise ValueError("loss.tis_cap is set but no behaviour_logprobs were given to ppo_clip_loss")
        is_ratio = torch.exp((old_logprobs - behaviour_logprobs).detach().float().clamp(-20.0, 20.0))
        tis_capped = is_ratio > cfg.tis_cap
        per_token = per_token * is_ratio.clamp(max=cfg.tis_cap)

    loss = aggregate(per_token, mask, num_tokens, num_seqs, max_len)
    ent_value = 0.0
    if entropy is not None:
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * aggregate(entropy, mask, num_tokens, num_seqs, max_len)
        ent_value = _masked_mean(entropy.detach(), mask)
    kl_value = 0.0
    if ref_logprobs is not None:
        # k3 estimator (Schulman): unbiased, always >= 0. Clamped per token to [-10, 10] as verl does:
        # one token far from the reference (exp(20) before the clamp) cannot dominate the step; a
        # clamped token gives no KL gradient.
        log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
        kl = (torch.exp(log_r) - log_r - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
        if cfg.kl_coef > 0:
            loss = loss + cfg.kl_coef * aggregate(kl, mask, num_tokens, num_seqs, max_len)
        kl_value = _masked_mean(kl.detach(), mask)

    with torch.no_grad():
        is_clipped = ((ratio < 1.0 - cfg.clip_low) & (adv < 0)) | ((ratio > 1.0 + cfg.clip_high) & (adv > 0))
        diagnostics = {
            "clip_frac": _masked_mean(is_clipped.float(), mask),
            "approx_kl": _masked_mean(0.5 * log_ratio.detach() ** 2, mask),
            "entropy": ent_value,
            "kl_ref": kl_value,
            "tis_clip_frac": _masked_mean(tis_capped.float(), mask) if tis_capped is not None else 0.0,
        }
    return loss, diagnostics


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    total = float(mask.sum().item())
    return float((values * mask).sum().item() / total) if total > 0 else 0.0
