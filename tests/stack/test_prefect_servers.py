"""One pytest process, two Prefect servers: each flow's task runs reach the server it ran against.

Task runs reach Prefect's API only as events, through one process-wide events worker that stays
on the first server it sent to (see `on_prefect_server`, stack/conftest.py). test_fanout.py and
test_browser.py run flows against servers of their own in the same process as the harness's flows
(test_flows.py), in whatever order pytest runs them: this test checks both ways, on two small flows.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect import flow, task

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@task
def one_step(i: int) -> int:
    return i


@flow(name="two-servers")
def two_steps() -> str:
    from prefect.runtime import flow_run

    one_step(1)
    one_step(2)
    return flow_run.id


def task_run_names(flow_run_id: str, timeout_s: float = 60) -> list[str]:
    """The flow run's task runs on the current server, once both are recorded (bounded wait)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if len(runs) >= 2 or time.monotonic() > deadline:
                return sorted(r.name.rsplit("-", 1)[0] for r in runs)
            time.sleep(0.5)


def test_task_runs_reach_the_server_their_flow_ran_on(prefect_harness, prefect_api, ui_stack):
    """The harness, then the `make ui` stack's Prefect server (a server of its own, as test_fanout's
    and test_browser's are), then the harness again, all in this process."""
    from prefect.settings import PREFECT_API_URL

    harness = PREFECT_API_URL.value()
    url = ui_stack[1]["prefect_url"]
    before = two_steps()  # the harness first: its events worker exists when the switch comes
    with prefect_api(f"{url}/api"):
        other = two_steps()
    after = two_steps()
    assert task_run_names(before) == task_run_names(after) == ["one_step", "one_step"]
    with prefect_api(f"{url}/api"):
        assert task_run_names(other) == ["one_step", "one_step"]
        assert task_run_names(after, timeout_s=0) == []  # nothing of the harness's went there
    assert PREFECT_API_URL.value() == harness


# ---------------------------------------------------------------------------------------------
# Prefect's temporary server on a fresh home, from a process that only imported `flows`

