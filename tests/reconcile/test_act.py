"""act: what act.py's docstring promises, over the in-memory Nomad with a
ManualClock — every write re-checks what it changes, because time passed
since the plan: a deletion for an idle-only reason skips a runner claimed
meanwhile and holds the RunnerGuard so no claim starts during it, an
inactivity release skips a runner touched meanwhile and refuses touches
from its decision on, ending a claim loses to any other change; creations
are expected until Nomad shows them, a replica that is not leader
writes nothing, and where other replicas claim too, an idle runner is
stopped over the version the pass saw before it is deleted."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from controller.model import LossReason, Template
from controller.nomad import jobs
from controller.nomad.gateway import IndexConflict, NomadAPIError, NomadUnavailable
from controller.reconcile.claims import NoRunnerAvailable
from controller.reconcile.expectations import Pending
from controller.reconcile.plan import (
    IDLE_ONLY_REASONS,
    Action,
    Budget,
    CreateRunners,
    DeleteReason,
    DeleteRunner,
    EndClaim,
    Plan,
    PoolCounts,
)
from tests.support.fake_nomad import JsonDict
from tests.support.pool import ENV, Pool

# Reasons that remove a runner nobody holds (act re-checks them against a claim).
IDLE_ONLY = tuple(sorted(IDLE_ONLY_REASONS))


def execute(pool: Pool, *actions: Action) -> int:
    """The plan's actions carried out; how many writes failed."""
    template: Template | None = pool.observer.snapshot.templates.get(ENV.id)
    plan = Plan(actions=actions, budget=Budget(), degraded=False, counts=PoolCounts())
    return pool.actor.execute(ENV.id, plan, template)


def writes(pool: Pool, action: str, outcome: str) -> float:
    return pool.count("nrc_nomad_writes", action=action, outcome=outcome)


# -- deletions -------------------------------------------------------------------------------

# (reason, deleted when claimed after the plan, deleted when idle): every
# reason, on a runner a client claimed after the plan (its claim expired, as an
# inactivity release needs) and on one nobody holds.
RULES = [
    *((reason, False, True) for reason in IDLE_ONLY),
    (DeleteReason.INACTIVITY_TIMEOUT, True, False),  # an idle runner has no timer
    (DeleteReason.LOST_RETENTION, True, True),  # planned for lost claims only
]
DELETIONS = [
    (f"{reason.value}, {'claimed meanwhile' if claimed else 'idle'}", reason, claimed, deleted)
    for reason, if_claimed, if_idle in RULES
    for claimed, deleted in ((True, if_claimed), (False, if_idle))
]
assert {row[1] for row in DELETIONS} == set(DeleteReason), "every reason has its rule"


@pytest.mark.parametrize(
    ("name", "reason", "claimed", "deleted"), DELETIONS, ids=[d[0] for d in DELETIONS]
)
def test_a_deletion_rechecks_the_runner(
    pool: Pool, name: str, reason: DeleteReason, claimed: bool, deleted: bool
) -> None:
    runner_id, other = pool.ready_runners(2)
    planned = DeleteRunner(runner_id, reason)
    if claimed:
        assert pool.claim(1).id == runner_id
        pool.clock.advance(1)  # expired

    assert execute(pool, planned) == 0, "skipping is not a failure: the next pass decides"

    assert pool.nomad.deregistered() == ([runner_id] if deleted else []), name
    assert (runner_id in pool.observer.snapshot.runners) is not deleted
    assert other in pool.observer.snapshot.runners
    if deleted:
        assert pool.expectations.is_deleting(runner_id)
        assert writes(pool, "delete", "ok") == 1
        assert pool.count("nrc_jobs_deleted", reason=reason.value) == 1


def test_a_claim_in_flight_blocks_a_deletion(pool: Pool) -> None:
    runner_id, _ = pool.ready_runners(2)
    assert pool.guard.begin_claim(runner_id)
    assert execute(pool, DeleteRunner(runner_id, DeleteReason.SURPLUS)) == 0
    assert pool.nomad.deregistered() == []
    pool.guard.end_claim(runner_id)
    assert execute(pool, DeleteRunner(runner_id, DeleteReason.SURPLUS)) == 0
    assert pool.nomad.deregistered() == [runner_id]


