"""The research samplers (ada_core/sampling/research.py; issue #37): each one's budget, its rule on a hand-computed
case, resume, strict options, its preset and its row in `ada simulate`."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from ada_core.config import AdvantageConfig, ConfigError, SamplerConfig, build_config
from ada_core.data.source import PromptSource
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt, Sample
from ada_core.sampling import make_sampler
from ada_core.sampling.allocation import PromptHistory, mixed_prob
from ada_core.sampling.research import (AdaV3wSampler, GresoSampler, KnapsackSampler, PilotSampler, fill_budget,
                                        knapsack_value, pool_mixed_prob, v3_weight)
from ada_core.sampling.samplers import AdaSampler
from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, make_prompts

SAMPLING = SamplingParams(max_tokens=14)
GRPO, GLOBAL_MEAN = AdvantageConfig(name="grpo"), AdvantageConfig(name="global_mean")


def sampler(name: str, n: int = 4, advantage: AdvantageConfig = GRPO, **options):
    return make_sampler(SamplerConfig(name=name, n=n, options=options), advantage)


def step(s, prompts, seed, source=None, engine=None):
    return s.sample(prompts, engine or BernoulliEngine(), BernoulliVerifier(), SAMPLING, np.random.default_rng(seed),
                    source=source)


def prompt(pid: str, pass_rate: float, curated: tuple[int, float] | None = None) -> Prompt:
    meta = {"pass_rate": pass_rate}
    if curated:
        meta["curation_k"] = curated[0]
    return Prompt(id=pid, text=pid, answer="1", source="test", difficulty=curated[1] if curated else None, meta=meta)


class ScriptedEngine(BernoulliEngine):
    """Each prompt's samples follow `meta["script"]` ("10": 1, 0, 1, 0, ... across every call of the test)."""

    def __init__(self):
        super().__init__()
        self.drawn: dict[str, int] = {}

    def generate(self, requests, sampling):
        out = []
        for p, k in requests:
            script, start = p.meta["script"], self.drawn.get(p.id, 0)
            self.drawn[p.id] = start + k
            texts = [script[(start + j) % len(script)] for j in range(k)]
            out.append([Sample(p.id, [1] * 4, [-0.1] * 4, t) for t in texts])
        return out


def scripted(pid: str, script: str) -> Prompt:
    return Prompt(id=pid, text=pid, answer="1", source="test", meta={"pass_rate": 0.5, "script": script})


def sizes(batch) -> dict[str, int]:
    return {pool.prompt.id: len(pool.samples) for pool in batch.pools}


# --- the shared fill --------------------------------------------------------------------------------
def test_fill_budget_is_greedy_by_gain_per_sample_and_spends_the_budget_exactly():
    weight = [1.0, 0.5, 0.0]  # prompt 0 worth 1 a sample, prompt 1 worth 0.5, prompt 2 nothing
    gain = lambda i, k: weight[i] * k  # noqa: E731
    assert fill_budget(gain, 3, 8, first=2, cap=4) == [4, 4, 0]
    # 9 cannot stay on the two worth anything (cap 4): a third prompt opens with `first`, moved from the largest
    assert fill_budget(gain, 3, 9, first=2, cap=4) == [3, 4, 2]
    assert fill_budget(lambda i, k: 0.0, 3, 7, first=2, cap=4) == [3, 2, 2]  # no gains at all: spread, exact
    with pytest.raises(ValueError, match="cannot be spread"):
        fill_budget(gain, 3, 13, first=2, cap=4)


# --- knapsack ---------------------------------------------------------------------------------------
def test_knapsack_value_on_a_hand_computed_case():
    # Beta(1, 3): E[p^4] = 1/35, E[(1-p)^4] = 3/7; p_hat = 1/4, InfoGain = 1/4 x (3/4)^2 = 9/64
    assert knapsack_value(1.0, 3.0, 4) == pytest.approx((1 - 1 / 35 - 3 / 7) * 9 / 64)
    assert knapsack_value(1.0, 3.0, 1) == 0.0  # one sample can never be mixed


