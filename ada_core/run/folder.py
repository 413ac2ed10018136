"""Who may write into a run folder.

A run folder holds one run's record: its config, its per-step metrics and its checkpoints. A second
run written into it would append its rows to the first one's `metrics.jsonl` and overwrite its
checkpoints, so the file would no longer describe either run. Every writer of a run folder (the CLI,
the `train` flow, `trainer.setup`) therefore claims it here first:

- a folder another live process is writing is refused, naming its pid: the writer holds an
  exclusive `flock` on `run.lock` in the folder for as long as it runs (`RunLock`), and the kernel
  drops it when that process ends, however it ends (SIGKILL included), so a dead run never blocks;
- an empty or new folder is taken as it is;
- a folder left by a run that stopped before its first complete checkpoint holds nothing to resume:
  it is taken too, its leftovers moved aside to `<name>.replaced-<time>` (never deleted);
- a folder that holds a run with a checkpoint is refused, with nothing in it changed, unless the
  caller resumes that very run (`resume` is the folder itself) or asks to `overwrite`, which moves
  the old run aside the same way.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from ada_core.errors import RunDirError, RunInUse
from ada_core.run import files
from ada_core.run.checkpoints import latest_checkpoint

__all__ = ["RUN_DIRS", "RUN_FILES", "RunDirError", "RunInUse", "RunLock", "check_run_dir", "claim_run_dir",
           "lock_holder", "run_contents"]

log = logging.getLogger(__name__)

# What marks a folder as holding a run: any one of these is enough.
RUN_FILES = (files.CONFIG, files.METRICS, files.GENERATIONS)  # any of these: the folder holds a run
RUN_DIRS = (files.CHECKPOINTS,)


class RunLock:
    """The exclusive lock of the one process writing a run folder: `flock` on `<folder>/run.lock`,
    which also holds that process's pid for the message a second writer gets.

    The lock belongs to the open file, so the kernel releases it when the process ends, however it
    ends; the file itself stays (deleting it would let two writers lock two different files).
    """

    def __init__(self, folder: Path, handle):
        self.folder = folder
        self._handle = handle

    @classmethod
    def acquire(cls, folder: str | Path) -> RunLock:
        """Lock `folder` (which must exist) for this process, or raise `RunInUse` naming the holder."""
        folder = Path(folder)
        handle = open(folder / files.LOCK, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise _in_use(folder, _read_pid(folder)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return cls(folder, handle)

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def lock_holder(folder: str | Path) -> int | None:
    """The pid of the live process holding `folder`'s run lock (0 if it has not written it yet), or
    None when no process holds it. Changes nothing."""
    path = Path(folder) / files.LOCK
    try:
        handle = open(path)  # noqa: SIM115
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(Path(folder)) or 0
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _read_pid(folder: Path) -> int:
    try:
        return int((folder / files.LOCK).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _in_use(folder: Path, pid: int) -> RunInUse:
    who = f"process {pid}" if pid else "another process"
    stop = f" or stop it (`kill {pid}`)" if pid else ""
    return RunInUse(f"run folder {folder} is in use by {who}, which is still writing it; nothing in it was "
                    f"changed. Wait for that run to end{stop}, then run again.", pid=pid or None)


def run_contents(folder: Path) -> list[str]:
    """The run files and folders present in `folder` (empty when it holds no run)."""
    found = [name for name in RUN_FILES if (folder / name).is_file()]
    found += [f"{name}/" for name in RUN_DIRS if (folder / name).is_dir() and any((folder / name).iterdir())]
    return found


def check_run_dir(output_dir: str | Path, resume: str | Path | None = None, overwrite: bool = False) -> None:
    """Raise `RunDirError` if writing a run into `output_dir` would mix two runs, or `RunInUse` if a
    live process is writing it; changes nothing."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise RunDirError(f"output folder {output_dir} is a file, not a folder")
    same = resume is not None and _same_path(output_dir, Path(resume))
    if same and overwrite:
        raise RunDirError(f"resume and overwrite both name {output_dir}: resume continues that run, overwrite "
                          "would move it aside; choose one")
    if not output_dir.is_dir():
        return
    holder = lock_holder(output_dir)
    if holder is not None:
        raise _in_use(output_dir, holder)
    found = run_contents(output_dir)
    if not found or same or overwrite or latest_checkpoint(output_dir) is None:
        return  # nothing there, that very run, or leftovers with nothing to resume (moved aside by the claim)
    raise RunDirError(
        f"output folder {output_dir} already holds a run ({', '.join(found)}); nothing in it was changed. "
        f"To continue that run, resume it (`ada train --resume {output_dir}`, or the train flow's resume field). "
        f"To start a new run, choose another output folder, or overwrite (`--overwrite`), which moves the old "
        f"run aside to {output_dir.name}.replaced-<time> next to it."
    )


def claim_run_dir(output_dir: str | Path, resume: str | Path | None = None,
                  overwrite: bool = False) -> tuple[Path | None, RunLock]:
    """Check `output_dir` (see `check_run_dir`), lock it for this process, move an old run (or the
    leftovers of one that never checkpointed) aside, and create the folder.

    Returns (where the old run went or None, the held `RunLock`: release it when the run ends)."""
    output_dir = Path(output_dir)
    check_run_dir(output_dir, resume, overwrite)
    moved = None
    resuming_here = resume is not None and _same_path(output_dir, Path(resume))
    if not resuming_here and output_dir.is_dir() and run_contents(output_dir):
        old = RunLock.acquire(output_dir)  # nobody else may be writing what is moved aside
        try:
            moved = _aside_name(output_dir)
            output_dir.rename(moved)
        finally:
            old.release()
        if not overwrite:
            log.warning("%s held the leftovers of a run that stopped before its first checkpoint; moved them "
                        "aside to %s", output_dir, moved)
    output_dir.mkdir(parents=True, exist_ok=True)
    return moved, RunLock.acquire(output_dir)


def _aside_name(folder: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = folder.with_name(f"{folder.name}.replaced-{stamp}")
    index = 1
    while candidate.exists():
        candidate = folder.with_name(f"{folder.name}.replaced-{stamp}-{index}")
        index += 1
    return candidate


def _same_path(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()
