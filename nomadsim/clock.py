"""Injectable time for the simulator: wall-clock nanoseconds for Nomad's
timestamps, and timers that run callbacks on the simulator's event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Unix time in nanoseconds (Nomad's CreateTime/ModifyTime unit)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns()

    def monotonic(self) -> float:
        return time.monotonic()


class Timers:
    """Schedules state transitions (task start, kill, restart) on the loop.

    Every pending timer is kept so that `cancel_all` can stop the simulator
    without callbacks firing into a closed loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handles: set[asyncio.TimerHandle] = set()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        def run() -> None:
            self._handles.discard(handle)
            fn()

        handle = self._loop.call_later(max(0.0, delay_s), run)
        self._handles.add(handle)
        return handle

    def cancel(self, handle: asyncio.TimerHandle | None) -> None:
        if handle is not None:
            handle.cancel()
            self._handles.discard(handle)

    def cancel_all(self) -> None:
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()

    @property
    def pending(self) -> int:
        return len(self._handles)
