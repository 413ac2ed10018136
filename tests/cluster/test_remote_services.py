"""The services a run reaches across the network, each on the other host (tests/cluster/hosts.py, no Ray):

- a vLLM server started on host b with `ada vllm-serve` (infra/GPU.md, 3c) serves the rollouts of a run
  driven from host a, the weight sync included, and refuses a request without its key;
- a team `make ui` on host a, bound to its address with credentials (infra/TEAM.md), runs a `train` flow
  started through the API as the Prefect UI starts it on a worker that joined from host b with
  `make ui-worker`, and the run logs to host a's MLflow; a worker without the credentials is refused
  before it starts.

The hosts share the file system, as the platform requires of real machines (the model folder, the
weight-sync folder, the run folders), and `/dev/shm`, which two machines would not (infra/GPU.md says
what only they can show).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ada_core.run.files import read_metrics

pytestmark = pytest.mark.slow

VLLM_PORT = 8000
USER, PASSWORD = "ada-team", "cluster-team-pass"


def popen(host, args: list[str], env: dict, log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    return subprocess.Popen(host.command(args), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=env["PYTHONPATH"].split(os.pathsep)[0])


def wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            pytest.fail(f"exited ({proc.returncode}) before {text!r}:\n{log.read_text(errors='replace')[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {text!r} within {timeout:.0f} s:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)


def status_from(hosts, host, url: str, headers: dict) -> int:
    """The HTTP status of a GET of `url` sent from `host`."""
    code = (f"import urllib.request, urllib.error\nrequest = urllib.request.Request({url!r}, headers={headers!r})\n"
            "try:\n    print(urllib.request.urlopen(request, timeout=30).status)\n"
            "except urllib.error.HTTPError as err:\n    print(err.code)\n")
    return int(hosts.python(host, code).strip())


def test_a_vllm_server_on_the_other_host_serves_a_runs_rollouts_and_takes_its_weights(bare_hosts, tmp_path):
    hosts, key = bare_hosts, secrets.token_hex(16)
    env = {**hosts.env, "ADA_HOME": os.environ["ADA_HOME"], "ADA_VLLM_API_KEY": key}
    python = str(Path(sys.executable))
    serve_log = tmp_path / "serve.log"
    server = popen(hosts.b, [python, "-m", "ada_core.cli", "vllm-serve", "--model", "tiny", "--host", hosts.b.address,
                             "--port", str(VLLM_PORT), "--startup-timeout-s", "600"], env, serve_log)
    try:
        wait_for(serve_log, "vLLM serving", server, timeout=700)
        url = f"http://{hosts.b.address}:{VLLM_PORT}"
        assert status_from(hosts, hosts.a, f"{url}/v1/models", {}) == 401
        assert status_from(hosts, hosts.a, f"{url}/v1/models", {"Authorization": f"Bearer {key}"}) == 200

        out, log = tmp_path / "run", tmp_path / "train.log"
        train = popen(hosts.a, [python, "-m", "ada_core.cli", "train", "--preset", "ada-balance", "--profile", "tiny",
                                "--engine", "vllm", "--output-dir", str(out), "--steps", "2",
                                f"--set=rollout.vllm.base_url={url}", "--set=prompts_per_step=4",
                                "--set=sft_steps=0", "--set=data.train_size=32", "--set=data.eval_size=4",
                                "--set=eval_every=0", "--set=checkpoint_every=0"], env, log)
        assert train.wait(timeout=900) == 0, log.read_text()[-4000:]
        rows = [r for r in read_metrics(out) if "sync/weight_version" in r]
        # Each step's weights reached the server on the other host (the sync checks the version it reports).
        assert [r["sync/weight_version"] for r in rows] == [1, 2]
        assert all(r["budget/generated_tokens"] > 0 and r["sync/reload_s"] > 0 for r in rows)
        assert server.poll() is None
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    assert "vLLM serving" in serve_log.read_text() and key not in serve_log.read_text()


def test_a_worker_on_the_other_host_runs_a_train_flow_of_the_team_make_ui(bare_hosts, tmp_path):
    hosts = bare_hosts
    python = str(Path(sys.executable))
    servers_home, worker_home = tmp_path / "servers-home", tmp_path / "worker-home"
    ui_env = {**hosts.env, "ADA_HOME": str(servers_home), "ADA_UI_HOST": hosts.a.address, "ADA_UI_USER": USER,
              "ADA_UI_PASSWORD": PASSWORD, "ADA_WORKERS": "0"}
    started = subprocess.run(hosts.a.command([python, "infra/ui.py", "start"]), env=ui_env, capture_output=True,
                             text=True, timeout=900, cwd=hosts.env["PYTHONPATH"].split(os.pathsep)[0])
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    assert PASSWORD not in started.stdout + started.stderr
    state = json.loads((servers_home / "ui" / "servers.json").read_text())
    assert state["prefect_url"] == f"http://{hosts.a.address}:4200" and state["auth"] is True
    worker_env = {**hosts.env, "ADA_HOME": str(worker_home), "PREFECT_API_URL": f"{state['prefect_url']}/api",
                  "MLFLOW_TRACKING_URI": state["mlflow_url"], "ADA_WORKER_NAME": "host-b"}

    # Without the credentials: one line, exit 2, no worker started.
    refused = subprocess.run(hosts.b.command([python, "infra/ui.py", "worker"]), env=worker_env, capture_output=True,
                             text=True, timeout=120, cwd=hosts.env["PYTHONPATH"].split(os.pathsep)[0])
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: make ui-worker: Prefect and MLflow refused no credentials (Prefect 401, MLflow 401)"), line
    assert not (worker_home / "ui").exists()

    log = tmp_path / "worker.log"
    worker = popen(hosts.b, [python, "infra/ui.py", "worker"],
                   {**worker_env, "ADA_UI_USER": USER, "ADA_UI_PASSWORD": PASSWORD}, log)
    try:
        wait_for(log, "worker(s) on pool", worker, timeout=120)
        # A teammate on host b starts the train deployment through the API, as the Prefect UI's Run button does.
        client_env = {**worker_env, "PREFECT_API_AUTH_STRING": f"{USER}:{PASSWORD}", "MLFLOW_TRACKING_USERNAME": USER,
                      "MLFLOW_TRACKING_PASSWORD": PASSWORD}
        code = """
