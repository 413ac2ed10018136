"""`make ui`'s servers and the processes it starts: the Prefect server (its UI calling the API on its own
port) and the MLflow server (basic auth for a team), each started in its own session and recorded in
servers.json by pid, start time and boot (`record`), so `stop_pid` later signals them and never a
process that got one of their pids since."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from ada_core.processes import boot_id, identity, stop_group
from ui_env import BIN, LOOPBACK, REPO, Credentials, _get_json, quiet_env

def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, port)) != 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def record(state: dict, procs: list[subprocess.Popen]) -> list[int]:
    """Note which processes these are in `state` (servers.json): pid, start time and boot, so that `stop`
    later signals them and never a process that got one of their pids since. Returns the pids."""
    for proc in procs:
        ident = identity(proc.pid)  # our unreaped child: this is it, even if it has exited already
        if ident is not None:
            state.setdefault("started", {})[str(proc.pid)] = ident
    return [proc.pid for proc in procs]


def stop_pid(pid: int, ident: dict | None = None, timeout_s: float = 20) -> str:
    """SIGTERM the process group we started as `pid`, SIGKILL what is left after `timeout_s`; what happened.

    Only a process proven ours is signalled: this process's own child (`spawn`, not reaped yet), or the
    one `ident` describes (servers.json's record: start time and boot, `ada_core.processes.identity`),
    each member of its group checked on its own. A pid from a stale servers.json (after a reboot, or a
    server that died long ago) may be anyone's by now."""
    own = _STARTED.pop(pid, None)
    if own is not None and ident is None and own.returncode is None:
        ident = identity(pid)  # not reaped, so the pid is still our child's, zombie or not
    if not ident:
        outcome = "not signalled: nothing records which process it was (a servers.json of an older ada?)"
    elif ident.get("boot") != boot_id():
        outcome = "not running (servers.json is from before a reboot)"
    else:
        outcome = stop_group(pid, int(ident["start"]), timeout_s)
    if own is not None:
        own.wait(timeout=10)  # reaped only now: until then nothing else could be given its pid
    return outcome


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
    # Prefect's server as `prefect server start` runs it, with a Run that SQLite refused created again inside
    # it (infra/prefect_server.py says why: the UI's Run button does not retry a 503)
    proc = spawn([str(BIN / "python"), "-u", str(Path(__file__).with_name("prefect_server.py")), "--host", host,
                  "--port", str(port)], env, log_dir / "prefect-server.log")
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