def test_knapsack_allocation_is_the_exhaustive_optimum_of_its_value_on_a_small_case():
    beliefs = [(0.5 + 1, 0.5 + 15), (0.5 + 4, 0.5 + 12), (0.5 + 16, 0.5 + 0)]  # curated 1/16, 4/16, 16/16
    value = lambda i, k: knapsack_value(*beliefs[i], k)  # noqa: E731
    greedy = fill_budget(value, 3, 12, first=2, cap=8)
    choices = [0] + list(range(2, 9))
    best = max((c for c in itertools.product(choices, repeat=3) if sum(c) == 12),
               key=lambda c: sum(value(i, k) for i, k in enumerate(c)))
    assert sum(greedy) == 12
    assert sum(value(i, k) for i, k in enumerate(greedy)) == pytest.approx(sum(value(i, k) for i, k in enumerate(best)))
    # the solved prompt gets nothing; 4/16 more than 1/16: InfoGain p (1-p)^2 peaks at p = 1/3
    assert greedy == [4, 8, 0]


def test_knapsack_spends_b_times_n_in_one_call_trains_every_sample_and_follows_its_rule():
    prompts = [prompt("hard", 0.05, (16, 1 / 16)), prompt("mid", 0.25, (16, 4 / 16)), prompt("solved", 1.0, (16, 1.0))]
    s = sampler("knapsack", max_samples=8)
    beliefs = [s.history.posterior(p) for p in prompts]
    expected = fill_budget(lambda i, k: knapsack_value(*beliefs[i], k), 3, 12, 2, 8)
    batch = step(s, prompts, 0)
    assert list(sizes(batch).values()) == expected
    assert batch.metrics["budget/generated_samples"] == 12 == batch.metrics["budget/trained_samples"]
    assert batch.metrics["sampler/rounds"] == 1 and batch.metrics["sampler/exit_skipped"] == 1
    assert {g.prompt.id: len(g.samples) for g in batch.groups} == {"hard": expected[0], "mid": expected[1]}


@pytest.mark.parametrize("n, options", [(4, {}), (8, {"max_samples": 32}), (4, {"min_samples": 3, "max_samples": 6})])
def test_knapsack_spends_exactly_its_budget_every_step(n, options):
    rng = np.random.default_rng(0)
    dataset = make_prompts(64, rng, curation_k=8)
    s, source = sampler("knapsack", n=n, **options), PromptSource(dataset, seed=0)
    for t in range(6):  # the pool of 64 comes back: the history moves the allocation
        batch = step(s, source.take(16), t, source)
        assert batch.metrics["budget/generated_samples"] == 16 * n == batch.metrics["budget/trained_samples"]
        given = [len(p.samples) for p in batch.pools if p.samples]
        assert min(given) >= s_min(options) and max(given) <= options.get("max_samples", 16)


def s_min(options) -> int:
    return options.get("min_samples", 2)


def test_knapsack_without_information_is_grpo():
    """Same prior for every prompt, no history: equal values, so n each (the concave fill splits evenly)."""
    batch = step(sampler("knapsack"), make_prompts(8, np.random.default_rng(1)), 0)
    assert set(sizes(batch).values()) == {4}


# --- pilot ------------------------------------------------------------------------------------------
def test_pool_mixed_prob_after_a_pilot():
    assert pool_mixed_prob(1.5, 1.5, 1, 1, 0) == 1.0  # already mixed
    assert pool_mixed_prob(0.5, 2.5, 0, 2, 0) == 0.0
    assert pool_mixed_prob(0.5, 2.5, 0, 2, 1) == pytest.approx(0.5 / 3)  # P(the next is positive) = E[p] = 1/6
    assert pool_mixed_prob(0.5, 0.5, 0, 0, 4) == pytest.approx(mixed_prob(0.5, 0.5, 4))


@pytest.mark.parametrize("value, expected", [("mixed", {"mix": 2, "hard": 5, "easy": 5}),
                                             ("signal", {"mix": 8, "hard": 2, "easy": 2})])
def test_pilot_stage_two_on_a_hand_computed_case(value, expected):
    """Pilots of 2: `mix` 1 and 0, `hard` 0 and 0, `easy` 1 and 1; stage 2 holds 3 x 4 - 6 = 6 samples.
    `mixed`: a mixed pilot gains nothing; hard and easy are symmetric, so 3 each. `signal`: the mixed pilot gains
    1 a sample, more than hard's first 3 x E[p] = 3/6, so it takes all 6 (to the cap 8)."""
    prompts = [scripted("mix", "10"), scripted("hard", "0"), scripted("easy", "1")]
    batch = step(sampler("pilot", value=value), prompts, 0, engine=ScriptedEngine())
    assert sizes(batch) == expected
    assert batch.metrics["budget/generated_samples"] == 12 == batch.metrics["budget/trained_samples"]
    assert batch.metrics["sampler/pilot_mixed_frac"] == pytest.approx(1 / 3)
    assert batch.metrics["sampler/rounds"] == 2


