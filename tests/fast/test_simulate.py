"""The simulation benchmark (Bernoulli engine, oracle, `ada simulate`) and the matched-budget helpers."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from ada_core import metrics as mk
from ada_core.cli import app
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt, VerifierStatus
from ada_core.sampling import make_sampler
from ada_core.sampling.budget import compute_flops, matched_grpo_prompts
from ada_core.sampling.simulate import (
    BernoulliEngine,
    BernoulliVerifier,
    DifficultyMix,
    OracleSampler,
    default_methods,
    make_prompts,
    run_simulation,
)


def prompt(pid: str, rate) -> Prompt:
    return Prompt(id=pid, text="q", answer="1", meta={"pass_rate": rate})


@pytest.fixture(scope="session")
def small_run():
    return run_simulation(num_prompts=256, steps=1, seed=3)


# --- the engine and verifier ------------------------------------------------------------------------
def test_bernoulli_engine_follows_pass_rates_and_seed():
    engine = BernoulliEngine()
    requests = [(prompt("never", 0.0), 5), (prompt("always", 1.0), 5), (prompt("half", 0.5), 400)]
    out = engine.generate(requests, SamplingParams(seed=11, max_tokens=10))
    assert [s.text for s in out[0]] == ["0"] * 5 and [s.text for s in out[1]] == ["1"] * 5
    assert 0.4 < np.mean([s.text == "1" for s in out[2]]) < 0.6
    again = engine.generate(requests, SamplingParams(seed=11, max_tokens=10))
    assert [[s.text for s in ss] for ss in again] == [[s.text for s in ss] for ss in out]
    for s in out[2]:
        assert s.prompt_id == "half" and s.reward is None
        assert 1 <= s.num_tokens <= 10 and len(s.logprobs) == s.num_tokens
        assert not s.truncated or s.num_tokens == 10
        assert sum(s.logprobs) == pytest.approx(math.log(0.5))
    assert any(s.truncated for s in out[2])  # lengths 4..16 against max_tokens 10


def test_bernoulli_engine_rejects_a_missing_pass_rate():
    with pytest.raises(ValueError, match="prompt 'x': meta\\['pass_rate'\\] must be a number in \\[0, 1\\]"):
        BernoulliEngine().generate([(Prompt(id="x", text="q", answer="1"), 1)], SamplingParams(seed=0))
    with pytest.raises(ValueError, match="prompt 'y'"):
        BernoulliEngine().generate([(prompt("y", 1.5), 1)], SamplingParams(seed=0))


def test_bernoulli_verifier_reads_the_text():
    verdicts = BernoulliVerifier().verify([(prompt("a", 0.5), t) for t in ("1", "0", " 1\n", "maybe")])
    assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0, 0.0]
    assert verdicts[-1].status == VerifierStatus.PARSE_ERROR and verdicts[0].status == VerifierStatus.OK


# --- the difficulty distribution ------------------------------------------------------------------
def test_default_mix_gives_about_70_percent_zero_variance_groups_at_n4():
    mix = DifficultyMix()
    assert mix.zero_variance_frac(4) == pytest.approx(0.705, abs=0.005)
    prompts = make_prompts(4000, np.random.default_rng(0), mix)
    grpo = make_sampler(SamplerConfig(name="fixed", n=4), AdvantageConfig(name="grpo"))
    batch = grpo.sample(prompts, BernoulliEngine(), BernoulliVerifier(), SamplingParams(), np.random.default_rng(0))
    measured = batch.metrics[mk.SAMPLER_ALL_CORRECT_FRAC] + batch.metrics[mk.SAMPLER_ALL_WRONG_FRAC]
    assert measured == pytest.approx(mix.zero_variance_frac(4), abs=0.03)


def test_mix_masses():
    rates = DifficultyMix(frac_zero=0.5, frac_one=0.5).draw(1000, np.random.default_rng(0))
    assert set(rates.tolist()) == {0.0, 1.0}
    with pytest.raises(ValueError, match="frac_zero=0.7 and frac_one=0.6"):
        DifficultyMix(frac_zero=0.7, frac_one=0.6).draw(10, np.random.default_rng(0))


# --- the oracle -----------------------------------------------------------------------------------
@pytest.mark.parametrize("rule, need", [("mixed", (1, 1)), ("balance", (2, 2))])
def test_oracle_skips_hopeless_prompts_and_stops_at_the_first_good_pool(rule, need):
    prompts = [prompt("zero", 0.0), prompt("one", 1.0)] + [prompt(f"m{i}", 0.4) for i in range(30)]
    oracle = OracleSampler(rule=rule, n=4, max_samples_per_prompt=32)
    batch = oracle.sample(prompts, BernoulliEngine(), BernoulliVerifier(), SamplingParams(), np.random.default_rng(1))
    m = batch.metrics
    assert m[mk.SAMPLER_PROMPTS_DRAWN] == 32.0 and m[mk.exit_reason_key("skipped")] == 2.0
    assert {g.prompt.id for g in batch.groups} <= {f"m{i}" for i in range(30)}
    for g in batch.groups:
        assert len(g.samples) == 4
        pos, neg = g.pool_positives, g.pool_size - g.pool_positives
        if g.exit_reason == rule:
            assert pos >= need[0] and neg >= need[1]
            # one sample fewer would not have been enough (or the pool is the first n)
            assert g.pool_size == 4 or pos - 1 < need[0] or neg - 1 < need[1]
    assert m[mk.SAMPLER_SAMPLES_PER_PROMPT_MAX] <= 32


# --- the benchmark --------------------------------------------------------------------------------
def test_default_methods_cover_the_comparison():
    assert set(default_methods()) == {
        "grpo-n4", "grpo-n8", "grpo-n16", "grpo-n32", "dapo", "ada-pos-m8", "ada-balance-m8",
        "ada-pos-m4", "ada-balance-m4", "oracle-mixed", "oracle-balance", "ada-posterior", "ada-budget", "oracle-budget",
        "ada-est", "knapsack", "pilot", "greso", "ada-v3w",  # the research samplers' presets
    }


def test_simulation_results_make_sense(small_run):
    r = small_run
    for n in (4, 8, 16, 32):
        assert r[f"grpo-n{n}"]["samples_per_prompt_drawn"] == n
        assert r[f"grpo-n{n}"]["trained_samples_per_step"] == 256 * n
    assert r["grpo-n4"]["effective_ratio"] < r["grpo-n32"]["effective_ratio"]
    assert r["grpo-n4"]["zero_variance_frac"] == pytest.approx(0.7, abs=0.08)
    for m in ("ada-pos-m8", "ada-balance-m8", "ada-pos-m4", "ada-balance-m4"):
        assert r[m]["samples_per_prompt_drawn"] <= 32 and r[m]["trained_samples_per_step"] == 256 * 4
        assert r[m]["effective_ratio"] > r["grpo-n4"]["effective_ratio"]
    assert r["dapo"]["prompts_drawn_per_step"] > 256
    # at the same per-prompt cap, the oracle gets as many informative groups for fewer samples
    assert r["oracle-mixed"]["generated_per_informative_group"] < r["ada-balance-m8"]["generated_per_informative_group"]
    assert r["oracle-balance"]["effective_ratio"] >= r["ada-balance-m8"]["effective_ratio"] - 0.05
    for name, summary in r.items():
        assert summary["matched_grpo_n4_prompts"] == matched_grpo_prompts(summary["generated_samples_per_step"], 4)


def test_simulation_is_reproducible():
    methods = {"ada": default_methods()["ada-balance-m8"]}
    a = run_simulation(num_prompts=32, steps=2, seed=5, methods=methods)
    b = run_simulation(num_prompts=32, steps=2, seed=5, methods=methods)
    strip = lambda res: {k: v for k, v in res["ada"].items() if k != "bookkeeping_us_per_step"}
    assert strip(a) == strip(b)


def test_cli_simulate_writes_json_and_png(tmp_path):
    out_json, out_png = tmp_path / "sim.json", tmp_path / "plots" / "sim.png"
    result = CliRunner().invoke(
        app, ["simulate", "--prompts", "48", "--steps", "1", "--json", str(out_json), "--png", str(out_png)]
    )
    assert result.exit_code == 0, result.output
    assert "| ada-balance-m8 |" in result.output and "zero-variance groups at n=4" in result.output
    payload = json.loads(out_json.read_text())
    assert payload["config"]["prompts"] == 48 and "effective_ratio" in payload["methods"]["grpo-n4"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_is_a_command_group_and_checks_options():
    runner = CliRunner()
    assert "simulate" in runner.invoke(app, ["--help"]).output
    bad = runner.invoke(app, ["simulate", "--frac-zero", "0.8", "--frac-one", "0.5"])
    assert bad.exit_code != 0 and "must be <= 1" in bad.output


# --- matched budget and compute -------------------------------------------------------------------
def test_matched_grpo_prompts():
    assert matched_grpo_prompts(1715, 4) == 429  # DESIGN.md: Ada-balance's 1,715 samples a step
    assert matched_grpo_prompts(10, 4) == 3  # 2.5 rounds up
    assert matched_grpo_prompts(9.9, 4) == 2
    assert matched_grpo_prompts(0.0, 4) == 1  # at least one prompt
    with pytest.raises(ValueError, match="n: must be >= 1"):
        matched_grpo_prompts(100, 0)
    with pytest.raises(ValueError, match="mean_generated_samples_per_step"):
        matched_grpo_prompts(float("nan"), 4)


def test_compute_flops():
    assert compute_flops(1e6, 100, 40, 40) == pytest.approx(5.2e8)
    assert compute_flops(10, 0, 1, 0) == 60.0
    with pytest.raises(ValueError, match="trained_tokens"):
        compute_flops(1e6, 1, -1, 0)
