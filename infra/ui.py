"""`make ui`: a local Prefect server + MLflow server + process workers, all on 127.0.0.1.

    python infra/ui.py start    # servers, work pool, `prefect deploy --all`, worker; prints the URLs
    python infra/ui.py status
    python infra/ui.py stop     # `make ui-stop`

State lives under $ADA_HOME (default ./.ada): the Prefect home and its SQLite database in
prefect/, the MLflow store in mlflow.db with artifacts in mlartifacts/ (the same store the embedded
default writes, so earlier runs show up), and ui/servers.json with the URLs and process ids. While
the MLflow server answers, flows log to it over HTTP (flows/tracking/store.py reads servers.json), so
several processes never write one SQLite file. Ports: ADA_PREFECT_PORT (4200), ADA_MLFLOW_PORT (5000).

The Prefect UI is a page that calls the API from the browser at the URL its /ui-settings names.
Prefect derives that URL from PREFECT_SERVER_API_PORT, not from `--port`, so a server started on
another port would serve a UI that calls 4200; the server here gets PREFECT_UI_API_URL (and the
host/port settings) for its own port. `status` checks each piece answers and says what is wrong.

Workers (flows/fanout.py runs a group's children on them): $ADA_WORKERS process workers (default 1;
with $ADA_WORKER_GPUS="0,1,..." one per listed GPU, each with that CUDA_VISIBLE_DEVICES) on the
`default` queue of the `ada-process` pool, each `--limit 1`: they run train, evaluate and curate.
One more worker on the `groups` queue runs compare and sweep parents, which mostly wait for their
children, so a parent never takes the slot its children need. The global concurrency limit
$ADA_CONCURRENCY_LIMIT (`ada-train`) gets $ADA_TRAIN_SLOTS slots (default: the number of workers).

The weekly sweep's schedule ships paused (prefect.yaml); `start` prints the one command that resumes it.

A team setup (infra/TEAM.md): ADA_UI_HOST binds both servers to another address than 127.0.0.1, which
`start` refuses without credentials: ADA_UI_USER and ADA_UI_PASSWORD (or ADA_UI_PASSWORD_FILE, a file
holding the password). With them (on any address) the Prefect API requires them
(PREFECT_SERVER_API_AUTH_STRING) and MLflow runs its basic-auth app with that user as its admin;
the workers and `status` get them as PREFECT_API_AUTH_STRING and MLFLOW_TRACKING_USERNAME/PASSWORD in
their environment. The password is never written to servers.json, a command line or a log.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORK_POOL = "ada-process"
TRAIN_QUEUE = "default"  # train, evaluate, curate: one run per worker
GROUP_QUEUE = "groups"  # compare, sweep: parents that wait for their children
BIN = Path(sys.executable).parent  # the venv's prefect and mlflow scripts sit next to its python
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
SWEEP = "sweep/sweep"


class Credentials:
    """The team's user and password for both servers; `repr` never shows the password."""

    def __init__(self, user: str, password: str):
        if not user or ":" in user:
            raise SystemExit("ADA_UI_USER must be a non-empty name without ':'")
        if len(password) < 8:
            raise SystemExit("ADA_UI_PASSWORD must have at least 8 characters")
        self.user, self.password = user, password

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, password=***)"

    @property
    def header(self) -> str:
        """`Basic <base64 user:password>`: what both servers accept (Prefect compares it to its auth string)."""
        return "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()

    def client_env(self) -> dict[str, str]:
        """What a Prefect or MLflow client needs in its environment to be let in."""
        return {"PREFECT_API_AUTH_STRING": f"{self.user}:{self.password}",
                "MLFLOW_TRACKING_USERNAME": self.user, "MLFLOW_TRACKING_PASSWORD": self.password}


def ui_host() -> str:
    """The address both servers bind to and are reached at: $ADA_UI_HOST, default 127.0.0.1."""
    return os.environ.get("ADA_UI_HOST") or "127.0.0.1"


