"""What every part of `make ui` (infra/ui.py) shares: where its state lives ($ADA_HOME, servers.json), the
address both servers bind to, the team's credentials (`ADA_UI_USER`/`ADA_UI_PASSWORD`) and an HTTP GET
that sends them, the environment each process gets, and the names of the work pool and its queues."""

from __future__ import annotations

import base64
import json
import os
import sys
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


def state_file(home: Path) -> Path:
    return home / "ui" / "servers.json"


def _open(url: str, creds: Credentials | None = None, timeout_s: float = 3.0):
    """urlopen with the team's Authorization header when there are credentials."""
    request = urllib.request.Request(url)
    if creds is not None:
        request.add_header("Authorization", creds.header)
    return urllib.request.urlopen(request, timeout=timeout_s)


def _get_json(url: str, timeout_s: float = 3.0, creds: Credentials | None = None) -> Any:
    with _open(url, creds, timeout_s) as response:
        return json.loads(response.read().decode() or "null")