@pytest.mark.parametrize(("name", "runners"), [("another runner", 2), ("no other runner", 1)])
def test_a_deletion_in_flight_blocks_a_claim_of_its_runner(
    pool: Pool, name: str, runners: int
) -> None:
    ids = pool.ready_runners(runners)
    handed: list[str | None] = []

    def claim_meanwhile(job_id: str) -> None:
        try:
            handed.append(pool.claim(60).id)
        except NoRunnerAvailable:
            handed.append(None)

    pool.nomad.before_deregister = claim_meanwhile
    assert execute(pool, DeleteRunner(ids[0], DeleteReason.SURPLUS)) == 0
    assert pool.nomad.deregistered() == [ids[0]]
    assert handed == [ids[1] if runners > 1 else None], name


def test_an_inactivity_release_skips_a_runner_touched_since_the_plan(pool: Pool) -> None:
    runner_id = pool.claim_ready(1)
    pool.clock.advance(1)  # expired: the plan releases it
    assert pool.claims.touch(runner_id)  # ... but its client came back first
    assert execute(pool, DeleteRunner(runner_id, DeleteReason.INACTIVITY_TIMEOUT)) == 0
    assert pool.nomad.deregistered() == []
    assert pool.claims.touch(runner_id)


def test_a_touch_during_an_inactivity_release_is_refused(pool: Pool) -> None:
    runner_id = pool.claim_ready(1)
    pool.clock.advance(1)
    touched: list[bool] = []
    pool.nomad.before_deregister = lambda job_id: touched.append(pool.claims.touch(job_id))
    assert execute(pool, DeleteRunner(runner_id, DeleteReason.INACTIVITY_TIMEOUT)) == 0
    assert touched == [False], "no client hears 'alive' from a runner being deleted"
    assert pool.nomad.deregistered() == [runner_id]


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("Nomad unreachable", NomadUnavailable("connection refused")),
        ("Nomad failing", NomadAPIError(500, "rpc error")),
    ],
)
def test_a_failed_deletion_is_retried_by_the_next_pass(
    pool: Pool, name: str, error: Exception
) -> None:
    runner_id = pool.claim_ready(1)
    pool.clock.advance(1)

    def fail(job_id: str) -> None:
        raise error

    pool.nomad.before_deregister = fail
    assert execute(pool, DeleteRunner(runner_id, DeleteReason.INACTIVITY_TIMEOUT)) == 1, name
    assert not pool.expectations.is_deleting(runner_id)
    assert runner_id in pool.observer.snapshot.runners
    assert writes(pool, "delete", "error") == 1
    assert not pool.claims.touch(runner_id), "the release stays decided"
    pool.nomad.before_deregister = None
    assert execute(pool, DeleteRunner(runner_id, DeleteReason.INACTIVITY_TIMEOUT)) == 0
    assert pool.nomad.deregistered() == [runner_id]


def test_a_deletion_of_a_runner_gone_meanwhile_writes_nothing(pool: Pool) -> None:
    runner_id, _ = pool.ready_runners(2)
    pool.observer.forget(runner_id)
    assert execute(pool, DeleteRunner(runner_id, DeleteReason.SURPLUS)) == 0
    assert pool.nomad.deregistered() == []


# -- creations --------------------------------------------------------------------------------


def test_creations_register_new_jobs_and_are_expected_until_seen(pool: Pool) -> None:
    pool.environment()
    pool.refresh()
    sent: list[int | None] = []
    pool.nomad.before_register = lambda spec, enforce_index: sent.append(enforce_index)
    assert execute(pool, CreateRunners(ENV.id, 2)) == 0
    assert sent == [0, 0], "a new job must not exist yet"
    created = pool.nomad.created()
    assert len(created) == 2
    assert pool.expectations.pending(ENV.id).creating == 2
    assert writes(pool, "create", "ok") == 2
    assert pool.count("nrc_jobs_created", environment=str(ENV.id)) == 2
    pool.nomad.reads.clear()
    pool.refresh()
    assert pool.expectations.pending(ENV.id).creating == 0
    assert set(created) <= set(pool.observer.snapshot.runners)
    # The specs we wrote are cached with the index Nomad gave them: listed,
    # not read back; Nomad's CreateIndex comes from the list.
    assert not [r for r in pool.nomad.reads if r.startswith("get_job")]
    for job_id in created:
        assert pool.view(job_id).known
        assert pool.view(job_id).job.create_index == pool.nomad.specs[job_id]["CreateIndex"] > 0