def credentials() -> Credentials | None:
    """$ADA_UI_USER with $ADA_UI_PASSWORD or $ADA_UI_PASSWORD_FILE; None when no user is set."""
    user = os.environ.get("ADA_UI_USER")
    password = os.environ.get("ADA_UI_PASSWORD")
    if os.environ.get("ADA_UI_PASSWORD_FILE"):
        password = Path(os.environ["ADA_UI_PASSWORD_FILE"]).read_text().strip()
    if not user and not password:
        return None
    if not user or not password:
        raise SystemExit("set both ADA_UI_USER and ADA_UI_PASSWORD (or ADA_UI_PASSWORD_FILE), or neither")
    return Credentials(user, password)


def check_exposure(host: str, creds: Credentials | None) -> None:
    """Servers reachable beyond this machine need credentials: refuse to start them without."""
    if host not in LOOPBACK and creds is None:
        raise SystemExit(f"ADA_UI_HOST={host} would expose the Prefect and MLflow servers beyond this machine "
                         "without credentials: set ADA_UI_USER and ADA_UI_PASSWORD (or ADA_UI_PASSWORD_FILE); "
                         "see infra/TEAM.md")


def ada_home() -> Path:
    home = Path(os.environ.get("ADA_HOME") or REPO / ".ada").resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def quiet_env(home: Path) -> dict[str, str]:
    """The environment every process here gets: telemetry off, state under $ADA_HOME."""
    env = dict(os.environ)
    env.update({
        "ADA_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    return env


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, port)) != 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _open(url: str, creds: Credentials | None = None, timeout_s: float = 3.0):
    """urlopen with the team's Authorization header when there are credentials."""
    request = urllib.request.Request(url)
    if creds is not None:
        request.add_header("Authorization", creds.header)
    return urllib.request.urlopen(request, timeout=timeout_s)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Poll `url` until it answers 200; fail early if `proc` exits. Bounded by `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"process for {url} exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s")


RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT")
_STARTED: dict[int, subprocess.Popen] = {}  # this process's children, reaped by stop_pid


def spawn(args: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> subprocess.Popen:
    """Start a background process in its own session, so `stop` can end it and its children by id.

    The caller's torch.distributed rendezvous (MASTER_ADDR/MASTER_PORT, which an in-process DeepSpeed
    engine exports) is not passed on: a worker's flow runs must pick their own port, not bind one the
    caller's process group already holds."""
    env = {k: v for k, v in env.items() if k not in RENDEZVOUS_VARS}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    _STARTED[proc.pid] = proc
    return proc


def prefect_server_env(home: Path, port: int, host: str = "127.0.0.1",
                       creds: Credentials | None = None) -> dict[str, str]:
    """The server's environment: its UI calls the API on this port, whatever the user's shell exports;
    with credentials, the API refuses requests without them (the UI asks for them once)."""
    env = quiet_env(home)
    url = f"http://{host}:{port}"
    env.update({
        "PREFECT_SERVER_API_HOST": host,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_UI_API_URL": f"{url}/api",
        "PREFECT_API_URL": f"{url}/api",
    })
    if creds is not None:
        env["PREFECT_SERVER_API_AUTH_STRING"] = f"{creds.user}:{creds.password}"
        env.update(creds.client_env())
    return env


def start_prefect_server(home: Path, port: int, log_dir: Path, host: str = "127.0.0.1",
                         creds: Credentials | None = None) -> tuple[subprocess.Popen, str]:
    env = prefect_server_env(home, port, host, creds)
    proc = spawn([str(BIN / "prefect"), "server", "start", "--host", host, "--port", str(port),
                  "--analytics-off"], env, log_dir / "prefect-server.log")
    url = f"http://{host}:{port}"
    wait_http(f"{url}/api/health", 120, proc, log_dir / "prefect-server.log")
    ui_api = (_get_json(f"{url}/ui-settings", creds=creds) or {}).get("api_url")
    if ui_api != f"{url}/api":
        raise RuntimeError(f"the Prefect UI at {url} would call the API at {ui_api}, not {url}/api")
    return proc, url


def mlflow_store(home: Path) -> str:
    """The MLflow server's backend store: $ADA_MLFLOW_STORE (e.g. a team's PostgreSQL) or $ADA_HOME/mlflow.db."""
    return os.environ.get("ADA_MLFLOW_STORE") or f"sqlite:///{home / 'mlflow.db'}"


def masked(uri: str) -> str:
    """`postgresql://ada:secret@db/mlflow` -> `postgresql://ada:***@db/mlflow`: a URI fit to print."""
    import re

    return re.sub(r"(//[^/:@]+):[^/]*@", r"\1:***@", uri)


