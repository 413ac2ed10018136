"""benchmarks/grid_time.py and benchmarks/signal_table.py: a grid's time by phase and each method's signal per step,
read from a run's metrics rows; a folder that is not an ADA_HOME (eval_k_variance.py: not a run) is refused in one
line, exit 2."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ada_core import metrics as K

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows() -> list[dict[str, float]]:
    """Two steps, evaluations at 0 and 2, the set-up on step 1's row."""
    step = {K.TIME_STEP_S: 2.0, K.TIME_GENERATE_S: 0.5, K.TIME_REWARD_S: 0.1, K.TIME_UPDATE_S: 1.2,
            K.UPDATE_RECOMPUTE_S: 0.3, K.TRAIN_LOSS: 0.1, K.SAMPLER_EFFECTIVE_RATIO: 0.5, K.SAMPLER_PROMPTS_DRAWN: 32,
            K.BUDGET_GENERATED_SAMPLES: 128, K.BUDGET_TRAINED_SAMPLES: 128, K.TRAIN_GRAD_NORM: 0.2,
            K.SAMPLER_ALL_CORRECT_FRAC: 0.1, K.SAMPLER_ALL_WRONG_FRAC: 0.4}
    return [{"step": 0, K.EVAL_AVG_AT_K: 0.1, K.TIME_EVAL_S: 5.0},
            {"step": 1, **step, K.TIME_SETUP_S: 3.0},
            {"step": 2, **step, K.SAMPLER_EFFECTIVE_RATIO: 0.75},
            {"step": 2, K.EVAL_AVG_AT_K: 0.2, K.TIME_EVAL_S: 6.0}]


def test_a_runs_wall_time_splits_into_its_phases_and_the_rest_is_outside():
    split = load("grid_time").run_split(rows(), wall_s=30.0)
    assert split["set-up"] == 3.0 and split["evaluation"] == 11.0
    assert (split["generation"], split["reward"], split["update"]) == pytest.approx((1.0, 0.2, 2.4))
    assert split["  of it: old/ref log-prob recompute"] == pytest.approx(0.6)
    assert split["rest of steps"] == pytest.approx(4.0 - 3.6)
    assert split["outside (logging, checkpoint, flow)"] == pytest.approx(30.0 - 3.0 - 4.0 - 11.0)
    # A run from before time/setup_s and time/eval_s is left out, not split wrongly.
    assert load("grid_time").run_split([{k: v for k, v in r.items() if k not in (K.TIME_SETUP_S, K.TIME_EVAL_S)}
                                        for r in rows()], wall_s=30.0) is None


def test_a_runs_signal_is_its_per_step_means_and_its_last_evaluation():
    signal = load("signal_table").run_signal(rows())
    assert signal["effective ratio"] == pytest.approx(0.625)
    assert signal["informative groups/step"] == pytest.approx(20.0)
    assert signal["samples/step"] == 128 and signal["grad norm"] == pytest.approx(0.2)
    assert signal["final avg@k"] == 0.2


@pytest.mark.parametrize("script", ["grid_time", "signal_table"])
def test_a_folder_that_is_not_there_is_refused_in_one_line(script, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == f"{script}: {tmp_path / 'nope'}: no such ADA_HOME folder"


def test_eval_k_variance_refuses_a_folder_that_is_not_a_run(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eval_k_variance.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip() == f"eval_k_variance: {tmp_path}: not a run folder (no config.yaml)"
