"""`ada train --resume R` is the same run: R's own config, continued exactly; a flag that would change
the run is refused with the difference and nothing written; a live run is refused by its pid; input
mistakes are one line and exit 2. One 2-step ada-balance CLI run is shared; each test works on a copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ada_core.cli import INPUT_ERROR_EXIT, RUN_FAILURE_EXIT, app
from ada_core.paths import bytes_under
from ada_core.run.checkpoints import verify_checkpoint
from ada_core.run.files import read_metrics
from ada_core.run.folder import lock_holder
from ada_core.run.resume import resumed_config
from ada_core.training import setup

pytestmark = pytest.mark.slow

SMALL = ["--set", "sft_steps=0", "--set", "prompts_per_step=4", "--set", "eval_every=0", "--set", "data.train_size=16",
         "--set", "data.eval_size=4", "--set", "checkpoint_every=1", "--set", "checkpoint.keep_last=0"]


def cli(*args: str):
    return CliRunner().invoke(app, ["train", *map(str, args)])


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not (k.startswith(("time/", "throughput/")) or k.endswith("_s"))}
            for r in rows]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(result) -> str:
    """The refusal the user sees: one `error: ...` line on stderr, no traceback."""
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_model):
    out = tmp_path_factory.mktemp("resume") / "base"
    result = cli("--preset", "ada-balance", "--steps", 2, "--output-dir", out, *SMALL)
    assert result.exit_code == 0, result.output
    return out


def copy_of(base: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base, run, ignore=shutil.ignore_patterns("run.lock"))
    return run


def test_a_flag_that_changes_the_run_is_refused_with_the_difference_and_nothing_written(base, tmp_path):
    run = copy_of(base, tmp_path)
    before = snapshot(run)
    bf16 = tmp_path / "bf16.yaml"
    bf16.write_text("optim:\n  precision: bf16\n")
    cases = {
        "preset: ada-balance -> grpo": ["--preset", "grpo"],
        "sampler.name: ada -> fixed": ["--set", "sampler.name=fixed"],
        "seed: 0 -> 1": ["--seed", "1"],
        "distributed.num_ranks: 1 -> 2": ["--set", "distributed.num_ranks=2"],
        "optim.zero_stage: 0 -> 1": ["--set", "optim.zero_stage=1"],
        "optim.precision: fp32 -> bf16": ["--config", str(bf16)],
        "data.train_size: 16 -> 32": ["--set", "data.train_size=32", "--steps", "3"],
    }
    for shown, flags in cases.items():
        result = cli("--resume", run, *flags)
        assert result.exit_code == INPUT_ERROR_EXIT, (shown, result.output)
        assert shown in one_line(result) and "steps: 2 -> 3" not in result.output, result.output
    assert snapshot(run) == before


def test_resume_of_nothing_says_what_works(tmp_path, ada_home):
    result = cli("--resume", tmp_path / "missing")
    assert result.exit_code == INPUT_ERROR_EXIT and "no such folder" in one_line(result)
    left = tmp_path / "left"  # what a run that failed at step 1 leaves: its config, its step-0 evaluation
    left.mkdir()
    (left / "config.yaml").write_text("steps: 2\n")
    (left / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/avg_at_k": 0.0}) + "\n")
    result = cli("--resume", left)
    assert result.exit_code == INPUT_ERROR_EXIT
    line = one_line(result)
    assert "nothing to resume" in line and f"--output-dir {left}" in line and "--resume" not in line


def test_more_prompts_per_step_than_the_data_fails_in_one_line_and_its_leftovers_can_be_rerun(tmp_path, ada_home):
    out = tmp_path / "run"
    result = cli("--output-dir", out, "--steps", 1, *SMALL, "--set", "prompts_per_step=40")
    assert result.exit_code == INPUT_ERROR_EXIT
    assert "prompts_per_step=40 exceeds the 16 training prompts" in one_line(result)
    assert not out.exists()
    out.mkdir()  # what that failure left before this check existed: config and step-0 rows, no checkpoint
    (out / "config.yaml").write_text("steps: 1\n")
    (out / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/avg_at_k": 0.0}) + "\n")
    result = cli("--output-dir", out, "--steps", 1, *SMALL)  # no --overwrite needed: nothing there to resume
    assert result.exit_code == 0, result.output
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert (aside / "metrics.jsonl").read_text().startswith('{"step": 0')
    assert [r["step"] for r in read_metrics(out)] == [1]


HOLD = """
import sys, time
from ada_core.run.folder import RunLock
lock = RunLock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def test_a_live_run_is_refused_by_pid_and_once_its_process_is_gone_resume_continues_it_exactly(base, tmp_path):
    run = copy_of(base, tmp_path)
    shutil.rmtree(run / "checkpoints" / "step_000002")  # as if killed after step 2's rows, before its save
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(run)
        for flags in (["--resume", run], ["--output-dir", run, "--overwrite", *SMALL]):
            result = cli(*flags)
            assert result.exit_code == INPUT_ERROR_EXIT, result.output
            assert f"in use by process {holder.pid}" in one_line(result)
        assert snapshot(run) == before
    finally:
        holder.kill()  # SIGKILL: nothing of it cleans up, the kernel drops its lock
        holder.wait(timeout=30)
    state = setup(resumed_config(run), run, resume=run)  # a real writer holds the lock too
    try:
        assert lock_holder(run) == os.getpid()
        result = cli("--resume", run)
        assert result.exit_code == INPUT_ERROR_EXIT and f"in use by process {os.getpid()}" in one_line(result)
    finally:
        state.close()
    assert lock_holder(run) is None
    result = cli("--resume", run)  # no other flag: the run's own config, continued exactly
    assert result.exit_code == 0, result.output
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(base))
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["preset"], config["sampler"]["name"], config["steps"]) == ("ada-balance", "ada", 2)


@pytest.fixture()
def small_disk(base, tmp_path):
    """A file system of the test's own (tmpfs) with room for one checkpoint of `base`'s run, not two."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    folder = tmp_path / "disk"
    folder.mkdir()
    size = int(1.5 * bytes_under(base / "checkpoints" / "step_000001")) // 1024
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_disk_that_fills_at_a_checkpoint_is_one_line_leaves_no_partial_folder_and_the_last_one_resumes_exactly(
        base, small_disk):
    """The run folder's disk fills while step 2's checkpoint is written: one line naming the folder and the
    space needed, the partial folder gone (its space free again), step 1's checkpoint intact; once there is
    room, the resume is the run `base` ran uninterrupted."""
    run = small_disk / "run"
    result = cli("--preset", "ada-balance", "--steps", 2, "--output-dir", run, *SMALL)
    assert result.exit_code == RUN_FAILURE_EXIT, result.output
    line = one_line(result)
    assert f"no space left in {run / 'checkpoints'} for checkpoint step_000002: it needs about " in line, line
    assert "the partial .tmp_step_000002 was removed; free space, then resume the run (from step_000001)" in line
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001"]
    assert verify_checkpoint(run / "checkpoints" / "step_000001") is None  # whole: every file matches its manifest
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # the user frees space
    result = cli("--resume", run)
    assert result.exit_code == 0, result.output
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(base))
