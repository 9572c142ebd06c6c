"""LeaderElector over an in-memory variable lock: acquire, renew, loss on
LockHeld or on a lease that ran out, retries, stop, and two replicas that are
never both leader."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from controller.clock import ManualClock
from controller.nomad.gateway import Lock, LockHeld, NomadAPIError, NomadUnavailable
from controller.reconcile.leader import LeaderElector
from tests.helpers import wait_until

TTL = 10.0
PATH = "nomad-runner-controller/leader"


@dataclass
class Held:
    lock_id: str
    expires: float
    ttl_s: float
    delay_s: float


class FakeLocks:
    """Nomad's variable lock, strictly: dead one TTL after the last acquire or
    renew (Nomad itself waits 2×TTL), then refused to everyone for LockDelay."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.held: dict[str, Held] = {}
        self._ids = itertools.count(1)

    def holder(self, path: str = PATH) -> str | None:
        h = self.held.get(path)
        return h.lock_id if h is not None and self.clock.monotonic() < h.expires else None

    def acquire(self, path: str, ttl_s: float, lock_delay_s: float) -> Lock:
        now = self.clock.monotonic()
        h = self.held.get(path)
        if h is not None and now < h.expires + h.delay_s:
            raise LockHeld(path)
        lock_id = f"lock-{next(self._ids)}"
        self.held[path] = Held(lock_id, now + ttl_s, ttl_s, lock_delay_s)
        return Lock(path, lock_id)

    def renew(self, lock: Lock) -> None:
        h = self.held.get(lock.path)
        if h is None or h.lock_id != lock.lock_id or self.clock.monotonic() >= h.expires:
            raise LockHeld(lock.path)
        h.expires = self.clock.monotonic() + h.ttl_s

    def release(self, lock: Lock) -> None:
        h = self.held.get(lock.path)
        if h is not None and h.lock_id == lock.lock_id:
            del self.held[lock.path]

    def steal(self, path: str = PATH) -> None:
        self.held[path] = Held("thief", self.clock.monotonic() + 1000 * TTL, 1000 * TTL, 0)


class FakeGateway:
    """One replica's view of the lock backend: can fail every call, and can
    run hooks while a request is in flight: `before` the server sees it (a
    slow request) or `after` (a slow response)."""

    def __init__(self, backend: FakeLocks) -> None:
        self.backend = backend
        self.fail: Exception | None = None
        self.calls: list[tuple[str, object]] = []
        self.before: Callable[[], None] | None = None
        self.after: Callable[[], None] | None = None

    def _call(self, name: str, arg: object) -> None:
        self.calls.append((name, arg))
        if self.before is not None:
            self.before()
        if self.fail is not None:
            raise self.fail

    def _return(self) -> None:
        if self.after is not None:
            self.after()

    def lock_acquire(self, path: str, ttl_s: float, lock_delay_s: float) -> Lock:
        self._call("acquire", (path, ttl_s, lock_delay_s))
        lock = self.backend.acquire(path, ttl_s, lock_delay_s)
        self._return()
        return lock

    def lock_renew(self, lock: Lock) -> None:
        self._call("renew", lock)
        self.backend.renew(lock)
        self._return()

    def lock_release(self, lock: Lock) -> None:
        self._call("release", lock)
        self.backend.release(lock)
        self._return()

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class Replica:
    def __init__(self, backend: FakeLocks, clock: ManualClock) -> None:
        self.gateway = FakeGateway(backend)
        self.changes: list[bool] = []
        self.elector = LeaderElector(
            self.gateway, PATH, clock, ttl_s=TTL, on_change=self.changes.append
        )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def backend(clock: ManualClock) -> FakeLocks:
    return FakeLocks(clock)


def test_first_step_acquires_with_ttl_and_lock_delay(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    assert not r.elector.is_leader()
    assert r.elector.step() == pytest.approx(0.7 * TTL)
    assert r.gateway.calls == [("acquire", (PATH, TTL, TTL))]
    assert r.elector.is_leader()
    assert r.changes == [True]
    assert backend.holder() is not None


def test_renews_every_0_7_ttl_and_stays_leader(clock: ManualClock, backend: FakeLocks) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())
    for _ in range(5):
        assert r.elector.step() == pytest.approx(0.7 * TTL)
        assert r.elector.is_leader()
        clock.advance(0.7 * TTL)
    assert r.gateway.names() == ["acquire"] + ["renew"] * 5
    assert r.changes == [True]


