"""A token bucket that bounds how fast the controller writes to Nomad.

The per-key backoff in the work queue keeps one failing environment from
spinning; this bucket is the global limit on top of it, so a burst of work
(a restart that finds every pool empty, a drain of many nodes) cannot flood
Nomad with registrations.

Refill follows the injected clock. `timeout_s` is how long the calling thread
is willing to block, in real time; a test driving a `ManualClock` calls
`poke()` after `advance()` so blocked callers look at the clock again.
"""

from __future__ import annotations

import threading
import time

from controller.clock import Clock

# Clock readings are floats: 0.3 - 0.2 refills 0.999… of a token at 10/s. Without
# slack a caller would wait (forever, on a ManualClock) for a rounding error.
_EPSILON = 1e-9


class TokenBucket:
    """`burst` tokens at most, refilled at `rate_per_s`; `rate_per_s <= 0` means unlimited."""

    def __init__(self, rate_per_s: float, burst: int, clock: Clock) -> None:
        if rate_per_s > 0 and burst < 1:
            raise ValueError("a limited bucket needs a burst of at least one token")
        self._rate = rate_per_s
        self._burst = float(burst)
        self._clock = clock
        self._cond = threading.Condition()
        self._tokens = float(burst)
        self._last = clock.monotonic()

    @property
    def unlimited(self) -> bool:
        return self._rate <= 0

    def try_acquire(self) -> bool:
        """Take a token if one is available now."""
        if self.unlimited:
            return True
        with self._cond:
            return self._take_locked() is None

    def acquire(self, timeout_s: float | None = None) -> bool:
        """Take a token, blocking until one is available; False if `timeout_s`
        real seconds pass first (None waits forever)."""
        if self.unlimited:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                wait_s = self._take_locked()
                if wait_s is None:
                    return True
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    wait_s = min(wait_s, remaining)
                self._cond.wait(wait_s)

    def poke(self) -> None:
        """Wake blocked callers so they re-read the clock (after a ManualClock advance)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def tokens(self) -> float:
        """Tokens available now (for tests and metrics)."""
        if self.unlimited:
            return float("inf")
        with self._cond:
            self._refill_locked()
            return self._tokens

    def _refill_locked(self) -> None:
        now = self._clock.monotonic()
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
            self._last = now

    def _take_locked(self) -> float | None:
        """Take a token and return None, or return the seconds until one is due."""
        self._refill_locked()
        if self._tokens >= 1.0 - _EPSILON:
            self._tokens = max(0.0, self._tokens - 1.0)
            return None
        return (1.0 - self._tokens) / self._rate
