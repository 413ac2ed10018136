"""The run folder without a model: who may write it (one live writer, what a second one is told), what
a resume may change, a resume with nothing to resume, too many prompts per step, torn jsonl lines."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from support import tiny_config as _config

from ada_core.config import ConfigError
from ada_core.errors import InputError, ResumeError, RunInUse
from ada_core.run.files import read_jsonl
from ada_core.run.folder import RunDirError, check_run_dir, claim_run_dir, lock_holder
from ada_core.run.resume import RESUMABLE, check_resume_target, resumed_config
from ada_core.training import setup


def _checkpointed(run):
    """Give `run` a checkpoint folder with its COMPLETE marker (what makes it resumable)."""
    done = run / "checkpoints" / "step_000002"
    done.mkdir(parents=True)
    (done / "COMPLETE").write_text("ok\n")


def test_a_folder_without_a_run_is_taken_and_one_with_a_run_is_refused(tmp_path):
    claim_run_dir(tmp_path / "new")[1].release()  # created
    assert (tmp_path / "new").is_dir()
    (tmp_path / "new" / "notes.txt").write_text("not a run file\n")
    claim_run_dir(tmp_path / "new")[1].release()  # an unrelated file does not make a run
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    claim_run_dir(run)[1].release()  # nor does an empty checkpoints/ folder
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    _checkpointed(run)
    with pytest.raises(RunDirError, match=rf"{run} already holds a run \(metrics.jsonl, checkpoints/\); nothing in it was changed"):
        claim_run_dir(run)
    check_run_dir(run, resume=run)  # resuming that very run is the way to continue it
    with pytest.raises(RunDirError, match="choose one"):
        check_run_dir(run, resume=run, overwrite=True)
    with pytest.raises(RunDirError, match="already holds a run"):
        check_run_dir(run, resume=tmp_path / "other")  # resuming another run into it is not
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        check_run_dir(tmp_path / "file")


def test_leftovers_of_a_run_that_never_checkpointed_are_moved_aside_not_refused(tmp_path):
    """A run that failed at step 1 (too many prompts per step, say) has nothing to resume: running it
    again into its folder works without --overwrite, and --resume says so instead of failing later."""
    run = tmp_path / "run"
    (run / "checkpoints" / ".tmp_step_000002").mkdir(parents=True)  # a save the failure interrupted
    (run / "config.yaml").write_text("steps: 4\n")
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/avg_at_k": 0.1}\n{"step": 1}\n')
    with pytest.raises(ResumeError) as refused:
        check_resume_target(run)
    message = str(refused.value)
    assert "nothing to resume" in message and f"--output-dir {run}" in message and "--resume" not in message
    assert "metrics reach step 1" in message
    check_run_dir(run)  # a fresh run into it is not refused
    moved, lock = claim_run_dir(run)
    lock.release()
    assert moved.name.startswith("run.replaced-") and (moved / "metrics.jsonl").is_file()
    assert sorted(p.name for p in run.iterdir()) == ["run.lock"]
    with pytest.raises(ResumeError, match="no such folder"):
        check_resume_target(tmp_path / "missing")


HOLD = """
import sys, time
from ada_core.run.folder import RunLock
lock = RunLock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def test_a_live_writer_is_refused_by_pid_and_its_death_frees_the_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    _checkpointed(run)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock_holder(run) == holder.pid
        for kwargs in ({"resume": run}, {"overwrite": True}, {}):
            with pytest.raises(RunInUse, match=rf"in use by process {holder.pid}.*kill {holder.pid}") as refused:
                check_run_dir(run, **kwargs)
            assert refused.value.pid == holder.pid and isinstance(refused.value, InputError)
        with pytest.raises(RunInUse, match=str(holder.pid)):
            claim_run_dir(run, resume=run)
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the kernel drops the lock
        holder.wait(timeout=30)
    assert lock_holder(run) is None
    check_run_dir(run, resume=run)
    _, lock = claim_run_dir(run, resume=run)
    assert lock_holder(run) == os.getpid()
    lock.release()
    assert lock_holder(run) is None


def _saved_run(tmp_path, preset="ada-balance"):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(_config(preset, steps=4).model_dump(), sort_keys=False))
    return run


def test_a_resume_takes_the_runs_own_config_and_refuses_what_would_change_the_run(tmp_path):
    run = _saved_run(tmp_path)
    assert resumed_config(run) == _config("ada-balance", steps=4)  # no flag: the run as it was
    longer = resumed_config(run, {"steps": 6, "eval_every": 3, "checkpoint": {"keep_last": 1}})
    assert (longer.steps, longer.sampler.name, longer.checkpoint.keep_last) == (6, "ada", 1)
    assert {"steps", "eval_every", "checkpoint_every", "checkpoint.keep_last"} <= set(RESUMABLE)
    # A run that lost a node resumes on the nodes left: where the ranks go changes no step.
    spread = resumed_config(run, {"distributed": {"placement_strategy": "STRICT_SPREAD"}})
    assert spread.distributed.placement_strategy == "STRICT_SPREAD"
    refusals = {
        "sampler.name: ada -> fixed": {"sampler": {"name": "fixed"}},
        "preset: ada-balance -> grpo": {"preset": "grpo"},
        "seed: 0 -> 1 (the seed draws every sample": {"seed": 1},
        "data.seed: 0 -> 1 (it draws the dataset, its split and the SFT warm start)": {"seed": 1},
        "data.seed: 0 -> 2": {"data": {"seed": 2}},
        "distributed.num_ranks: 1 -> 2 (the optimizer state was saved by that many ranks; where a node is gone, "
        "resume with them on the nodes left (distributed.placement_strategy=PACK) or add a node)":
            {"distributed": {"num_ranks": 2}},
        "optim.zero_stage: 0 -> 2": {"optim": {"zero_stage": 2}},
        "optim.precision: fp32 -> bf16": {"optim": {"precision": "bf16"}},
        "data.train_size: 96 -> 200": {"data": {"train_size": 200}},
        "model: tiny -> smollm2-135m": {"model": "smollm2-135m"},
    }
    before = (run / "config.yaml").read_bytes()
    for shown, change in refusals.items():
        with pytest.raises(ResumeError) as refused:
            resumed_config(run, {"steps": 6, **change})
        message = str(refused.value)
        assert shown in message and "steps: 4 -> 6" not in message and "\n" not in message
    with pytest.raises(ConfigError, match="sampler.n"):
        resumed_config(run, {"sampler": {"n": 1}})
    assert (run / "config.yaml").read_bytes() == before
    with pytest.raises(ResumeError, match="no config.yaml"):
        resumed_config(tmp_path)


def test_more_prompts_per_step_than_the_data_holds_fails_before_any_model_is_loaded(tmp_path):
    with pytest.raises(ConfigError, match=r"prompts_per_step=200 exceeds the 96 training prompts of data.dataset "
                                          r"arithmetic .*data.train_size=96, data.eval_size=16"):
        setup(_config("grpo", steps=1, prompts_per_step=200), tmp_path / "out")
    with pytest.raises(ConfigError, match=r"exceeds the 10 training prompts.*data.train_pool=10"):
        setup(_config("grpo", steps=1, prompts_per_step=12, data={"train_size": 96, "eval_size": 16, "train_pool": 10}),
              tmp_path / "out")
    assert not (tmp_path / "out").exists()


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
