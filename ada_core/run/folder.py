"""Who may write into a run folder.

A run folder holds one run's record: its config, its per-step metrics and its checkpoints. A second
run written into it would append its rows to the first one's `metrics.jsonl` and overwrite its
checkpoints, so the file would no longer describe either run. Every writer of a run folder (the CLI,
the `train` flow, `trainer.setup`) therefore claims it here first:

- an empty or new folder is taken as it is;
- a folder that holds a run is refused, with nothing in it changed, unless the caller resumes that
  very run (`resume` is the folder itself) or asks to `overwrite`, which moves the old run aside to a
  sibling `<name>.replaced-<time>` folder instead of deleting it.
"""

from __future__ import annotations

import time
from pathlib import Path

from ada_core.errors import InputError
from ada_core.run import files

# What marks a folder as holding a run: any one of these is enough.
RUN_FILES = (files.CONFIG, files.METRICS, files.GENERATIONS)  # any of these: the folder holds a run
RUN_DIRS = (files.CHECKPOINTS,)


class RunDirError(InputError, ValueError):
    """A run folder that cannot be written as asked; the message names it and says what to do."""


def run_contents(folder: Path) -> list[str]:
    """The run files and folders present in `folder` (empty when it holds no run)."""
    found = [name for name in RUN_FILES if (folder / name).is_file()]
    found += [f"{name}/" for name in RUN_DIRS if (folder / name).is_dir() and any((folder / name).iterdir())]
    return found


def check_run_dir(output_dir: str | Path, resume: str | Path | None = None, overwrite: bool = False) -> None:
    """Raise `RunDirError` if writing a run into `output_dir` would mix two runs; changes nothing."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise RunDirError(f"output folder {output_dir} is a file, not a folder")
    same = resume is not None and _same_path(output_dir, Path(resume))
    if same and overwrite:
        raise RunDirError(f"resume and overwrite both name {output_dir}: resume continues that run, overwrite "
                          "would move it aside; choose one")
    found = run_contents(output_dir) if output_dir.is_dir() else []
    if not found or same or overwrite:
        return
    raise RunDirError(
        f"output folder {output_dir} already holds a run ({', '.join(found)}); nothing in it was changed. "
        f"To continue that run, resume it (`ada train --resume {output_dir}`, or the train flow's resume field). "
        f"To start a new run, choose another output folder, or overwrite (`--overwrite`), which moves the old "
        f"run aside to {output_dir.name}.replaced-<time> next to it."
    )


def claim_run_dir(output_dir: str | Path, resume: str | Path | None = None, overwrite: bool = False) -> Path | None:
    """Check `output_dir` (see `check_run_dir`), move an old run aside if overwriting, and create the
    folder. Returns where the old run went, or None when nothing was moved."""
    output_dir = Path(output_dir)
    check_run_dir(output_dir, resume, overwrite)
    moved = None
    resuming_here = resume is not None and _same_path(output_dir, Path(resume))
    if overwrite and not resuming_here and output_dir.is_dir() and run_contents(output_dir):
        moved = _aside_name(output_dir)
        output_dir.rename(moved)
    output_dir.mkdir(parents=True, exist_ok=True)
    return moved


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
