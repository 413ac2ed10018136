"""The state directory. Everything a run keeps lives under `ADA_HOME` (default `./.ada`)."""

from __future__ import annotations

import os
from pathlib import Path


def ada_home(create: bool = True) -> Path:
    """`$ADA_HOME`, or `./.ada` in the working directory; created on first use unless `create=False`."""
    home = Path(os.environ.get("ADA_HOME") or Path.cwd() / ".ada").resolve()
    if create:
        home.mkdir(parents=True, exist_ok=True)
    return home


def models_dir() -> Path:
    path = ada_home() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir(create: bool = True) -> Path:
    path = ada_home(create) / "runs"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    path = ada_home() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path
