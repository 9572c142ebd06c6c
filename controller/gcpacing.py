"""When Python's garbage collector walks the whole heap, paced for a
long-running controller.

A full (generation 2) collection walks every object the process holds: the
snapshot, the spec cache, the libraries' own, about 120,000 objects with a
pool of 1,500. It held the GIL for 76–97 ms each time (docs/performance.md),
and under 100 claims/s it came every few seconds. Every claim and execution
in flight waits for it: against a Nomad that answers in milliseconds those
pauses set the claims' p99 (against the simulator its own stalls are
longer still).

`CollectorPacer` collects what is new and freezes the rest (`gc.freeze`), on
a thread: once the first observation of Nomad has filled the snapshot, then
every `freeze_interval_s`. The collector's own collections then walk
only what was made since the last freeze (4–17 ms in the benchmarks). Reference counting
still frees frozen objects once nothing refers to them; only garbage cycles
among frozen objects wait for the full collection (unfreeze, collect,
freeze), every `full_interval_s`. That bounds the memory such cycles hold to
what one interval makes.

Every generation-2 collection, automatic or paced, is timed into
`nrc_gc_pause_seconds`, so the pauses a claim can meet are visible.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

log = logging.getLogger(__name__)

READY_POLL_S = 0.5  # how often the first step looks whether the snapshot is filled


class Collector(Protocol):
    """The part of the `gc` module the pacer uses (a fake in tests)."""

    def collect(self) -> int: ...

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...


class Step(Enum):
    FREEZE = "freeze"  # collect what is not frozen, then freeze what is left
    FULL = "full"  # unfreeze, collect everything, freeze again


@dataclass(frozen=True)
class Pacing:
    """`freeze_interval_s` 0: the pacer does nothing (Python's collector as is)."""

    freeze_interval_s: float = 30.0
    full_interval_s: float = 600.0

    @property
    def enabled(self) -> bool:
        return self.freeze_interval_s > 0


def next_step(pacing: Pacing, now: float, last_full: float | None) -> Step:
    """What a pacer step does at `now` (monotonic s), given when the last full
    collection was (None: never, so the first step walks everything once)."""
    if last_full is None or now - last_full >= pacing.full_interval_s:
        return Step.FULL
    return Step.FREEZE


class CollectorPacer:
    def __init__(
        self,
        pacing: Pacing,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        collector: Collector = gc,
        on_pause: Callable[[float], None] = lambda seconds: None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self._pacing = pacing
        self._monotonic = monotonic
        self._collector = collector
        self._on_pause = on_pause
        self._ready = ready
        self._last_full: float | None = None
        self._frozen = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pause_started = 0.0

    def step(self) -> Step:
        """Do the step that is due (see `next_step`)."""
        now = self._monotonic()
        step = next_step(self._pacing, now, self._last_full)
        if step is Step.FULL:
            self._collector.unfreeze()
            self._last_full = now
        self._collector.collect()
        self._collector.freeze()
        self._frozen = True
        return step

    def start(self) -> None:
        """Time every generation-2 collection; pace them if enabled. The first
        step comes once `ready` (the first observation of Nomad has filled the
        snapshot), or one interval after the start at the latest."""
        gc.callbacks.append(self._timed)
        if not self._pacing.enabled:
            return
        self._thread = threading.Thread(target=self._run, name="nrc-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop pacing and give every object back to the collector."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)
        if self._frozen:
            self._collector.unfreeze()
            self._frozen = False

    def _run(self) -> None:
        first = self._monotonic() + self._pacing.freeze_interval_s
        while not self._ready() and self._monotonic() < first:
            if self._stop.wait(min(READY_POLL_S, self._pacing.freeze_interval_s)):
                return
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # never expected; the collector then runs as is
                log.exception("pacing the garbage collector failed")
            if self._stop.wait(self._pacing.freeze_interval_s):
                return

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._pause_started = time.perf_counter()
        else:
            self._on_pause(time.perf_counter() - self._pause_started)
