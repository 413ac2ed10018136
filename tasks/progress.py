"""A Prefect progress artifact (step k of N), for tasks and flows alike.

ada_core reports progress through plain callbacks (`progress(done, total)`); `ProgressArtifact`
turns them into one artifact per bar, updated in place and throttled to `min_interval_s` (the last
update always goes through). The curation task passes its callbacks to ada_core; the train flow's
`flows.progress.TrainProgress` uses it for the run's bar.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class ProgressArtifact:
    """One Prefect progress artifact: `update(done, total)` moves the bar and says `<what> k of N`."""

    def __init__(self, what: str, unit: str = "step", min_interval_s: float = 2.0):
        self.what, self.unit, self.min_interval_s = what, unit, min_interval_s
        self._id = None
        self._last = -math.inf

    def update(self, done: int, total: int, force: bool = False) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        now = time.monotonic()
        if not force and done < total and now - self._last < self.min_interval_s and self._id is not None:
            return
        self._last = now
        percent = 100.0 * done / total if total else 100.0
        description = f"{self.what}: {self.unit} {done} of {total}"
        if self._id is None:
            self._id = create_progress_artifact(progress=percent, description=description)
        else:
            update_progress_artifact(self._id, progress=percent, description=description)

    def callback(self) -> Callable[[int, int], None]:
        return lambda done, total: self.update(done, total)