def test_leadership_ends_when_the_lease_runs_out_even_without_a_step(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    r.elector.step()
    clock.advance(TTL - 0.001)
    assert r.elector.is_leader()
    clock.advance(0.001)
    # Nothing ran: the elector's thread might be stuck. The answer is still no.
    assert not r.elector.is_leader()
    assert r.changes == [True], "on_change is sent by the next step"
    assert r.elector.step() == 0.0
    assert r.changes == [True, False]
    assert r.gateway.names() == ["acquire", "release"]


def test_lease_is_timed_from_the_start_of_a_slow_renew(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())  # t = 7, lease until 10
    seen_in_flight: list[bool] = []

    def slow_response() -> None:
        clock.advance(0.5 * TTL)  # Nomad renewed at t = 7; we hear of it at t = 12
        seen_in_flight.append(r.elector.is_leader())

    r.gateway.after = slow_response
    r.elector.step()
    r.gateway.after = None
    assert seen_in_flight == [False], "a replica stuck in a renew must stop acting at once"
    # The renew did succeed, so the new lease runs from its start: until t = 17.
    assert r.elector.is_leader()
    clock.advance(5.0 - 0.001)
    assert r.elector.is_leader()
    clock.advance(0.001)
    assert not r.elector.is_leader()


def test_renew_that_reaches_nomad_too_late_loses_leadership(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())  # t = 7, lease until 10

    def slow_request() -> None:
        clock.advance(0.5 * TTL)  # reaches Nomad at t = 12, after the lock died

    r.gateway.before = slow_request
    r.elector.step()
    r.gateway.before = None
    assert not r.elector.is_leader()
    assert r.changes == [True, False]


def test_lock_taken_by_another_ends_leadership_at_once(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())
    backend.steal()
    assert r.elector.step() == pytest.approx(1.1 * TTL)
    assert not r.elector.is_leader()
    assert r.changes == [True, False]
    clock.advance(1.1 * TTL)
    assert r.elector.step() == pytest.approx(1.1 * TTL)
    assert r.gateway.names() == ["acquire", "renew", "acquire"]
    assert not r.elector.is_leader()


@pytest.mark.parametrize(
    "error",
    [NomadUnavailable("connection refused"), NomadAPIError(500, "rpc error: no leader")],
)
def test_renew_errors_are_retried_within_the_lease(
    clock: ManualClock, backend: FakeLocks, error: Exception
) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())  # t = 7, lease until 10
    r.gateway.fail = error
    assert r.elector.step() == pytest.approx(0.1 * TTL)
    clock.advance(0.1 * TTL)  # t = 8
    assert r.elector.step() == pytest.approx(0.1 * TTL)
    assert r.elector.is_leader()
    r.gateway.fail = None
    clock.advance(0.1 * TTL)  # t = 9
    assert r.elector.step() == pytest.approx(0.7 * TTL)
    assert r.elector.is_leader()
    assert r.changes == [True], "a blip that the retries ride out is not a loss"
    assert r.gateway.names() == ["acquire", "renew", "renew", "renew"]


@pytest.mark.parametrize(
    "error",
    [NomadUnavailable("connection refused"), NomadAPIError(503, "unavailable")],
)
def test_renew_errors_until_the_lease_ends_lose_leadership(
    clock: ManualClock, backend: FakeLocks, error: Exception
) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())  # t = 7, lease until 10
    r.gateway.fail = error
    delays = []
    while r.elector.is_leader():
        delay = r.elector.step()
        delays.append(delay)
        clock.advance(delay)
    # 0.1×TTL apart, and the last wait ends exactly when the lease does.
    assert sum(delays) == pytest.approx(0.3 * TTL)
    assert all(d <= 0.1 * TTL + 1e-9 for d in delays)
    assert r.changes == [True]
    assert r.elector.step() == 0.0
    assert r.changes == [True, False]
    assert r.gateway.names()[-1] == "release", "gives the lock up in case Nomad still has it"
    # Back to acquiring, on the slower schedule while Nomad is unreachable.
    assert r.elector.step() == pytest.approx(1.1 * TTL)
    assert r.gateway.names()[-1] == "acquire"