@pytest.mark.parametrize("options", [{}, {"value": "signal"}, {"pilot": 3, "max_samples": 12}])
def test_pilot_spends_exactly_b_times_n(options):
    s = sampler("pilot", **options)
    for t in range(3):
        batch = step(s, make_prompts(32, np.random.default_rng(t)), t)
        assert batch.metrics["budget/generated_samples"] == 128 == batch.metrics["budget/trained_samples"]
        assert all(options.get("pilot", 2) <= len(p.samples) <= options.get("max_samples", 8) for p in batch.pools)


# --- greso ------------------------------------------------------------------------------------------
def test_greso_skips_a_predicted_zero_variance_prompt_replaces_it_and_retests_it_at_the_floor():
    dataset = [prompt(f"r{i}", 0.5) for i in range(40)]
    source = PromptSource(dataset, seed=0)
    s = sampler("greso", explore_prob=0.0, explore_after=2)
    s.history.observe("dead", 0, 20)  # Beta(1/2, 20 1/2): P(uniform 4-group) ~ 0.91 >= 0.8
    assert s.predicted_uniform(prompt("dead", 0.0)) == pytest.approx(
        math.prod((20.5 + j) / (21 + j) for j in range(4)) + math.prod((0.5 + j) / (21 + j) for j in range(4)))
    for t, retested in enumerate([False, False, True]):
        batch = step(s, [prompt("dead", 0.0), prompt(f"fresh{t}", 0.5)], t, source)
        dead = next(p for p in batch.pools if p.prompt.id == "dead")
        assert (len(dead.samples) == 4) == retested
        assert batch.metrics["budget/generated_samples"] == 8 == batch.metrics["budget/trained_samples"]
        assert len(batch.groups) == 2  # still B prompts trained: a replacement from the source took its place
        assert batch.metrics["sampler/skipped"] == (0 if retested else 1)
        assert batch.metrics["sampler/replaced"] == (0 if retested else 1)
        assert dead.exit_reason == ("uniform" if retested else "skipped")


def test_greso_explores_a_prompt_it_would_skip_with_explore_prob():
    s = sampler("greso", explore_prob=1.0)
    s.history.observe("dead", 0, 20)
    batch = step(s, [prompt("dead", 0.0), prompt("b", 0.5)], 0, PromptSource([prompt("c", 0.5)] * 1, seed=0))
    assert sizes(batch)["dead"] == 4 and batch.metrics["sampler/explored"] == 1


def test_greso_on_fresh_prompts_is_grpo():
    """No history, Jeffreys prior: P(uniform 4-group) = 2 E[p^4] = 0.547 < 0.8, so nothing is skipped."""
    batch = step(sampler("greso"), make_prompts(16, np.random.default_rng(0)), 0)
    assert set(sizes(batch).values()) == {4} and batch.metrics["sampler/skipped"] == 0


def test_greso_in_a_revisited_pool_spends_b_times_n_and_skips():
    rng = np.random.default_rng(0)
    dataset = make_prompts(48, rng)  # 20% p = 0, 15% p = 1: they come back and get skipped
    s, source = sampler("greso", explore_prob=0.0), PromptSource(dataset, seed=0)
    skipped = 0.0
    for t in range(10):
        batch = step(s, source.take(16), t, source)
        assert batch.metrics["budget/generated_samples"] == 64 and len(batch.groups) == 16
        skipped += batch.metrics["sampler/skipped"]
    assert skipped > 0


# --- ada_v3w ----------------------------------------------------------------------------------------
def test_v3_weight_on_a_hand_computed_case():
    assert v3_weight(2, 8, 0.0) == pytest.approx(2.0)
    assert v3_weight(8, 8, 0.0) == pytest.approx(1.0)


