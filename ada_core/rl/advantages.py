"""Advantage estimators: a registry of small pure functions, chosen by name (verl `core_algos` style).

Every estimator has the same signature:

    fn(group_rewards: np.ndarray[n], pool_rewards: np.ndarray[P], eps: float) -> np.ndarray[n]

`group_rewards` are the rewards of the n samples that will be trained on. `pool_rewards` are the
rewards of every sample drawn for the prompt this step (P >= n; Reinforce-Ada draws more than it
trains on). For the `fixed` and `dynamic_filter` samplers the pool *is* the group.

Standard deviations are the unbiased (n - 1) estimate, as `torch.std` in verl. A std below `eps`
counts as zero variance and gives all-zero advantages for the std-normalised estimators, instead of
dividing noise by eps.

A new estimator is one function plus `@register_advantage("name")`, and touches no sampler or trainer
(add the name to `AdvantageConfig.name` too, so configs accept it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

AdvantageFn = Callable[[np.ndarray, np.ndarray, float], np.ndarray]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def wrap(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGES[name] = fn
        return fn

    return wrap


def _mean(values: np.ndarray) -> float:
    return float(values.sum()) / values.size  # np.mean's wrapper costs more than the sum on tiny arrays


def _std(values: np.ndarray) -> float:
    """Unbiased (n - 1) standard deviation; 0 for fewer than 2 values."""
    if values.size < 2:
        return 0.0
    centred = values - _mean(values)
    return math.sqrt(float(centred @ centred) / (values.size - 1))


def _standardise(rewards: np.ndarray, reference: np.ndarray, eps: float) -> np.ndarray:
    """(r - mean(reference)) / (std(reference) + eps); zeros when the reference has no variance."""
    std = _std(reference)
    if std < eps:
        return np.zeros_like(rewards)
    return (rewards - _mean(reference)) / (std + eps)


@register_advantage("grpo")
def grpo(group_rewards: np.ndarray, pool_rewards: np.ndarray, eps: float) -> np.ndarray:
    """GRPO: (r - mean_group) / (std_group + eps); the pool is ignored.

    group [4] = [1, 0, 0, 0]: mean 0.25, std 0.5 -> [1.5, -0.5, -0.5, -0.5] (eps aside).
    group [4] = [1, 1, 1, 1]: std 0 < eps -> [0, 0, 0, 0].
    """
    return _standardise(group_rewards, group_rewards, eps)


@register_advantage("group_mean")
def group_mean(group_rewards: np.ndarray, pool_rewards: np.ndarray, eps: float) -> np.ndarray:
    """r - mean_group, no std (Dr. GRPO); the pool is ignored.

    group [4] = [1, 0, 0, 0] -> [0.75, -0.25, -0.25, -0.25].
    """
    return group_rewards - _mean(group_rewards)


@register_advantage("global_mean")
def global_mean(group_rewards: np.ndarray, pool_rewards: np.ndarray, eps: float) -> np.ndarray:
    """r - p_hat, where p_hat is the mean reward of the WHOLE pool (Reinforce-Ada reference run).

    pool [8] with 3 positives: p_hat = 0.375; group [4] = [1, 1, 0, 0] -> [0.625, 0.625, -0.375, -0.375].
    The group's advantages sum to 0.5, not 0: a hard prompt gets a net push toward its positives.
    """
    return group_rewards - _mean(pool_rewards)


@register_advantage("global_mean_std")
def global_mean_std(group_rewards: np.ndarray, pool_rewards: np.ndarray, eps: float) -> np.ndarray:
    """(r - p_hat) / (std_pool + eps): Reinforce-Ada with std-normalisation on.

    pool [4] = [1, 0, 0, 0] (std 0.5), group = pool -> [1.5, -0.5, -0.5, -0.5] (eps aside).
    A uniform pool (std < eps) gives zeros.
    """
    return _standardise(group_rewards, pool_rewards, eps)


@register_advantage("rloo")
def rloo(group_rewards: np.ndarray, pool_rewards: np.ndarray, eps: float) -> np.ndarray:
    """Leave-one-out: r_i - mean of the OTHER n - 1 group rewards; the pool is ignored.

    group [4] = [1, 0, 0, 0] -> [1.0, -1/3, -1/3, -1/3]. Equals n / (n - 1) * (r - mean_group).
    """
    n = group_rewards.size
    if n < 2:
        return np.zeros_like(group_rewards)
    return (group_rewards * n - group_rewards.sum()) / (n - 1)


def compute_advantages(
    name: str, group_rewards: np.ndarray | list[float], pool_rewards: np.ndarray | list[float], eps: float
) -> list[float]:
    """Look up estimator `name`, check its inputs, and return one float advantage per group sample.

    >>> compute_advantages("global_mean", [1, 0], [1, 0, 0, 0], 1e-6)
    [0.75, -0.25]
    """
    if name not in ADVANTAGES:
        raise ValueError(f"advantage.name: unknown estimator {name!r}; choose from {sorted(ADVANTAGES)}")
    group = np.asarray(group_rewards, dtype=np.float64)
    pool = np.asarray(pool_rewards, dtype=np.float64)
    for label, values in (("group_rewards", group), ("pool_rewards", pool)):
        if values.ndim != 1 or values.size == 0:
            raise ValueError(f"{label}: expected a non-empty 1-D array, got shape {values.shape}")
        if not math.isfinite(float(values.sum())):  # a NaN or inf anywhere makes the sum non-finite
            raise ValueError(f"{label}: not all finite (NaN or inf): {values.tolist()}")
    if eps <= 0:
        raise ValueError(f"eps: must be > 0, got {eps}")
    return np.asarray(ADVANTAGES[name](group, pool, eps), dtype=np.float64).tolist()
