"""The run folder without a model: who may write it, a resume with nothing to resume, torn jsonl lines."""

from __future__ import annotations

import pytest
from support import tiny_config as _config

from ada_core.run.files import read_jsonl
from ada_core.run.folder import RunDirError, check_run_dir, claim_run_dir
from ada_core.training import setup


def test_a_folder_without_a_run_is_taken_and_one_with_a_run_is_refused(tmp_path):
    claim_run_dir(tmp_path / "new")  # created
    assert (tmp_path / "new").is_dir()
    (tmp_path / "new" / "notes.txt").write_text("not a run file\n")
    claim_run_dir(tmp_path / "new")  # an unrelated file does not make a run
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    claim_run_dir(run)  # nor does an empty checkpoints/ folder
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match=rf"{run} already holds a run \(metrics.jsonl\); nothing in it was changed"):
        claim_run_dir(run)
    check_run_dir(run, resume=run)  # resuming that very run is the way to continue it
    with pytest.raises(RunDirError, match="choose one"):
        check_run_dir(run, resume=run, overwrite=True)
    with pytest.raises(RunDirError, match="already holds a run"):
        check_run_dir(run, resume=tmp_path / "other")  # resuming another run into it is not
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        check_run_dir(tmp_path / "file")


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        setup(_config("grpo", steps=1), tmp_path / "out", resume=tmp_path / "missing")


def test_a_torn_line_before_the_last_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2: not valid JSON"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n{"step": 2, "x')
    assert read_jsonl(path) == [{"step": 1}]