def test_ada_v3w_is_adas_elimination_with_each_group_weighted_by_its_pool_rate():
    prompts = make_prompts(16, np.random.default_rng(3))
    ada = make_sampler(SamplerConfig(name="ada", n=4, exit_rule="balance", M=4, N=3), GLOBAL_MEAN)
    v3w = sampler("ada_v3w", advantage=GLOBAL_MEAN, M=4, N=3, eps=1e-6)
    a, w = step(ada, prompts, 5), step(v3w, prompts, 5)
    assert sizes(a) == sizes(w)
    assert a.metrics["budget/generated_samples"] == w.metrics["budget/generated_samples"]
    weights = []
    for ga, gw in zip(a.groups, w.groups):
        weight = 1 / math.sqrt(ga.pool_positives / ga.pool_size + 1e-6)
        assert gw.advantages == pytest.approx([x * weight for x in ga.advantages])
        if 0 < ga.pool_positives < ga.pool_size:
            weights.append(weight)
    assert w.metrics["sampler/v3w_weight_max"] == pytest.approx(max(weights))
    assert isinstance(ada, AdaSampler) and isinstance(v3w, AdaV3wSampler)


def test_ada_v3w_options_change_adas_rounds():
    prompts = make_prompts(16, np.random.default_rng(3))
    few, many = (step(sampler("ada_v3w", M=m, N=n), prompts, 0) for m, n in ((4, 1), (8, 4)))
    assert few.metrics["budget/generated_samples"] == 64 < many.metrics["budget/generated_samples"]
    dropped = step(sampler("ada_v3w", unresolved="drop"), prompts, 0)
    assert len(dropped.groups) < len(step(sampler("ada_v3w"), prompts, 0).groups)


# --- resume, options, presets, simulate ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["knapsack", "greso", "pilot", "ada_v3w"])
def test_resume_continues_identically(name):
    dataset = make_prompts(40, np.random.default_rng(0), curation_k=8)
    first, source = sampler(name), PromptSource(dataset, seed=0)
    for t in range(4):
        step(first, source.take(10), t, source)
    state = json.loads(json.dumps(first.state_dict()))  # as trainer_state.json holds it
    resumed = sampler(name)
    resumed.load_state_dict(state)
    cursor = source.state_dict()
    prompts = source.take(10)
    a = step(first, prompts, 9, source)
    source.load_state_dict(cursor)  # the resumed run's source, from the same checkpoint
    assert source.take(10) == prompts
    b = step(resumed, prompts, 9, source)
    assert [(p.prompt.id, [s.reward for s in p.samples]) for p in a.pools] == \
           [(p.prompt.id, [s.reward for s in p.samples]) for p in b.pools]
    assert json.dumps(first.state_dict()) == json.dumps(resumed.state_dict())
    if name in ("knapsack", "greso"):
        assert state["beliefs"]  # the history is what resumes
        assert isinstance(first, (KnapsackSampler, GresoSampler))
    else:
        assert state is None and isinstance(first, (PilotSampler, AdaV3wSampler))


@pytest.mark.parametrize("preset, options, field", [
    ("knapsack", {"nope": 1}, "sampler.options.nope"),
    ("knapsack", {"min_samples": 1}, "sampler.options.min_samples"),
    ("knapsack", {"min_samples": 6, "max_samples": 4}, "max_samples (4) must be >= min_samples (6)"),
    ("pilot", {"value": "best"}, "sampler.options.value"),
    ("greso", {"skip_above": 0.0}, "sampler.options.skip_above"),
    ("greso", {"explore_prob": 1.5}, "sampler.options.explore_prob"),
    ("ada-v3w", {"exit_rule": "all"}, "sampler.options.exit_rule"),
    ("ada-v3w", {"eps": 0}, "sampler.options.eps"),
])
def test_options_are_validated_strictly(preset, options, field):
    with pytest.raises(ConfigError, match=field.replace("(", r"\(").replace(")", r"\)")):
        build_config(preset, "testbed", overrides={"sampler": {"options": options}})


def test_a_cap_below_n_or_a_pilot_past_n_is_refused_when_the_sampler_is_built():
    with pytest.raises(ValueError, match=r"sampler.options.max_samples: 4 is below sampler.n = 8"):
        sampler("knapsack", n=8, max_samples=4)
    with pytest.raises(ValueError, match=r"sampler.options.pilot: 5 is more than sampler.n = 4"):
        sampler("pilot", pilot=5)


def test_each_is_a_preset_of_the_testbed_and_a_row_of_ada_simulate():
    from typer.testing import CliRunner

    from ada_core.cli import app

    for preset, name in (("knapsack", "knapsack"), ("pilot", "pilot"), ("greso", "greso"), ("ada-v3w", "ada_v3w")):
        config = build_config(preset, "testbed")
        assert (config.preset, config.sampler.name, config.sampler.n) == (preset, name, 4)
        assert config.sampler.options  # every default filled in, so logged as MLflow params
    out = CliRunner().invoke(app, ["simulate", "--prompts", "16", "--steps", "2"])
    assert out.exit_code == 0, out.output
    rows = {line.split("|")[1].strip(): line for line in out.output.splitlines() if line.startswith("| ")}
    assert {"knapsack", "pilot", "greso", "ada-v3w"} <= set(rows)
    assert rows["knapsack"].split("|")[4].strip() == "64"  # gen/step: B x n


