"""Which runs of a pool the paper tables read, and at which step: runs of unequal length are never mixed.

A pool's read step is the last evaluation of its longest runs (a grid plans one length for all, so
that is the planned final step). A run whose last evaluation comes before it (killed and kept
anyway, a different `steps`, no evaluation at all) is left out of every table of that pool, and
each row it would have entered names it with the step it stopped at. The alternative, reading the
whole pool at its shortest run's step, would let one stopped run move every row back without a
sign; leaving it out and naming it keeps the rows at the length the grid was run for and shows
exactly what is missing. Seeds that have no run at all (a partial grid) are named the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ada_core import metrics as K
from report.curves import RunCurves


def last_eval_step(run: RunCurves) -> float:
    """The step of the run's last held-out evaluation; NaN when it has none."""
    steps = [p["step"] for p in run.points if K.EVAL_AVG_AT_K in p]
    return max(steps) if steps else math.nan


def why_short(run: RunCurves) -> str:
    """Why a run does not reach the read step: `stopped at step 20 of 60` (its config planned 60),
    `last evaluation at step 20` (no planned length, or 20 planned), or `no evaluation`."""
    reach = last_eval_step(run)
    if math.isnan(reach):
        return "no evaluation"
    planned = run.config.get("steps")
    if planned is not None and reach < planned:
        return f"stopped at step {reach:g} of {planned}"
    return f"last evaluation at step {reach:g}"


@dataclass
class PoolRuns:
    """One pool's runs as the tables read them."""

    name: str
    step: float
    """The read step: the last evaluation of the pool's longest runs (NaN when no run has one)."""
    runs: list[RunCurves]
    """The runs that reach `step`: the only ones any table of this pool reads."""
    left_out: dict[tuple[str, int], str]
    """(label, seed) -> why, for every run of the pool that does not reach `step`."""
    seeds: list[int]
    """Every seed any run of the pool has: a label without one of them is missing a run."""
    labels: list[str]
    """Every label of the pool, read or left out, in the order the runs came."""

    def of(self, label: str) -> list[RunCurves]:
        return [r for r in self.runs if r.label == label]

    def why_not(self, label: str, seed: int) -> str:
        """Why `label`'s seed is not read: left out (and why), or no run."""
        return self.left_out.get((label, seed), "no run")

    def seeds_cell(self, label: str, counted: list[int], reference: str | None = None) -> str:
        """`0,1` plus, for each of the pool's other seeds, why it is not counted: `0,1 (seed 2: stopped
        at step 20 of 60)`; with `reference`, a seed whose reference run is missing says so."""
        notes = [f"seed {seed}: {self._why_uncounted(label, seed, reference)}" for seed in self.seeds
                 if seed not in counted]
        listed = ",".join(str(s) for s in counted) or "none"
        return listed + (f" ({'; '.join(notes)})" if notes else "")

    def _why_uncounted(self, label: str, seed: int, reference: str | None) -> str:
        if not self._reads(label, seed):
            return self.why_not(label, seed)
        if reference is not None and not self._reads(reference, seed):
            why = self.why_not(reference, seed)
            return f"no {reference} run" if why == "no run" else f"{reference} {why}"
        return "no value"

    def _reads(self, label: str, seed: int) -> bool:
        return any((r.label, r.seed) == (label, seed) for r in self.runs)

    def summary(self) -> str:
        """One line: the read step and every run left out, with why."""
        if math.isnan(self.step):
            return f"pool `{self.name}`: no run has a held-out evaluation; nothing to read"
        line = f"pool `{self.name}`: read at step {self.step:g}, the last evaluation of its longest runs; " \
               f"{len(self.runs)} runs reach it"
        if self.left_out:
            line += "; left out of every table: " + ", ".join(
                f"{label} seed {seed} ({why})" for (label, seed), why in self.left_out.items())
        return line


def pool_runs(name: str, runs: list[RunCurves]) -> PoolRuns:
    """Split a pool's runs into those that reach its read step and those left out, with why."""
    reaches = [last_eval_step(r) for r in runs]
    known = [x for x in reaches if not math.isnan(x)]
    step = max(known) if known else math.nan
    read = [r for r, x in zip(runs, reaches, strict=True) if x == step]
    left_out = {(r.label, r.seed): why_short(r) for r, x in zip(runs, reaches, strict=True) if x != step}
    return PoolRuns(name, step, read, left_out, sorted({r.seed for r in runs}),
                    list(dict.fromkeys(r.label for r in runs)))


def read_pools(runs_by_pool: dict[str, list[RunCurves]]) -> dict[str, PoolRuns]:
    return {name: pool_runs(name, runs) for name, runs in runs_by_pool.items()}