def test_a_claimed_runner_keeps_the_create_index_nomad_listed(pool: Pool) -> None:
    """A claim writes the spec without Nomad's fields; the snapshot keeps the
    runner's CreateIndex (its age among the runners) from the list."""
    pool.environment()
    (runner_id,) = pool.ready_runners(1)
    listed = pool.view(runner_id).job.create_index
    assert listed == pool.nomad.specs[runner_id]["CreateIndex"] > 0
    pool.claim()
    assert pool.view(runner_id).claimed
    assert pool.view(runner_id).job.create_index == listed
    pool.refresh()
    assert pool.view(runner_id).job.create_index == listed


CREATE_FAILURES = [
    # The write may have landed: expected until a list or the timeout says otherwise.
    ("Nomad unreachable", NomadUnavailable("timeout"), "unavailable", 1),
    ("Nomad refused it", NomadAPIError(400, "bad job"), "error", 0),
    ("the job exists already", IndexConflict("exists"), "error", 0),
]


@pytest.mark.parametrize(
    ("name", "error", "outcome", "still_expected"),
    CREATE_FAILURES,
    ids=[c[0] for c in CREATE_FAILURES],
)
def test_a_failed_creation(
    pool: Pool, name: str, error: Exception, outcome: str, still_expected: int
) -> None:
    pool.environment()
    pool.refresh()

    def fail(spec: JsonDict, enforce_index: int | None) -> None:
        raise error

    pool.nomad.before_register = fail
    assert execute(pool, CreateRunners(ENV.id, 1)) == 1, name
    assert pool.expectations.pending(ENV.id).creating == still_expected
    assert writes(pool, "create", outcome) == 1


def test_no_template_no_creation(pool: Pool) -> None:
    assert execute(pool, CreateRunners(ENV.id, 3)) == 0
    assert pool.nomad.writes == []


# -- ending claims -------------------------------------------------------------------------------


def end_claim_of(pool: Pool, runner_id: str) -> EndClaim:
    return EndClaim(runner_id, pool.view(runner_id).job.job_modify_index, LossReason.RESTARTED)


def nothing(pool: Pool, runner_id: str) -> None:
    pass


def touched_by_us(pool: Pool, runner_id: str) -> None:
    # A newer version we know of (our own write since the plan).
    spec = pool.nomad.specs[runner_id]
    result = pool.nomad.register_job(spec)
    pool.observer.apply_spec(runner_id, {**spec, "JobModifyIndex": result.job_modify_index})


def touched_by_another(pool: Pool, runner_id: str) -> None:
    pool.nomad.put(pool.nomad.specs[runner_id])  # not observed yet


def unreachable(pool: Pool, runner_id: str) -> None:
    def fail(spec: JsonDict, enforce_index: int | None) -> None:
        raise NomadUnavailable("timeout")

    pool.nomad.before_register = fail


END_CLAIMS: list[tuple[str, Callable[[Pool, str], None], bool, int, str | None]] = [
    ("unchanged since the plan: written", nothing, True, 0, "ok"),
    ("we changed it since: the next pass looks again", touched_by_us, False, 0, None),
    ("somebody else changed it: loses to the change", touched_by_another, False, 0, "conflict"),
    ("Nomad unreachable: the pass is retried", unreachable, False, 1, "error"),
]


@pytest.mark.parametrize(
    ("name", "meanwhile", "written", "failures", "outcome"),
    END_CLAIMS,
    ids=[e[0] for e in END_CLAIMS],
)
def test_ending_a_claim(
    pool: Pool,
    name: str,
    meanwhile: Callable[[Pool, str], None],
    written: bool,
    failures: int,
    outcome: str | None,
) -> None:
    runner_id = pool.claim_ready()
    planned = end_claim_of(pool, runner_id)
    meanwhile(pool, runner_id)
    assert execute(pool, planned) == failures, name
    assert pool.nomad.end_claims(runner_id) == (["restarted"] if written else [])
    for result in ("ok", "conflict", "error"):
        assert writes(pool, "end_claim", result) == (1 if result == outcome else 0)