@pytest.mark.parametrize(
    "error", [LockHeld(PATH), NomadUnavailable("timeout"), NomadAPIError(500, "boom")]
)
def test_follower_retries_acquire_every_1_1_ttl(
    clock: ManualClock, backend: FakeLocks, error: Exception
) -> None:
    r = Replica(backend, clock)
    r.gateway.fail = error
    for _ in range(3):
        assert r.elector.step() == pytest.approx(1.1 * TTL)
        assert not r.elector.is_leader()
    assert r.gateway.names() == ["acquire"] * 3
    assert r.changes == []
    r.gateway.fail = None
    r.elector.step()
    assert r.elector.is_leader()
    assert r.changes == [True]


def test_stop_releases_the_lock_and_steps_no_more(clock: ManualClock, backend: FakeLocks) -> None:
    r = Replica(backend, clock)
    r.elector.step()
    r.elector.stop()
    assert not r.elector.is_leader()
    assert backend.holder() is None
    assert r.changes == [True, False]
    r.elector.step()
    assert r.gateway.names() == ["acquire", "release"]


def test_stop_during_an_acquire_releases_what_it_returns(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    r.gateway.before = r.elector.stop
    r.elector.step()
    assert not r.elector.is_leader()
    assert backend.holder() is None
    assert r.changes == []


def test_thread_acquires_and_stop_is_prompt(clock: ManualClock, backend: FakeLocks) -> None:
    r = Replica(backend, clock)
    became = threading.Event()

    def on_change(leader: bool) -> None:
        if leader:
            became.set()

    r.elector = LeaderElector(r.gateway, PATH, clock, ttl_s=TTL, on_change=on_change)
    r.elector.start()
    assert became.wait(2)
    wait_until(r.elector.is_leader, timeout=2)
    start = time.monotonic()
    r.elector.stop()
    assert time.monotonic() - start < 1.0, "the thread waits on an Event, not a sleep"
    assert backend.holder() is None
    with pytest.raises(RuntimeError):
        r.elector.start()


@pytest.mark.parametrize("failure", ["unreachable", "stuck"])
def test_two_replicas_are_never_both_leader_and_fail_over(
    clock: ManualClock, backend: FakeLocks, failure: str
) -> None:
    """Drive two electors on one lock by their own schedules, checking every
    quarter second that at most one is leader. At t = 50 the leader stops
    renewing: it cannot reach Nomad, or its thread is stuck."""
    a, b = Replica(backend, clock), Replica(backend, clock)
    due = {"a": 0.0, "b": 0.1}
    replicas = {"a": a, "b": b}
    frozen: set[str] = set()
    leaders_over_time: list[str | None] = []
    tick = 0.25
    for i in range(int(120 / tick)):
        now = i * tick
        if now == 50.0:
            if failure == "unreachable":
                a.gateway.fail = NomadUnavailable("partitioned")
            else:
                frozen.add("a")
        for name, r in replicas.items():
            if name not in frozen and due[name] <= now:
                due[name] = now + r.elector.step()
        both = a.elector.is_leader() and b.elector.is_leader()
        assert not both, f"two leaders at t={now}"
        leaders_over_time.append(
            "a" if a.elector.is_leader() else "b" if b.elector.is_leader() else None
        )
        clock.advance(tick)

    before = leaders_over_time[: int(50 / tick)]
    after = leaders_over_time[int(50 / tick) :]
    assert set(before) == {"a"}, "the first to ask leads, and keeps leading while it renews"
    assert after[-1] == "b", "the other replica takes over"
    takeover = after.index("b") * tick + 50
    # Lease end (≤ 10 s), lock delay (10 s) and one acquire interval (11 s).
    assert takeover <= 50 + TTL + TTL + 1.1 * TTL + tick
    assert a.changes == [True] if failure == "stuck" else a.changes == [True, False]
    assert b.changes == [True]

    # The old leader comes back: it must find the lock gone and stay a follower.
    a.gateway.fail = None
    frozen.clear()
    for i in range(int(60 / tick)):
        now = 120 + i * tick
        for name, r in replicas.items():
            if due[name] <= now:
                due[name] = now + r.elector.step()
        assert not a.elector.is_leader(), f"the old leader came back at t={now}"
        assert b.elector.is_leader(), f"the new leader lost the lock at t={now}"
        clock.advance(tick)
    assert a.changes[-1] is False
    assert b.changes == [True]