def flask_secret_key(home: Path) -> str:
    """The basic-auth app's CSRF signing key: made once per $ADA_HOME (`ui/mlflow-secret-key`, mode 600)
    and kept, so a restart does not void the forms of open browser tabs."""
    import secrets

    path = home / "ui" / "mlflow-secret-key"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32))
    return path.read_text().strip()


def mlflow_auth_config(home: Path, creds: Credentials) -> Path:
    """The basic-auth app's ini: its user store under $ADA_HOME, `creds.user` as the admin. The
    password is not in it: the app reads MLFLOW_AUTH_ADMIN_PASSWORD when it creates the admin (first
    start only; afterwards the stored password counts, infra/TEAM.md says how to change it)."""
    path = home / "ui" / "mlflow-auth.ini"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[mlflow]\n"
                    "default_permission = READ\n"
                    f"database_uri = sqlite:///{home / 'mlflow-auth.db'}\n"
                    f"admin_username = {creds.user}\n"
                    "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    return path


def start_mlflow_server(home: Path, port: int, log_dir: Path, host: str = "127.0.0.1",
                        creds: Credentials | None = None) -> tuple[subprocess.Popen, str]:
    env = quiet_env(home)
    # MLflow 3's server otherwise forks a job runner and seven huey consumers (GenAI jobs we never
    # submit): eight more processes on a 2-core machine, and they outlive a SIGTERM by 20 s.
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    (home / "mlartifacts").mkdir(exist_ok=True)
    auth: list[str] = []
    if creds is not None:
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(mlflow_auth_config(home, creds))
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = creds.password
        env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", flask_secret_key(home))  # the app's CSRF protection
        auth = ["--app-name", "basic-auth"]
    if host not in LOOPBACK:  # MLflow's host-header check otherwise refuses requests by that address
        env.setdefault("MLFLOW_SERVER_ALLOWED_HOSTS", f"{host},{host}:{port},localhost,127.0.0.1")
    # The store from the environment, not the command line, where `ps` would show a password in it.
    env["MLFLOW_BACKEND_STORE_URI"] = mlflow_store(home)
    proc = spawn([
        str(BIN / "mlflow"), "server", "--host", host, "--port", str(port), "--workers", "1", *auth,
        "--artifacts-destination", str(home / "mlartifacts"),
    ], env, log_dir / "mlflow-server.log")
    url = f"http://{host}:{port}"
    wait_http(f"{url}/health", 120, proc, log_dir / "mlflow-server.log")
    return proc, url


