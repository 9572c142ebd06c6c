"""LeaderElector over an in-memory variable lock: acquire, renew, loss on
LockHeld or on a lease that ran out, retries, stop, and two replicas that are
never both leader."""

from __future__ import annotations

import threading
import time

import pytest

from controller.clock import ManualClock
from controller.nomad.gateway import NomadAPIError, NomadUnavailable
from controller.reconcile.leader import WATCH_S, LeaderElector
from tests.helpers import wait_until
from tests.support.fake_nomad import FakeLocks, FakeNomad

TTL = 10.0
PATH = "nomad-runner-controller/leader"


class Replica:
    """One controller replica: its own gateway to the lock backend all share."""

    def __init__(self, backend: FakeLocks, clock: ManualClock) -> None:
        self.gateway = FakeNomad(clock, locks=backend)
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
    assert r.gateway.lock_calls == [("acquire", (PATH, TTL, TTL))]
    assert r.elector.is_leader()
    assert r.changes == [True]
    assert backend.holder(PATH) is not None


def test_renews_every_0_7_ttl_and_stays_leader(clock: ManualClock, backend: FakeLocks) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())
    for _ in range(5):
        assert r.elector.step() == pytest.approx(0.7 * TTL)
        assert r.elector.is_leader()
        clock.advance(0.7 * TTL)
    assert r.gateway.lock_names() == ["acquire"] + ["renew"] * 5
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
    assert r.gateway.lock_names() == ["acquire", "release"]


def test_lease_is_timed_from_the_start_of_a_slow_renew(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())  # t = 7, lease until 10
    seen_in_flight: list[bool] = []

    def slow_response() -> None:
        clock.advance(0.5 * TTL)  # Nomad renewed at t = 7; we hear of it at t = 12
        seen_in_flight.append(r.elector.is_leader())

    r.gateway.after_lock = slow_response
    r.elector.step()
    r.gateway.after_lock = None
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

    r.gateway.before_lock = slow_request
    r.elector.step()
    r.gateway.before_lock = None
    assert not r.elector.is_leader()
    assert r.changes == [True, False]


def test_lock_taken_by_another_ends_leadership_at_once(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())
    backend.steal(PATH, 1000 * TTL)
    assert r.elector.step() == pytest.approx(1.1 * TTL)
    assert not r.elector.is_leader()
    assert r.changes == [True, False]
    clock.advance(1.1 * TTL)
    # Held by another: from now on it is watched with reads, not acquires.
    assert r.elector.step() == pytest.approx(WATCH_S)
    assert r.elector.step() == pytest.approx(WATCH_S)
    assert r.gateway.lock_names() == ["acquire", "renew", "acquire", "held"]
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
    r.gateway.lock_failure = error
    assert r.elector.step() == pytest.approx(0.1 * TTL)
    clock.advance(0.1 * TTL)  # t = 8
    assert r.elector.step() == pytest.approx(0.1 * TTL)
    assert r.elector.is_leader()
    r.gateway.lock_failure = None
    clock.advance(0.1 * TTL)  # t = 9
    assert r.elector.step() == pytest.approx(0.7 * TTL)
    assert r.elector.is_leader()
    assert r.changes == [True], "a blip that the retries ride out is not a loss"
    assert r.gateway.lock_names() == ["acquire", "renew", "renew", "renew"]


@pytest.mark.parametrize(
    "error",
    [NomadUnavailable("connection refused"), NomadAPIError(503, "unavailable")],
)
def test_renew_errors_until_the_lease_ends_lose_leadership(
    clock: ManualClock, backend: FakeLocks, error: Exception
) -> None:
    r = Replica(backend, clock)
    clock.advance(r.elector.step())  # t = 7, lease until 10
    r.gateway.lock_failure = error
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
    assert r.gateway.lock_names()[-1] == "release", "gives the lock up in case Nomad still has it"
    # Back to acquiring, on the slower schedule while Nomad is unreachable.
    assert r.elector.step() == pytest.approx(1.1 * TTL)
    assert r.gateway.lock_names()[-1] == "acquire"


@pytest.mark.parametrize("error", [NomadUnavailable("timeout"), NomadAPIError(500, "boom")])
def test_follower_retries_acquire_every_1_1_ttl_while_nomad_fails(
    clock: ManualClock, backend: FakeLocks, error: Exception
) -> None:
    r = Replica(backend, clock)
    r.gateway.lock_failure = error
    for _ in range(3):
        assert r.elector.step() == pytest.approx(1.1 * TTL)
        assert not r.elector.is_leader()
    assert r.gateway.lock_names() == ["acquire"] * 3
    assert r.changes == []
    r.gateway.lock_failure = None
    r.elector.step()
    assert r.elector.is_leader()
    assert r.changes == [True]


def test_stop_releases_the_lock_and_steps_no_more(clock: ManualClock, backend: FakeLocks) -> None:
    r = Replica(backend, clock)
    r.elector.step()
    r.elector.stop()
    assert not r.elector.is_leader()
    assert backend.holder(PATH) is None
    assert r.changes == [True, False]
    r.elector.step()
    assert r.gateway.lock_names() == ["acquire", "release"]


def test_stop_during_an_acquire_releases_what_it_returns(
    clock: ManualClock, backend: FakeLocks
) -> None:
    r = Replica(backend, clock)
    r.gateway.before_lock = r.elector.stop
    r.elector.step()
    assert not r.elector.is_leader()
    assert backend.holder(PATH) is None
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
    assert backend.holder(PATH) is None
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
                a.gateway.lock_failure = NomadUnavailable("partitioned")
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
    a.gateway.lock_failure = None
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


def test_a_follower_reads_the_held_lock_and_takes_it_right_after_a_release(
    clock: ManualClock, backend: FakeLocks
) -> None:
    """A leader that steps down (a drain) releases the lock: a follower that
    watches it with reads leads within one watch interval, not a TTL."""
    leader, follower = Replica(backend, clock), Replica(backend, clock)
    leader.elector.step()
    assert follower.elector.step() == pytest.approx(WATCH_S)  # the acquire: held
    for _ in range(5):
        clock.advance(WATCH_S)
        leader.elector.step()
        assert follower.elector.step() == pytest.approx(WATCH_S)
    assert follower.gateway.lock_names() == ["acquire"] + ["held"] * 5, "reads, not writes"
    leader.elector.stop()
    clock.advance(WATCH_S)
    follower.elector.step()
    assert follower.elector.is_leader() and not leader.elector.is_leader()


def test_a_lock_waiting_out_its_lock_delay_is_still_held(
    clock: ManualClock, backend: FakeLocks
) -> None:
    leader, follower = Replica(backend, clock), Replica(backend, clock)
    leader.elector.step()
    follower.elector.step()
    clock.advance(TTL + 0.1)  # the leader died: its lock is dead, in its LockDelay
    follower.elector.step()
    assert follower.gateway.lock_names()[-1] == "held" and not follower.elector.is_leader()
