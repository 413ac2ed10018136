"""A run folder holds one run: a second run into it is refused unless it resumes that run or overwrites
it, and overwriting moves the old run aside instead of deleting it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ada_core.cli import app
from ada_core.run.files import read_metrics

FAST = ["--steps", "1", "--set", "sft_steps=0", "--set", "prompts_per_step=4", "--set", "eval_every=0",
        "--set", "data.train_size=16", "--set", "data.eval_size=4"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_second_cli_run_into_a_used_folder_is_refused_and_overwrite_moves_it_aside(tmp_path, monkeypatch):
    monkeypatch.setenv("ADA_HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    first = CliRunner().invoke(app, ["train", "--output-dir", str(out), *FAST])
    assert first.exit_code == 0, first.output
    before = _snapshot(out)
    assert {"config.yaml", "metrics.jsonl"} <= set(before) and any(k.startswith("checkpoints/") for k in before)

    # A real process, as a user runs it: non-zero exit, the message, and not one byte changed.
    env = {**os.environ, "ADA_HOME": str(tmp_path / "home")}
    second = subprocess.run([sys.executable, "-m", "ada_core.cli", "train", "--output-dir", str(out), *FAST],
                            capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 2, second.stdout + second.stderr
    message = " ".join(re.sub("[│╭╮╰╯─]", " ", second.stderr).split())  # typer boxes and wraps it
    for part in ("already holds a run", "--resume", "--overwrite", "nothing in it was changed"):
        assert part in message, message
    assert _snapshot(out) == before

    third = CliRunner().invoke(app, ["train", "--output-dir", str(out), "--overwrite", *FAST])
    assert third.exit_code == 0, third.output
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(aside) == 1 and _snapshot(aside[0]) == before
    assert [r["step"] for r in read_metrics(out)] == [1]  # the new run's rows only
