"""The simulation benchmark: the REAL samplers driven by a Bernoulli rollout engine.

Each prompt has a true pass rate (`prompt.meta["pass_rate"]`). The engine answers "1" with that
probability and "0" otherwise; the verifier reads the text back. Nothing is learned, so the
benchmark isolates what each sampler spends (generated samples) against what it yields (groups with a
nonzero advantage). `ada simulate` runs it; docs/benchmarks/simulation.md records the results.

Pass rates come from `DifficultyMix`: a mass of unsolvable prompts (p = 0), a mass of solved ones
(p = 1), and the rest Beta(a, b). The default gives about 70% zero-variance groups at n = 4.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ada_core import metrics as mk
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.data.source import PromptSource
from ada_core.protocols import RolloutEngine, SamplingParams, Verdict
from ada_core.records import Prompt, PromptPool, RolloutBatch, Sample, VerifierStatus
from ada_core.sampling.allocation import greedy_allocation, step_budget
from ada_core.sampling.budget import matched_grpo_prompts
from ada_core.sampling.rounds import downsample_balanced, draw_and_score, make_group
from ada_core.sampling.samplers import make_sampler
from ada_core.sampling.step_metrics import StepClock, step_metrics


@dataclass(frozen=True)
class DifficultyMix:
    """Distribution of true pass rates: P(p=0) = frac_zero, P(p=1) = frac_one, otherwise Beta(a, b)."""

    frac_zero: float = 0.2
    frac_one: float = 0.15
    beta_a: float = 0.5
    beta_b: float = 0.5

    def draw(self, num: int, rng: np.random.Generator) -> np.ndarray:
        if not (0 <= self.frac_zero and 0 <= self.frac_one and self.frac_zero + self.frac_one <= 1):
            raise ValueError(f"difficulty: frac_zero={self.frac_zero} and frac_one={self.frac_one} must be >= 0, sum <= 1")
        kind = rng.random(num)
        rates = rng.beta(self.beta_a, self.beta_b, size=num)
        rates[kind < self.frac_zero] = 0.0
        rates[(kind >= self.frac_zero) & (kind < self.frac_zero + self.frac_one)] = 1.0
        return rates

    def zero_variance_frac(self, n: int) -> float:
        """Expected share of n-sample groups with all-equal rewards: E[p^n + (1-p)^n] (exact Beta moments)."""
        a, b = self.beta_a, self.beta_b
        beta_moment = lambda x, y: math.prod((x + k) / (x + y + k) for k in range(n))  # E[p^n] for Beta(x, y)
        middle = 1.0 - self.frac_zero - self.frac_one
        return self.frac_zero + self.frac_one + middle * (beta_moment(a, b) + beta_moment(b, a))


def make_prompts(num: int, rng: np.random.Generator, mix: DifficultyMix = DifficultyMix(),
                 curation_k: int = 0) -> list[Prompt]:
    """`num` prompts `sim-0`, `sim-1`, ... with pass rates drawn from `mix`.

    With `curation_k` > 0 each prompt also carries what ada_core.data.curation would have measured: the
    pass rate of `curation_k` draws in `prompt.difficulty` and `meta["curation_k"]` (the budgeted
    sampler's prior reads these; the true rate stays in `meta["pass_rate"]`, which only the engine reads).
    """
    rates = mix.draw(num, rng)
    measured = rng.binomial(curation_k, rates) / curation_k if curation_k > 0 else [None] * num
    prompts = []
    for i, (p, m) in enumerate(zip(rates, measured)):
        meta = {"pass_rate": float(p)}
        if m is not None:
            meta["curation_k"] = curation_k
        prompts.append(Prompt(id=f"sim-{i}", text=f"sim prompt {i}", answer="1", source="simulate",
                              difficulty=None if m is None else float(m), meta=meta))
    return prompts


def pass_rate(prompt: Prompt) -> float:
    p = prompt.meta.get("pass_rate")
    if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"prompt {prompt.id!r}: meta['pass_rate'] must be a number in [0, 1], got {p!r}")
    return float(p)


@dataclass
class BernoulliEngine(RolloutEngine):
    """A RolloutEngine whose sample is "1" with probability `prompt.meta["pass_rate"]`, else "0".

    Completion lengths are uniform on [min_tokens, max_tokens_drawn]; a length past
    `sampling.max_tokens` is cut there and marked truncated. Each token's log-prob is log P(outcome)
    spread evenly, so a sample's summed log-prob is the log-probability of its outcome. Seeded by
    `sampling.seed`: the same seed gives the same samples.
    """

    min_tokens: int = 4
    max_tokens_drawn: int = 16

    def generate(self, requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams) -> list[list[Sample]]:
        rng = np.random.default_rng(sampling.seed)
        out = []
        for prompt, k in requests:
            p = pass_rate(prompt)
            correct = rng.random(k) < p
            lengths = rng.integers(self.min_tokens, self.max_tokens_drawn + 1, size=k)
            samples = []
            for ok, length in zip(correct.tolist(), lengths.tolist()):
                kept = min(length, sampling.max_tokens)
                logp = math.log(p if ok else 1.0 - p) / kept
                samples.append(
                    Sample(prompt.id, [1 if ok else 0] * kept, [logp] * kept, "1" if ok else "0", truncated=length > kept)
                )
            out.append(samples)
        return out


class BernoulliVerifier:
    """Reads the Bernoulli engine's text: "1" -> 1.0, "0" -> 0.0, anything else a parse error (0.0)."""

    def verify(self, items: Sequence[tuple[Prompt, str]], within_s: float | None = None) -> list[Verdict]:
        """A table lookup: every batch is scored long before any deadline."""
        table = {"1": Verdict(1.0), "0": Verdict(0.0)}
        return [table.get(text.strip(), Verdict(0.0, VerifierStatus.PARSE_ERROR)) for _, text in items]


ORACLE_RULES = {
    "mixed": lambda n: (1, 1),  # the fewest samples for a group with a nonzero advantage
    "balance": lambda n: (n // 2, n - n // 2),  # the fewest samples for Ada-balance's target group
}


@dataclass
class OracleSampler:
    """A sampler that knows every pass rate: the floor on generated samples per informative group.

    It skips prompts with p in {0, 1}: no sample can make their group mixed (exit reason `skipped`,
    zero samples, still counted as drawn). For the others it draws n samples, then ONE at a time,
    stopping as soon as the pool holds the rule's positives and negatives (`mixed`: >= 1 of each;
    `balance`: n//2 and n - n//2), at most `max_samples_per_prompt` (Ada's M0 + (N-1) M) each. Pools
    that reach the cap are kept like Ada's `keep`. With this cap no sampler gets a mixed pool more
    often, and none stops sooner.
    """

    rule: str = "mixed"
    n: int = 4
    max_samples_per_prompt: int = 32
    advantage: AdvantageConfig = field(default_factory=lambda: AdvantageConfig(name="global_mean"))

    def sample(self, prompts, engine, verifier, sampling, rng, source=None) -> RolloutBatch:
        clock = StepClock()
        cfg = SamplerConfig(name="fixed", n=self.n)  # threshold and n for the shared helpers
        need_pos, need_neg = ORACLE_RULES[self.rule](self.n)
        pools = [PromptPool(p) for p in prompts]
        active = []
        for pool in pools:
            if 0.0 < pass_rate(pool.prompt) < 1.0:
                active.append(pool)
            else:
                pool.exit_reason = "skipped"
        r = 0
        while active:
            k = self.n if r == 0 else 1
            clock.active_per_round.append(len(active))
            drawn = draw_and_score([(pool.prompt, k) for pool in active], r, engine, verifier, sampling, rng, clock)
            still_active = []
            for pool, samples in zip(active, drawn):
                pool.samples.extend(samples)
                pool.rounds = r + 1
                pos = pool.num_positive(cfg.positive_threshold)
                if pos >= need_pos and len(pool.samples) - pos >= need_neg:
                    pool.exit_reason = self.rule
                elif len(pool.samples) >= self.max_samples_per_prompt:
                    pool.exit_reason = "unresolved"
                else:
                    still_active.append(pool)
            active, r = still_active, r + 1
        groups = [
            make_group(pool, downsample_balanced(pool.samples, self.n, cfg.positive_threshold, rng), self.advantage,
                       cfg.positive_threshold)
            for pool in pools if pool.samples
        ]
        batch_metrics = step_metrics(
            pools, groups, clock, cfg.positive_threshold, [self.rule, "unresolved", "skipped"], (need_pos, need_neg)
        )
        batch_metrics[mk.SAMPLER_TIME_S] = clock.bookkeeping_s()
        return RolloutBatch(groups, batch_metrics, pools)


@dataclass
class BudgetOracle:
    """The budgeted samplers' ceiling: the same greedy allocation under the same budget (default B x n)
    and per-prompt cap, but with every TRUE pass rate, so f(k) = 1 - p^k - (1-p)^k is known exactly.

    p in {0, 1} is skipped (f = 0). One engine call. No sampler with that budget and cap expects more
    mixed pools from a static allocation.
    """

    n: int = 4
    budget: int | None = None
    max_samples_per_prompt: int = 16
    advantage: AdvantageConfig = field(default_factory=lambda: AdvantageConfig(name="global_mean"))

    def sample(self, prompts, engine, verifier, sampling, rng, source=None) -> RolloutBatch:
        clock = StepClock()
        threshold = SamplerConfig().positive_threshold
        budget = step_budget(self.budget, len(prompts), self.n)
        known = [(pass_rate(p) * 1e9, (1.0 - pass_rate(p)) * 1e9) for p in prompts]  # Beta with no spread
        alloc = greedy_allocation(known, self.n, budget, self.max_samples_per_prompt)
        pools = [PromptPool(p, exit_reason="skipped") for p in prompts]
        requests = [(i, k) for i, k in enumerate(alloc) if k > 0]
        if requests:
            clock.active_per_round.append(len(requests))
            drawn = draw_and_score([(prompts[i], k) for i, k in requests], 0, engine, verifier, sampling, rng, clock)
            for (i, _), samples in zip(requests, drawn):
                pools[i].samples, pools[i].rounds = samples, 1
                pos = pools[i].num_positive(threshold)
                pools[i].exit_reason = "mixed" if 0 < pos < len(samples) else "unresolved"
        groups = [make_group(pool, downsample_balanced(pool.samples, self.n, threshold, rng), self.advantage, threshold)
                  for pool in pools if pool.samples]
        batch_metrics = step_metrics(pools, groups, clock, threshold, ["mixed", "unresolved", "skipped"], (1, 1))
        batch_metrics[mk.SAMPLER_TIME_S] = clock.bookkeeping_s()
        return RolloutBatch(groups, batch_metrics, pools)


def default_methods() -> dict[str, object]:
    """Method name -> sampler: GRPO n = 4..32, DAPO, Ada (reference M=8 and tiny-profile M=4), oracle, the
    budgeted samplers, the research samplers' presets and every registered plugin sampler's."""
    grpo, global_mean = AdvantageConfig(name="grpo"), AdvantageConfig(name="global_mean")
    methods: dict[str, object] = {
        f"grpo-n{n}": make_sampler(SamplerConfig(name="fixed", n=n), grpo) for n in (4, 8, 16, 32)
    }
    methods["dapo"] = make_sampler(SamplerConfig(name="dynamic_filter", n=4, max_gen_batches=3), grpo)
    for M in (8, 4):
        for rule in ("pos", "balance"):
            cfg = SamplerConfig(name="ada", exit_rule=rule, n=4, M=M, N=4)
            methods[f"ada-{rule}-m{M}"] = make_sampler(cfg, global_mean)
    methods["oracle-mixed"] = OracleSampler(rule="mixed", n=4, max_samples_per_prompt=32)
    methods["oracle-balance"] = OracleSampler(rule="balance", n=4, max_samples_per_prompt=32)
    methods.update(budgeted_methods())
    methods.update(registered_methods())
    return methods


def registered_methods() -> dict[str, object]:
    """Every preset a sampler brought through `register_sampler(presets=...)`, by preset name: the research samplers
    (ada_core/sampling/research.py) and every plugin's (docs/SAMPLERS.md), built from their sampler and advantage
    sections over the defaults, as `ada train --preset` builds them."""
    from ada_core.config.presets import PRESETS, preset_names
    from ada_core.config.registry import get_sampler

    methods: dict[str, object] = {}
    for preset in preset_names():
        section = PRESETS[preset]
        if preset in get_sampler(section["sampler"]["name"]).presets:
            methods[preset] = make_sampler(SamplerConfig(**section["sampler"]), AdvantageConfig(**section["advantage"]))
    return methods


def budgeted_methods() -> dict[str, object]:
    """The fixed-budget samplers at GRPO n=4's samples per step (B x 4), with the tiny profile's M = 4,
    N = 4 (cap 16 per prompt), and their ceiling with known pass rates."""
    global_mean = AdvantageConfig(name="global_mean")
    methods: dict[str, object] = {}
    for name, allocation in (("ada-posterior", "posterior"), ("ada-budget", "elimination")):
        cfg = SamplerConfig(name="budgeted", allocation=allocation, n=4, M=4, N=4)
        methods[name] = make_sampler(cfg, global_mean)
    methods["ada-est"] = make_sampler(SamplerConfig(name="est", n=4), global_mean)  # the paper's Est
    methods["oracle-budget"] = BudgetOracle(n=4, max_samples_per_prompt=16)
    return methods


def run_simulation(
    num_prompts: int = 512, steps: int = 4, seed: int = 0, mix: DifficultyMix = DifficultyMix(),
    methods: dict[str, object] | None = None, pool: int | None = None, curation_k: int = 0,
) -> dict[str, dict[str, float]]:
    """Run every method for `steps` steps of `num_prompts` prompts; return a summary per method.

    All methods see the same dataset (`pool` prompts, default 8 x num_prompts), the same prompt order
    (a PromptSource seeded by `seed`) and the same per-step rng seeds, so differences come from the
    samplers. A pool smaller than steps x num_prompts is reused over epochs (the paper's regime, where
    a prompt's history can inform its next draw); the default never repeats a prompt in 8 steps.
    `curation_k` gives every prompt a curated pass-rate measurement (see `make_prompts`).
    """
    if num_prompts < 1 or steps < 1:
        raise ValueError(f"num_prompts and steps must be >= 1, got {num_prompts} and {steps}")
    if pool is not None and pool < num_prompts:
        raise ValueError(f"pool={pool} must hold at least num_prompts={num_prompts} prompts")
    dataset = make_prompts(pool or 8 * num_prompts, np.random.default_rng(seed), mix, curation_k)
    engine, verifier, sampling = BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14)
    results = {}
    for name, sampler in (methods or default_methods()).items():
        source = PromptSource(dataset, seed=seed)
        totals: dict[str, float] = {}
        informative = kept = fell_back = 0
        for step in range(steps):
            rng = np.random.default_rng([seed, step])
            batch = sampler.sample(source.take(num_prompts), engine, verifier, sampling, rng, source=source)
            for key, value in batch.metrics.items():
                totals[key] = totals.get(key, 0.0) + value
            informative += sum(not g.is_uniform for g in batch.groups)
            kept += len(batch.groups)
            fell_back += int(batch.metrics.get(mk.SAMPLER_FELL_BACK, 0.0))
        results[name] = summarize(totals, informative, kept, fell_back, num_prompts, steps)
    return results


def summarize(totals: dict[str, float], informative: int, kept: int, fell_back: int, num_prompts: int, steps: int):
    """Per-method summary from metric totals over the steps (see docs/benchmarks/simulation.md for each field)."""
    drawn = totals[mk.SAMPLER_PROMPTS_DRAWN]
    generated = totals[mk.BUDGET_GENERATED_SAMPLES]
    per_step = generated / steps
    return {
        "effective_ratio": informative / drawn,
        "informative_per_step_prompt": informative / (steps * num_prompts),
        "samples_per_prompt_drawn": generated / drawn,
        "generated_samples_per_step": per_step,
        "generated_samples_per_step_prompt": per_step / num_prompts,
        "generated_per_informative_group": generated / informative if informative else float("inf"),
        "generated_tokens_per_step": totals[mk.BUDGET_GENERATED_TOKENS] / steps,
        "trained_samples_per_step": totals[mk.BUDGET_TRAINED_SAMPLES] / steps,
        "prompts_drawn_per_step": drawn / steps,
        "groups_kept_per_step": kept / steps,
        "zero_variance_frac": (totals[mk.SAMPLER_ALL_CORRECT_FRAC] + totals[mk.SAMPLER_ALL_WRONG_FRAC]) / steps,
        "unresolved_frac": totals.get(mk.SAMPLER_UNRESOLVED, 0.0) / drawn,
        "rounds_mean": totals[mk.SAMPLER_ROUNDS] / steps,
        "fell_back_steps": float(fell_back),
        "matched_grpo_n4_prompts": float(matched_grpo_prompts(per_step, 4)),
        "bookkeeping_us_per_step": 1e6 * totals[mk.SAMPLER_TIME_S] / steps,
    }


TABLE_COLUMNS = [
    ("effective_ratio", "eff.ratio", "{:.3f}"),
    ("samples_per_prompt_drawn", "samples/prompt", "{:.2f}"),
    ("generated_samples_per_step", "gen/step", "{:.0f}"),
    ("generated_per_informative_group", "gen/informative", "{:.2f}"),
    ("trained_samples_per_step", "trained/step", "{:.0f}"),
    ("zero_variance_frac", "zero-var", "{:.3f}"),
    ("unresolved_frac", "unresolved", "{:.3f}"),
    ("matched_grpo_n4_prompts", "matched B(n=4)", "{:.0f}"),
]


def format_table(results: dict[str, dict[str, float]]) -> str:
    """A markdown table, one row per method."""
    header = "| method | " + " | ".join(title for _, title, _ in TABLE_COLUMNS) + " |"
    rows = [header, "|" + "---|" * (len(TABLE_COLUMNS) + 1)]
    for name, summary in results.items():
        cells = [fmt.format(summary[key]) for key, _, fmt in TABLE_COLUMNS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(results: dict[str, dict[str, float]], path: str) -> None:
    """Left: informative groups per step prompt against samples generated per step prompt (GRPO's n
    sweep as a curve). Right: generated samples per informative group, per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    grpo = [name for name in results if name.startswith("grpo-")]
    xs = [results[m]["generated_samples_per_step_prompt"] for m in grpo]
    ys = [results[m]["informative_per_step_prompt"] for m in grpo]
    left.plot(xs, ys, "o-", color="grey", label="GRPO n=4..32")
    for m, x, y in zip(grpo, xs, ys):
        left.annotate(m, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    for m in results:
        if m not in grpo:
            r = results[m]
            left.plot(r["generated_samples_per_step_prompt"], r["informative_per_step_prompt"], "s", label=m)
    left.set_xscale("log", base=2)
    left.set_xlabel("generated samples per step prompt (log2)")
    left.set_ylabel("groups with nonzero advantage per step prompt")
    left.set_title("What each sampler buys")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    names = list(results)
    bars = right.barh(names, [results[m]["generated_per_informative_group"] for m in names], color="tab:blue")
    right.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    right.invert_yaxis()
    right.set_xlabel("generated samples per informative group (lower is better)")
    right.set_title("Cost of one learning signal")
    right.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
