"""WorkQueue: dedup, one pass in flight per key, FIFO, delays on the injected
clock, per-key backoff, shutdown, and no lost wake-ups under concurrency."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from controller.clock import ManualClock, SystemClock
from controller.reconcile.queue import WorkQueue
from tests.helpers import wait_until


def drain(q: WorkQueue[str]) -> list[str]:
    """Take every ready key (marking each done), in the order handed out."""
    out: list[str] = []
    while (key := q.get(timeout_s=0)) is not None:
        out.append(key)
        q.done(key)
    return out


def in_thread(
    q: WorkQueue[str], timeout_s: float | None
) -> tuple[threading.Event, list[str | None]]:
    """Run one blocking get on a thread; the event is set when it returns."""
    returned = threading.Event()
    result: list[str | None] = []

    def run() -> None:
        result.append(q.get(timeout_s))
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    return returned, result


@pytest.mark.parametrize(
    ("adds", "expected"),
    [
        (["a"], ["a"]),
        (["a", "a", "a"], ["a"]),
        (["a", "b", "a", "c", "b"], ["a", "b", "c"]),
        (["c", "a", "b"], ["c", "a", "b"]),
        ([], []),
    ],
)
def test_add_dedups_and_keeps_fifo_order(adds: list[str], expected: list[str]) -> None:
    q: WorkQueue[str] = WorkQueue(ManualClock())
    for key in adds:
        q.add(key)
    assert q.depth == len(expected) == len(q)
    assert drain(q) == expected
    assert q.depth == 0


def test_key_added_while_processing_is_handed_out_once_after_done() -> None:
    q: WorkQueue[str] = WorkQueue(ManualClock())
    q.add("a")
    q.add("b")
    assert q.get(0) == "a"
    q.add("a")
    q.add("a")
    # "a" is in flight: nobody else may have it, but "b" is still available.
    assert q.depth == 1
    assert q.get(0) == "b"
    assert q.get(0) is None
    q.done("a")
    assert q.get(0) == "a"
    q.done("a")
    q.done("b")
    assert q.get(0) is None


def test_done_without_readd_does_not_requeue_and_stray_done_is_harmless() -> None:
    q: WorkQueue[str] = WorkQueue(ManualClock())
    q.add("a")
    assert q.get(0) == "a"
    q.done("a")
    q.done("a")
    q.done("never-seen")
    assert q.get(0) is None
    q.add("a")
    q.done("a")  # not in flight: must not queue it a second time
    assert drain(q) == ["a"]


def test_add_after_waits_for_the_clock() -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add_after("a", 1.0)
    q.add_after("now", 0)
    assert drain(q) == ["now"]
    assert q.delayed == 1
    clock.advance(0.99)
    assert q.get(0) is None
    clock.advance(0.01)
    assert q.depth == 1
    assert q.delayed == 0
    assert drain(q) == ["a"]


@pytest.mark.parametrize(
    ("first_s", "second_s", "ready_at_s"),
    [
        (5.0, 1.0, 1.0),  # a sooner add moves the key earlier
        (1.0, 5.0, 1.0),  # a later add never postpones it
        (2.0, 2.0, 2.0),
    ],
)
def test_add_after_keeps_the_earliest_time(
    first_s: float, second_s: float, ready_at_s: float
) -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add_after("a", first_s)
    q.add_after("a", second_s)
    clock.advance(ready_at_s - 0.001)
    assert drain(q) == []
    clock.advance(0.001)
    assert drain(q) == ["a"]
    clock.advance(10)
    assert drain(q) == [], "a key delayed twice is delivered once"


def test_delayed_keys_join_the_fifo_in_due_order() -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add_after("late", 2.0)
    q.add_after("early", 1.0)
    q.add("now")
    clock.advance(3)
    assert drain(q) == ["now", "early", "late"]


def test_delayed_key_already_waiting_is_not_duplicated() -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add("a")
    q.add_after("a", 1.0)
    clock.advance(1.0)
    assert drain(q) == ["a"]


@pytest.mark.parametrize(
    ("base_s", "cap_s", "failures", "expected_s"),
    [
        (0.05, 30.0, 0, 0.05),
        (0.05, 30.0, 1, 0.1),
        (0.05, 30.0, 4, 0.8),
        (0.05, 30.0, 9, 25.6),
        (0.05, 30.0, 10, 30.0),
        (0.05, 30.0, 10_000, 30.0),  # no float overflow after many failures
        (1.0, 5.0, 2, 4.0),
        (1.0, 5.0, 3, 5.0),
        (0.0, 5.0, 3, 0.0),
    ],
)
def test_backoff_is_exponential_and_capped(
    base_s: float, cap_s: float, failures: int, expected_s: float
) -> None:
    q: WorkQueue[str] = WorkQueue(ManualClock(), base_s=base_s, cap_s=cap_s)
    assert q.backoff_s(failures) == pytest.approx(expected_s)


def test_add_rate_limited_backs_off_per_key_until_forget() -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock, base_s=1.0, cap_s=30.0)
    expected_delays = [1.0, 2.0, 4.0, 8.0]
    for n, delay in enumerate(expected_delays):
        assert q.num_requeues("a") == n
        q.add_rate_limited("a")
        clock.advance(delay - 0.01)
        assert drain(q) == [], f"failure {n + 1} retried before {delay}s"
        clock.advance(0.01)
        assert drain(q) == ["a"]
    assert q.num_requeues("a") == len(expected_delays)
    assert q.num_requeues("b") == 0, "backoff is per key"
    q.forget("a")
    assert q.num_requeues("a") == 0
    q.add_rate_limited("a")
    clock.advance(1.0)
    assert drain(q) == ["a"]


def test_blocked_get_wakes_on_add() -> None:
    q: WorkQueue[str] = WorkQueue(ManualClock())
    returned, result = in_thread(q, None)
    q.add("a")
    assert returned.wait(2)
    assert result == ["a"]


def test_blocked_get_wakes_on_poke_after_the_clock_moves() -> None:
    clock = ManualClock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add_after("a", 60.0)
    returned, result = in_thread(q, 30.0)
    clock.advance(60.0)
    q.poke()
    assert returned.wait(2), "a getter must re-check delayed keys when poked"
    assert result == ["a"]


def test_delayed_add_wakes_a_getter_on_the_system_clock() -> None:
    q: WorkQueue[str] = WorkQueue(SystemClock())
    returned, result = in_thread(q, None)
    q.add_after("a", 0.02)
    assert returned.wait(2)
    assert result == ["a"]


def test_get_times_out_with_none() -> None:
    q: WorkQueue[str] = WorkQueue(ManualClock())
    q.add_after("a", 1.0)
    assert q.get(timeout_s=0.01) is None
    assert q.get(timeout_s=0) is None


def test_shutdown_wakes_getters_and_stops_everything() -> None:
    q: WorkQueue[str] = WorkQueue(ManualClock())
    waiters = [in_thread(q, None) for _ in range(3)]
    q.shutdown()
    for returned, result in waiters:
        assert returned.wait(2)
        assert result == [None]
    assert q.shutting_down
    q.add("a")
    q.add_after("b", 0)
    assert q.depth == 0
    assert q.get(timeout_s=None) is None


def test_concurrent_workers_never_share_a_key_and_lose_no_add() -> None:
    """8 workers, 2 producers, 4 keys: a key is in at most one worker, and every
    add that happens after a pass has started leads to another pass."""
    q: WorkQueue[int] = WorkQueue(SystemClock())
    keys = range(4)
    guard = threading.Lock()
    in_flight: dict[int, int] = defaultdict(int)
    overlaps: list[int] = []
    # added[k] counts adds of k; seen[k] is added[k] as of the start of the
    # latest pass. An add after a pass started must cause a later pass, so once
    # everything settles seen == added for every key.
    added: dict[int, int] = defaultdict(int)
    seen: dict[int, int] = defaultdict(int)
    passes = 0

    def worker() -> None:
        nonlocal passes
        while (key := q.get(timeout_s=None)) is not None:
            with guard:
                in_flight[key] += 1
                if in_flight[key] > 1:
                    overlaps.append(key)
                seen[key] = added[key]
                passes += 1
            threading.Event().wait(0.0001)  # let others run while the key is held
            with guard:
                in_flight[key] -= 1
            q.done(key)

    def producer(offset: int) -> None:
        for i in range(1000):
            key = keys[(i + offset) % len(keys)]
            with guard:
                added[key] += 1
            q.add(key)

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    producers = [threading.Thread(target=producer, args=(n,), daemon=True) for n in range(2)]
    for t in workers + producers:
        t.start()
    for t in producers:
        t.join(5)

    def settled() -> bool:
        with guard:
            return all(seen[k] == added[k] for k in keys) and not any(in_flight.values())

    wait_until(settled, timeout=2)
    q.shutdown()
    for t in workers:
        t.join(2)
    assert overlaps == []
    assert all(not t.is_alive() for t in workers)
    assert len(keys) <= passes <= 2000
