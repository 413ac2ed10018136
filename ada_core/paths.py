"""The state directory. Everything a run keeps lives under `ADA_HOME` (default `./.ada`), and how a
big write there is staged so that a full disk leaves nothing half-written behind (`staged`)."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ada_core.errors import DiskFull

# Free bytes below which a failed write is taken to have met a full disk: torch.save reports ENOSPC as
# a RuntimeError without an errno ("iostream error", "unexpected pos"), so the disk itself is asked.
_FULL_BYTES = 64 << 10


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


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file in the same folder, fsync, then rename over `path`: a reader sees the old file or the
    whole new one, never half of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


@contextmanager
def staged(partial: str | Path, what: str, needs: int | None = None, then: str = "") -> Iterator[Path]:
    """Write `what` into `partial` (the temporary file or folder the block renames into place).

    If the block fails, `partial` is removed: an interrupted write must not keep the space it took. A
    failure that met a full disk (ENOSPC or EDQUOT anywhere in the exception's chain, by errno or by
    message: torch and safetensors report it as their own errors, or less than 64 KiB free once it
    failed) becomes one `DiskFull` line naming the folder, the space `what` needs (`needs` bytes,
    when the caller knows: e.g. the size of the previous checkpoint) and what was free; `then` says
    how to go on."""
    partial = Path(partial)
    try:
        yield partial
    except BaseException as err:
        free, written = _free_bytes(partial.parent), bytes_under(partial)
        _remove(partial)
        if isinstance(err, Exception) and (_no_space(err) or free < _FULL_BYTES):
            need = f"about {_human(needs)}" if needs else f"more than the {_human(written)} written before it filled"
            raise DiskFull(f"no space left in {partial.parent} for {what}: it needs {need}, {_human(free)} free when "
                           f"the write failed; the partial {partial.name} was removed{then}") from None
        raise


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    """`err` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def _no_space(err: BaseException) -> bool:
    codes = (errno.ENOSPC, errno.EDQUOT)
    texts = [os.strerror(code) for code in codes] + [f"os error {code}" for code in codes]
    return any((isinstance(e, OSError) and e.errno in codes) or any(t in str(e) for t in texts) for e in _chain(err))


def _free_bytes(folder: Path) -> int:
    """Free bytes (for this user) on the file system of `folder` or its nearest existing parent."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def bytes_under(path: Path) -> int:
    """The bytes of the file `path`, or of every file under the folder `path`; 0 when it is absent."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _remove(path: Path) -> None:
    """Remove the file or folder `path`, each file truncated first: a failed writer (torch's, until its
    traceback is gone) may still hold a file open, and an unlinked open file keeps its space. A file
    with other hard links (keep_reference links the model's files) is only unlinked: its data is theirs."""
    for file in ([path] if path.is_file() else path.rglob("*") if path.is_dir() else []):
        try:
            if file.is_file() and not file.is_symlink() and file.stat().st_nlink == 1:
                os.truncate(file, 0)
        except OSError:
            pass
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _human(count: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"
