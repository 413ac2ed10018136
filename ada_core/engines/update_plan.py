"""The driver's half of an update: which sequences each rank trains in each optimizer step, and the
global loss denominators that make N ranks take the same step as one rank on the whole batch.

One rank (`DeepSpeedUpdateEngine.update`) and N ranks (`RankGroup.update`) run the same plan: the
driver flattens the groups, shuffles them (its own seeded generator), cuts them into
`optim.mini_batches` mini-batches per PPO epoch, and splits each mini-batch across ranks by whole
prompts, balanced by tokens. Each optimizer step carries its `Denominators`, totals over the WHOLE
mini-batch (every rank's share):

- `num_tokens`: response tokens under the effective mask (token-mean);
- `num_seqs`: sequences with at least one such token (the sequence-mean modes; see docs/ALGORITHM.md
  for why fully masked rows count in no denominator);
- `max_len`: the Dr. GRPO length normaliser, the constant `rollout.max_tokens` when the engine is
  given it (the trainer always does), else the longest response of the mini-batch;
- `num_micro`: micro-batches EVERY rank runs. A rank with a smaller share pads with zero-weight
  micro-batches, so every rank enters the same number of backward passes, and ZeRO-2's per-micro-batch
  gradient reductions line up.

Why global: DeepSpeed averages gradients over ranks. A rank's loss is its share's per-token sum over
the global denominator, multiplied by the world size, so the average of the rank gradients is the
gradient of the one-rank loss. Each rank normalising by its own token count instead weights a token
on a rank with few tokens more than one on a rank with many: a different update (tests/services/test_distributed.py
shows it).

Example: 2 ranks, a mini-batch of groups with 10, 6 and 3 response tokens: rank 0 takes [10], rank 1
takes [6, 3]; num_tokens = 19 on both, so a token weighs 1/19 wherever it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ada_core import metrics as K
from ada_core.config import LossConfig, OptimConfig
from ada_core.rl.losses import sequence_kept
from ada_core.records import Group

# ppo_clip_loss's diagnostics, token-weighted over every optimizer step of an update.
DIAGNOSTICS = ("clip_frac", "approx_kl", "entropy", "kl_ref", "tis_clip_frac")


@dataclass(frozen=True)
class Denominators:
    """Whole-mini-batch totals every rank's loss divides by (see the module docstring)."""

    num_tokens: float
    num_seqs: float
    max_len: int
    num_micro: int


@dataclass(frozen=True)
class PlannedStep:
    """One optimizer step: `shares[r]` indexes the sequences rank r trains on (possibly none)."""

    shares: list[list[int]]
    denominators: Denominators
    pad: int  # a sequence of the mini-batch that an empty share trains on with zero weight


def flatten(groups: list[Group]) -> list[dict]:
    """One dict per (group, sample) with completion tokens, validated, in group order."""
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


def plan_update(seqs: list[dict], num_groups: int, generator: torch.Generator, optim_cfg: OptimConfig,
                loss_cfg: LossConfig, world_size: int, max_response_len: int | None = None) -> list[PlannedStep]:
    """Every optimizer step of one update: shuffle per PPO epoch, mini-batches by prompt, shares by rank.

    The shuffle draws from `generator` exactly as the one-rank engine always has, so a run's
    mini-batches do not depend on the world size."""
    by_group: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_group.setdefault(s["group"], []).append(i)
    plan = []
    for _ in range(optim_cfg.ppo_epochs):
        order = torch.randperm(num_groups, generator=generator).tolist()
        for chunk in split_evenly(order, optim_cfg.mini_batches):
            groups = [by_group[g] for g in chunk if g in by_group]
            mini = [i for members in groups for i in members]
            if not mini:
                continue
            kept = [i for i in mini if sequence_kept(seqs[i]["advantage"], seqs[i]["truncated"], loss_cfg)]
            shares = balance_by_tokens(groups, [_cost(seqs, members) for members in groups], world_size)
            num_micro = max(1, max(math.ceil(len(s) / optim_cfg.micro_batch_size) for s in shares))
            longest = max(len(seqs[i]["completion"]) for i in mini)
            plan.append(PlannedStep(
                shares=shares,
                denominators=Denominators(
                    num_tokens=float(sum(len(seqs[i]["completion"]) for i in kept)),
                    num_seqs=float(len(kept)),
                    max_len=int(max_response_len) if max_response_len is not None else longest,
                    num_micro=num_micro,
                ),
                pad=mini[0],
            ))
    return plan


def old_is_current(plan: list[PlannedStep]) -> bool:
    """True when the update is ONE optimizer step (one PPO epoch of one mini-batch, the testbed's and most
    GRPO recipes'): that step starts from the weights the old log-probs would be recomputed on, so its own
    forward, detached, IS the old policy's and the ratio is exactly 1 (verl's on-policy path does the same).
    The engines then skip the separate no-grad forward (the frozen reference's, with a KL term, still runs)."""
    return len(plan) == 1


def local_steps(seqs: list[dict], plan: list[PlannedStep], rank: int) -> list[tuple[list[dict], Denominators]]:
    """Rank `rank`'s sequences and denominators for each planned step. An empty share becomes one
    zero-weight copy of the step's pad sequence, so the rank still joins the gradient reduction."""
    out = []
    for step in plan:
        share = [seqs[i] for i in step.shares[rank]] or [{**seqs[step.pad], "keep": False}]
        out.append((share, step.denominators))
    return out


