"""How long a rollout server ran below its concurrency: the idle share of a step's generation time.

An engine owns one `OccupancyMeter` sized to the sequences it may keep in flight
(`rollout.vllm.concurrency`) and moves its level up when a request goes out and down when it comes
back (a request with n=k counts k). The sampler reads the meter before and after generating; the
difference of two readings is the time spent below capacity in between. Time below capacity is
time the server could have been batching more sequences: the round barrier's tail shows up here.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    at: float
    """perf_counter() when read."""
    below_s: float
    """Seconds spent below capacity since the meter was made."""
    slot_s: float
    """Integral of min(level, capacity) over time: busy slot-seconds."""
    empty_s: float = 0.0
    """Seconds with nothing in flight: the server idle (`rollout/server_<i>/idle_fraction`)."""


class OccupancyMeter:
    """A thread-safe integral of 'in flight < capacity' over wall time."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.level = 0
        self._below_s = 0.0
        self._slot_s = 0.0
        self._empty_s = 0.0
        self._t = time.perf_counter()
        self._lock = threading.Lock()

    def _advance(self, now: float) -> None:
        if self.level < self.capacity:
            self._below_s += now - self._t
        self._slot_s += min(self.level, self.capacity) * (now - self._t)
        if self.level <= 0:
            self._empty_s += now - self._t
        self._t = now

    def add(self, k: int) -> None:
        """k more sequences in flight (negative: k fewer)."""
        with self._lock:
            self._advance(time.perf_counter())
            self.level += k

    def read(self) -> Reading:
        with self._lock:
            now = time.perf_counter()
            self._advance(now)
            return Reading(now, self._below_s, self._slot_s, self._empty_s)

    @contextmanager
    def running(self, k: int):
        """Count k sequences in flight for the duration of the block."""
        self.add(k)
        try:
            yield
        finally:
            self.add(-k)
