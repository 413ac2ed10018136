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
    DEADLINE = "deadline"  # not checked before its batch's deadline (verifier.step_budget_s) ran out


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
    """Weight version (updates applied) of the policy that generated it; set by the training loop. Under
    rollout.partial_rollout: the version of its first token (the oldest)."""
    token_versions: list[int] | None = None
    """rollout.partial_rollout: the weight version each completion token was sampled on (same length as
    `completion_ids`, non-decreasing: a sample in flight at a weight load spans two or more). None: every
    token is `policy_version`'s."""

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


def batch_to_dict(batch: RolloutBatch) -> dict[str, Any]:
    """`batch` as plain JSON values, exactly (every float as written), for a checkpoint to hold a batch
    drawn ahead (rollout.async_steps). A prompt or sample shared by a pool and a group is written once
    and shared again by `batch_from_dict`."""
    prompts: list[Prompt] = []
    samples: list[Sample] = []
    index: dict[tuple[str, int], int] = {}

    def ref(obj: Any, table: list) -> int:
        key = (type(obj).__name__, id(obj))
        if key not in index:
            index[key] = len(table)
            table.append(obj)
        return index[key]

    pools = [{"prompt": ref(p.prompt, prompts), "samples": [ref(s, samples) for s in p.samples],
              "exit_reason": p.exit_reason, "rounds": p.rounds} for p in batch.pools]
    groups = [{"prompt": ref(g.prompt, prompts), "samples": [ref(s, samples) for s in g.samples],
               "advantages": list(g.advantages), "pool_size": g.pool_size, "pool_positives": g.pool_positives,
               "p_hat": g.p_hat, "exit_reason": g.exit_reason} for g in batch.groups]
    return {"metrics": dict(batch.metrics), "pools": pools, "groups": groups,
            "prompts": [vars(p).copy() for p in prompts],
            "samples": [{**vars(s), "status": VerifierStatus(s.status).value} for s in samples]}


def batch_from_dict(data: dict[str, Any]) -> RolloutBatch:
    """The batch `batch_to_dict` wrote."""
    prompts = [Prompt(**p) for p in data["prompts"]]
    samples = [Sample(**{**s, "status": VerifierStatus(s["status"])}) for s in data["samples"]]
    pools = [PromptPool(prompts[p["prompt"]], [samples[i] for i in p["samples"]], p["exit_reason"], p["rounds"])
             for p in data["pools"]]
    groups = [Group(prompts[g["prompt"]], [samples[i] for i in g["samples"]], g["advantages"], g["pool_size"],
                    g["pool_positives"], g["p_hat"], g["exit_reason"]) for g in data["groups"]]
    return RolloutBatch(groups, data["metrics"], pools)
