"""The frozen reference policy of a KL run: the run's initial weights, kept in its own folder.

With `loss.kl_coef > 0` the loss pulls the policy towards the weights it started from. Those are
the start model's (`ada_core.training.start.start_model`: the named model, or its SFT warm start
in `ADA_HOME/cache/sft/`), and a resume must find them exactly, not the checkpoint's current
weights, whatever happened to the cache or to the local model folder since. So a fresh KL run
keeps them in the run folder:

    reference/          the start model's folder (config, safetensors, tokenizer), with the same
                        MANIFEST.json (sha256 of every file) and COMPLETE marker as a checkpoint

Files are hard-linked from the start model's folder where the file system allows (no extra disk:
model folders are written once, to a temporary folder renamed into place) and copied otherwise.
A resume loads `reference/` of the run it continues after checking the manifest, and a resume into
another folder takes a copy along, so that folder can be resumed in turn. A KL run whose folder
has no whole `reference/` cannot resume: the message says so before anything is written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ada_core.errors import InputError
from ada_core.paths import bytes_under, staged
from ada_core.run import files
from ada_core.run.checkpoints import (
    COMPLETE,
    MANIFEST,
    mark_complete,
    verify_checkpoint,
)


class ReferenceWeightsError(InputError, ValueError):
    """A KL run's reference weights are missing or damaged; the message names the folder."""


def keep_reference(source: Path, run_dir: Path) -> Path:
    """`source` (a model folder) as `run_dir/reference/`, hard-linked or copied, then manifested.
    A leftover `reference/` (a set-up that failed before the run started) is replaced."""
    target = Path(run_dir) / files.REFERENCE
    tmp = Path(run_dir) / f".tmp_{files.REFERENCE}"
    shutil.rmtree(tmp, ignore_errors=True)
    with staged(tmp, "the KL reference weights", bytes_under(Path(source))):  # a full disk: one line, no partial
        for path in sorted(p for p in Path(source).rglob("*") if p.is_file() and p.name not in (MANIFEST, COMPLETE)):
            dest = tmp / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:  # another file system, or links not allowed: a copy
                shutil.copy2(path, dest)
        tmp.mkdir(parents=True, exist_ok=True)
        mark_complete(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def reference_of(run_dir: Path) -> Path:
    """`run_dir/reference/` after checking it against its manifest; `ReferenceWeightsError` if it is not whole."""
    folder = Path(run_dir) / files.REFERENCE
    if not folder.is_dir():
        raise ReferenceWeightsError(
            f"--resume {run_dir}: loss.kl_coef > 0 needs the run's initial weights in {folder}, and there are none "
            "(the run started with loss.kl_coef = 0, or before KL runs kept them); start the run again")
    problem = verify_checkpoint(folder)
    if problem is not None or not (folder / MANIFEST).is_file():
        raise ReferenceWeightsError(f"--resume {run_dir}: the reference weights in {folder} are damaged "
                             f"({problem or 'no manifest'}); the run cannot continue against its initial weights")
    return folder
