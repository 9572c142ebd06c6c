"""A runner's uses as tokens: every execution and file operation on a claimed
runner holds a `RunnerUse` from its start to its end, and the runner is never
released for inactivity while one is held.

A use is ended exactly once, whatever path its work takes: `end()` is
idempotent and `with` / `async with` call it on every exit. Work that
outlives the code that began it (an execution's command stopped in the
background, a download streamed after its route returned) takes the use with
`hand_on()`: the new token owns it, and ending the old one does nothing. So a
use can be neither forgotten (a runner that never expires) nor ended twice
(a runner that expires under another execution).

`Uses` is the registry: how many uses each runner has, and which are in
flight (what a graceful drain waits for).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType


@dataclass(frozen=True)
class InFlight:
    """A use in flight, as the registry reports it."""

    runner_id: str
    what: str  # "execution", "copy", "list", "download"


class RunnerUse:
    """One use of a runner, begun by `Uses.begin`; ended by `end()`, once."""

    def __init__(self, registry: Uses, key: int, runner_id: str, what: str) -> None:
        self._registry = registry
        self._key = key
        self.runner_id = runner_id
        self.what = what
        self._done = False  # ended, or handed on

    @property
    def ended(self) -> bool:
        """Ended, or handed on to another token (this one no longer owns it)."""
        return self._done

    def end(self) -> None:
        """The use is over: the runner's inactivity timer counts again from now.
        Does nothing the second time, or after `hand_on`."""
        if self._done:
            return
        self._done = True
        self._registry._end(self._key)

    def hand_on(self) -> RunnerUse:
        """The same use, owned from now on by the returned token; ending this
        one does nothing. Raises if it has already ended."""
        if self._done:
            raise RuntimeError(f"the {self.what} use of runner {self.runner_id} has ended")
        self._done = True
        return RunnerUse(self._registry, self._key, self.runner_id, self.what)

    def __enter__(self) -> RunnerUse:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.end()

    async def __aenter__(self) -> RunnerUse:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.end()


class Uses:
    """The uses in flight, per runner. `on_end(runner_id)` is called as a use
    ends, outside the registry's lock and before the use stops counting: a
    reader in between sees the runner still in use, never idle with an old
    activity time."""

    def __init__(self, on_end: Callable[[str], None]) -> None:
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self._in_flight: dict[int, InFlight] = {}
        self._per_runner: dict[str, int] = {}
        self._on_end = on_end

    def begin(self, runner_id: str, what: str) -> RunnerUse:
        """A use begins now. The caller decides first whether the runner may
        be used (`Claims.begin_use`)."""
        with self._lock:
            key = next(self._keys)
            self._in_flight[key] = InFlight(runner_id, what)
            self._per_runner[runner_id] = self._per_runner.get(runner_id, 0) + 1
        return RunnerUse(self, key, runner_id, what)

    def count(self, runner_id: str) -> int:
        """Uses of the runner begun and not yet ended."""
        with self._lock:
            return self._per_runner.get(runner_id, 0)

    def busy(self, runner_id: str) -> bool:
        return self.count(runner_id) > 0

    def in_flight(self) -> tuple[InFlight, ...]:
        """Every use not yet ended, oldest first."""
        with self._lock:
            return tuple(self._in_flight.values())

    def _end(self, key: int) -> None:
        with self._lock:
            runner_id = self._in_flight[key].runner_id
        self._on_end(runner_id)
        with self._lock:
            use = self._in_flight.pop(key)
            left = self._per_runner[use.runner_id] - 1
            if left > 0:
                self._per_runner[use.runner_id] = left
            else:
                del self._per_runner[use.runner_id]
