"""Injectable time for the simulator: wall-clock nanoseconds for Nomad's
timestamps, timers that run callbacks on the simulator's event loop, and
`SimTime`, the three together as the simulator's parts use them."""

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

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handles: set[asyncio.TimerHandle] = set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run timers on `loop` from now on (the simulator's start)."""
        self._loop = loop

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        if self._loop is None:
            raise RuntimeError("simulator not started")

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


class SimTime:
    """The simulator's time as its parts use it: the clock for Nomad's
    timestamps, timers on the event loop (bound when the simulator starts),
    and the scale of durations that come from Nomad objects."""

    def __init__(self, clock: Clock, scale: float) -> None:
        self.clock = clock
        self.timers = Timers()
        self._scale = scale

    def now_ns(self) -> int:
        return self.clock.now_ns()

    def scaled(self, ns: int) -> int:
        """A duration from a Nomad object (policy delay, deadline, TTL) in the
        simulator's time: multiplied by `time_scale`, so a test can run a 10 s
        lock TTL in 10 ms."""
        return int(ns * self._scale)
