"""`make ui`'s work side: the process work pool, prefect.yaml's deployments on it (the weekly sweep's
schedule among them), the global concurrency limit, the workers that run the flows (one per GPU of
$ADA_WORKER_GPUS, plus one for group parents), and the reaping of runs whose process died unwatched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ui_env import BIN, GROUP_QUEUE, REPO, SWEEP, TRAIN_QUEUE, WORK_POOL, Credentials, _get_json, quiet_env
from ui_servers import spawn

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
    if count < 0:
        raise SystemExit(f"ADA_WORKERS must be >= 0 (0: training workers only join from other machines), got {count}")
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


def start_workers(home: Path, prefect_url: str, log_dir: Path, count: int,
                  creds: Credentials | None = None) -> list[subprocess.Popen]:
    """`count` training workers with `--limit 1` (one per GPU of $ADA_WORKER_GPUS) and the group worker."""
    gpus = worker_gpus()
    procs = [start_worker(home, prefect_url, log_dir, TRAIN_QUEUE, f"ada-worker-{i}", 1,
                          gpus[i % len(gpus)] if gpus else None, creds) for i in range(count)]
    procs.append(start_worker(home, prefect_url, log_dir, GROUP_QUEUE, "ada-groups", None, creds=creds))
    return procs


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