CLEARED = ("PREFECT_SERVER_ANALYTICS_ENABLED", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PREFECT_API_URL",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "MLFLOW_TRACKING_URI", "PREFECT_HOME", "ADA_HOME")
# The cheapest real `train` run: one step of two prompts, no SFT, curation, evaluation or checkpoint. The
# last line shows the telemetry settings the child ended with: none was set but by `import flows`.
TRAIN_FLOW = """
import os, flows
from flows.params import TrainParams
from flows.train import train

result = train(TrainParams(preset="grpo", steps=1, prompts_per_step=2, curate=False, experiment="first-start",
                           overrides={"model": MODEL, "sft_steps": 0, "eval_every": 0, "checkpoint_every": 0,
                                      "data.train_size": 8, "data.eval_size": 2}))
print("finished", os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"], os.environ["MLFLOW_DISABLE_TELEMETRY"],
      result["run_id"])
"""


def _flow_process(code: str, home, tiny_model) -> subprocess.Popen:
    """`code` in a fresh interpreter whose environment has none of the telemetry or server settings."""
    # Nor this process's torch.distributed rendezvous (an in-process DeepSpeed engine exports it).
    env = {k: v for k, v in os.environ.items()
           if k not in CLEARED and k not in ("MASTER_ADDR", "MASTER_PORT") and not k.startswith("PYTEST")}
    env.update({"ADA_HOME": str(home), "PREFECT_HOME": str(home / "prefect"), "PYTHONPATH": str(REPO),
                "TQDM_DISABLE": "1",
                # Had anything been left on, nothing leaves the machine: an unreachable proxy.
                "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                "NO_PROXY": "127.0.0.1,localhost"})
    code = code.replace("MODEL", repr(str(tiny_model)))  # the session's tiny model: not rebuilt in the new home
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _check_finished(home, procs: list[subprocess.Popen], flows: int) -> None:
    """Every train run finished with telemetry off, and the home's Prefect database shows it: `flows`
    completed flow runs, no telemetry session row (the server's heartbeat never ran)."""
    for proc in procs:
        out = proc.communicate(timeout=900)[0]
        assert proc.returncode == 0 and "finished false true" in out, out[-3000:]
    with sqlite3.connect(home / "prefect" / "prefect.db") as db:
        assert db.execute("select count(*) from configuration where key = 'TELEMETRY_SESSION'").fetchone() == (0,)
        assert db.execute("select count(*) from flow_run where state_type = 'COMPLETED'").fetchone() == (flows,)


def test_flows_start_at_once_on_a_fresh_home_with_telemetry_off(tmp_path, tiny_model):
    """Four `train` flows started together on one new Prefect database (its first start: every
    migration), from processes that set nothing but `import flows`: all four finish.

    With Prefect's own 20 s start-up bound all four timed out on this 2-core machine ("Timed out while
    attempting to connect to ephemeral Prefect API server"); with 300 s and no migration lock, two of
    four lost the migration race (docs/benchmarks/prefect-start.md)."""
    home = tmp_path / "home"
    home.mkdir()
    _check_finished(home, [_flow_process(TRAIN_FLOW, home, tiny_model) for _ in range(4)], flows=4)


# Prefect checks that the port it chose is free, then starts uvicorn, which binds it seconds later. Here
# another server binds it right after the check (`find_available_port`'s first answer), as a flow process
# started at the same moment can: it answers the health check, and our uvicorn finds the port taken.
PORT_TAKEN = """
import json, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from prefect.server.api.server import SubprocessASGIServer
import flows.runtime

seen = []
class Other(BaseHTTPRequestHandler):  # another process's server: healthy, and no Prefect API
    def do_GET(self):
        seen.append(self.command + " " + self.path)
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    do_POST = do_PATCH = do_GET
    def log_message(self, *args):
        pass

choose = SubprocessASGIServer.find_available_port
def chosen_then_taken(self):
    port = choose(self)
    SubprocessASGIServer.find_available_port = choose  # the next start chooses as Prefect does
    other = ThreadingHTTPServer(("127.0.0.1", port), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    return port
SubprocessASGIServer.find_available_port = chosen_then_taken

@flows.runtime.flow(name="port-taken")
def hello():
    from prefect.runtime import flow_run
    return flow_run.id

run_id = hello()
print("result", json.dumps({"run": str(run_id), "other": seen}), flush=True)
"""


def test_a_flow_whose_servers_port_another_server_took_runs_on_a_server_of_its_own(tmp_path):
    """Another server takes the port between Prefect's check and our server's bind, and answers the
    health check: the flow still runs on this process's own server (another port), and the other server
    saw nothing but health checks."""
    import json

    home = tmp_path / "home"
    home.mkdir()
    proc = _flow_process(PORT_TAKEN, home, tiny_model=None)
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, out[-3000:]
    result = json.loads(next(line for line in out.splitlines() if line.startswith("result "))[len("result "):])
    assert result["other"] and set(result["other"]) == {"GET /api/health"}, result
    assert "was another process's" in out
    with sqlite3.connect(home / "prefect" / "prefect.db") as db:
        assert db.execute("select count(*) from flow_run where id = ? and state_type = 'COMPLETED'",
                          (result["run"],)).fetchone() == (1,)


@pytest.mark.load  # about 5 minutes: `make test-load`, not `make test`
def test_flows_start_on_ten_fresh_homes_in_a_row(tmp_path, tiny_model):
    """Ten `train` flows one after another, each a new process on a new ADA_HOME: each is the temporary
    server's very first start, on a database that did not exist. All ten finish.

    Before the 300 s start-up bound, 4 of 4 such first starts in a row timed out here. Prints each
    start's seconds (docs/benchmarks/prefect-start.md)."""
    seconds = []
    for i in range(10):
        home = tmp_path / f"home-{i}"
        home.mkdir()  # raises on a folder that exists: every home is new
        started = time.perf_counter()
        _check_finished(home, [_flow_process(TRAIN_FLOW, home, tiny_model)], flows=1)
        seconds.append(round(time.perf_counter() - started, 1))
    print("seconds per first start:", seconds, "median", round(statistics.median(seconds), 1))


def test_importing_flows_sets_telemetry_defaults_but_keeps_the_users(tmp_path):
    code = "import os, flows; print([os.environ[k] for k in flows.ENV_DEFAULTS])"
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['false', 'true', '1', '300']"
    env.update({"MLFLOW_DISABLE_TELEMETRY": "false", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['false', 'false', '1', '60']"