def prefect_cli(args: list[str], env: dict[str, str], timeout_s: float = 300) -> str:
    """Run one `prefect` command against the server in `env`; raise with its output on failure."""
    result = subprocess.run([str(BIN / "prefect"), "--no-prompt", *args], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"prefect {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def api_env(home: Path, prefect_url: str, creds: Credentials | None = None) -> dict[str, str]:
    """A client's environment (the prefect CLI, workers and their flow runs): the API URL and, for a
    team setup, the credentials for both servers."""
    env = quiet_env(home)
    env["PREFECT_API_URL"] = f"{prefect_url}/api"
    env["PWD"] = str(REPO)  # prefect.yaml's pull step: set_working_directory {{ $PWD }}
    if creds is not None:
        env.update(creds.client_env())
    return env


def deploy(home: Path, prefect_url: str, names: list[str] | None = None, creds: Credentials | None = None) -> None:
    """Create the process work pool and register prefect.yaml's deployments (all, or `names`)."""
    env = api_env(home, prefect_url, creds)
    prefect_cli(["work-pool", "create", WORK_POOL, "--type", "process", "--overwrite"], env)
    targets = ["--all"] if not names else [arg for name in names for arg in ("--name", name)]
    prefect_cli(["deploy", *targets], env)


def worker_gpus() -> list[str]:
    """$ADA_WORKER_GPUS as a list of CUDA device ids ("0,1,2" -> ["0", "1", "2"]); empty when unset."""
    return [gpu.strip() for gpu in os.environ.get("ADA_WORKER_GPUS", "").split(",") if gpu.strip()]


def worker_count() -> int:
    count = int(os.environ.get("ADA_WORKERS") or len(worker_gpus()) or 1)
    if count < 1:
        raise SystemExit(f"ADA_WORKERS must be >= 1, got {count}")
    return count


def start_worker(home: Path, prefect_url: str, log_dir: Path, queue: str = TRAIN_QUEUE, name: str = "ada-worker-0",
                 limit: int | None = 1, gpu: str | None = None, creds: Credentials | None = None) -> subprocess.Popen:
    """One process worker on `queue` of the pool; `limit` flow runs at a time; `gpu` its CUDA_VISIBLE_DEVICES."""
    env = api_env(home, prefect_url, creds)
    # Prefect's default 10 s poll adds up to 10 s before each child starts (and again before a
    # matched control); 2 s costs the server one cheap query per worker every 2 s.
    env.setdefault("PREFECT_WORKER_QUERY_SECONDS", "2")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    args = [str(BIN / "prefect"), "worker", "start", "--pool", WORK_POOL, "--type", "process", "--work-queue", queue,
            "--name", name, "--install-policy", "never"]
    if limit is not None:
        args += ["--limit", str(limit)]
    return spawn(args, env, log_dir / f"{name}.log")


def start_workers(home: Path, prefect_url: str, log_dir: Path, count: int, creds: Credentials | None = None) -> list[int]:
    """`count` training workers with `--limit 1` (one per GPU of $ADA_WORKER_GPUS) and the group worker."""
    gpus = worker_gpus()
    pids = [start_worker(home, prefect_url, log_dir, TRAIN_QUEUE, f"ada-worker-{i}", 1,
                         gpus[i % len(gpus)] if gpus else None, creds).pid for i in range(count)]
    pids.append(start_worker(home, prefect_url, log_dir, GROUP_QUEUE, "ada-groups", None, creds=creds).pid)
    return pids


def ensure_concurrency_limit(home: Path, prefect_url: str, name: str, slots: int,
                             creds: Credentials | None = None) -> None:
    """The global concurrency limit `name` with `slots` slots, created or resized."""
    env = api_env(home, prefect_url, creds)
    try:
        prefect_cli(["gcl", "create", name, "--limit", str(slots)], env)
    except RuntimeError:  # it exists (a server restarted on its old database): set its size
        prefect_cli(["gcl", "update", name, "--limit", str(slots)], env)


def reap_dead_runs(home: Path, prefect_url: str, mlflow_url: str, creds: Credentials | None = None) -> None:
    """Runs whose process died while nothing watched (SIGKILL, OOM) stay RUNNING in MLflow and Prefect:
    mark them KILLED / Crashed (flows/resume.py). A failure here is reported, not fatal."""
    env = api_env(home, prefect_url, creds)
    env["MLFLOW_TRACKING_URI"] = mlflow_url
    try:
        result = subprocess.run([sys.executable, "-m", "flows.resume", "reap"], env=env, cwd=REPO,
                                capture_output=True, text=True, timeout=300)
        print(f"ui: {result.stdout.strip() or result.stderr.strip()[-500:]}")
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"ui: could not check for dead runs: {err}")


def state_file(home: Path) -> Path:
    return home / "ui" / "servers.json"


def stop_pid(pid: int, timeout_s: float = 20) -> None:
    """SIGTERM the process group we started for `pid`, then SIGKILL what is left after `timeout_s`."""
    own = _STARTED.pop(pid, None)
    try:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if own is not None:
                own.poll()  # reap our own child: its zombie would keep the group "alive"
            os.killpg(pid, 0)
            time.sleep(0.2)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if own is not None:
        own.wait(timeout=10)


def _get_json(url: str, timeout_s: float = 3.0, creds: Credentials | None = None) -> Any:
    with _open(url, creds, timeout_s) as response:
        return json.loads(response.read().decode() or "null")


def sweep_schedule(prefect_url: str, creds: Credentials | None = None) -> dict[str, Any] | None:
    """The sweep deployment's first schedule (id, active, cron) as the API has it; None without one."""
    deployment = _get_json(f"{prefect_url}/api/deployments/name/{SWEEP}", creds=creds) or {}
    schedules = deployment.get("schedules") or []
    if not schedules:
        return None
    first = schedules[0]
    return {"id": first["id"], "active": first["active"], "cron": (first.get("schedule") or {}).get("cron")}


