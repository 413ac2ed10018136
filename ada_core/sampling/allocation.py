"""Budgeted allocation: a fixed number of samples per step, spent where a prompt's history says the
signal is. The `budgeted` sampler (ada_core/sampling/samplers.py) runs one of the policies below.

GRPO spends n samples on every prompt; Reinforce-Ada spends several times that on the hard ones.
Here the step has a hard budget (`sampler.budget`, default B * n = GRPO's samples per step, so
per-step curves are equal-generation curves) and a `PromptHistory` remembers, across steps, each
prompt's outcomes as a Beta posterior over its pass rate p. A group is informative when its pool
holds a positive and a negative, so the value of giving a prompt k samples is

    f(k) = P(pool of k is mixed) = 1 - E[p^k] - E[(1-p)^k],   E[p^k] = prod_{j<k} (a + j) / (a + b + j)

for p ~ Beta(a, b). f is concave and increasing in k, which is what makes greedy allocation by
marginal gain optimal for this objective (a concave knapsack; arXiv 2509.25849 packs the same
kind of value into a rollout budget).

Two policies, chosen by `sampler.allocation`:

- `posterior` (estimation-based, one engine call; Knapsack RL, VIP arXiv 2602.01601, MoPPS
  arXiv 2507.04632): every drawn prompt not skipped competes for the budget; a prompt's first
  chunk is n samples (it must fill a group), each further sample one at a time, always to the
  prompt whose next chunk buys the most f per sample, up to `max_samples_per_prompt`.
- `elimination` (budgeted successive elimination): Ada's rounds under the budget. Round 0 gives
  every selected prompt n samples; a prompt whose pool is mixed exits, and what the exited
  prompts did not spend goes to the ones still active, M each per round, shrunk to fit.

Both skip, before any rollout, prompts whose posterior says their n-group will be uniform with
probability >= `skip_confidence` (GRESO arXiv 2506.02177), and prompts the budget cannot reach;
the exploration floor forces n samples on a prompt skipped `explore_after` draws in a row, so a
skipped prompt is retested within `explore_after + 1` draws of it whenever the budget covers
n x (forced prompts); the default budget B * n always does.

**The baseline it reduces to.** With the same prior for every prompt (the flat Beta(1, 1), or the
default Beta(1/2, 1/2)) and no history every prompt has the same f, so `posterior` gives each prompt exactly n and `elimination` spends the whole default
budget in round 0: both are GRPO's allocation. Without prompt-specific information nothing can
do better at B * n samples: f is concave and the posterior predictive of a prompt falls with every
uniform outcome, so moving samples from one prompt to another only lowers the expected count of
mixed pools. Gains need history (a pool reused over epochs) or a curated prior.

**Priors and forgetting.** A curated prompt (`meta["curation_k"]` set by ada_core.data.curation, with
its measured pass rate in `prompt.difficulty`) starts from Beta(s/2 + w r k, s/2 + w (1 - r) k),
w = `prior_weight`; any other prompt from Beta(s/2, s/2), s = `prior_strength` (1: Jeffreys' prior,
which suits pass rates piled up near 0 and 1; 2: flat). Evidence from training decays by
`forget` per step since it was seen, because the policy moves and old outcomes describe an older
policy.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

from ada_core.records import Prompt


def moment(a: float, b: float, k: int) -> float:
    """E[p^k] for p ~ Beta(a, b). moment(1, 1, 2) = 1/3."""
    out = 1.0
    for j in range(k):
        out *= (a + j) / (a + b + j)
    return out


def mixed_prob(a: float, b: float, k: int) -> float:
    """f(k) = P(k draws from Bernoulli(p), p ~ Beta(a, b), are not all equal); 0 for k < 2.

    Flat prior, k = 4: 1 - 2/5 = 0.6. Beta(1, 9) (0 of 8 seen, flat prior), k = 4: ~0.30.
    """
    if k < 2:
        return 0.0
    return max(0.0, 1.0 - moment(a, b, k) - moment(b, a, k))


@dataclass
class Belief:
    """What a prompt's history says: pseudo-counts of positives and negatives since its prior."""

    pos: float = 0.0
    neg: float = 0.0
    last_step: int = 0
    skipped_in_a_row: int = 0
    draws: int = 0