def balance_by_tokens(items: list[list[int]], costs: list[int], parts: int) -> list[list[int]]:
    """Assign whole items (a prompt's sequences) to `parts` shares, largest first to the lightest share.

    [[0], [1, 2], [3]] with costs [10, 6, 3], 2 parts -> [[0], [1, 2, 3]] (10 vs 9 tokens)."""
    shares: list[list[int]] = [[] for _ in range(parts)]
    load = [0] * parts
    for index in sorted(range(len(items)), key=lambda i: (-costs[i], i)):
        target = min(range(parts), key=lambda r: (load[r], r))
        shares[target].extend(items[index])
        load[target] += costs[index]
    return [sorted(s) for s in shares]


def split_evenly(items: list[int], parts: int) -> list[list[int]]:
    """[0..6], 3 -> [[0, 1, 2], [3, 4], [5, 6]]; never more parts than items."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def update_metrics(seqs: list[dict], rank_results: list[list[dict[str, float]]], rank_seconds: list[dict[str, float]],
                   world_size: int, tis: bool, old_recomputed: bool = True) -> dict[str, float]:
    """Reduce every rank's per-step results to the update's metrics.

    rank_results[r][s] holds rank r's `loss` (its share's part of the global loss), `grad_norm` and
    `lr` (global, the same on every rank), `tokens` and token-summed diagnostics for step s. Summing
    the ranks' parts gives the one-rank loss; diagnostics are token-weighted over all steps.
    rank_seconds[r] holds that rank's `recompute_s` and `optimize_s`."""
    steps = len(rank_results[0])
    loss = sum(sum(r[s]["loss"] for r in rank_results) for s in range(steps))
    grad_norm = sum(rank_results[0][s]["grad_norm"] for s in range(steps))
    tokens = sum(r[s]["tokens"] for r in rank_results for s in range(steps))
    diag = {key: sum(r[s][key] for r in rank_results for s in range(steps)) for key in DIAGNOSTICS}
    per_rank = [t["recompute_s"] + t["optimize_s"] for t in rank_seconds]
    out = {
        K.TRAIN_LOSS: loss / max(steps, 1),
        K.TRAIN_ENTROPY: diag["entropy"] / max(tokens, 1.0),
        K.TRAIN_CLIP_FRAC: diag["clip_frac"] / max(tokens, 1.0),
        K.TRAIN_APPROX_KL: diag["approx_kl"] / max(tokens, 1.0),
        K.TRAIN_GRAD_NORM: grad_norm / max(steps, 1),
        K.TRAIN_LR: float(rank_results[0][-1]["lr"]) if steps else 0.0,
        K.TRAIN_KL_REF: diag["kl_ref"] / max(tokens, 1.0),
        **off_policy_stats(seqs),
        K.UPDATE_OPTIMIZER_STEPS: float(steps),
        K.UPDATE_OLD_RECOMPUTED: 1.0 if old_recomputed else 0.0,
        K.UPDATE_RECOMPUTE_S: max(t["recompute_s"] for t in rank_seconds),
        K.UPDATE_OPTIMIZE_S: max(t["optimize_s"] for t in rank_seconds),
        K.DIST_WORLD_SIZE: float(world_size),
        K.DIST_RANK_UPDATE_MAX_S: max(per_rank),
        K.DIST_RANK_UPDATE_MIN_S: min(per_rank),
    }
    if tis:
        out[K.UPDATE_TIS_CLIP_FRAC] = diag["tis_clip_frac"] / max(tokens, 1.0)
    return out


def off_policy_stats(seqs: list[dict]) -> dict[str, float]:
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


def zero_metrics(lr: float, tis: bool, world_size: int) -> dict[str, float]:
    """An update with nothing to train on; the importance ratios are reported as 1 (no mismatch seen)."""
    keys = (K.TRAIN_LOSS, K.TRAIN_ENTROPY, K.TRAIN_CLIP_FRAC, K.TRAIN_APPROX_KL, K.TRAIN_GRAD_NORM,
            K.TRAIN_KL_REF, K.UPDATE_OLD_LOGPROB_GAP_MEAN, K.UPDATE_OLD_LOGPROB_GAP_MAX, K.UPDATE_OPTIMIZER_STEPS,
            K.UPDATE_RECOMPUTE_S, K.UPDATE_OPTIMIZE_S, K.UPDATE_OLD_RECOMPUTED, K.DIST_RANK_UPDATE_MAX_S,
            K.DIST_RANK_UPDATE_MIN_S) + ((K.UPDATE_TIS_CLIP_FRAC,) if tis else ())
    return {**dict.fromkeys(keys, 0.0), K.UPDATE_IS_RATIO_MEAN: 1.0, K.UPDATE_IS_RATIO_MAX: 1.0, K.TRAIN_LR: lr,
            K.DIST_WORLD_SIZE: float(world_size)}


def _cost(seqs: list[dict], members: list[int]) -> int:
    """Tokens a rank runs forward and backward for these sequences: the balance criterion."""
    return sum(len(seqs[i]["prompt"]) + len(seqs[i]["completion"]) for i in members)
