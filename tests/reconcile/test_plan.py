"""plan: table-driven cases over runner views."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from controller.model import (
    SECOND,
    Allocation,
    Claim,
    Environment,
    LossReason,
    Phase,
    RunnerJob,
    RunnerView,
)
from controller.reconcile.plan import (
    IDLE_ONLY_REASONS,
    Budget,
    CreateRunners,
    DeleteReason,
    DeleteRunner,
    EndClaim,
    Plan,
    PlanInput,
    PlanSettings,
    PoolCounts,
    count_pool,
    plan,
)

T0 = 1_700_000_000 * SECOND
ENV = Environment(id=7, image="python:3.12", prewarming_pool_size=3)
SETTINGS = PlanSettings(
    orphan_grace_ns=60 * SECOND,
    startup_timeout_ns=120 * SECOND,
    lost_retention_ns=3600 * SECOND,
    backoff_base_ns=SECOND,
    backoff_cap_ns=16 * SECOND,
    degraded_after=3,
)


def view(
    n: int,
    phase: Phase = Phase.READY,
    claim: Claim | None = None,
    template_hash: str = ENV.template_hash,
    **kw: object,
) -> RunnerView:
    job = RunnerJob(
        id=f"7-{n}",
        env_id=7,
        job_modify_index=100 + n,
        create_index=n,
        claim=claim,
        template_hash=template_hash,
    )
    alloc = Allocation(id=f"a{n}", job_id=job.id, create_time=T0, client_status="running")
    base = RunnerView(
        job=job, phase=phase, alloc=alloc, starting_since=T0 if phase is Phase.STARTING else 0
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def run(
    runners: list[RunnerView], now: int = T0 + SECOND, env: Environment | None = ENV, **kw: Any
) -> Plan:
    return plan(
        PlanInput(env_id=7, env=env, runners=tuple(runners), now=now, settings=SETTINGS, **kw)
    )


def deletes(result: Plan) -> set[tuple[str, DeleteReason]]:
    return {(a.runner_id, a.reason) for a in result.actions if isinstance(a, DeleteRunner)}


def creates(result: Plan) -> int:
    return sum(a.count for a in result.actions if isinstance(a, CreateRunners))


def test_empty_pool_is_filled():
    assert creates(run([])) == 3


def test_starting_and_ready_count_towards_the_pool():
    result = run([view(1), view(2, Phase.STARTING)])
    assert creates(result) == 1 and not deletes(result)
    assert (result.counts.idle_ready, result.counts.idle_starting) == (1, 1)


def test_expected_creations_count_so_a_lagging_list_never_over_creates():
    assert creates(run([view(1)], creating=2)) == 0
    assert creates(run([], creating=5)) == 0


def test_expected_deletions_are_not_pool_members_and_not_deleted_again():
    result = run([view(1), view(2), view(3), view(4)], deleting=frozenset({"7-4"}))
    assert not deletes(result) and creates(result) == 0


def test_claimed_runners_are_never_pool_members():
    claimed = [view(n, claim=Claim(timeout=0, alloc_id=f"a{n}", claimed_at=T0)) for n in (1, 2, 3)]
    result = run(claimed)
    assert creates(result) == 3 and not deletes(result)
    assert result.counts.claimed == 3 and result.counts.idle_ready == 0


def test_surplus_deletes_starting_newest_first_then_oldest_ready():
    runners = [view(1), view(2), view(3), view(4, Phase.STARTING), view(5, Phase.STARTING)]
    assert deletes(run(runners)) == {("7-5", DeleteReason.SURPLUS), ("7-4", DeleteReason.SURPLUS)}
    runners = [view(1), view(2), view(3), view(4), view(5, Phase.STARTING)]
    assert deletes(run(runners)) == {("7-5", DeleteReason.SURPLUS), ("7-1", DeleteReason.SURPLUS)}


def test_outdated_idle_runners_are_replaced_claimed_ones_kept():
    old = "0" * 16
    claimed = view(9, claim=Claim(alloc_id="a9", claimed_at=T0), template_hash=old)
    result = run([view(1, template_hash=old), view(2), view(3), claimed])
    assert deletes(result) == {("7-1", DeleteReason.OUTDATED)}
    assert creates(result) == 1


def test_dead_and_stopped_idle_runners_are_removed_and_replaced():
    result = run([view(1, Phase.DEAD), view(2, Phase.STOPPING), view(3)])
    assert deletes(result) == {("7-1", DeleteReason.DEAD), ("7-2", DeleteReason.DEAD)}
    assert creates(result) == 2


def test_claim_with_reset_is_ended_with_its_reason():
    claimed = view(1, claim=Claim(alloc_id="a1", claimed_at=T0), reset=LossReason.MIGRATED)
    result = run([claimed, view(2), view(3), view(4)])
    assert result.actions == (EndClaim("7-1", 101, LossReason.MIGRATED),)


def test_lost_claims_are_kept_for_the_retention_period_then_deleted():
    lost = view(
        1, Phase.DEAD, claim=Claim(alloc_id="a1", lost_reason=LossReason.OOM_KILLED, lost_at=T0)
    )
    others = [view(2), view(3), view(4)]
    assert not deletes(run([lost, *others], now=T0 + 3599 * SECOND))
    assert deletes(run([lost, *others], now=T0 + 3600 * SECOND)) == {
        ("7-1", DeleteReason.LOST_RETENTION)
    }
    assert run([lost, *others]).counts.lost == 1


def test_inactivity_timeout_counts_from_the_last_activity():
    claimed = view(1, claim=Claim(timeout=30, alloc_id="a1", claimed_at=T0))
    others = [view(2), view(3), view(4)]
    assert deletes(run([claimed, *others], now=T0 + 30 * SECOND)) == {
        ("7-1", DeleteReason.INACTIVITY_TIMEOUT)
    }
    touched = {"7-1": T0 + 20 * SECOND}
    assert not deletes(run([claimed, *others], now=T0 + 30 * SECOND, last_activity=touched))
    forever = view(1, claim=Claim(timeout=0, alloc_id="a1", claimed_at=T0))
    assert not deletes(run([forever, *others], now=T0 + 10**6 * SECOND))


def test_orphans_are_removed_after_the_grace_period_claimed_ones_kept():
    claimed = view(2, claim=Claim(alloc_id="a2", claimed_at=T0))
    runners = [view(1), claimed]
    assert not run(runners, env=None, orphan_since=T0, now=T0 + 59 * SECOND).actions
    result = run(runners, env=None, orphan_since=T0, now=T0 + 60 * SECOND)
    assert deletes(result) == {("7-1", DeleteReason.ORPHAN)}
    assert creates(result) == 0


def test_unsafe_pass_creates_but_never_deletes_or_ends():
    runners = [
        view(1, Phase.DEAD),
        view(2, claim=Claim(alloc_id="a2", claimed_at=T0), reset=LossReason.LOST),
        view(3),
        view(4),
        view(5),
        view(6),
    ]
    result = run(runners, safe=False)
    assert not deletes(result)
    assert not [a for a in result.actions if isinstance(a, EndClaim)]
    assert creates(run([view(1)], safe=False)) == 2


def test_the_runners_a_pass_replaces_are_named_whether_or_not_it_may_delete():
    runners = [view(1, Phase.DEAD), view(2, template_hash="old"), view(3), view(4)]
    replaced = {(a.runner_id, a.reason) for a in run(runners).replaced}
    assert replaced == {("7-1", DeleteReason.DEAD), ("7-2", DeleteReason.OUTDATED)}
    unsafe = run(runners, safe=False)
    assert {(a.runner_id, a.reason) for a in unsafe.replaced} == replaced
    assert creates(unsafe) == 1 and not deletes(unsafe)  # pool 3: two left
    assert (unsafe.deferred, run(runners).deferred) == (2, 0)
    assert not run([view(1), view(2), view(3)]).replaced


def test_unknown_runners_count_and_are_never_touched():
    unknown = view(1, Phase.STARTING, known=False, template_hash="")
    result = run([unknown, view(2), view(3), view(4)])
    assert ("7-1", DeleteReason.SURPLUS) not in deletes(result)
    assert creates(run([unknown])) == 2


def test_failure_budget_backs_off_and_degrades_then_recovers():
    budget = Budget()
    now = T0 + 200 * SECOND
    delays = []
    for round_ in range(4):
        failing = view(10 + round_, Phase.STARTING, failed_to_start=True)
        result = run([failing], now=now, budget=budget)
        assert (f"7-{10 + round_}", DeleteReason.FAILED_TO_START) in deletes(result)
        budget = result.budget
        delays.append(budget.retry_at - now)
        # no creation while backing off
        assert creates(run([], now=now + 1, budget=budget)) == 0
        assert creates(run([], now=budget.retry_at, budget=budget)) == 3
        now = budget.retry_at
    assert delays == [1 * SECOND, 2 * SECOND, 4 * SECOND, 8 * SECOND]
    assert result.degraded
    started_later = view(20)
    assert started_later.alloc is not None
    started_later = replace(
        started_later, alloc=replace(started_later.alloc, create_time=now + SECOND)
    )
    healed = run([started_later], now=now + 2 * SECOND, budget=budget)
    assert healed.budget.failures == 0 and not healed.degraded


def test_startup_timeout_counts_as_a_failure():
    stuck = view(1, Phase.STARTING)
    assert not deletes(run([stuck], now=T0 + 120 * SECOND))
    result = run([stuck], now=T0 + 121 * SECOND)
    assert deletes(result) == {("7-1", DeleteReason.STARTUP_TIMEOUT)}
    assert result.budget.failures == 1


def test_backoff_is_capped():
    budget = Budget(failures=20, retry_at=0, last_failure_at=T0)
    result = run([view(1, Phase.STARTING, failed_to_start=True)], budget=budget)
    assert result.budget.retry_at - (T0 + SECOND) == 16 * SECOND


def test_wake_at_is_the_next_deadline():
    claimed = view(1, claim=Claim(timeout=30, alloc_id="a1", claimed_at=T0))
    lost = view(2, Phase.DEAD, claim=Claim(alloc_id="a2", lost_reason=LossReason.LOST, lost_at=T0))
    starting = view(3, Phase.STARTING)
    assert run([claimed, lost, view(4), view(5)]).wake_at == T0 + 30 * SECOND
    assert run([lost, view(4), view(5), view(6)]).wake_at == T0 + 3600 * SECOND
    assert run([starting, view(4), view(5)]).wake_at == T0 + 120 * SECOND + 1
    assert run([view(1)], env=None, orphan_since=T0).wake_at == T0 + 60 * SECOND
    backing_off = Budget(failures=1, retry_at=T0 + 5 * SECOND, last_failure_at=T0)
    assert run([], budget=backing_off).wake_at == T0 + 5 * SECOND
    assert run([view(4), view(5), view(6)]).wake_at is None


# --- count_pool: what the API shows -------------------------------------------------

COUNT_CASES = [
    ("empty", [], PoolCounts()),
    ("ready idle", [view(1), view(2)], PoolCounts(idle_ready=2)),
    ("starting idle", [view(1, Phase.STARTING)], PoolCounts(idle_starting=1)),
    ("unknown counts as starting", [replace(view(1), known=False)], PoolCounts(idle_starting=1)),
    ("dead idle is not counted", [view(1, Phase.DEAD)], PoolCounts()),
    ("claimed", [view(1, claim=Claim(alloc_id="a1"))], PoolCounts(claimed=1)),
    (
        "lost",
        [view(1, claim=Claim(alloc_id="a1", lost_reason=LossReason.OOM_KILLED))],
        PoolCounts(lost=1),
    ),
]


@pytest.mark.parametrize(("name", "views", "counts"), COUNT_CASES, ids=[c[0] for c in COUNT_CASES])
def test_count_pool(name: str, views: list[RunnerView], counts: PoolCounts) -> None:
    assert count_pool(views) == counts


def test_a_claimed_runner_is_never_deleted_for_an_idle_only_reason() -> None:
    """Whatever a claimed runner's state, plan ends it only for a reason that
    may hit a claimed runner (act relies on this split, see IDLE_ONLY_REASONS)."""
    claimed = [
        view(n, phase, claim=Claim(alloc_id=f"a{n}"), template_hash=h)
        for n, (phase, h) in enumerate(
            [(p, h) for p in Phase for h in (ENV.template_hash, "old")], start=1
        )
    ]
    for env in (ENV, None):
        out = run(claimed, env=env, now=T0 + 10**6 * SECOND, orphan_since=T0)
        for action in out.actions:
            if isinstance(action, DeleteRunner):
                assert action.reason not in IDLE_ONLY_REASONS, action


def _claimed(n: int) -> RunnerView:
    return view(n, claim=Claim(claimed_at=T0, timeout=0))


# name, runners, creating, pool_size, expected creations, expected surplus deletions
POOL_SIZE_CASES: list[tuple[str, list[RunnerView], int, int | None, int, set[str]]] = [
    ("static: prewarmingPoolSize", [view(1)], 0, None, 2, set()),
    ("adaptive above the floor fills to the target", [view(1)], 0, 8, 7, set()),
    ("adaptive counts what is being created", [view(1)], 4, 8, 3, set()),
    ("adaptive at the floor is the floor", [view(1), view(2), view(3)], 0, 3, 0, set()),
    ("adaptive claimed runners are not the pool", [_claimed(1), view(2)], 0, 3, 2, set()),
    (
        "adaptive surplus: oldest ready only, never starting",
        [view(1), view(2), view(3, Phase.STARTING), view(4, Phase.STARTING), view(5)],
        0,
        3,
        0,
        {"7-1", "7-2"},
    ),
    (
        "adaptive surplus of starting runners only: none deleted",
        [view(1), view(2, Phase.STARTING), view(3, Phase.STARTING), view(4, Phase.STARTING)],
        0,
        3,
        0,
        {"7-1"},
    ),
    (
        "adaptive surplus never touches a claimed runner",
        [_claimed(1), view(2), view(3), view(4), view(5)],
        0,
        3,
        0,
        {"7-2"},
    ),
    (
        "static surplus still deletes starting first",
        [view(1), view(2), view(3, Phase.STARTING), view(4, Phase.STARTING), view(5)],
        0,
        None,
        0,
        {"7-3", "7-4"},
    ),
]


@pytest.mark.parametrize(
    ("name", "runners", "creating", "pool_size", "created", "surplus"),
    POOL_SIZE_CASES,
    ids=[c[0] for c in POOL_SIZE_CASES],
)
def test_pool_size(
    name: str,
    runners: list[RunnerView],
    creating: int,
    pool_size: int | None,
    created: int,
    surplus: set[str],
) -> None:
    result = run(runners, creating=creating, pool_size=pool_size)
    assert creates(result) == created
    assert deletes(result) == {(r, DeleteReason.SURPLUS) for r in surplus}