class PromptHistory:
    """Per-prompt Beta posteriors over pass rates, kept across steps and saved with the run.

    The sampler calls `posterior` to allocate, `observe` after each step's pools are scored, and
    `skipped`/`sampled` to run the exploration floor. `state_dict` is JSON-able: the trainer puts
    it in checkpoints/step_N/trainer_state.json so a resumed run continues the same posteriors.
    """

    def __init__(self, prior_strength: float = 1.0, prior_weight: float = 1.0, forget: float = 1.0):
        self.prior_strength = prior_strength
        self.prior_weight = prior_weight
        self.forget = forget
        self.step = 0
        self.beliefs: dict[str, Belief] = {}

    def prior(self, prompt: Prompt) -> tuple[float, float]:
        """Beta(s/2, s/2), plus the curated measurement as pseudo-counts (see the module docstring)."""
        half = self.prior_strength / 2.0
        k = prompt.meta.get("curation_k")
        rate = prompt.difficulty
        if isinstance(k, (int, float)) and k > 0 and isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0:
            w = self.prior_weight * float(k)
            return half + w * rate, half + w * (1.0 - rate)
        return half, half

    def posterior(self, prompt: Prompt) -> tuple[float, float]:
        a, b = self.prior(prompt)
        belief = self.beliefs.get(prompt.id)
        if belief is None:
            return a, b
        decay = self.forget ** max(0, self.step - belief.last_step)
        return a + decay * belief.pos, b + decay * belief.neg

    def belief(self, prompt_id: str) -> Belief:
        return self.beliefs.setdefault(prompt_id, Belief(last_step=self.step))

    def observe(self, prompt_id: str, positives: int, negatives: int) -> None:
        """Fold this step's outcomes in: decay the old evidence to now, then add the new counts."""
        belief = self.belief(prompt_id)
        decay = self.forget ** max(0, self.step - belief.last_step)
        belief.pos = decay * belief.pos + positives
        belief.neg = decay * belief.neg + negatives
        belief.last_step = self.step

    def end_step(self) -> None:
        self.step += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "beliefs": {pid: [b.pos, b.neg, b.last_step, b.skipped_in_a_row, b.draws] for pid, b in self.beliefs.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.step = int(state["step"])
            self.beliefs = {
                str(pid): Belief(float(p), float(n), int(last), int(skips), int(draws))
                for pid, (p, n, last, skips, draws) in state["beliefs"].items()
            }
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"sampler state: not a PromptHistory state dict ({err})") from None


def uniform_prob(a: float, b: float, n: int) -> float:
    """P(an n-group is all-positive or all-negative) under Beta(a, b): 1 - f(n)."""
    return 1.0 - mixed_prob(a, b, n)


