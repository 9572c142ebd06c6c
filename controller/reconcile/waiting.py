"""Claims that wait a moment for a runner (NRC_CLAIM_WAIT): right after an
environment is created, or when a burst empties its pool, runners are
starting; rather than answer "no runner" at once (which a learning platform
shows a student as a depleted pool), a claim may wait up to `wait_s` for one.

Waiters of one environment are served first come, first served: only the
oldest tries to claim; the others wait their turn. At most `max_waiting`
claims wait at once (each holds a thread of the API's pool); one beyond
that is answered at once, as without waiting.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from controller.clock import Clock

T = TypeVar("T")
# How often a waiting claim looks at the snapshot again: it changes when an
# event or a pass installs a new one, tens of milliseconds apart.
POLL_S = 0.02


class WaitingClaims:
    def __init__(self, clock: Clock, wait_s: float, max_waiting: int) -> None:
        self._clock = clock
        self.wait_s = wait_s
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._queues: dict[int, deque[object]] = {}
        self._waiting = 0

    @property
    def waiting(self) -> int:
        with self._cond:
            return self._waiting

    def serve(self, env_id: int, attempt: Callable[[], T | None]) -> T | None:
        """`attempt()` again, in turn, until it gives something or `wait_s`
        has passed; None then, or at once when waiting is off or too many
        claims wait already."""
        if self.wait_s <= 0:
            return None
        ticket = object()
        with self._cond:
            if self._waiting >= self.max_waiting:
                return None
            queue = self._queues.setdefault(env_id, deque())
            queue.append(ticket)
            self._waiting += 1
        deadline = self._clock.monotonic() + self.wait_s
        try:
            while True:
                with self._cond:
                    while queue[0] is not ticket:
                        left = deadline - self._clock.monotonic()
                        if left <= 0:
                            return None
                        self._cond.wait(min(left, POLL_S))
                found = attempt()
                if found is not None:
                    return found
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    return None
                with self._cond:
                    self._cond.wait(min(left, POLL_S))
        finally:
            with self._cond:
                queue.remove(ticket)
                if not queue:
                    self._queues.pop(env_id, None)
                self._waiting -= 1
                self._cond.notify_all()
