"""Killed flows resume: a real `train` / `compare` flow process is stopped at an exact point, killed
by its pid (SIGKILL), and resumed through the flow under Prefect's test harness.

The child process stops itself (SIGSTOP) right after a chosen metrics row or checkpoint, so the kill
lands at the same place on every machine; the test then SIGKILLs it while it is stopped.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from ada_core import metrics as K
from ada_core.run.files import RUN_INFO, read_metrics
from flows import tracking
from flows.params import CompareParams, TrainParams
from flows.resume import reap_dead_runs

pytestmark = pytest.mark.slow

OVERRIDES = {"sft_steps": 0, "eval_every": 3, "eval_k": 2, "checkpoint_every": 2, "data.train_size": 48,
             "data.eval_size": 8}
TRAIN = {"preset": "grpo", "steps": 6, "prompts_per_step": 4, "curate": False, "overrides": OVERRIDES,
         "experiment": "resume-train"}
COMPARE = {"variants": ["grpo", "ada-balance"], "matched_grpo": False, "steps": 4, "prompts_per_step": 4,
           "curate": False, "overrides": OVERRIDES, "experiment": "resume-compare"}

CHILD = r"""
import json, os, signal, sys
import ada_core.run.files as F
import ada_core.training as T

spec = json.loads(sys.argv[1])

def stop():
    os.kill(os.getpid(), signal.SIGSTOP)  # the test SIGKILLs us by pid while we are stopped

def ours(folder):
    return folder.name.startswith(spec["folder"])

if spec["at"] == "row":
    append = F.append_jsonl
    def append_jsonl(path, row):
        append(path, row)
        if ours(path.parent) and row["step"] == spec["step"] and "time/step_s" in row:
            stop()
    F.append_jsonl = append_jsonl
else:
    save = T.save_checkpoint
    def save_checkpoint(state):
        path = save(state)
        if ours(state.output_dir) and state.step == spec["step"]:
            stop()  # saved, but its rows not yet sent to MLflow
        return path
    T.save_checkpoint = save_checkpoint

if spec["flow"] == "train":
    from flows.params import TrainParams
    from flows.train import train
    train(TrainParams(**spec["params"]))
else:
    from flows.compare import compare
    from flows.params import CompareParams
    compare(CompareParams(**spec["params"]))