def select_prompts(
    prompts: list[Prompt], history: PromptHistory, n: int, budget: int, skip_confidence: float, explore_after: int,
) -> tuple[list[int], list[int], dict[int, tuple[float, float]]]:
    """Which prompts may get samples this step: (forced, candidates, posteriors by index).

    forced: skipped `explore_after` draws in a row, retested first (longest run first), as many as
    the budget has n-chunks for. candidates: the rest whose n-group is uniform with probability
    below `skip_confidence`. Everything else is skipped this step.
    """
    posteriors = {i: history.posterior(p) for i, p in enumerate(prompts)}
    overdue = [i for i, p in enumerate(prompts) if history.belief(p.id).skipped_in_a_row >= explore_after]
    overdue.sort(key=lambda i: -history.belief(prompts[i].id).skipped_in_a_row)
    forced = overdue[: budget // n]
    forced_set = set(forced)
    candidates = [
        i for i in range(len(prompts))
        if i not in forced_set and uniform_prob(*posteriors[i], n) < skip_confidence
    ]
    return forced, candidates, posteriors


def greedy_allocation(
    posteriors: list[tuple[float, float]], n: int, budget: int, max_per_prompt: int, start: list[int] | None = None,
) -> list[int]:
    """Samples per prompt maximising sum f_i(k_i) under sum k_i <= budget, k_i in {0} or [n, max].

    A prompt at 0 can take a chunk of n (gain f(n), per sample f(n)/n); a prompt at k >= n one more
    sample (gain f(k+1) - f(k)). Each step takes the best gain per sample that fits; ties go to the
    earlier prompt. `start` pre-allocates (forced prompts get n). Flat priors, budget B*n -> n each.
    """
    alloc = list(start) if start is not None else [0] * len(posteriors)
    remaining = budget - sum(alloc)
    heap: list[tuple[float, int]] = []

    def push(i: int) -> None:
        a, b = posteriors[i]
        k = alloc[i]
        if k >= max_per_prompt:
            return
        step = n if k == 0 else 1
        gain = mixed_prob(a, b, k + step) - mixed_prob(a, b, k)
        if gain > 1e-12:
            heapq.heappush(heap, (-gain / step, i))

    for i in range(len(posteriors)):
        push(i)
    while heap and remaining > 0:
        _, i = heapq.heappop(heap)
        step = n if alloc[i] == 0 else 1
        if step > remaining:
            continue  # a whole n-chunk no longer fits; single samples for others still may
        alloc[i] += step
        remaining -= step
        push(i)
    return alloc


def expected_informative(posteriors: list[tuple[float, float]], alloc: list[int]) -> float:
    return sum(mixed_prob(a, b, k) for (a, b), k in zip(posteriors, alloc))


def step_budget(budget: int | None, prompts: int, n: int) -> int:
    """The step's budget in samples: `budget`, or B * n (GRPO's samples per step) when None."""
    return prompts * n if budget is None else int(budget)


# ---------------------------------------------------------------------------------------------------
# Reinforce-Ada-Est (arXiv 2510.04996v3): the estimation-based realization of the log objective.
# ---------------------------------------------------------------------------------------------------
EST_P_FLOOR = 1e-3  # the lowest estimate the allocation reads: an EMA of a never-solved prompt tends to 0


class EstHistory:
    """Per-prompt pass-rate estimates for `est` (arXiv 2510.04996v3, Algorithm 1): an exponential moving
    average of the prompt's observed pass rate, started from its curation measurement.

        start:  p_hat_x = the prompt's curation pass rate (`prompt.difficulty`, when `meta["curation_k"]` says it
                was measured), else the prior mean a0 / (a0 + b0) (Beta(1, 16) in the authors' code)
        visit:  p_hat_x <- ema * p_hat_x + (1 - ema) * positives / samples

    so the curation prior is only the start, and each visit moves the estimate towards what the current
    policy does (a prompt not drawn keeps its estimate). The allocation reads max(p_hat, EST_P_FLOOR).

    ema 0.9, start 0.25: a visit of 8 samples with 6 positives -> 0.9 * 0.25 + 0.1 * 0.75 = 0.3.
    """

    def __init__(self, ema: float = 0.9, prior: tuple[float, float] | list[float] = (1.0, 16.0)):
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"est: the EMA factor must be in [0, 1), got {ema}")
        self.ema = ema
        self.prior = (float(prior[0]), float(prior[1]))
        self.rates: dict[str, list[float]] = {}  # prompt id -> [p_hat, visits]

    def start(self, prompt: Prompt) -> float:
        k, rate = prompt.meta.get("curation_k"), prompt.difficulty
        if isinstance(k, (int, float)) and k > 0 and isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0:
            return float(rate)
        a0, b0 = self.prior
        return a0 / (a0 + b0)

    def estimate(self, prompt: Prompt) -> float:
        entry = self.rates.get(prompt.id)
        return max(entry[0] if entry is not None else self.start(prompt), EST_P_FLOOR)

    def visit(self, prompt: Prompt, positives: int, samples: int) -> None:
        if samples < 1:
            raise ValueError(f"est: a visit of prompt {prompt.id} needs at least one sample")
        entry = self.rates.get(prompt.id)
        before = entry[0] if entry is not None else self.start(prompt)
        visits = int(entry[1]) + 1 if entry is not None else 1
        self.rates[prompt.id] = [self.ema * before + (1.0 - self.ema) * positives / samples, visits]

    def state_dict(self) -> dict[str, Any]:
        return {"est_ema": {pid: list(entry) for pid, entry in self.rates.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(state, dict) and "est" in state and "est_ema" not in state:
            raise ValueError("sampler state: a checkpoint of the earlier `est` (discounted counts, before v3's EMA); "
                             "it cannot continue under this sampler: start the run afresh")
        try:
            self.rates = {str(pid): [float(p), int(v)] for pid, (p, v) in state["est_ema"].items()}
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"sampler state: not an EstHistory state dict ({err})") from None


def est_allocation(p_hat: list[float], budget: int, n_min: int, n_max: int) -> list[int]:
    """Samples per prompt for the log objective: N_x proportional to 1/sqrt(p_hat_x), clipped to
    [n_min, n_max], summing to exactly `budget`.

    The real-valued allocation is clip(c / sqrt(p_hat_x), n_min, n_max) with the one scale c that makes
    it sum to `budget` (the sum is continuous and non-decreasing in c: bisection). It is then rounded
    down and the samples left over go one each to the largest fractional parts (ties: earlier prompt),
    which never passes n_max (a value at n_max has no fractional part).

    p_hat [1/4, 1/16, 1], budget 14, bounds [2, 8] -> c = 2 -> [4, 8, 2].
    """
    count = len(p_hat)
    if count == 0:
        return []
    if not count * n_min <= budget <= count * n_max:
        raise ValueError(f"est: a budget of {budget} samples cannot give {count} prompts {n_min}..{n_max} each")
    if any(not 0.0 < p <= 1.0 for p in p_hat):
        raise ValueError(f"est: every pass-rate estimate must be in (0, 1], got {min(p_hat)}..{max(p_hat)}")
    raw = [1.0 / math.sqrt(p) for p in p_hat]

    def spread(c: float) -> list[float]:
        return [min(max(c * r, n_min), n_max) for r in raw]

    low, high = 0.0, n_max / min(raw)  # spread(high) is all n_max
    for _ in range(200):
        mid = (low + high) / 2
        if sum(spread(mid)) < budget:
            low = mid
        else:
            high = mid
    values = spread(high)
    alloc = [min(n_max, max(n_min, math.floor(v + 1e-9))) for v in values]
    left = budget - sum(alloc)
    order = sorted(range(count), key=lambda i: (-(values[i] - alloc[i]), i))
    while left > 0:  # one pass suffices; the loop only guards against rounding at the bounds
        for i in order:
            if left > 0 and alloc[i] < n_max:
                alloc[i] += 1
                left -= 1
    while left < 0:  # float error rounded a value up past the budget: take back from the smallest parts
        for i in reversed(order):
            if left < 0 and alloc[i] > n_min:
                alloc[i] -= 1
                left += 1
    return alloc


def est_weights(pass_rates: list[float], eps: float) -> list[float]:
    """v3's Algorithm 1 weight of each prompt's advantages, from this step's pool: 1 / sqrt(r_bar_x + eps),
    unnormalised. With N_x proportional to 1/sqrt(p_hat_x) samples each, a prompt's summed weight is then
    about 1 / p_x, the gradient of the log objective. r_bar [0.25, 1.0], eps 0 -> [2.0, 1.0]."""
    return [1.0 / math.sqrt(r + eps) for r in pass_rates]
