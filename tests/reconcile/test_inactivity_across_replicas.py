"""Inactivity with several replicas: a runner touched (or used) through a
follower is never released by the leader while its client is active, and
is released within its timeout plus the stated bound once the client went
away — also after the lead moves to another replica.

Two Controllers with leader election over one in-memory Nomad and one
ManualClock; nothing runs on its own: each simulated second both replicas
renew or try the lock, publish their activity, and the leader runs a pass.
TIMEOUT_S = 10 and the publish interval 1 s: touches every 5 s are well
within the bound (timeout − 2 × interval = 8 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.model import Allocation, Environment
from controller.nomad.gateway import NomadUnavailable
from controller.reconcile.loop import Controller, ControllerSettings
from tests.support.fake_nomad import FakeNomad

ENV = Environment(id=5, image="python:3.12", prewarming_pool_size=1)
TIMEOUT_S = 10
INTERVAL_S = 1.0
SETTINGS = ControllerSettings(
    workers=1,
    write_concurrency=1,
    write_rate_per_s=0,
    leader_election=True,
    leader_ttl_s=15.0,
    activity_publish_interval_s=INTERVAL_S,
)


class Replicas:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.nomad = FakeNomad(self.clock)
        self.a = Controller(self.nomad, SETTINGS, clock=self.clock, metrics=Metrics())
        self.b = Controller(self.nomad, SETTINGS, clock=self.clock, metrics=Metrics())
        self.allocs = 0
        self.step_electors()
        assert self.a.is_leader() and not self.b.is_leader()

    def close(self) -> None:
        for c in (self.a, self.b):
            c.actor.shutdown()

    @property
    def replicas(self) -> tuple[Controller, Controller]:
        return (self.a, self.b)

    def leader(self) -> Controller:
        (leader,) = [c for c in self.replicas if c.is_leader()]
        return leader

    def step_electors(self) -> None:
        for c in self.replicas:
            assert c.elector is not None
            if not c.elector._stop.is_set():
                c.elector.step()

    def observe(self) -> None:
        for c in self.replicas:
            c.observer.refresh()

    def place_new_runners(self) -> None:
        for job_id in self.nomad.created():
            if not any(a.job_id == job_id for a in self.nomad.allocs.values()):
                self.allocs += 1
                now = self.clock.now_ns()
                self.nomad.put_alloc(
                    Allocation(
                        id=f"alloc-{self.allocs}",
                        job_id=job_id,
                        node_id="agent-1",
                        node_name="agent-1",
                        client_status="running",
                        create_index=self.nomad.index + 1,
                        create_time=now,
                        started_at=now,
                    )
                )

    def pass_(self) -> None:
        """The leader's pass over the environment, its new runners placed."""
        leader = self.leader()
        leader.observer.refresh()
        assert leader.reconciler.reconcile(ENV.id).ok
        self.place_new_runners()

    def second(self) -> None:
        """One second: leases, publishes, then the leader's pass."""
        self.clock.advance(1.0)
        self.step_electors()
        self.observe()
        for c in self.replicas:
            assert c.activity is not None
            c.activity.publish()
        self.pass_()

    def claim(self, timeout_s: int = TIMEOUT_S) -> str:
        """A runner of the environment claimed through the leader, seen by both."""
        self.a.pools.put_environment(ENV)
        self.pass_()
        self.pass_()
        self.observe()
        runner_id = self.a.pools.claim(ENV.id, timeout_s).id
        self.observe()
        assert self.b.pools.lookup(runner_id) is not None
        return runner_id

    def released(self, runner_id: str) -> bool:
        return runner_id in self.nomad.deregistered()

    def expect_release_after(self, runner_id: str, seconds: int) -> None:
        """Nobody touches the runner from now on: it is kept for `seconds`,
        and the first pass after that releases it (passes run every second
        here; the publish and read intervals delay nothing on this side)."""
        for second in range(1, seconds):
            self.second()
            assert not self.released(runner_id), f"released {second} s after the last touch"
        self.second()
        assert self.released(runner_id), "not released by the first pass after the timeout"


@pytest.fixture
def replicas() -> Iterator[Replicas]:
    r = Replicas()
    try:
        yield r
    finally:
        r.close()


