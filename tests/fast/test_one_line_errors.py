"""Bad input through `ada train`: one line naming the file, row or field, exit 2, before any model is built
and with nothing written under ADA_HOME (issue 26 finding 14)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ada_core.cli import INPUT_ERROR_EXIT, app


@pytest.fixture
def ada(tmp_path, monkeypatch):
    """`ada <args>` -> its one stderr line; fails the test if a model is built or ADA_HOME is written."""
    home = tmp_path / "home"
    monkeypatch.setenv("ADA_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the input was refused")

    monkeypatch.setattr("ada_core.training.state.start_model", no_model)
    monkeypatch.setattr("ada_core.training.state.load_policy", no_model)

    def run(*args: str) -> str:
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == INPUT_ERROR_EXIT, (result.exit_code, result.output, result.exception)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
        assert not home.exists() or not any(home.rglob("*")), sorted(map(str, home.rglob("*")))
        return lines[0]

    return run


def test_a_cross_field_error_names_its_fields_not_the_whole_config(ada):
    line = ada("train", "--preset", "ada-balance", "--steps", "1", "--set", "sampler.global_sample_cap=3")
    assert "sampler.global_sample_cap = 3 is below sampler.n = 4" in line
    assert "(got {" not in line and "'exit_rule'" not in line
    line = ada("train", "--steps", "1", "--set", "rollout.async_steps=2")  # a check across sections
    assert "rollout.async_steps: 2 needs rollout.engine: vllm" in line and "(got {" not in line


def test_a_wrong_type_in_a_config_file_names_the_file_line_and_field(ada, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("seed: 1\nsampler:\n  M: abc\n")
    line = ada("train", "--steps", "1", "--config", str(config))
    assert f"config file {config}, line 3: sampler.M: Input should be a valid integer" in line, line
    config.write_text("optim:\n  lr: 0.001\nsampler:\n  window: 4\n")  # set where the run never reads it
    line = ada("train", "--steps", "1", "--config", str(config))
    assert f"config file {config}, line 4: sampler.window: set to 4, but this run never reads it" in line, line
    # the same field given on the command line is the command line's
    line = ada("train", "--steps", "1", "--config", str(config), "--set", "sampler.window=x")
    assert "config file" not in line and "sampler.window" in line


def test_an_eval_size_larger_than_a_small_dataset_names_the_field_and_the_file(ada, tmp_path):
    data = tmp_path / "three.jsonl"
    data.write_text("".join(f'{{"problem": "1+{i}=", "answer": "{i + 1}"}}\n' for i in range(3)))
    line = ada("train", "--steps", "1", "--dataset", str(data))
    assert f"data.eval_size = 128 held-out prompts, but data.dataset {data} has 3 prompts" in line, line
    assert "at most 2" in line


@pytest.mark.parametrize("rows, why", [
    ([{"problem": "1+1=", "answer": "2"}, {"problem": "1+2=", "answer": ""}], "row 2: field 'answer' is empty"),
    ([{"problem": "1+1=", "answer": "2", "uuid": "a"}, {"problem": "1+2=", "answer": "3", "uuid": "a"}],
     "row 2: field 'uuid' repeats id 'a' of row 1"),
])
def test_a_bad_parquet_file_is_refused_with_no_cache_left_under_ada_home(ada, tmp_path, rows, why):
    data = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    assert ada("train", "--steps", "1", "--dataset", str(data)) == f"error: {data}: {why}"  # and ADA_HOME empty


def test_a_set_that_a_flag_contradicts_is_refused(ada):
    assert ada("train", "--steps", "8", "--set", "steps=40") == \
        "error: --set steps=40 contradicts --steps 8: both set steps; give one"
    assert "contradicts --engine vllm" in ada("train", "--engine", "vllm", "--set", "rollout.engine=transformers")
    assert "contradicts --dataset" in ada("train", "--dataset", "arithmetic", "--set", "data.dataset=chain_sum:2")
    assert ada("train", "--set", "preset=dapo") == "error: --set preset=dapo: a preset is chosen with --preset " \
                                                  "dapo, not --set"


def test_vllm_serve_without_a_key_is_refused_before_anything_starts(tmp_path, monkeypatch):
    """`ada vllm-serve` binds beyond loopback for a trainer elsewhere: it never serves without a key."""
    monkeypatch.setenv("ADA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ADA_VLLM_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["vllm-serve", "--host", "10.0.0.5"])
    assert result.exit_code == INPUT_ERROR_EXIT, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: $ADA_VLLM_API_KEY is not set"), line
    assert not (tmp_path / "home").exists()


def test_make_ui_worker_refuses_what_it_cannot_join_in_one_line(infra_ui, tmp_path, monkeypatch, capsys):
    """`make ui-worker` (infra/TEAM.md): no server named, or one that does not answer, is one `error:` line and
    exit 2, before any worker starts."""
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "ADA_UI_USER", "ADA_UI_PASSWORD", "ADA_UI_PASSWORD_FILE",
                "ADA_WORKERS"):
        monkeypatch.delenv(key, raising=False)
    lines = []
    for env in ({}, {"PREFECT_API_URL": "http://127.0.0.1:9/api"},
                {"PREFECT_API_URL": "http://127.0.0.1:9", "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
                {"PREFECT_API_URL": "http://127.0.0.1:9/api", "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}):
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            assert infra_ui.join(tmp_path) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        lines.append(line)
    assert lines[0].startswith("error: make ui-worker: set PREFECT_API_URL and MLFLOW_TRACKING_URI"), lines[0]
    assert lines[1].startswith("error: make ui-worker: set MLFLOW_TRACKING_URI"), lines[1]
    assert "does not end in /api" in lines[2], lines[2]
    assert "could not check them: Prefect no answer" in lines[3], lines[3]
    assert not (tmp_path / "ui").exists()