def resume_sweep_command(state: dict) -> str | None:
    """The one command that starts the weekly sweep's (paused) schedule of a `make ui` state."""
    schedule = state.get("sweep_schedule")
    if not schedule:
        return None
    return (f"PREFECT_API_URL={state['prefect_url']}/api {BIN / 'prefect'} deployment schedule resume "
            f"{SWEEP} {schedule['id']}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check(state: dict, creds: Credentials | None = None) -> list[tuple[str, bool, str]]:
    """(what, ok, detail) for each server and the worker of a `servers.json` state; `creds` for a team
    setup (the default: those of the environment, when `state` says the servers want them)."""
    if creds is None and state.get("auth"):
        creds = credentials()
    results: list[tuple[str, bool, str]] = []
    prefect_url, mlflow_url = state.get("prefect_url"), state.get("mlflow_url")
    if prefect_url:
        try:
            _get_json(f"{prefect_url}/api/health")
            results.append(("Prefect API", True, f"{prefect_url}/api/health answers"))
        except (OSError, ValueError) as err:
            results.append(("Prefect API", False, f"{prefect_url}/api/health does not answer ({err}); see "
                                                  "ui/prefect-server.log, restart with make ui"))
        try:
            ui_api = (_get_json(f"{prefect_url}/ui-settings", creds=creds) or {}).get("api_url")
            expected = f"{prefect_url}/api"
            if ui_api == expected:
                results.append(("Prefect UI", True, f"{prefect_url} calls the API at {ui_api}"))
            else:
                results.append(("Prefect UI", False, f"{prefect_url} calls the API at {ui_api}, not {expected}: every "
                                                     "page will say it cannot connect; restart with make ui"))
        except (OSError, ValueError, AttributeError) as err:
            results.append(("Prefect UI", False, f"{prefect_url}/ui-settings does not answer ({err})"))
    else:
        results.append(("Prefect API", False, "servers.json names no Prefect server"))
    if mlflow_url:
        try:
            with _open(f"{mlflow_url}/health", creds) as response:
                ok = response.status == 200
            results.append(("MLflow", ok, f"{mlflow_url}/health answers" if ok else f"{mlflow_url}/health: {response.status}"))
        except OSError as err:
            results.append(("MLflow", False, f"{mlflow_url}/health does not answer ({err}); see ui/mlflow-server.log"))
    else:
        results.append(("MLflow", False, "servers.json names no MLflow server"))
    workers = [int(pid) for pid in state.get("pids", {}).get("workers") or []]
    alive = [pid for pid in workers if _pid_alive(pid)]
    if workers and alive == workers:
        results.append(("worker", True, f"{len(workers)} workers (pids {', '.join(map(str, workers))}) poll work "
                                        f"pool '{WORK_POOL}'"))
    else:
        dead = sorted(set(workers) - set(alive))
        results.append(("worker", False, f"{'workers ' + ', '.join(map(str, dead)) + ' are' if dead else 'no worker is'} "
                                         "not running; deployments will stay Scheduled; see ui/ada-worker-*.log "
                                         "and ui/ada-groups.log, restart with make ui"))
    return results


def status(home: Path) -> int:
    """Print one line per piece; 0 when all answer, 1 otherwise (also when nothing runs)."""
    path = state_file(home)
    if not path.exists():
        print(f"ui: not running (no {path}); start with make ui")
        return 1
    results = check(json.loads(path.read_text()))
    for what, ok, detail in results:
        print(f"{'ok     ' if ok else 'PROBLEM'} {what:<12} {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1


def start(home: Path) -> dict:
    state_path = state_file(home)
    if state_path.exists():
        stop(home)  # a stale state file from a crashed session: clear what it names first
    host, creds = ui_host(), credentials()
    check_exposure(host, creds)  # before anything starts
    log_dir = home / "ui"
    prefect_port = int(os.environ.get("ADA_PREFECT_PORT", 4200))
    mlflow_port = int(os.environ.get("ADA_MLFLOW_PORT", 5000))
    for name, port in (("ADA_PREFECT_PORT", prefect_port), ("ADA_MLFLOW_PORT", mlflow_port)):
        if not port_is_free(port, "127.0.0.1" if host in ("0.0.0.0", "::") else host):
            raise SystemExit(f"port {port} on {host} is taken; set {name} to a free port")
    state: dict = {"pids": {}, "auth": creds is not None, "host": host}  # never the password
    try:
        prefect_proc, prefect_url = start_prefect_server(home, prefect_port, log_dir, host, creds)
        state.update(prefect_url=prefect_url)
        state["pids"]["prefect_server"] = prefect_proc.pid
        _write_state(state_path, state)
        mlflow_proc, mlflow_url = start_mlflow_server(home, mlflow_port, log_dir, host, creds)
        state.update(mlflow_url=mlflow_url)
        state["pids"]["mlflow_server"] = mlflow_proc.pid
        _write_state(state_path, state)
        deploy(home, prefect_url, creds=creds)
        state["sweep_schedule"] = sweep_schedule(prefect_url, creds)
        workers = worker_count()
        limit = os.environ.get("ADA_CONCURRENCY_LIMIT", "ada-train")
        ensure_concurrency_limit(home, prefect_url, limit, int(os.environ.get("ADA_TRAIN_SLOTS") or workers), creds)
        state["concurrency_limit"] = limit
        state["pids"]["workers"] = start_workers(home, prefect_url, log_dir, workers, creds)
        _write_state(state_path, state)
        reap_dead_runs(home, prefect_url, mlflow_url, creds)
    except BaseException:
        stop(home)
        raise
    return state


def stop(home: Path) -> None:
    path = state_file(home)
    if not path.exists():
        print("ui: nothing running (no servers.json)")
        return
    state = json.loads(path.read_text())
    pids = state.get("pids", {})
    for name in ("workers", "worker", "mlflow_server", "prefect_server"):  # workers first: they talk to both
        for pid in (pids.get(name) or []) if name == "workers" else [pids.get(name)]:
            if pid:
                stop_pid(int(pid))
                print(f"ui: stopped {name} (pid {pid})")
    path.unlink()


def _write_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status"])
    args = parser.parse_args(argv)
    home = ada_home()
    if args.command == "stop":
        stop(home)
        return
    if args.command == "status":
        raise SystemExit(status(home))
    state = start(home)
    for what, ok, detail in check(state):
        print(f"{'ok     ' if ok else 'PROBLEM'} {what:<12} {detail}")
    print(f"""
Prefect UI : {state['prefect_url']}     (deployments: train, compare, evaluate, curate, sweep;
                                          work pool '{WORK_POOL}': {len(state['pids']['workers']) - 1} worker(s)
                                          with --limit 1, one for compare/sweep parents;
                                          concurrency limit '{state['concurrency_limit']}')
MLflow UI  : {state['mlflow_url']}     (store {masked(mlflow_store(home))}, artifacts {home / 'mlartifacts'})
Logs       : {home / 'ui'}
Trigger a run from the Prefect UI (Deployments -> compare -> Run), or:
  PREFECT_API_URL={state['prefect_url']}/api {BIN / 'prefect'} deployment run compare/compare
{sweep_note(state)}{auth_note(state)}Stop everything with: make ui-stop
""")


def sweep_note(state: dict) -> str:
    command = resume_sweep_command(state)
    if command is None:
        return ""
    if state["sweep_schedule"]["active"]:
        return f"The weekly sweep ({state['sweep_schedule']['cron']}, UTC) is scheduled.\n"
    return (f"The weekly sweep ({state['sweep_schedule']['cron']}, UTC) ships paused; start its schedule with\n"
            f"  {command}\n  (or Prefect UI -> Deployments -> sweep -> the schedule's toggle)\n")


def auth_note(state: dict) -> str:
    if not state.get("auth"):
        return ""
    return ("Both servers want the team's credentials (ADA_UI_USER / ADA_UI_PASSWORD): clients send them as\n"
            "  PREFECT_API_AUTH_STRING=<user>:<password>, MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD\n"
            "  (the commands above too); see infra/TEAM.md\n")


if __name__ == "__main__":
    main()