@pytest.mark.parametrize("every_s", [5, 7])  # 7: just under timeout − 2 × interval
def test_a_runner_touched_through_a_follower_is_kept_then_released_once_its_client_left(
    replicas: Replicas, every_s: int
) -> None:
    runner_id = replicas.claim()
    for second in range(1, 6 * TIMEOUT_S + 1):  # six timeouts
        if second % every_s == 0:
            assert replicas.b.pools.touch(runner_id)
        replicas.second()
        assert not replicas.released(runner_id), f"released at second {second}"
    assert replicas.b.pools.touch(runner_id)  # the client's last touch: it goes away
    replicas.expect_release_after(runner_id, TIMEOUT_S)


def test_a_use_in_flight_on_a_follower_keeps_the_runner(replicas: Replicas) -> None:
    runner_id = replicas.claim()
    use = replicas.b.pools.begin_use(runner_id, "execution")
    assert use is not None
    for second in range(1, 3 * TIMEOUT_S + 1):
        replicas.second()
        assert not replicas.released(runner_id), f"released at second {second}"
    use.end()  # the timer counts from here
    replicas.expect_release_after(runner_id, TIMEOUT_S)


def test_the_new_leader_keeps_a_runner_the_old_leaders_clients_kept_touching(
    replicas: Replicas,
) -> None:
    runner_id = replicas.claim()
    for second in range(1, 2 * TIMEOUT_S + 1):
        if second % 5 == 0:
            assert replicas.a.pools.touch(runner_id)
        replicas.second()
    # A hands the lead over (a drain) one second after its client's last touch
    # and keeps serving; B takes the lock at its next step.
    replicas.a.step_down()
    replicas.second()
    assert replicas.leader() is replicas.b
    for second in range(1, 3 * TIMEOUT_S + 1):
        if second % 5 == 0:
            assert replicas.a.pools.touch(runner_id)  # through A, now a follower
        replicas.second()
        assert not replicas.released(runner_id), f"released {second} s after the change"
    assert replicas.a.pools.touch(runner_id)
    replicas.expect_release_after(runner_id, TIMEOUT_S)


def test_a_new_leader_that_cannot_read_the_activity_releases_nothing(
    replicas: Replicas,
) -> None:
    runner_id = replicas.claim()
    for second in range(1, TIMEOUT_S + 1):
        if second % 5 == 0:
            assert replicas.b.pools.touch(runner_id)
        replicas.second()
    replicas.a.step_down()
    replicas.step_electors()
    assert replicas.leader() is replicas.b

    def unavailable(prefix: str) -> tuple[()]:
        raise NomadUnavailable("list_variables: connection refused")

    listing = replicas.nomad.list_variables
    replicas.nomad.list_variables = unavailable  # type: ignore[method-assign]
    for _ in range(2 * TIMEOUT_S):
        replicas.second()
        assert not replicas.released(runner_id)
    replicas.nomad.list_variables = listing  # type: ignore[method-assign]
    replicas.second()
    # The last touch (through B, now the leader) is long past: released.
    assert replicas.released(runner_id)


def test_a_leader_without_inactivity_timers_reads_no_activity(replicas: Replicas) -> None:
    runner_id = replicas.claim(timeout_s=0)
    for _ in range(3):
        assert replicas.b.pools.touch(runner_id)
        replicas.second()
    assert replicas.nomad.variable_writes  # the replicas publish as ever
    assert [r for r in replicas.nomad.variable_reads if r.startswith("list")] == []
    assert not replicas.released(runner_id)


def test_a_single_replica_does_no_variable_io() -> None:
    clock = ManualClock()
    nomad = FakeNomad(clock)
    single = ControllerSettings(workers=1, write_concurrency=1, write_rate_per_s=0)
    controller = Controller(nomad, single, clock=clock, metrics=Metrics())
    try:
        assert controller.activity is None
        controller.pools.put_environment(ENV)
        controller.observer.refresh()
        controller.reconciler.reconcile(ENV.id)
        (job_id,) = nomad.created()
        nomad.run(job_id)
        controller.observer.refresh()
        runner_id = controller.pools.claim(ENV.id, TIMEOUT_S).id
        assert controller.pools.touch(runner_id)
        clock.advance(TIMEOUT_S + 1)
        controller.observer.refresh()
        controller.reconciler.reconcile(ENV.id)
        assert runner_id in nomad.deregistered()
        assert (nomad.variable_reads, nomad.variable_writes) == ([], [])
    finally:
        controller.actor.shutdown()
