"""Checkpoints you can trust: a sha256 manifest, verification on load, fallback and pruning.

A checkpoint folder `checkpoints/step_N/` is written in a temporary folder and renamed into place
(ada_core.training.save_checkpoint). Inside it, `MANIFEST.json` lists every file's size and sha256
and is written before the `COMPLETE` marker, so a folder with `COMPLETE` always has a manifest.
On resume, `latest_good_checkpoint` walks the checkpoints newest first and takes the first whose
files all match their manifest; each one it passes over is reported by name with the reason
(a flipped byte, a truncated file, a missing file). A flipped byte in `model.safetensors` loads
without complaint and trains on NaNs, hence the hash rather than a size check.

What a checkpoint holds is data only: `hf/` (safetensors), `trainer_state.json` (the prompt cursor,
sampler state, RNG states, ledger position), under `rollout.async_steps` `rollout_ahead.json` (the
batches drawn ahead of its step, plain JSON: ada_core/training/feed.py), and `optimizer/update_engine.pt` and `torch_rng.pt`,
tensors and plain values that load with `torch.load(weights_only=True)` (engines/update_state.py
`save_state`/`load_state`), so a resume pointed at a folder someone else wrote runs none of its code.

Cost: one extra read of the checkpoint's bytes when saving and one when resuming
(docs/benchmarks/reliability.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ada_core.errors import ResumeError
from ada_core.run import files

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
COMPLETE = "COMPLETE"
_CHUNK = 1 << 22  # 4 MiB reads: hashing runs at disk speed without holding a file in memory


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, COMPLETE))


def write_manifest(folder: Path) -> dict[str, dict[str, int | str]]:
    """Hash every file under `folder` into `folder/MANIFEST.json`; returns the entries."""
    entries = {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
               for p in _files(folder)}
    (folder / MANIFEST).write_text(json.dumps({"version": 1, "files": entries}, indent=1) + "\n")
    return entries


def mark_complete(folder: Path) -> None:
    """Manifest first, then the marker: a folder with `COMPLETE` always has a manifest to check."""
    write_manifest(folder)
    (folder / COMPLETE).write_text("ok\n")


def verify_checkpoint(folder: Path) -> str | None:
    """None when the checkpoint is whole, else why not, naming the file (`model.safetensors: sha256 ...`)."""
    if not (folder / COMPLETE).is_file():
        return "no COMPLETE marker (the save did not finish)"
    if not (folder / MANIFEST).exists():
        # Written before manifests existed: nothing to check against, so it is used as it is.
        log.warning("checkpoint %s has no %s (an older save); its files cannot be checked", folder, MANIFEST)
        return None
    try:
        entries = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST} cannot be read ({err})"
    for name, entry in entries.items():
        path = folder / name
        if not path.is_file():
            return f"{name}: missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            return f"{name}: {size} bytes, the manifest says {entry['bytes']} (truncated or overwritten)"
        if sha256_file(path) != entry["sha256"]:
            return f"{name}: sha256 does not match the manifest (corrupted bytes)"
    return None


@dataclass
class CheckpointChoice:
    """The checkpoint a resume uses, and every newer one it passed over with the reason."""

    path: Path | None
    rejected: list[tuple[Path, str]] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"checkpoint {p.name} rejected: {why}" for p, why in self.rejected]
        lines.append(f"resuming from {self.path.name}" if self.path else "no good checkpoint left")
        return "; ".join(lines)

    @property
    def damaged(self) -> bool:
        """A passed-over checkpoint had its COMPLETE marker: a finished save that failed its manifest
        (a half-written one is normal after a crash)."""
        return any((p / COMPLETE).is_file() for p, _ in self.rejected)


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Every `step_N` folder (complete or not), oldest first."""
    root = Path(run_dir) / files.CHECKPOINTS
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []


def latest_good_checkpoint(run_dir: Path) -> CheckpointChoice:
    """The newest checkpoint that passes `verify_checkpoint`; newer failing ones are logged and listed."""
    choice = CheckpointChoice(path=None)
    for folder in reversed(checkpoint_dirs(run_dir)):
        problem = verify_checkpoint(folder)
        if problem is None:
            choice.path = folder
            break
        if (folder / COMPLETE).is_file():  # a half-written save is normal after a crash; a bad one is news
            log.warning("checkpoint %s is damaged and will not be used: %s", folder, problem)
        choice.rejected.append((folder, problem))
    return choice


def prune_checkpoints(run_dir: Path, keep_last: int, newest_good: Path) -> list[Path]:
    """Delete all but the `keep_last` newest checkpoints, never `newest_good`; 0 keeps every one.

    Leftovers of interrupted saves (`.tmp_step_*`) older than `newest_good` go too. Returns what was removed.
    """
    if keep_last <= 0:
        return []
    folders = checkpoint_dirs(run_dir)
    keep = set(folders[-keep_last:]) | {newest_good}
    removed = [p for p in folders if p not in keep and p.name < newest_good.name]
    removed += [p for p in (Path(run_dir) / files.CHECKPOINTS).glob(".tmp_step_*")
                if p.name.removeprefix(".tmp_") < newest_good.name]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint with its COMPLETE marker; half-written ones are ignored. Not hashed:
    use `latest_good_checkpoint` where the files must be checked (resume)."""
    done = [p for p in checkpoint_dirs(run_dir) if (p / COMPLETE).is_file()]
    return done[-1] if done else None


class NoCheckpoint(ResumeError, FileNotFoundError):
    """`--resume` names a run folder with no complete checkpoint; `damaged` says whether one with its
    COMPLETE marker was there and failed its manifest (that needs a person, not a silent restart)."""

    def __init__(self, message: str, damaged: bool):
        super().__init__(message)
        self.damaged = damaged
