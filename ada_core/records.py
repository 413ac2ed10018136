"""The records that cross every boundary: engines, sampler, verifier, advantages and update.

An engine returns `Sample`s; the verifier fills their reward and status; the sampler gathers them
into one `PromptPool` per prompt and selects a `Group` of n from it; the update engine sees only
`Group`s. An engine never sees an advantage, and the loss never sees a prompt string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class VerifierStatus(str, Enum):
    """Why a reward has the value it has. Anything but `ok` gives reward 0."""

    OK = "ok"
    TIMEOUT = "timeout"
    PARSE_ERROR = "parse_error"


@dataclass
class Prompt:
    """One training or evaluation problem."""

    id: str
    text: str
    answer: str
    prompt_ids: list[int] = field(default_factory=list)
    """Token ids of the fully formatted prompt (chat template applied); filled by the trainer."""
    source: str = ""
    """Where the prompt came from, e.g. `reasoning_gym/basic_arithmetic` or `math500`."""
    difficulty: float | None = None
    """Generator level, or the curated pass rate of the model that curated it."""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    """One completion drawn for one prompt."""

    prompt_id: str
    completion_ids: list[int]
    logprobs: list[float]
    """Behaviour-policy log-prob of each completion token, same length as `completion_ids`."""
    text: str
    reward: float | None = None
    """Verifier reward; None until the verifier has scored the sample."""
    status: VerifierStatus = VerifierStatus.OK
    truncated: bool = False
    """True when generation hit `max_tokens` before EOS or a stop string."""
    round: int = 0
    """Sampler round (0-based) in which the sample was drawn."""
    policy_version: int | None = None
    """Weight version (updates applied) of the policy that generated it; set by the training loop."""

    @property
    def num_tokens(self) -> int:
        return len(self.completion_ids)


@dataclass
class PromptPool:
    """Every sample drawn for one prompt in one step, in draw order."""

    prompt: Prompt
    samples: list[Sample] = field(default_factory=list)
    exit_reason: str = "active"
    """`pos`, `balance`, `mixed`, `fixed`, `varied`, `uniform`, `skipped` or `unresolved` once sampling is over."""
    rounds: int = 0

    def rewards(self) -> list[float]:
        return [float(s.reward) for s in self.samples]  # type: ignore[arg-type]

    def num_positive(self, threshold: float) -> int:
        return sum(1 for s in self.samples if s.reward is not None and s.reward > threshold)

    def num_negative(self, threshold: float) -> int:
        return len(self.samples) - self.num_positive(threshold)

    @property
    def p_hat(self) -> float:
        """Mean reward over the whole pool: the baseline of the `global_mean` estimators."""
        rewards = self.rewards()
        return sum(rewards) / len(rewards) if rewards else 0.0


@dataclass
class Group:
    """The n samples kept for one prompt, with their advantages and a summary of the pool."""

    prompt: Prompt
    samples: list[Sample]
    advantages: list[float]
    pool_size: int
    pool_positives: int
    p_hat: float
    exit_reason: str = "fixed"

    @property
    def is_uniform(self) -> bool:
        """True when every advantage is zero: the group gives no policy gradient."""
        return all(abs(a) < 1e-8 for a in self.advantages)


@dataclass
class RolloutBatch:
    """The groups of one step plus the sampler's metrics (keys from `ada_core.metrics`)."""

    groups: list[Group]
    metrics: dict[str, float] = field(default_factory=dict)
    pools: list[PromptPool] = field(default_factory=list)
    """Every prompt drawn this step with its whole pool (kept or not): what the prompt ledger records."""

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]
