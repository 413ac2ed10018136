"""Crash safety without flows: checkpoint manifest and fallback, keep_last, resume trimming per-step
files (torn lines, duplicated generations), and bad inputs that must fail with a clear error and
leave nothing behind. One tiny 4-step run is shared; each drill damages a copy of it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ada_core.run.checkpoints import MANIFEST, latest_good_checkpoint, verify_checkpoint
from ada_core.run.files import read_jsonl
from ada_core.cli import INPUT_ERROR_EXIT, app
from ada_core.config import build_config
from ada_core.models import MAX_CHARS_PER_TOKEN, encode_prompts, load_tokenizer
from ada_core.records import Prompt
from ada_core.training import run_steps, setup, train
from ada_core.run.files import read_metrics

TINY_RUN = {
    "sft_steps": 0, "steps": 4, "prompts_per_step": 4, "eval_every": 2, "eval_k": 2, "checkpoint_every": 1,
    "data": {"train_size": 48, "eval_size": 8}, "checkpoint": {"keep_last": 3},
}


def tiny_config(**extra):
    return build_config("grpo", "tiny", overrides={**TINY_RUN, **extra})


def without_timing(rows: list[dict]) -> list[dict]:
    """Rows with wall-clock keys dropped: everything else must match exactly after a resume."""
    return [{k: v for k, v in r.items() if not (k.startswith(("time/", "throughput/")) or k.endswith("_s"))}
            for r in rows]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_model):
    out = tmp_path_factory.mktemp("reliability") / "base"
    train(tiny_config(), out)
    return out


def test_checkpoints_carry_a_manifest_and_keep_last_prunes_older_ones(base_run):
    names = sorted(p.name for p in (base_run / "checkpoints").iterdir())
    assert names == ["step_000002", "step_000003", "step_000004"]  # keep_last=3 of 4 saves
    manifest = json.loads((base_run / "checkpoints" / "step_000004" / MANIFEST).read_text())["files"]
    assert {"hf/model.safetensors", "optimizer/update_engine.pt", "trainer_state.json"} <= set(manifest)
    assert verify_checkpoint(base_run / "checkpoints" / "step_000004") is None


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 65536] = os.urandom(min(65536, len(data) - middle))  # same size, new bytes
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, name", [
    (_flip, "hf/model.safetensors"), (_truncate, "hf/model.safetensors"),
    (_truncate, "optimizer/update_engine.pt"), (_truncate, "trainer_state.json"),
])
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_used(base_run, tmp_path, damage, name):
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    damage(run / "checkpoints" / "step_000004" / name)
    choice = latest_good_checkpoint(run)
    assert choice.path.name == "step_000003"
    [(rejected, why)] = choice.rejected
    assert rejected.name == "step_000004" and why.startswith(f"{name}:")


@pytest.mark.slow
def test_resume_falls_back_trims_torn_lines_and_does_not_duplicate_generations(base_run, tmp_path):
    """A flipped newest checkpoint, a torn metrics line, generations past the checkpoint: resume from
    step 3 and finish with the same rows as the run that never broke."""
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    _flip(run / "checkpoints" / "step_000004" / "hf" / "model.safetensors")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "reward/me')  # the kill hit mid-write
    state = setup(tiny_config(), run, resume=run)
    try:
        assert state.step == 3 and [p.name for p, _ in state.resumed_from.rejected] == ["step_000004"]
        run_steps(state)
    finally:
        state.close()
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(base_run))
    generations = read_jsonl(run / "generations.jsonl")
    assert generations == read_jsonl(base_run / "generations.jsonl")  # step 4's eval rows once, not twice
    assert verify_checkpoint(run / "checkpoints" / "step_000004") is None  # rewritten from good weights


# ---------------------------------------------------------------------------------------------
# Inputs: file, row and field named; one exit code; nothing written


def test_a_prompt_past_max_prompt_tokens_is_skipped_before_tokenising(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    huge = Prompt(id="huge", text="1+" * 25_000_000 + "1=", answer="x")  # 50 MB: tokenising it took 8+ GB
    assert len(huge.text) > 1024 * MAX_CHARS_PER_TOKEN
    near = Prompt(id="near", text="1+" * 600 + "1=", answer="601")  # 1202 tokens: tokenised, then skipped
    ok = Prompt(id="ok", text="12+34=", answer="46")
    assert encode_prompts(tokenizer, [huge, near, ok], max_tokens=1024) == [ok]
    assert ok.prompt_ids and not huge.prompt_ids and not near.prompt_ids


def _snapshot(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")} if root.exists() else {}


@pytest.mark.slow
def test_cli_input_errors_share_one_exit_code_and_write_nothing(tmp_path, monkeypatch, tiny_model):
    ada_home = tmp_path / "home"  # an ADA_HOME of its own: the session's shares its builds with the other test worker
    monkeypatch.setenv("ADA_HOME", str(ada_home))
    bad_bytes = tmp_path / "bytes.jsonl"
    bad_bytes.write_bytes(b'{"problem": "\xff", "answer": "1"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    long_only = tmp_path / "long.jsonl"
    long_only.write_text(json.dumps({"id": "a", "text": "1+" * 40_000 + "1=", "answer": "1"}) + "\n"
                         + json.dumps({"id": "b", "text": "1+" * 40_000 + "2=", "answer": "2"}) + "\n")
    bad_yaml = tmp_path / "cfg.yaml"
    bad_yaml.write_text("steps: [1\n")
    out = tmp_path / "run"
    cases = {
        "field 'problem' is not valid UTF-8": ["--dataset", str(bad_bytes)],
        "the file has no rows": ["--dataset", str(empty)],
        "longer than data.max_prompt_tokens": ["--dataset", str(long_only), "--set", "data.eval_size=1",
                                               "--set", "sft_steps=0", "--set", "prompts_per_step=1"],
        "not valid YAML": ["--config", str(bad_yaml)],
        "sampler.n": ["--set", "sampler.n=1"],
        "no such file, and not a generator": ["--dataset", str(tmp_path / "missing.jsonl")],
    }
    before = _snapshot(ada_home)
    for message, args in cases.items():
        result = CliRunner().invoke(app, ["train", "--output-dir", str(out), *args])
        assert result.exit_code == INPUT_ERROR_EXIT, (message, result.output)
        assert message in result.output and "Traceback" not in result.output
        assert not out.exists()
    after = _snapshot(ada_home)
    assert {k: v for k, v in after.items() if "models" not in k} == {k: v for k, v in before.items() if "models" not in k}
