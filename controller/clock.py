"""Injectable time for the controller: wall-clock nanoseconds (comparable with
Nomad's timestamps) and a monotonic clock for timers and backoff."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Wall-clock time in nanoseconds since the epoch, like Nomad's timestamps."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests move by hand; both readings advance together."""

    def __init__(self, start_ns: int = 1_700_000_000 * 1_000_000_000) -> None:
        self._ns = start_ns
        self._start = start_ns
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        with self._lock:
            return self._ns

    def monotonic(self) -> float:
        with self._lock:
            return (self._ns - self._start) / 1e9

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._ns += int(seconds * 1e9)
