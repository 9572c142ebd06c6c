"""TokenBucket: burst, refill on the injected clock, blocking, unlimited mode."""

from __future__ import annotations

import threading
import time

import pytest

from controller.clock import ManualClock, SystemClock
from controller.reconcile.ratelimit import TokenBucket


def take_all(bucket: TokenBucket, limit: int = 1000) -> int:
    n = 0
    while n < limit and bucket.try_acquire():
        n += 1
    return n


@pytest.mark.parametrize(
    ("rate", "burst", "advance_s", "refilled"),
    [
        (1.0, 1, 0.0, 0),
        (1.0, 1, 0.99, 0),
        (1.0, 1, 1.0, 1),
        (10.0, 2, 0.1, 1),
        (10.0, 2, 0.25, 2),
        (10.0, 2, 60.0, 2),  # never more than the burst
        (2.0, 5, 1.0, 2),
        (0.5, 3, 4.0, 2),
    ],
)
def test_burst_then_refill(rate: float, burst: int, advance_s: float, refilled: int) -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate, burst, clock)
    assert take_all(bucket) == burst
    clock.advance(advance_s)
    assert take_all(bucket) == refilled


def test_refill_is_not_lost_to_float_rounding() -> None:
    clock = ManualClock()
    bucket = TokenBucket(10.0, 1, clock)
    assert bucket.try_acquire()
    for _ in range(50):
        clock.advance(0.1)
        assert bucket.try_acquire()
        assert not bucket.try_acquire()


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_non_positive_rate_is_unlimited(rate: float) -> None:
    bucket = TokenBucket(rate, 0, ManualClock())
    assert bucket.unlimited
    assert take_all(bucket) == 1000
    assert bucket.acquire(timeout_s=0)


def test_limited_bucket_needs_a_burst() -> None:
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(1.0, 0, ManualClock())


def test_acquire_times_out_without_tokens() -> None:
    bucket = TokenBucket(1.0, 1, ManualClock())
    assert bucket.acquire(timeout_s=0)
    assert not bucket.acquire(timeout_s=0)
    assert not bucket.acquire(timeout_s=0.01)


def test_acquire_blocks_until_the_clock_refills() -> None:
    clock = ManualClock()
    bucket = TokenBucket(1.0, 1, clock)
    assert bucket.try_acquire()
    got = threading.Event()

    def take() -> None:
        if bucket.acquire():
            got.set()

    threading.Thread(target=take, daemon=True).start()
    assert not got.wait(0.05), "no token may appear while the clock stands still"
    clock.advance(1.0)
    bucket.poke()
    assert got.wait(2)
    assert bucket.tokens == pytest.approx(0.0)


def test_acquire_waits_for_the_refill_on_the_system_clock() -> None:
    bucket = TokenBucket(50.0, 1, SystemClock())
    assert bucket.try_acquire()
    start = time.monotonic()
    assert bucket.acquire(timeout_s=2)
    elapsed = time.monotonic() - start
    assert 0.01 <= elapsed < 1.0


def test_concurrent_acquirers_get_no_more_than_the_budget() -> None:
    clock = ManualClock()
    bucket = TokenBucket(1.0, 5, clock)
    results: list[bool] = []
    guard = threading.Lock()

    def grab() -> None:
        ok = bucket.acquire(timeout_s=0.05)
        with guard:
            results.append(ok)

    threads = [threading.Thread(target=grab) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2)
    assert sorted(results) == [False] * 7 + [True] * 5
