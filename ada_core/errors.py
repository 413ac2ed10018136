"""The errors every entry point reports as one clean line, in two families with one exit code each.

- `InputError` (exit 2, `ada_core.cli.INPUT_ERROR_EXIT`): what the user asked for cannot run as
  asked, and nothing was written. The message names the file, row, field or folder and, where there
  is one, what works instead. Raised before heavy set-up wherever the information is there.

      ConfigError     a config value or combination (the dotted field named)
      DatasetError    a dataset file or row (file, 1-based row, field)
      DatasetMissingError
      RunDirError     a run folder that cannot be written as asked
        RunInUse      another live process holds the folder (its pid named)
      ResumeError     a resume that cannot continue the run as asked (nothing to resume, a changed
                      field: `sampler.name: ada -> fixed`)

- `RunFailure` (exit 1): the run started and something outside the input failed (a training rank
  died). `summary` is the one line the CLI prints; the message may hold more (a log tail).

      DiskFull        a write ran out of space: the folder, the space it needed, what was free; the
                      partial file or folder is already removed (`ada_core.paths.staged`)
"""

from __future__ import annotations


class InputError(Exception):
    """Bad user input (a config, a YAML file, a dataset, a run folder): the message names it.

    The CLI turns every one into the same clean message and exit code (`ada_core.cli.INPUT_ERROR_EXIT`).
    """


class ConfigError(InputError, ValueError):
    """A config value is invalid; the message names the dotted field."""


class DatasetError(InputError, ValueError):
    """A dataset cannot be used; the message names the file, the 1-based row and the field."""


class DatasetMissingError(InputError, FileNotFoundError):
    """A dataset file that does not exist."""


class RunDirError(InputError, ValueError):
    """A run folder that cannot be written as asked; the message names it and says what to do."""


class RunInUse(RunDirError):
    """A live process holds the run folder's lock (`ada_core.run.folder.RunLock`); `pid` is that process."""

    def __init__(self, message: str, pid: int | None = None):
        super().__init__(message)
        self.pid = pid


class ResumeError(InputError):
    """A resume that cannot continue its run as asked: no run or checkpoint to resume, or a field that
    would make it another run (`ada_core.run.resume`)."""


class RunFailure(RuntimeError):
    """The run failed for a reason outside its input; the CLI prints `summary` and exits 1."""

    @property
    def summary(self) -> str:
        text = str(self).strip()
        return text.splitlines()[0] if text else type(self).__name__


class DiskFull(RunFailure):
    """A write ran out of space. The message names the folder, the space the write needed and what was
    free; the partial file or folder it left is removed before this is raised (`ada_core.paths.staged`)."""