# -- leadership ---------------------------------------------------------------------------------


def test_a_replica_that_is_not_leader_writes_nothing(pool: Pool) -> None:
    claimed = pool.claim_ready()
    idle = pool.add_runner()
    pool.refresh()
    plan = (
        CreateRunners(ENV.id, 2),
        DeleteRunner(idle, DeleteReason.SURPLUS),
        end_claim_of(pool, claimed),
    )
    writes_before = list(pool.nomad.writes)
    pool.leading = False
    assert execute(pool, *plan) == 4, "every write failed: the pass is retried"
    assert pool.nomad.writes == writes_before
    assert pool.expectations.pending(ENV.id) == Pending(creating=0, deleting=frozenset())


# -- replicas that claim too ----------------------------------------------------------------


@pytest.fixture
def leader() -> Iterator[Pool]:
    """A leader whose runners other replicas claim too (the Actor's `shared`)."""
    p = Pool(shared=True)
    try:
        yield p
    finally:
        p.close()


def other_replica(leader: Pool) -> Pool:
    """Another replica over the same Nomad, which has observed it."""
    other = Pool(leader.nomad)
    other.refresh()
    return other


def test_an_idle_runner_another_replica_just_claimed_is_not_deleted(leader: Pool) -> None:
    """The leader's snapshot does not show the other replica's claim yet;
    its surplus deletion stops the runner over the version it knows, which
    fails against the claim, and deletes nothing."""
    runner_id, _ = leader.ready_runners(2)
    other = other_replica(leader)
    try:
        assert other.claim(60).id == runner_id
    finally:
        other.close()
    assert not leader.view(runner_id).claimed, "the claim does not show here yet"

    assert execute(leader, DeleteRunner(runner_id, DeleteReason.SURPLUS)) == 0

    assert leader.nomad.deregistered() == []
    claim = jobs.runner_from_job(leader.nomad.specs[runner_id], ENV.id).claim
    assert claim is not None and not leader.nomad.specs[runner_id].get("Stop")
    assert writes(leader, "retire", "conflict") == 1
    assert writes(leader, "delete", "ok") == 0


def test_an_idle_runner_is_stopped_before_it_is_deleted_so_no_replica_claims_it(
    leader: Pool,
) -> None:
    """Once the stop has landed, another replica that still sees the runner
    idle cannot claim it: its write is over the version before the stop."""
    runner_id, other_id = leader.ready_runners(2)
    other = other_replica(leader)
    handed: list[str] = []
    stopped: list[bool] = []

    def claim_meanwhile(job_id: str) -> None:
        stopped.append(bool(leader.nomad.specs[job_id].get("Stop")))
        handed.append(other.claim(60).id)

    leader.nomad.before_deregister = claim_meanwhile
    try:
        assert execute(leader, DeleteRunner(runner_id, DeleteReason.SURPLUS)) == 0
    finally:
        other.close()

    assert stopped == [True]
    assert leader.nomad.deregistered() == [runner_id]
    assert handed == [other_id]
    assert writes(leader, "retire", "ok") == 1
    assert writes(leader, "delete", "ok") == 1


@pytest.mark.parametrize("shared", [False, True])
def test_a_runner_that_cannot_be_claimed_is_deleted_with_one_write(shared: bool) -> None:
    """Only a runner some replica could claim is stopped first: one that is
    not ready (here, its allocation failed) is deleted at once, and without
    other replicas every deletion is one write."""
    pool = Pool(shared=shared)
    try:
        pool.environment()
        failed = pool.add_runner(status="failed")
        ready = pool.add_runner()
        pool.refresh()
        execute(
            pool,
            DeleteRunner(failed, DeleteReason.DEAD),
            DeleteRunner(ready, DeleteReason.SURPLUS),
        )
        assert sorted(pool.nomad.deregistered()) == sorted([failed, ready])
        assert writes(pool, "retire", "ok") == (1 if shared else 0)
    finally:
        pool.close()
