"""claims: what claims.py's docstring promises, over the in-memory Nomad with a
ManualClock — a claim written with EnforceIndex and the loser moving to the
next runner, RunnerGuard's exclusion, inactivity timers (counted from the
controller's start after a restart, never earlier than the claim, never
while busy) and the decision to release that refuses touches, losses whose
first write wins, and the invariant checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from controller.model import Claim, LossReason
from controller.nomad import jobs
from controller.nomad.gateway import IndexConflict
from controller.reconcile.claims import (
    NoRunnerAvailable,
    NotLeader,
    RunnerGuard,
    UnknownEnvironment,
)
from tests.support.fake_nomad import JsonDict
from tests.support.one_runner import OneRunner
from tests.support.pool import ENV, Pool

TIMEOUT_S = 60


def meta(spec: JsonDict) -> dict[str, str]:
    for group in spec.get("TaskGroups") or []:
        if group.get("Name") == jobs.CONFIG_GROUP:
            return {str(k): str(v) for k, v in (group.get("Meta") or {}).items()}
    return {}


def claimed_elsewhere(pool: Pool, runner_id: str, claimed_at: int | None = None) -> None:
    """Another replica claims the runner in Nomad (this one has not seen it yet)."""
    spec = pool.nomad.specs[runner_id]
    when = pool.clock.now_ns() if claimed_at is None else claimed_at
    claim = Claim(timeout=TIMEOUT_S, alloc_id=f"alloc-{runner_id}", claimed_at=when)
    pool.nomad.put(jobs.with_claim(spec, claim))


# -- RunnerGuard -------------------------------------------------------------------------


def begin(guard: RunnerGuard, kind: str, runner_id: str) -> bool:
    return guard.begin_claim(runner_id) if kind == "claim" else guard.begin_delete(runner_id)


def end(guard: RunnerGuard, kind: str, runner_id: str) -> None:
    if kind == "claim":
        guard.end_claim(runner_id)
    else:
        guard.end_delete(runner_id)


GUARD = [
    ("a claim in flight blocks a deletion", ("claim", "r1"), ("delete", "r1"), False),
    ("a deletion in flight blocks a claim", ("delete", "r1"), ("claim", "r1"), False),
    ("a claim in flight blocks a second claim", ("claim", "r1"), ("claim", "r1"), False),
    ("a deletion in flight blocks a second one", ("delete", "r1"), ("delete", "r1"), False),
    ("a claim leaves other runners free", ("claim", "r1"), ("delete", "r2"), True),
    ("a deletion leaves other runners free", ("delete", "r1"), ("claim", "r2"), True),
]


@pytest.mark.parametrize(("name", "held", "attempt", "allowed"), GUARD, ids=[g[0] for g in GUARD])
def test_runner_guard(
    name: str, held: tuple[str, str], attempt: tuple[str, str], allowed: bool
) -> None:
    guard = RunnerGuard()
    assert begin(guard, *held)
    assert begin(guard, *attempt) is allowed, name
    if allowed:
        end(guard, *attempt)
    end(guard, *held)
    assert begin(guard, *attempt), "once the first one ended, the runner is free again"


# -- claiming ------------------------------------------------------------------------------


def test_a_claim_writes_its_incarnation_with_enforce_index(pool: Pool) -> None:
    oldest, _ = pool.ready_runners(2)
    sent: list[int | None] = []
    pool.nomad.before_register = lambda spec, enforce_index: sent.append(enforce_index)
    index_before = pool.nomad.specs[oldest]["JobModifyIndex"]

    view = pool.claim(TIMEOUT_S)

    assert view.id == oldest, "oldest first"
    assert sent == [index_before]
    (write,) = pool.nomad.registered(oldest)[-1:]
    assert {k: v for k, v in write.meta.items() if k != jobs.META_TEMPLATE_HASH} == {
        jobs.META_USED: "true",
        jobs.META_TIMEOUT: str(TIMEOUT_S),
        jobs.META_CLAIM_ALLOC: f"alloc-{oldest}",
        jobs.META_CLAIM_RESTARTS: "0",
        jobs.META_CLAIMED_AT: str(pool.clock.now_ns()),
    }
    assert view.job.claim == Claim(
        timeout=TIMEOUT_S, alloc_id=f"alloc-{oldest}", claimed_at=pool.clock.now_ns()
    )
    assert pool.view(oldest).claimed, "the snapshot shows the claim at once"
    assert pool.changed == [ENV.id], "a pass refills the pool"
    assert pool.count("nrc_claims", result="claimed") == 1


CONFLICTS = [
    ("nobody else claims: the oldest is ours", [], 0),
    ("another replica won the oldest: the next one is ours", [0], 1),
    ("another replica won every runner: none is left", [0, 1], None),
]


@pytest.mark.parametrize("on_the_loop", [False, True], ids=["on a thread", "on the event loop"])
@pytest.mark.parametrize(("name", "taken", "ours"), CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_a_claim_that_loses_the_write_moves_to_the_next_runner(
    pool: Pool, name: str, taken: list[int], ours: int | None, on_the_loop: bool
) -> None:
    ids = pool.ready_runners(2)
    for n in taken:
        claimed_elsewhere(pool, ids[n])
    winners = {ids[n]: pool.nomad.specs[ids[n]]["JobModifyIndex"] for n in taken}
    claim = pool.claim_async if on_the_loop else pool.claim

    if ours is None:
        with pytest.raises(NoRunnerAvailable):
            claim(TIMEOUT_S)
    else:
        assert claim(TIMEOUT_S).id == ids[ours], name

    assert pool.nomad.conflicts == [ids[n] for n in taken], "Nomad refused each stale write"
    for runner_id, index in winners.items():
        assert pool.nomad.specs[runner_id]["JobModifyIndex"] == index, "the winner's claim stays"
    assert pool.count("nrc_claims", result="conflict") == len(taken)
    assert pool.count("nrc_claims", result="claimed") == (0 if ours is None else 1)
    assert pool.count("nrc_claims", result="empty") == (1 if ours is None else 0)


def starting(pool: Pool, ids: list[str]) -> None:
    pool.nomad.run(ids[0], "pending")  # a replacement allocation, not running yet


def outdated(pool: Pool, ids: list[str]) -> None:
    # The environment changed since the oldest runner was built: only newer ones are current.
    changed = replace(ENV, image="python:3.13")
    pool.nomad.put(jobs.template_job(changed))
    template = pool.nomad.specs[jobs.template_job_id(ENV.id)]
    pool.nomad.put(jobs.runner_job(template, jobs.environment_from_job(template, ENV.id), ids[1]))


def being_deleted(pool: Pool, ids: list[str]) -> None:
    pool.expectations.expect_delete(ENV.id, ids[0])


def deletion_in_flight(pool: Pool, ids: list[str]) -> None:
    assert pool.guard.begin_delete(ids[0])


def claimed_before(pool: Pool, ids: list[str]) -> None:
    pool.claim(TIMEOUT_S)


SKIPPED: list[tuple[str, Callable[[Pool, list[str]], None]]] = [
    ("a runner that is not ready", starting),
    ("a runner built from an older environment", outdated),
    ("a runner whose deletion is expected", being_deleted),
    ("a runner whose deletion is in flight", deletion_in_flight),
    ("a runner claimed already", claimed_before),
]


@pytest.mark.parametrize(("name", "setup"), SKIPPED, ids=[s[0] for s in SKIPPED])
def test_a_claim_skips_what_cannot_be_handed_out(
    pool: Pool, name: str, setup: Callable[[Pool, list[str]], None]
) -> None:
    ids = pool.ready_runners(2)
    setup(pool, ids)
    pool.refresh()
    writes_before = len(pool.nomad.registered(ids[0]))
    assert pool.claim(TIMEOUT_S).id == ids[1], name
    assert len(pool.nomad.registered(ids[0])) == writes_before, "nothing written on it"


def test_a_claim_needs_the_environment_and_the_lock(pool: Pool) -> None:
    with pytest.raises(UnknownEnvironment):
        pool.claim(TIMEOUT_S)
    pool.ready_runners(1)
    pool.serving = False
    with pytest.raises(NotLeader):
        pool.claim(TIMEOUT_S)
    assert not any(w.meta.get(jobs.META_USED) == "true" for w in pool.nomad.writes)


# -- releasing -----------------------------------------------------------------------------


def test_a_release_deletes_the_claimed_runner_once(pool: Pool) -> None:
    runner_id = pool.claim_ready()
    assert pool.claims.release(runner_id)
    assert pool.nomad.deregistered() == [runner_id]
    assert runner_id not in pool.observer.snapshot.runners
    assert pool.expectations.is_deleting(runner_id)
    assert pool.count("nrc_jobs_deleted", reason="released") == 1
    assert not pool.claims.release(runner_id), "already gone"
    assert pool.nomad.deregistered() == [runner_id]


def test_only_a_claimed_runner_is_released(pool: Pool) -> None:
    idle, _ = pool.ready_runners(2)
    assert not pool.claims.release(idle)
    assert not pool.claims.release(
        jobs.runner_job_id(ENV.id, "00000000-0000-4000-8000-999999999999")
    )
    pool.serving = False
    with pytest.raises(NotLeader):
        pool.claims.release(idle)
    assert pool.nomad.deregistered() == []


# -- inactivity ------------------------------------------------------------------------------


Step = Callable[[Pool, str], None]


def wait(seconds: float) -> Step:
    return lambda pool, runner_id: pool.clock.advance(seconds)


def touch(pool: Pool, runner_id: str) -> None:
    assert pool.claims.touch(runner_id)


def begin_use(pool: Pool, runner_id: str) -> None:
    use = pool.claims.begin_use(runner_id, "execution")
    assert use is not None
    pool.held.append(use)


def end_use(pool: Pool, runner_id: str) -> None:
    pool.held.pop(0).end()


def restart(pool: Pool, runner_id: str) -> None:
    pool.restart()
    pool.refresh()


TIMERS: list[tuple[str, int, list[Step], bool]] = [
    ("untouched for its timeout: expired", 60, [wait(60)], True),
    ("a little short of its timeout: not expired", 60, [wait(59.999)], False),
    ("a touch starts the timer again", 60, [wait(50), touch, wait(50)], False),
    ("a touch, then its timeout untouched: expired", 60, [wait(50), touch, wait(60)], True),
    ("timeout 0: never expires", 0, [wait(10**6)], False),
    ("busy with an execution: never expires", 60, [begin_use, wait(10**4)], False),
    (
        "two executions, one ended: still busy",
        60,
        [begin_use, begin_use, end_use, wait(100)],
        False,
    ),
    (
        "an execution ended: counts from its end",
        60,
        [begin_use, wait(100), end_use, wait(59)],
        False,
    ),
    ("its timeout after the execution ended: expired", 60, [begin_use, end_use, wait(60)], True),
    # After a restart the timers are not in Nomad: they count from the start.
    ("restarted: counts from the controller's start", 60, [wait(50), restart, wait(50)], False),
    ("restarted: its timeout after the start", 60, [wait(50), restart, wait(60)], True),
    ("restarted long after: still a full timeout", 60, [wait(10**4), restart, wait(59)], False),
]


@pytest.mark.parametrize(
    ("name", "timeout", "steps", "expired"), TIMERS, ids=[t[0] for t in TIMERS]
)
def test_inactivity_timer(
    pool: Pool, name: str, timeout: int, steps: list[Step], expired: bool
) -> None:
    runner_id = pool.claim_ready(timeout)
    for step in steps:
        step(pool, runner_id)
    assert pool.claims.begin_expiry(pool.view(runner_id), pool.clock.now_ns()) is expired, name


def test_after_a_restart_a_claim_newer_than_the_start_counts_from_the_claim(pool: Pool) -> None:
    ids = pool.ready_runners(1)
    pool.restart()
    pool.clock.advance(30)
    claimed_at = pool.clock.now_ns()
    claimed_elsewhere(pool, ids[0], claimed_at)  # by the replica that led meanwhile
    view = pool.refresh().runners[ids[0]]
    assert pool.claims.last_activity([view]) == {ids[0]: claimed_at}
    pool.clock.advance(TIMEOUT_S - 1)
    assert not pool.claims.begin_expiry(pool.view(ids[0]), pool.clock.now_ns())


def test_after_a_restart_a_claim_older_than_the_start_counts_from_the_start(pool: Pool) -> None:
    ids = pool.ready_runners(1)
    claimed_elsewhere(pool, ids[0], claimed_at=0)  # adopted from Poseidon: no claim time
    pool.clock.advance(3600)
    pool.restart()
    started = pool.clock.now_ns()
    view = pool.refresh().runners[ids[0]]
    assert pool.claims.last_activity([view]) == {ids[0]: started}


def test_idle_runners_have_no_timer(pool: Pool) -> None:
    idle, _ = pool.ready_runners(2)
    pool.clock.advance(10**4)
    assert pool.claims.last_activity([pool.view(idle)]) == {}
    assert not pool.claims.begin_expiry(pool.view(idle), pool.clock.now_ns())


def test_a_decided_release_refuses_every_touch_until_forgotten(pool: Pool) -> None:
    runner_id = pool.claim_ready(1)
    pool.clock.advance(1)
    assert pool.claims.begin_expiry(pool.view(runner_id), pool.clock.now_ns())
    assert not pool.claims.touch(runner_id)
    assert pool.claims.begin_use(runner_id, "execution") is None, "no execution starts on it"
    assert pool.claims.begin_expiry(pool.view(runner_id), 0), "decided is final, whatever the time"
    pool.claims.forget(runner_id)
    assert pool.claims.touch(runner_id)


def test_a_lost_claim_never_expires(pool: Pool) -> None:
    runner_id = pool.claim_ready(1)
    assert pool.claims.end_claim(
        runner_id, pool.view(runner_id).job.job_modify_index, LossReason.RESTARTED
    )
    pool.clock.advance(3600)
    assert not pool.claims.begin_expiry(pool.view(runner_id), pool.clock.now_ns())


# -- losses ----------------------------------------------------------------------------------


def test_end_claim_writes_the_loss_with_enforce_index(pool: Pool) -> None:
    runner_id = pool.claim_ready()
    index = pool.view(runner_id).job.job_modify_index
    sent: list[int | None] = []
    pool.nomad.before_register = lambda spec, enforce_index: sent.append(enforce_index)
    pool.clock.advance(5)

    assert pool.claims.end_claim(runner_id, index, LossReason.OOM_KILLED)

    assert sent == [index]
    assert pool.nomad.end_claims(runner_id) == ["oom_killed"]
    spec = pool.nomad.specs[runner_id]
    assert spec["Stop"] is True
    assert meta(spec)[jobs.META_LOST_AT] == str(pool.clock.now_ns())
    claim = pool.view(runner_id).job.claim
    assert claim is not None and claim.lost_reason is LossReason.OOM_KILLED
    assert pool.count("nrc_runner_losses", reason="oom_killed") == 1


def test_end_claim_on_a_job_that_changed_since_the_plan_writes_nothing(pool: Pool) -> None:
    runner_id = pool.claim_ready()
    planned = pool.view(runner_id).job.job_modify_index - 1
    assert not pool.claims.end_claim(runner_id, planned, LossReason.RESTARTED)
    assert pool.nomad.end_claims(runner_id) == []


def test_end_claim_loses_to_a_newer_version_in_nomad(pool: Pool) -> None:
    runner_id = pool.claim_ready()
    index = pool.view(runner_id).job.job_modify_index
    pool.nomad.put(pool.nomad.specs[runner_id])  # somebody else wrote it; not observed yet
    with pytest.raises(IndexConflict):
        pool.claims.end_claim(runner_id, index, LossReason.RESTARTED)
    assert pool.nomad.end_claims(runner_id) == []


def ended_elsewhere(pool: Pool, runner_id: str) -> None:
    spec = pool.nomad.specs[runner_id]
    pool.nomad.put(jobs.with_lost(spec, LossReason.MIGRATED, pool.clock.now_ns()))


def deleted_elsewhere(pool: Pool, runner_id: str) -> None:
    pool.nomad.delete(runner_id)


def changed_elsewhere(pool: Pool, runner_id: str) -> None:
    pool.nomad.put(pool.nomad.specs[runner_id])


def keeps_changing(pool: Pool, runner_id: str) -> None:
    def change_first(spec: JsonDict, enforce_index: int | None) -> None:
        pool.nomad.before_register = None
        changed_elsewhere(pool, runner_id)
        pool.nomad.before_register = change_first

    pool.nomad.before_register = change_first


LOSSES: list[tuple[str, Callable[[Pool, str], None], LossReason | type[Exception] | None]] = [
    ("nobody else wrote: ours is recorded", lambda pool, runner_id: None, LossReason.OOM_KILLED),
    ("somebody ended it first: theirs is told", ended_elsewhere, LossReason.MIGRATED),
    ("somebody changed it: read again and ours written", changed_elsewhere, LossReason.OOM_KILLED),
    ("it was deleted meanwhile: gone", deleted_elsewhere, None),
    ("it kept changing under three writes: retry later", keeps_changing, IndexConflict),
]


@pytest.mark.parametrize(("name", "meanwhile", "told"), LOSSES, ids=[row[0] for row in LOSSES])
def test_write_loss_tells_the_reason_nomad_records(
    pool: Pool,
    name: str,
    meanwhile: Callable[[Pool, str], None],
    told: LossReason | type[Exception] | None,
) -> None:
    runner_id = pool.claim_ready()
    view = pool.view(runner_id)
    meanwhile(pool, runner_id)
    if isinstance(told, type):
        with pytest.raises(told):
            pool.claims.write_loss(view, LossReason.OOM_KILLED)
        assert pool.nomad.end_claims(runner_id) == []
        return
    assert pool.claims.write_loss(view, LossReason.OOM_KILLED) is told, name
    if told is not None:
        assert pool.nomad.end_claims(runner_id) == [told.value], "written once, never rewritten"


def test_record_loss_repeats_a_recorded_loss_without_writing(pool: Pool) -> None:
    runner_id = pool.claim_ready()
    ended_elsewhere(pool, runner_id)
    view = pool.refresh().runners[runner_id]
    writes = len(pool.nomad.writes)
    assert pool.claims.record_loss(view) is LossReason.MIGRATED
    assert len(pool.nomad.writes) == writes


def test_a_loss_is_not_written_by_a_follower(pool: Pool) -> None:
    runner_id = pool.claim_ready()
    pool.serving = False
    with pytest.raises(NotLeader):
        pool.claims.write_loss(pool.view(runner_id), LossReason.LOST)
    assert pool.nomad.end_claims(runner_id) == []


# -- invariants --------------------------------------------------------------------------------


def test_check_finds_a_handed_out_runner_idle_again_or_claimed_again(pool: Pool) -> None:
    ids = pool.ready_runners(3)
    for _ in ids:
        pool.claim(TIMEOUT_S)
    # Nomad shows the first idle again, the second claimed by somebody else,
    # the third deleted.
    unclaimed = jobs.runner_job(pool.nomad.specs[ids[0]], ENV, ids[0])
    pool.nomad.put(unclaimed)
    claimed_elsewhere(pool, ids[1], claimed_at=pool.clock.now_ns() + 1)
    pool.nomad.delete(ids[2])
    snap = pool.refresh()
    assert pool.claims.check(snap.runners.values()) == {"claimed_twice": 1, "claimed_in_pool": 1}
    assert pool.claims.check(snap.runners.values()) == {"claimed_twice": 0, "claimed_in_pool": 0}


def test_prune_forgets_runners_no_longer_in_nomad(pool: Pool) -> None:
    runner_id = pool.claim_ready(1)
    pool.clock.advance(1)
    assert pool.claims.begin_expiry(pool.view(runner_id), pool.clock.now_ns())
    pool.claims.prune(frozenset())
    assert pool.claims.touch(runner_id), "nothing is remembered of it"


def test_the_node_of_an_observed_allocation_is_known_without_asking_nomad(
    one_runner: OneRunner,
) -> None:
    """What execs fall back on when the configured agent cannot be asked
    (controller/nomad/nodes.py)."""
    one_runner.claim()
    pools = one_runner.controller.pools
    assert pools.observed_node("alloc-1") == "agent-1"
    assert pools.observed_node("no-such-alloc") is None