"""


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not (k.startswith(("time/", "throughput/")) or k.endswith("_s"))}
            for r in rows]


@pytest.fixture(scope="module")
def resume_env(prefect_harness, ada_home):
    from prefect.settings import PREFECT_API_URL

    patch = pytest.MonkeyPatch()
    patch.setenv("TQDM_DISABLE", "1")
    patch.setenv("ADA_TORCH_THREADS", "1")  # the same kernels in the killed, resumed and reference runs
    patch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())  # the killed child reports to the harness
    yield MlflowClient(tracking.default_tracking_uri())
    patch.undo()


def run_until_killed(flow: str, params: dict, folder: str, at: str, step: int, log: Path) -> None:
    """Run a flow in a child process until it stops at (`at`, `step`) in a run folder named `folder*`; SIGKILL it."""
    spec = json.dumps({"flow": flow, "params": params, "folder": folder, "at": at, "step": step})
    with open(log, "wb") as fh:
        # Not this process's torch.distributed rendezvous (DeepSpeed exported it when a run here set up).
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE",
                                                               "LOCAL_RANK")}
        proc = subprocess.Popen([sys.executable, "-c", CHILD, spec], stdout=fh, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        pid, status = os.waitpid(proc.pid, os.WUNTRACED | os.WNOHANG)
        if pid and os.WIFSTOPPED(status):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            return
        if pid:
            pytest.fail(f"the flow ended before it reached {at} {step}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the flow did not reach {at} {step} in time:\n{log.read_text()[-3000:]}")


def assert_one_value_per_step(client: MlflowClient, run_id: str, rows: list[dict]) -> None:
    """MLflow's history of every metric is exactly metrics.jsonl's: one value per step, the same value."""
    keys = {k for r in rows for k in r if k != "step"}
    for key in sorted(keys):
        expected = [(r["step"], r[key]) for r in rows if key in r]
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert [s for s, _ in history] == [s for s, _ in expected], key
        for (_, got), (_, want) in zip(history, expected):
            assert got == want or (math.isnan(got) and math.isnan(want)), key


def flow_run_state(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state.type.value


def running_task_runs(flow_run_id: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [r.name for r in runs if r.state is not None and r.state.is_running()]


def test_a_killed_train_flow_resumes_into_the_same_mlflow_run(resume_env, tmp_path):
    from flows.train import train

    client = resume_env
    reference = train(TrainParams(**TRAIN, output_dir=str(tmp_path / "reference"), run_name="reference"))
    killed = tmp_path / "killed"
    run_until_killed("train", {**TRAIN, "output_dir": str(killed)}, "killed", "row", 5, tmp_path / "child.log")

    run_id = json.loads((killed / RUN_INFO).read_text())["mlflow_run_id"]
    before = client.get_run(run_id)
    assert before.info.status == "RUNNING"  # what the kill leaves
    # Rows reach MLflow with the checkpoint that covers them: 1-4 are there, 5 (after it) is not.
    assert [m.step for m in client.get_metric_history(run_id, "time/step_s")] == [1, 2, 3, 4]

    result = train(TrainParams(**TRAIN, resume=run_id))
    assert result["run_id"] == run_id and result["run_dir"] == str(killed)
    after = client.get_run(run_id)
    assert after.info.status == "FINISHED" and after.data.tags["ada.resumed_from"] == "step_000004"
    assert after.data.tags["ada.killed_reason"]  # marked KILLED before the resume reopened it
    assert flow_run_state(before.data.tags["prefect.flow_run_id"]) == "CRASHED"
    rows = read_metrics(killed)
    assert without_timing(rows) == without_timing(read_metrics(reference["run_dir"]))
    assert_one_value_per_step(client, run_id, rows)
    for axis in (K.VS_SAMPLES, K.VS_MFLOPS):  # the budget axes too: every point once, as uninterrupted
        for key in (K.REWARD_MEAN, K.EVAL_AVG_AT_K):
            got, want = ([(m.step, m.value) for m in client.get_metric_history(run, K.budget_axis_key(axis, key))]
                         for run in (run_id, reference["run_id"]))
            assert len(want) > 3 and sorted(got) == sorted(want), (axis, key, got, want)


def test_a_resumed_compare_skips_the_finished_child_and_resumes_the_killed_one(resume_env, tmp_path, ada_home):
    from flows.compare import compare

    client = resume_env
    runs = ada_home / "runs"
    existing = set(runs.glob("compare-*")) if runs.exists() else set()
    # ada-balance (the reference) runs first, then grpo: kill grpo just after its step-2 checkpoint is
    # saved and before its rows were sent, so the resume must send them.
    run_until_killed("compare", COMPARE, "grpo-s0", "checkpoint", 2, tmp_path / "child.log")
    [group] = set(runs.glob("compare-*")) - existing
    first, second = group / "ada-balance-s0", group / "grpo-s0"
    first_result = (first / "result.json").stat().st_mtime_ns
    first_run = json.loads((first / RUN_INFO).read_text())["mlflow_run_id"]
    second_run = json.loads((second / RUN_INFO).read_text())["mlflow_run_id"]
    first_end = client.get_run(first_run).info.end_time
    assert not (second / "result.json").exists()
    # What `make ui` does at start: the parent and the killed child are marked KILLED, their flow run Crashed.
    reaped = reap_dead_runs(client)
    assert second_run in reaped and len(reaped) == 2  # the child and the compare parent
    killed = client.get_run(second_run)
    assert killed.info.status == "KILLED" and flow_run_state(killed.data.tags["prefect.flow_run_id"]) == "CRASHED"
    assert running_task_runs(killed.data.tags["prefect.flow_run_id"]) == []  # checkpoint-step-2 was Running
    assert client.get_run(first_run).info.status == "FINISHED"

    summary = compare(CompareParams(**COMPARE, resume=str(group)))
    assert {c["variant"]: c["run_id"] for c in summary["children"]} == {"ada-balance": first_run, "grpo": second_run}
    assert (first / "result.json").stat().st_mtime_ns == first_result  # not rerun
    assert client.get_run(first_run).info.end_time == first_end
    assert client.get_run(second_run).info.status == "FINISHED"
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.run_id in reaped and parent.info.status == "FINISHED"
    assert_one_value_per_step(client, second_run, read_metrics(second))
    assert [r["step"] for r in read_metrics(second) if "time/step_s" in r] == [1, 2, 3, 4]


@pytest.mark.parametrize("fail_at, resumed_from", [(3, "step_000002"), (1, None)])
def test_a_flow_level_retry_resumes_from_the_last_checkpoint(resume_env, tmp_path, monkeypatch, fail_at,
                                                             resumed_from):
    """A failure after the step-2 checkpoint (or before any); Prefect retries the flow run, which finds its
    own MLflow run (tag prefect.flow_run_id) and resumes it (or starts it over, in the same MLflow run)."""
    import ada_core.run.files as F
    from flows.train import train

    append, failed = F.append_jsonl, []

    def fail_once(path, row):
        append(path, row)
        if row["step"] == fail_at and "time/step_s" in row and not failed:
            failed.append(True)
            raise RuntimeError(f"injected failure after step {fail_at}")

    monkeypatch.setattr(F, "append_jsonl", fail_once)
    out = tmp_path / "retried"
    result = train.with_options(retries=1, retry_delay_seconds=0)(
        TrainParams(**{**TRAIN, "steps": 4}, output_dir=str(out)))
    client = resume_env
    run = client.get_run(result["run_id"])
    assert failed and run.info.status == "FINISHED" and run.data.tags.get("ada.resumed_from") == resumed_from
    rows = read_metrics(out)
    assert [r["step"] for r in rows if "time/step_s" in r] == [1, 2, 3, 4]
    assert_one_value_per_step(client, result["run_id"], rows)


def test_a_resume_given_only_the_run_folder_continues_the_runs_own_config(resume_env, tmp_path):
    """TrainParams' defaults (ada-balance, curate) are not the run's: the resume takes the run's config.yaml,
    refuses a value that differs from it before anything is written, and records what it let change."""
    from flows.train import train

    client = resume_env
    out = tmp_path / "own"
    first = train(TrainParams(**{**TRAIN, "steps": 2, "experiment": "resume-own"}, output_dir=str(out)))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    with pytest.raises(Exception, match=r"resume .*would change what the run is: preset: grpo -> ada-balance"):
        train(TrainParams(resume=str(out), preset="ada-balance", curate=False, steps=3, experiment="resume-own"))
    with pytest.raises(Exception, match=r"optim\.lr: 0\.0003 -> 0\.001"):
        train(TrainParams(resume=str(out), overrides={"optim.lr": 1e-3}, experiment="resume-own"))
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()} == before
    assert client.get_run(first["run_id"]).info.status == "FINISHED"

    result = train(TrainParams(resume=str(out), steps=3, experiment="resume-own"))
    run = client.get_run(first["run_id"])
    assert (result["run_id"], result["preset"], result["variant"]) == (first["run_id"], "grpo", "grpo")
    assert run.data.tags["ada.resume_changes"] == "steps: 2 -> 3" and run.data.tags["ada.preset"] == "grpo"
    assert [r["step"] for r in read_metrics(out) if "time/step_s" in r] == [1, 2, 3]
    assert_one_value_per_step(client, first["run_id"], read_metrics(out))


def test_an_override_the_flow_sets_itself_is_refused_by_the_flow_call(resume_env, tmp_path):
    """`overrides: {seed: 3}` ran seed 3 under the name, tags and report of seed 0; now the parameters refuse it."""
    from flows.train import train

    used = tmp_path / "used"  # a folder the old code refused later, for another reason
    (used / "checkpoints" / "step_000001").mkdir(parents=True)
    (used / "checkpoints" / "step_000001" / "COMPLETE").write_text("ok\n")
    (used / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(Exception, match=r"overrides: 'seed' is set by this flow's own `seed` field"):
        train(params={**TRAIN, "overrides": {**OVERRIDES, "seed": 3}, "output_dir": str(used)})
    with pytest.raises(Exception, match=r"overrides: unknown key 'sampler\.MM'"):
        train(params={**TRAIN, "overrides": {**OVERRIDES, "sampler.MM": 3}, "output_dir": str(used)})


@pytest.mark.parametrize("crash_in", ["metrics", "upload"])
def test_a_crash_in_the_final_checkpoints_send_loses_nothing_on_resume(resume_env, tmp_path, monkeypatch, crash_in):
    """The run crashes while the final checkpoint goes to MLflow: before its metric rows are sent, or with
    one file of the checkpoint uploaded. The resume (nothing left to train) must still send every row and
    every accuracy/vs_samples and vs_mflops point, upload the checkpoint whole, register it, and report real metrics."""
    from ada_core.run.files import RESULT
    from flows.tracking import logger as tracking_logger
    from flows.train import train

    client, name, out, crashed = resume_env, f"crash-in-{crash_in}", tmp_path / "run", []
    params = {**TRAIN, "steps": 2, "register_as": name, "experiment": "resume-crash"}
    if crash_in == "metrics":
        on_checkpoint = tracking_logger.RunLogger.on_checkpoint

        def crash(self, step, path):
            if not crashed and step == 2:
                crashed.append(True)
                raise RuntimeError("injected crash: sending the final checkpoint's metrics")
            on_checkpoint(self, step, path)

        monkeypatch.setattr(tracking_logger.RunLogger, "on_checkpoint", crash)
    else:
        upload = tracking_logger.log_checkpoint

        def crash(mlflow_client, run_id, checkpoint):
            if not crashed and checkpoint.name == "step_000002":
                crashed.append(True)
                mlflow_client.log_artifact(run_id, str(checkpoint / "hf" / "config.json"),
                                           artifact_path=f"checkpoints/{checkpoint.name}/hf")
                raise RuntimeError("injected crash: uploading the final checkpoint")
            return upload(mlflow_client, run_id, checkpoint)

        monkeypatch.setattr(tracking_logger, "log_checkpoint", crash)
    with pytest.raises(RuntimeError, match="injected crash"):
        train(TrainParams(**params, output_dir=str(out)))
    run_id = json.loads((out / RUN_INFO).read_text())["mlflow_run_id"]

    result = train(TrainParams(**params, resume=run_id))
    rows = read_metrics(out)
    expected = {k: v for r in rows if r["step"] == 2 for k, v in r.items() if k != "step"}  # step 2 and its eval
    assert K.REWARD_MEAN in expected and K.EVAL_AVG_AT_K in expected
    assert result["metrics"] == expected == json.loads((out / RESULT).read_text())["metrics"]
    assert_one_value_per_step(client, run_id, rows)
    first, cum = (next(r for r in rows if r["step"] == s and K.TIME_STEP_S in r)[K.BUDGET_GENERATED_SAMPLES_CUM]
                  for s in (1, 2))
    # Every point of the shared grid the run's curves cover, once: evaluations from 0 to the last one's budget,
    # the reward from step 1's budget on.
    grid = tracking.grid_points(-1, cum)
    history = {key: sorted(m.step for m in client.get_metric_history(run_id, K.budget_axis_key(K.VS_SAMPLES, key)))
               for key in (K.EVAL_AVG_AT_K, K.REWARD_MEAN)}
    assert history == {K.EVAL_AVG_AT_K: grid, K.REWARD_MEAN: [g for g in grid if g >= first]}, history
    for key in (K.EVAL_AVG_AT_K, K.REWARD_MEAN):
        steps = [m.step for m in client.get_metric_history(run_id, K.budget_axis_key(K.VS_MFLOPS, key))]
        assert steps and len(steps) == len(set(steps)), (key, steps)
    # The registered version's files are all in MLflow, byte for byte the checkpoint's.
    assert str(result["registered_version"]) == "1"
    local = out / "checkpoints" / "step_000002"
    got = tracking.download_model(f"models:/{name}/1", tracking.default_tracking_uri(), tmp_path / "download")
    assert {p.name: p.stat().st_size for p in got.iterdir()} == {p.name: p.stat().st_size for p in (local / "hf").iterdir()}