import json, time
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as client:
    deployment = client.read_deployment_by_name("train/train")
    form = {**(deployment.parameters.get("params") or {}), "preset": "grpo", "steps": 1, "prompts_per_step": 2,
            "curate": False, "experiment": "cluster-team",
            "overrides": {"data.train_size": 16, "data.eval_size": 4, "sft_steps": 0, "eval_every": 1, "eval_k": 2,
                          "checkpoint_every": 0}}
    run = client.create_flow_run_from_deployment(deployment.id, parameters={"params": form})
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        flow_run = client.read_flow_run(run.id)
        if flow_run.state is not None and flow_run.state.is_final():
            break
        time.sleep(2)
mlflow = MlflowClient()
experiment = mlflow.get_experiment_by_name("cluster-team")
runs = mlflow.search_runs([experiment.experiment_id], f"tags.`prefect.flow_run_id` = '{run.id}'") if experiment else []
print(json.dumps({"id": str(run.id), "state": flow_run.state.type.value, "message": flow_run.state.message,
                  "mlflow": [(r.info.status, r.data.params.get("steps"), r.data.metrics.get("accuracy/heldout_avg_at_k")) for r in runs]}))
"""
        done = subprocess.run(hosts.b.command([python, "-c", code]), env=client_env, capture_output=True, text=True,
                              timeout=900, cwd=hosts.env["PYTHONPATH"].split(os.pathsep)[0])
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["state"] == "COMPLETED", (result, log.read_text()[-3000:])
        [(status, steps, accuracy)] = result["mlflow"]
        assert status == "FINISHED" and steps == "1" and accuracy is not None
        # It ran on host b's worker (no training worker runs on host a), in host b's home.
        assert result["id"] in "".join(p.read_text() for p in (worker_home / "ui").glob("host-b-*.log"))
        assert list((worker_home / "runs").iterdir()) and not (servers_home / "runs").exists()
        # Its artifacts went to host a's store through the MLflow server, not to host b's disk.
        assert any(p.is_file() for p in (servers_home / "mlartifacts").rglob("*"))
        assert not (worker_home / "mlartifacts").exists() or not any((worker_home / "mlartifacts").rglob("*"))
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
        subprocess.run(hosts.a.command([python, "infra/ui.py", "stop"]), env=ui_env, capture_output=True, timeout=120,
                       cwd=hosts.env["PYTHONPATH"].split(os.pathsep)[0])
    assert worker.returncode == 0, log.read_text()[-3000:]
    for path in [log, *(worker_home / "ui").glob("*.log")]:
        assert PASSWORD not in path.read_text(errors="replace"), path
