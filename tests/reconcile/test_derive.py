"""derive: table-driven cases, and every order of the production migration."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from controller.model import SECOND, Allocation, Claim, LossReason, Phase, RunnerJob
from controller.reconcile.derive import current_allocation, derive_runner

T0 = 1_700_000_000 * SECOND
CLAIM = Claim(timeout=60, alloc_id="a1", restarts=0, claimed_at=T0)


def job(claim: Claim | None = None, **kw: object) -> RunnerJob:
    base = RunnerJob(id="7-x", env_id=7, job_modify_index=10, status="running", claim=claim)
    return replace(base, **kw)  # type: ignore[arg-type]


def alloc(aid: str, client: str, desired: str = "run", **kw: object) -> Allocation:
    index = {"a1": 11, "a2": 20, "a3": 30}.get(aid, 40)
    base = Allocation(
        id=aid,
        job_id="7-x",
        client_status=client,
        desired_status=desired,
        create_index=index,
        create_time=T0 + index * SECOND,
        modify_time=T0 + index * SECOND,
        started_at=T0 + (index + 1) * SECOND if client in ("running", "complete") else None,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


MIGRATING = "alloc is being migrated"


@pytest.mark.parametrize(
    ("name", "claim", "job_kw", "allocs", "phase", "current", "reset"),
    [
        ("unplaced", None, {"status": "pending"}, [], Phase.STARTING, None, None),
        ("pending", None, {}, [alloc("a1", "pending")], Phase.STARTING, "a1", None),
        ("running", None, {}, [alloc("a1", "running")], Phase.READY, "a1", None),
        (
            "migrating, old still running",
            None,
            {},
            [alloc("a1", "running", "stop", desired_description=MIGRATING)],
            Phase.STARTING,
            None,
            None,
        ),
        (
            "migrated, new running",
            None,
            {},
            [alloc("a1", "complete", "stop"), alloc("a2", "running")],
            Phase.READY,
            "a2",
            None,
        ),
        (
            "failed, reschedule pending",
            None,
            {},
            [alloc("a1", "failed")],
            Phase.STARTING,
            "a1",
            None,
        ),
        (
            "failed, job dead",
            None,
            {"status": "dead"},
            [alloc("a1", "failed")],
            Phase.DEAD,
            "a1",
            None,
        ),
        (
            "complete, job dead",
            None,
            {"status": "dead"},
            [alloc("a1", "complete")],
            Phase.DEAD,
            "a1",
            None,
        ),
        (
            "all stopped, job dead",
            None,
            {"status": "dead"},
            [alloc("a1", "complete", "stop")],
            Phase.DEAD,
            None,
            None,
        ),
        (
            "job stopped, alloc running",
            None,
            {"stop": True},
            [alloc("a1", "running", "stop")],
            Phase.STOPPING,
            None,
            None,
        ),
        (
            "job stopped, alloc done",
            None,
            {"stop": True},
            [alloc("a1", "complete", "stop")],
            Phase.DEAD,
            None,
            None,
        ),
        # claimed runners
        ("claimed, serving", CLAIM, {}, [alloc("a1", "running")], Phase.READY, "a1", None),
        (
            "claimed, migrated (old running/stop)",
            CLAIM,
            {},
            [alloc("a1", "running", "stop", desired_description=MIGRATING)],
            Phase.STARTING,
            None,
            LossReason.MIGRATED,
        ),
        (
            "claimed, migrated via DesiredTransition only",
            CLAIM,
            {},
            [alloc("a1", "complete", "stop", migrate=True), alloc("a2", "running")],
            Phase.READY,
            "a2",
            LossReason.MIGRATED,
        ),
        (
            "claimed, restarted in place",
            CLAIM,
            {},
            [alloc("a1", "running", restarts=1)],
            Phase.READY,
            "a1",
            LossReason.RESTARTED,
        ),
        (
            "claimed, OOM killed and restarted",
            CLAIM,
            {},
            [alloc("a1", "running", restarts=1, last_exit_oom=True)],
            Phase.READY,
            "a1",
            LossReason.OOM_KILLED,
        ),
        (
            "claimed, OOM killed and failed",
            CLAIM,
            {},
            [alloc("a1", "failed", last_exit_oom=True), alloc("a2", "pending")],
            Phase.STARTING,
            "a2",
            LossReason.OOM_KILLED,
        ),
        (
            "claimed, OOM before the claim, restarted since for another reason",
            replace(CLAIM, restarts=1),
            {},
            [alloc("a1", "running", restarts=2, last_exit_oom=False)],
            Phase.READY,
            "a1",
            LossReason.RESTARTED,
        ),
        (
            "claimed, restarts counted before the claim",
            replace(CLAIM, restarts=2),
            {},
            [alloc("a1", "running", restarts=2, last_exit_oom=True)],
            Phase.READY,
            "a1",
            None,
        ),
        (
            "claimed, crashed and rescheduled",
            CLAIM,
            {},
            [alloc("a1", "failed"), alloc("a2", "running")],
            Phase.READY,
            "a2",
            LossReason.RESCHEDULED,
        ),
        (
            "claimed, node lost",
            CLAIM,
            {},
            [
                alloc(
                    "a1", "lost", "stop", desired_description="alloc is lost since its node is down"
                )
            ],
            Phase.STARTING,
            None,
            LossReason.LOST,
        ),
        (
            "claimed, allocation vanished",
            CLAIM,
            {},
            [alloc("a2", "running")],
            Phase.READY,
            "a2",
            LossReason.LOST,
        ),
        (
            "claimed, job stopped by someone",
            CLAIM,
            {"stop": True},
            [alloc("a1", "running", "stop")],
            Phase.STOPPING,
            None,
            LossReason.JOB_STOPPED,
        ),
        (
            "claimed, replacement seen before the old allocation's stop",
            CLAIM,
            {},
            [alloc("a1", "running"), alloc("a2", "pending")],
            Phase.STARTING,
            "a2",
            None,
        ),
        (
            "claimed, already ended: no second reason",
            replace(CLAIM, lost_reason=LossReason.MIGRATED, lost_at=T0),
            {"stop": True},
            [alloc("a1", "complete", "stop")],
            Phase.DEAD,
            None,
            None,
        ),
        (
            "adopted Poseidon claim, still running",
            Claim(timeout=60),
            {},
            [alloc("a1", "running")],
            Phase.READY,
            "a1",
            None,
        ),
        (
            "adopted Poseidon claim, dead",
            Claim(timeout=60),
            {"status": "dead"},
            [alloc("a1", "complete")],
            Phase.DEAD,
            "a1",
            LossReason.LOST,
        ),
    ],
)
def test_derive(name, claim, job_kw, allocs, phase, current, reset):
    view = derive_runner(job(claim, **job_kw), allocs)
    assert view.phase is phase, name
    assert (view.alloc.id if view.alloc else None) == current, name
    assert view.reset == reset, name


def test_startup_duration_and_failed_start():
    ready = derive_runner(job(), [alloc("a1", "running")])
    assert ready.startup_ns == SECOND
    failed = derive_runner(job(), [alloc("a1", "failed")])
    assert failed.failed_to_start and failed.startup_ns is None
    recovered = derive_runner(job(), [alloc("a1", "failed"), alloc("a2", "running")])
    assert not recovered.failed_to_start


def test_current_allocation_ignores_previous_allocation_and_list_order():
    allocs = [alloc("a2", "pending"), alloc("a1", "running", "stop"), alloc("a3", "running")]
    for perm in itertools.permutations(allocs):
        assert current_allocation(perm) == allocs[2]