@pytest.mark.parametrize("name, option, default, other", [
    ("knapsack", "forget", 0.9, 0.2),
    ("knapsack", "prior_weight", 1.0, 0.0),
    ("knapsack", "min_samples", 2, 4),
    ("knapsack", "max_samples", 16, 4),
    ("pilot", "pilot", 2, 1),
    ("pilot", "max_samples", 8, 4),
    ("pilot", "value", "mixed", "signal"),
    ("greso", "skip_above", 0.8, 0.5),
    ("greso", "explore_prob", 0.1, 1.0),
    ("greso", "explore_after", 3, 1),
    ("greso", "forget", 1.0, 0.3),
    ("greso", "max_draw", 4.0, 1.0),
    ("ada_v3w", "exit_rule", "balance", "pos"),
    ("ada_v3w", "M", 8, 4),
    ("ada_v3w", "N", 4, 2),
    ("ada_v3w", "unresolved", "keep", "drop"),
    ("ada_v3w", "eps", 1e-6, 0.5),
])
def test_every_option_changes_what_the_sampler_does(name, option, default, other):
    """Eight steps over a pool of 24 prompts revisited every 3 steps (curated, 20% never and 15% always pass);
    greso skips from P_uniform 0.6 (its other options act on what it skips)."""
    base = {"skip_above": 0.6} if name == "greso" and option != "skip_above" else {}

    def run(value):
        dataset = make_prompts(24, np.random.default_rng(0), curation_k=8)
        s, source = sampler(name, **{**base, option: value}), PromptSource(dataset, seed=0)
        out = []
        for t in range(8):
            batch = step(s, source.take(8), t, source)
            out.append([(p.prompt.id, len(p.samples)) for p in batch.pools])
            out.append([round(a, 9) for g in batch.groups for a in g.advantages])
        return out

    assert options_default(name, option) == default
    assert run(default) != run(other)


def options_default(name: str, option: str):
    from ada_core.config.registry import get_sampler

    return get_sampler(name).options.model_fields[option].default


@pytest.mark.parametrize("preset", ["knapsack", "pilot", "greso", "ada-v3w"])
def test_the_training_loops_rollout_step_runs_each_preset_and_logs_its_budget(preset, tmp_path):
    """`run_steps` with the real rollout and evaluate steps on the Bernoulli engine (the update needs a model and
    is left out, as tests/fast/test_every_field.py's probe does): the platform logs each step's budget and the
    sampler's own metrics."""
    from ada_core.run.files import read_metrics
    from ada_core.training.loop import RunState, StepFunctions, evaluate, rollout_step, run_steps

    cfg = build_config(preset, "tiny", overrides={"steps": 3, "prompts_per_step": 8, "eval_every": 0})
    prompts = make_prompts(40, np.random.default_rng(0), curation_k=4)
    state = RunState(config=cfg, output_dir=tmp_path, tokenizer=None, rollout=BernoulliEngine(), updater=None,
                     verifier=BernoulliVerifier(), source=PromptSource(prompts[:16], seed=cfg.seed),
                     eval_prompts=prompts[32:], rng=np.random.default_rng(cfg.seed),
                     sampler=make_sampler(cfg.sampler, cfg.advantage))
    run_steps(state, StepFunctions(rollout=rollout_step, update=lambda state, batch: {}, evaluate=evaluate,
                                   checkpoint=lambda state: tmp_path))
    rows = [row for row in read_metrics(tmp_path) if "budget/generated_samples" in row]
    assert len(rows) == 3
    if preset != "ada-v3w":  # the fixed-budget samplers spend B x n = 32 a step (greso: replacements suffice here)
        assert [row["budget/generated_samples"] for row in rows] == [32.0] * 3
    own = {"knapsack": "sampler/knapsack_max_k", "pilot": "sampler/pilot_mixed_frac", "greso": "sampler/skipped",
           "ada-v3w": "sampler/v3w_weight_max"}[preset]
    assert all(own in row for row in rows)
