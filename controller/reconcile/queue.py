"""The reconcile work queue, modelled on client-go's workqueue and its
rate-limiting and delaying wrappers.

Keys (environment ids) only say "look at this again", so the queue collapses
repeats: a key waiting once is queued once, and a key is never handed to two
workers at once. A key added while a worker processes it is remembered
("dirty") and queued again when the worker calls `done`, so no change is ever
lost between a pass's observation and its end.

Delays (`add_after`, `add_rate_limited`) follow the injected clock. A getter
sleeps on a condition variable until the next delayed key is due by that
clock; a test driving a `ManualClock` calls `poke()` after `advance()` so
waiting getters look at the clock again. The `timeout_s` of `get` is how long
the calling thread is willing to block, in real time, so a worker can always
come back to check for shutdown whatever clock is injected.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from controller.clock import Clock

K = TypeVar("K", bound=Hashable)

DEFAULT_BASE_S = 0.05
DEFAULT_CAP_S = 30.0
# 2**64 × any sane base already exceeds any sane cap; bounding the exponent
# keeps the float conversion from overflowing after thousands of failures.
_MAX_EXPONENT = 64


class WorkQueue(Generic[K]):
    """A thread-safe, deduplicating FIFO of keys with delayed and backed-off adds."""

    def __init__(
        self,
        clock: Clock,
        base_s: float = DEFAULT_BASE_S,
        cap_s: float = DEFAULT_CAP_S,
    ) -> None:
        if base_s < 0 or cap_s < 0:
            raise ValueError("backoff delays must not be negative")
        self._clock = clock
        self._base_s = base_s
        self._cap_s = cap_s
        self._cond = threading.Condition()
        # Ready keys in FIFO order; every key in it is also in _dirty.
        self._queue: deque[K] = deque()
        # Keys that need processing: queued, or added again while processing.
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        # Delayed keys: key -> (due time, sequence) of its one live heap entry.
        # Heap entries that no longer match are stale and skipped when popped;
        # the sequence number keeps keys themselves from ever being compared.
        self._waiting: dict[K, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0
        self._failures: dict[K, int] = {}
        self._shutting_down = False

    # -- adding -----------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue `key` unless it is already waiting; ignored after shutdown."""
        with self._cond:
            self._add_locked(key)

    def add_after(self, key: K, delay_s: float) -> None:
        """Queue `key` once `delay_s` seconds have passed on the clock.

        A key already waiting for a later time is moved earlier; one waiting
        for an earlier time keeps it (as in client-go), so repeated adds
        cannot postpone a key forever.
        """
        with self._cond:
            self._add_after_locked(key, delay_s)

    def add_rate_limited(self, key: K) -> None:
        """Queue `key` after its per-key exponential backoff (base × 2**failures, capped)."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
            self._add_after_locked(key, self.backoff_s(failures))

    def backoff_s(self, failures: int) -> float:
        """The delay `add_rate_limited` uses for a key that failed `failures` times before."""
        return min(self._cap_s, self._base_s * 2.0 ** min(failures, _MAX_EXPONENT))

    def forget(self, key: K) -> None:
        """Reset the key's failure count (call after a successful pass)."""
        with self._cond:
            self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    # -- taking -----------------------------------------------------------

    def get(self, timeout_s: float | None = None) -> K | None:
        """Take the oldest ready key, blocking up to `timeout_s` real seconds
        (forever with None). Returns None on timeout or once shut down. The
        caller must call `done(key)` when it has finished with the key."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._shutting_down:
                    return None
                self._promote_due_locked()
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                wait_s = self._next_due_in_locked()
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    wait_s = remaining if wait_s is None else min(wait_s, remaining)
                self._cond.wait(wait_s)

    def done(self, key: K) -> None:
        """Finish processing `key`; if it was added meanwhile, queue it again."""
        with self._cond:
            if key not in self._processing:
                return
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    # -- control and introspection -----------------------------------------

    def poke(self) -> None:
        """Wake waiting getters so they re-read the clock (after a ManualClock advance)."""
        with self._cond:
            self._cond.notify_all()

    def shutdown(self) -> None:
        """Stop handing out keys: every blocked and future `get` returns None."""
        with self._cond:
            self._shutting_down = True
            self._cond.notify_all()

    @property
    def shutting_down(self) -> bool:
        with self._cond:
            return self._shutting_down

    @property
    def depth(self) -> int:
        """Keys ready and waiting for a worker (for metrics)."""
        with self._cond:
            self._promote_due_locked()
            return len(self._queue)

    def __len__(self) -> int:
        return self.depth

    @property
    def delayed(self) -> int:
        """Keys waiting for their delay to pass."""
        with self._cond:
            self._promote_due_locked()
            return len(self._waiting)

    # -- internals (caller holds self._cond) --------------------------------

    def _add_locked(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            # `done` queues it; handing it out now would run two passes at once.
            return
        self._queue.append(key)
        self._cond.notify()

    def _add_after_locked(self, key: K, delay_s: float) -> None:
        if self._shutting_down:
            return
        if delay_s <= 0:
            self._add_locked(key)
            return
        due = self._clock.monotonic() + delay_s
        current = self._waiting.get(key)
        if current is not None and current[0] <= due:
            return
        self._seq += 1
        self._waiting[key] = (due, self._seq)
        heapq.heappush(self._heap, (due, self._seq, key))
        # A getter may be sleeping until a later due time, or with no timeout.
        self._cond.notify_all()

    def _promote_due_locked(self) -> None:
        now = self._clock.monotonic()
        while self._heap and self._heap[0][0] <= now:
            due, seq, key = heapq.heappop(self._heap)
            if self._waiting.get(key) != (due, seq):
                continue
            del self._waiting[key]
            self._add_locked(key)

    def _next_due_in_locked(self) -> float | None:
        while self._heap:
            due, seq, key = self._heap[0]
            if self._waiting.get(key) == (due, seq):
                return max(0.0, due - self._clock.monotonic())
            heapq.heappop(self._heap)
        return None
