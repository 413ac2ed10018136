"""The state directory. Everything a run keeps lives under `ADA_HOME` (default `./.ada`)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """An exclusive `flock` on the file `path` (created when missing) for as long as the block runs.

    What processes starting at once must not do together (migrate a new database, build a shared
    folder) runs under it: the others wait, then find it done. The kernel drops the lock when its
    holder dies, so a holder killed mid-way blocks no one."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
