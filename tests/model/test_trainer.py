"""The real trainer on the tiny model: a few steps of GRPO and Ada-balance, checkpoints and resume."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch
from support import SMALL, listeners_beyond_loopback
from support import tiny_config as _config

from ada_core import metrics as K
from ada_core.config import build_config
from ada_core.run.checkpoints import latest_checkpoint
from ada_core.run.files import read_metrics
from ada_core.training import run_steps, setup

pytestmark = pytest.mark.slow

# Every step must log these, whatever the preset: the budget and time split make comparisons honest.
REQUIRED = [
    K.SAMPLER_EFFECTIVE_RATIO, K.SAMPLER_ALL_CORRECT_FRAC, K.SAMPLER_ALL_WRONG_FRAC,
    K.SAMPLER_SAMPLES_PER_PROMPT_MEAN, K.SAMPLER_SAMPLES_PER_PROMPT_MAX, K.SAMPLER_P_HAT_MEAN,
    K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_GENERATED_TOKENS_CUM, K.BUDGET_TRAINED_SAMPLES_CUM,
    K.BUDGET_TRAINED_TOKENS_CUM, K.BUDGET_LOGPROB_TOKENS_CUM,
    K.TIME_GENERATE_S, K.TIME_REWARD_S, K.TIME_UPDATE_S, K.TIME_SYNC_S, K.TIME_STEP_S, K.TIME_ELAPSED_S,
    K.REWARD_MEAN, K.RESPONSE_LENGTH_MEAN, K.RESPONSE_TRUNCATED_FRAC,
    K.TRAIN_LOSS, K.TRAIN_ENTROPY, K.TRAIN_CLIP_FRAC, K.TRAIN_APPROX_KL, K.TRAIN_GRAD_NORM, K.TRAIN_LR,
    K.THROUGHPUT_GEN_TOKENS_PER_S, "verifier/ok",
]


@pytest.mark.parametrize("preset", ["grpo", "ada-balance"])
def test_a_few_steps_train_for_real(preset, tmp_path):
    state = setup(_config(preset, steps=3), tmp_path / preset)
    try:
        before = [p.detach().clone() for p in state.updater.module.parameters()]
        last = run_steps(state)
        after = list(state.updater.module.parameters())
        # The 1-rank process group listens on loopback alone (torch's TCPStore took `::` before).
        assert listeners_beyond_loopback(os.getpid()) == []
    finally:
        state.close()

    assert math.isfinite(last[K.TRAIN_LOSS])
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "no weight changed"
    missing = [k for k in REQUIRED if k not in last]
    assert not missing, f"metric keys missing: {missing}"
    assert all(K.is_valid_key(k) for k in last)

    rows = read_metrics(tmp_path / preset)
    step_rows = [r for r in rows if K.TRAIN_LOSS in r]
    assert [r["step"] for r in step_rows] == [1, 2, 3]
    cum = [r[K.BUDGET_GENERATED_SAMPLES_CUM] for r in step_rows]
    assert cum == sorted(cum) and cum[-1] == sum(r[K.BUDGET_GENERATED_SAMPLES] for r in step_rows)
    evals = [r for r in rows if K.EVAL_AVG_AT_K in r]
    assert [r["step"] for r in evals] == [0, 2, 3]
    assert all(0.0 <= r[K.EVAL_AVG_AT_K] <= r[K.EVAL_PASS_AT_K] <= 1.0 for r in evals)
    # The time split: each evaluation's seconds on its row, the set-up's once, on the first step's row.
    assert all(r[K.TIME_EVAL_S] > 0 for r in evals) and not any(K.TIME_EVAL_S in r for r in step_rows)
    assert [r["step"] for r in rows if K.TIME_SETUP_S in r] == [1] and step_rows[0][K.TIME_SETUP_S] > 0
    assert step_rows[-1][K.TIME_ELAPSED_S] == pytest.approx(sum(r[K.TIME_STEP_S] for r in step_rows))
    generations = (tmp_path / preset / "generations.jsonl").read_text().splitlines()
    assert generations and {"prompt", "completion", "reward"} <= set(json.loads(generations[0]))
    if preset == "ada-balance":
        # Ada draws more than n per prompt on average: the budget must show it.
        assert step_rows[-1][K.SAMPLER_SAMPLES_PER_PROMPT_MEAN] >= 4
    assert latest_checkpoint(tmp_path / preset).name == "step_000003"


def test_resume_gives_the_same_next_prompts(tmp_path):
    first = setup(_config("ada-balance", steps=2), tmp_path / "a")
    try:
        run_steps(first)
        expected_ids = [p.id for p in first.source.take(8)]
        expected_draw = first.rng.random()
        expected_weights = [p.detach().clone() for p in first.updater.module.parameters()]
    finally:
        first.close()

    resumed = setup(_config("ada-balance", steps=4), tmp_path / "b", resume=tmp_path / "a")
    try:
        assert resumed.step == 2
        assert [p.id for p in resumed.source.take(8)] == expected_ids
        assert resumed.rng.random() == expected_draw
        for a, b in zip(expected_weights, resumed.updater.module.parameters()):
            torch.testing.assert_close(a, b.detach())
        # Totals carry over, so cumulative budgets continue instead of restarting at zero.
        assert resumed.totals[K.BUDGET_GENERATED_SAMPLES_CUM] > 0
        assert [r["step"] for r in read_metrics(tmp_path / "b") if K.TRAIN_LOSS in r] == [1, 2]
    finally:
        resumed.close()




# --- loss.kl_coef through setup: the reference is the run's initial weights -----------------------

# No SFT warm start (every advantage 0 on the untrained model): the entropy bonus gives each step a
# gradient, so the policy leaves its initial weights and the KL term has something to pull back.
def _kl_config(steps: int, kl_coef: float):
    """SMALL's data and batch, no evaluation, one checkpoint at the end."""
    return build_config("grpo", "tiny", overrides={
        "steps": steps, "prompts_per_step": SMALL["prompts_per_step"], "data": SMALL["data"], "sft_steps": 0,
        "eval_every": 0, "checkpoint_every": 0, "ledger": {"enabled": False},
        "loss": {"entropy_coef": 0.05, "kl_coef": kl_coef}})


