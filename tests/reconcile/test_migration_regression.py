"""The production migration (docs/architecture.md), replayed through the real controller.

`test_migration_orders.py` checks derive and plan alone; this test runs the
whole machinery a client meets — `Controller` with its Observer, Claims,
Actor, Expectations and queue — over an in-memory Nomad (`FakeNomad`, with
EnforceIndex) and a `ManualClock`, so the ~0.7 s / ~30 ms spacing of the
reports is simulated time. Passes are driven by calling `reconcile` directly
(no threads of ours, no `start()`); every report is delivered as an event
through `_on_events`, which only says "look again": the pass decides from
the lists it then reads.

Two runners of one environment sit on the drained node: one claimed by a
client, one idle. Each gets the four reports of docs/architecture.md, in every one of
the 24 orders (and each report twice). What a list shows of an allocation is
the newest report that has arrived for it, as in `test_migration_orders.py`.
A third runner, on another node, keeps the pool honest.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.model import Allocation, Environment, LossReason, Phase
from controller.nomad.events import decode_events
from controller.nomad.gateway import IndexConflict
from controller.reconcile.claims import NoRunnerAvailable
from controller.reconcile.loop import Controller, ControllerSettings
from tests.support.fake_nomad import FakeNomad, JsonDict

ENV = Environment(id=7, image="python:3.12", prewarming_pool_size=2)
MIGRATING = "alloc is being migrated"
# Simulated time between the 1st and 2nd, 2nd and 3rd, 3rd and 4th report
# delivered: ~740 ms in all, as in production.
GAPS_S = (0.01, 0.7, 0.03)
SETTINGS = ControllerSettings(workers=1, write_concurrency=2, write_rate_per_s=0)
LOSS_REASONS = [r.value for r in LossReason]


def orders() -> list[tuple[str, tuple[int, ...]]]:
    out = [("".join(str(i + 1) for i in p), p) for p in itertools.permutations(range(4))]
    twice = [(0, 1, 2, 3), (3, 2, 1, 0)]
    out += [(f"each twice {''.join(str(i + 1) for i in p)}", p + p) for p in twice]
    return out


def alloc_event(alloc: Allocation, index: int) -> dict[str, Any]:
    return {
        "Topic": "Allocation",
        "Type": "AllocationUpdated",
        "Key": alloc.id,
        "Index": index,
        "Payload": {
            "Allocation": {
                "ID": alloc.id,
                "JobID": alloc.job_id,
                "ClientStatus": alloc.client_status,
                "DesiredStatus": alloc.desired_status,
                "DesiredDescription": alloc.desired_description,
            }
        },
    }


@dataclass
class Scene:
    clock: ManualClock
    nomad: FakeNomad
    controller: Controller
    claimed: str = ""  # the runner a client holds
    idle: str = ""  # the idle runner on the drained node
    other: str = ""  # an idle runner on another node
    reports: dict[str, tuple[Allocation, ...]] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)  # alloc id → newest report rank

    def place(self, job_id: str, alloc_id: str, node: str) -> None:
        now = self.clock.now_ns()
        alloc = Allocation(
            id=alloc_id,
            job_id=job_id,
            node_id=node,
            node_name=node,
            client_status="running",
            create_index=self.nomad.index + 1,
            create_time=now,
            started_at=now,
        )
        self.deliver([alloc])

    def deliver(self, allocs: list[Allocation]) -> None:
        """Nomad writes the allocations and the controller hears the events."""
        events = []
        for alloc in allocs:
            index = self.nomad.put_alloc(alloc)
            events.append(alloc_event(self.nomad.allocs[alloc.id], index))
        self.controller._on_events(self.nomad.index, decode_events(events))

    def reconcile(self) -> None:
        assert self.controller.reconciler.reconcile(ENV.id).ok, "a write failed"

    def probe(self) -> list[str]:
        """Every runner a claim by another client would be handed, in order.

        The real `Claims.claim` runs, but each of its writes is refused with
        an EnforceIndex conflict (as if someone else won), so it offers every
        candidate in turn and changes nothing."""
        offered: list[str] = []

        def refuse(spec: JsonDict, enforce_index: int | None) -> None:
            offered.append(str(spec["ID"]))
            raise IndexConflict("probe")

        self.nomad.before_register = refuse
        try:
            with pytest.raises(NoRunnerAvailable):
                self.controller.claims.claim(ENV.id, 60)
        finally:
            self.nomad.before_register = None
        return offered

    def loss_count(self, reason: str) -> float:
        value = self.controller.metrics.registry.get_sample_value(
            "nrc_runner_losses_total", {"reason": reason}
        )
        return value or 0.0

    def violations(self) -> float:
        return sum(
            self.controller.metrics.registry.get_sample_value(
                "nrc_invariant_violations_total", {"invariant": name}
            )
            or 0.0
            for name in ("claimed_twice", "claimed_in_pool")
        )


def migration_reports(scene: Scene, job_id: str, old_id: str, new_id: str) -> None:
    """The four reports of docs/architecture.md for one runner; PreviousAllocation on none."""
    old = scene.nomad.allocs[old_id]
    placed_at = scene.clock.now_ns()
    stopping = replace(old, desired_status="stop", desired_description=MIGRATING)
    pending = Allocation(
        id=new_id,
        job_id=job_id,
        node_id="agent-4",
        node_name="agent-4",
        client_status="pending",
        create_index=scene.nomad.index + 1,  # placed in the same plan that stops the old one
        create_time=placed_at,
    )
    running = replace(pending, client_status="running", started_at=placed_at + 710_000_000)
    complete = replace(stopping, client_status="complete")
    scene.reports[job_id] = (stopping, pending, running, complete)


@pytest.fixture
def scene() -> Iterator[Scene]:
    clock = ManualClock()
    nomad = FakeNomad(clock)
    controller = Controller(nomad, SETTINGS, clock=clock, metrics=Metrics())
    s = Scene(clock, nomad, controller)
    try:
        controller.pools.put_environment(ENV)
        s.reconcile()
        first = nomad.created()
        assert len(first) == 2
        for n, job_id in enumerate(first):
            s.place(job_id, f"old-{n}", "agent-3")
        s.reconcile()
        assert controller.pools.pool_counts(ENV.id).idle_ready == 2
        held = controller.claims.claim(ENV.id, 60)
        s.claimed = held.id
        s.idle = next(j for j in first if j != held.id)
        s.reconcile()  # refills the pool
        (s.other,) = [j for j in nomad.created() if j not in first]
        s.place(s.other, "other-0", "agent-5")
        s.reconcile()
        counts = controller.pools.pool_counts(ENV.id)
        assert (counts.idle_ready, counts.idle_starting, counts.claimed) == (2, 0, 1)
        clock.advance(30)
        yield s
    finally:
        controller.actor.shutdown()


@pytest.mark.parametrize(("name", "sequence"), orders(), ids=[n for n, _ in orders()])
def test_migration_in_any_order_through_the_controller(
    scene: Scene, name: str, sequence: tuple[int, ...]
) -> None:
    s = scene
    nomad, controller = s.nomad, s.controller
    claim = controller.observer.snapshot.runners[s.claimed].job.claim
    assert claim is not None
    (idle_alloc,) = [a.id for a in nomad.allocs.values() if a.job_id == s.idle]
    old = {s.claimed: claim.alloc_id, s.idle: idle_alloc}
    for job_id in (s.claimed, s.idle):
        migration_reports(s, job_id, old[job_id], f"new-{job_id}")
    new_idle = s.reports[s.idle][1].id
    created = nomad.created()

    for position, report in enumerate(sequence):
        if position:
            s.clock.advance(GAPS_S[min(position, len(GAPS_S)) - 1])
        changed = []
        for job_id in (s.claimed, s.idle):
            alloc = s.reports[job_id][report]
            if s.applied.get(alloc.id, -1) < report:
                s.applied[alloc.id] = report
                changed.append(alloc)
            else:
                changed.append(nomad.allocs[alloc.id])  # an older report: Nomad has newer
        s.deliver(changed)
        s.reconcile()

        snap = controller.observer.snapshot
        held, idle = snap.runners[s.claimed], snap.runners[s.idle]
        assert held.claimed, f"{name}: the claimed runner lost its claim"
        assert not idle.claimed
        # never deleted, never replaced, nothing created: it is one runner migrating
        assert s.idle in nomad.specs and s.idle not in nomad.deregistered(), name
        assert nomad.created() == created, f"{name}: runners created during a migration"
        if idle.phase is Phase.READY:
            assert idle.alloc is not None and idle.alloc.desired_status == "run", name
        assert len(nomad.end_claims(s.claimed)) <= 1, name
        # A second client is never offered the claimed runner; the idle one
        # only once its new allocation runs.
        offered = s.probe()
        assert s.claimed not in offered, f"{name}: claimed runner offered to a second client"
        assert s.other in offered
        new_running = s.applied.get(new_idle, -1) >= 2
        assert (s.idle in offered) == new_running, (name, position, offered)

    # Resyncs later: nothing changes any more.
    controller.observer.refresh()
    s.reconcile()

    assert nomad.end_claims(s.claimed) == ["migrated"], name
    assert s.loss_count("migrated") == 1
    assert sum(s.loss_count(r) for r in LOSS_REASONS) == 1
    held_view = controller.claims.lookup(s.claimed)
    assert held_view is not None and held_view.job.claim is not None
    assert held_view.job.claim.lost_reason is LossReason.MIGRATED
    idle_view = controller.observer.snapshot.runners[s.idle]
    assert idle_view.phase is Phase.READY and idle_view.alloc is not None
    assert idle_view.alloc.id == new_idle, "the idle runner serves from its new allocation"
    assert s.idle not in nomad.deregistered() and nomad.created() == created
    counts = controller.pools.pool_counts(ENV.id)
    assert (counts.idle_ready, counts.idle_starting, counts.claimed, counts.lost) == (2, 0, 0, 1)
    assert s.violations() == 0

    # Other clients get the two idle runners, never the migrated one.
    handed = []
    while True:
        try:
            handed.append(controller.claims.claim(ENV.id, 60).id)
        except NoRunnerAvailable:
            break
    assert sorted(handed) == sorted([s.idle, s.other]), name
    s.reconcile()
    assert len(nomad.created()) == len(created) + 2  # and the pool refills
    assert s.violations() == 0