def _weights(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _kl_run(out, kl_coef: float, steps: int = 2):
    """A run with nothing injected; returns its initial and final weights."""
    state = setup(_kl_config(steps, kl_coef), out)
    try:
        initial = _weights(state.updater.module)
        run_steps(state)
        return initial, _weights(state.updater.module)
    finally:
        state.close()


@pytest.fixture(scope="module")
def kl_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("kl")
    return root, _kl_run(root / "off", 0.0), _kl_run(root / "on", 1.0)


def test_kl_coef_builds_the_reference_and_changes_the_update(kl_runs):
    root, (initial_off, final_off), (initial_on, final_on) = kl_runs
    assert all(torch.equal(initial_off[k], initial_on[k]) for k in initial_off), "the two runs must start alike"
    kl = {r["step"]: r[K.TRAIN_KL_REF] for r in read_metrics(root / "on") if K.TRAIN_KL_REF in r}
    # Step 1 trains the initial weights against themselves (KL 0 exactly where the reference is the start);
    # step 2 trains weights that moved.
    assert kl[1] < 1e-9 < kl[2], kl
    assert all(r[K.TRAIN_KL_REF] == 0.0 for r in read_metrics(root / "off") if K.TRAIN_KL_REF in r)
    # The reference's forward is compute the budget counts; the old policy's is not run (the tiny profile's
    # update is one optimizer step, whose own forward gives the old log-probs).
    for name, passes in (("off", 0), ("on", 1)):
        rows = [r for r in read_metrics(root / name) if K.TRAIN_LOSS in r]
        assert rows and all(r[K.UPDATE_OLD_RECOMPUTED] == 0.0 for r in rows), name
        assert all(r[K.BUDGET_LOGPROB_TOKENS] == passes * r[K.BUDGET_TRAINED_TOKENS] for r in rows), name
    assert all(r[K.BUDGET_TRAINED_TOKENS] > 0 for r in read_metrics(root / "on") if K.TRAIN_LOSS in r)
    assert any(not torch.equal(final_on[k], final_off[k]) for k in final_on), "kl_coef changed no weight"
    assert (root / "on" / "reference" / "COMPLETE").is_file() and not (root / "off" / "reference").exists()


def test_a_resumed_kl_run_keeps_its_initial_weights_as_reference(kl_runs, tmp_path):
    from ada_core.run.reference import ReferenceWeightsError

    root, _, (initial, final) = kl_runs
    config = _kl_config(3, 1.0)
    resumed = setup(config, tmp_path / "resumed", resume=root / "on")
    try:
        ref = _weights(resumed.updater.ref_model)
        assert all(torch.equal(ref[k], initial[k]) for k in initial), "the reference is not the initial weights"
        assert any(not torch.equal(ref[k], final[k]) for k in final)
        run_steps(resumed)
    finally:
        resumed.close()
    assert read_metrics(tmp_path / "resumed")[-1][K.TRAIN_KL_REF] > 0
    assert (tmp_path / "resumed" / "reference" / "COMPLETE").is_file()  # it can be resumed in turn

    # A KL run whose initial weights are gone cannot resume against them: refused before anything is written.
    import shutil

    shutil.copytree(root / "on", tmp_path / "lost")
    shutil.rmtree(tmp_path / "lost" / "reference")
    with pytest.raises(ReferenceWeightsError, match="needs the run's initial weights"):
        setup(config, tmp_path / "again", resume=tmp_path / "lost")
    assert not (tmp_path / "again").exists()


def test_a_run_from_a_start_evaluated_before_reads_that_evaluation_and_scores_the_same(tmp_path, monkeypatch):
    """The step-0 evaluation of a start is computed once per ADA_HOME (ada_core/training/start_eval.py): a second
    run from the same start and exam (here another preset) reads it, with the same metrics and generations as
    the run that computed it; another exam (another eval_k) computes its own."""
    from ada_core.paths import cache_dir
    from ada_core.training import loop

    shutil.rmtree(cache_dir() / "start_eval", ignore_errors=True)  # this worker's earlier tests may have stored one
    scored_at = []
    score = loop._score
    monkeypatch.setattr(loop, "_score", lambda state, *a: (scored_at.append(state.step), score(state, *a))[1])

    def run(name, preset, **extra):
        scored_at.clear()
        state = setup(_config(preset, steps=1, **extra), tmp_path / name)
        try:
            run_steps(state)
        finally:
            state.close()
        row = next(r for r in read_metrics(tmp_path / name) if r["step"] == 0 and K.EVAL_AVG_AT_K in r)
        generations = [r for r in map(json.loads, (tmp_path / name / "generations.jsonl").read_text().splitlines())
                       if r["step"] == 0]
        return list(scored_at), {k: v for k, v in row.items() if not k.startswith("time/")}, generations

    computed, first_row, first_generations = run("first", "grpo")
    assert computed.count(0) >= 1 and len(list((cache_dir() / "start_eval").glob("*.json"))) == 1
    read, second_row, second_generations = run("second", "ada-balance")
    assert 0 not in read  # nothing was sampled for its step-0 evaluation
    assert second_row == first_row and second_generations == first_generations and first_generations
    other, _, _ = run("other", "grpo", eval_k=3)
    assert 0 in other and len(list((cache_dir() / "start_eval").glob("*.json"))) == 2
