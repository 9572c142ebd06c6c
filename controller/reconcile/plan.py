"""plan: the runner views of one environment, the desired pool and what the
controller already has in flight ⇒ the actions that close the gap.

Pure. Idle runners are pooled, replaced and removed freely; a claimed runner
is only ever ended for a stated reason (lost, inactivity, retention). In an
unsafe pass (partial observation) nothing is deleted or ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from controller.model import SECOND, Environment, LossReason, Phase, RunnerView


class DeleteReason(StrEnum):
    SURPLUS = "surplus"
    OUTDATED = "outdated"
    DEAD = "dead"
    FAILED_TO_START = "failed_to_start"
    STARTUP_TIMEOUT = "startup_timeout"
    INACTIVITY_TIMEOUT = "inactivity_timeout"
    LOST_RETENTION = "lost_retention"
    ORPHAN = "orphan"


# Reasons that remove a runner nobody holds: `act` skips such a deletion when
# the runner was claimed after the plan (a claim needs no pass).
IDLE_ONLY_REASONS = frozenset(
    {
        DeleteReason.SURPLUS,
        DeleteReason.OUTDATED,
        DeleteReason.DEAD,
        DeleteReason.FAILED_TO_START,
        DeleteReason.STARTUP_TIMEOUT,
        DeleteReason.ORPHAN,
    }
)
# Idle runners the plan no longer counts in the pool: the same pass creates
# their replacements.
REPLACED_REASONS = frozenset(
    {
        DeleteReason.OUTDATED,
        DeleteReason.DEAD,
        DeleteReason.FAILED_TO_START,
        DeleteReason.STARTUP_TIMEOUT,
    }
)


@dataclass(frozen=True)
class CreateRunners:
    env_id: int
    count: int


@dataclass(frozen=True)
class DeleteRunner:
    runner_id: str
    reason: DeleteReason


@dataclass(frozen=True)
class EndClaim:
    """Stop a claimed runner whose file system was reset, keeping the reason."""

    runner_id: str
    job_modify_index: int
    reason: LossReason


Action = CreateRunners | DeleteRunner | EndClaim


@dataclass(frozen=True)
class PlanSettings:
    orphan_grace_ns: int = 60 * SECOND
    startup_timeout_ns: int = 300 * SECOND
    lost_retention_ns: int = 3600 * SECOND
    backoff_base_ns: int = 1 * SECOND
    backoff_cap_ns: int = 300 * SECOND
    degraded_after: int = 3  # consecutive start failures before the environment is degraded


@dataclass(frozen=True)
class Budget:
    """An environment's recent start failures: creation backs off while they last."""

    failures: int = 0
    retry_at: int = 0  # ns; no creations before
    last_failure_at: int = 0


@dataclass(frozen=True)
class PlanInput:
    env_id: int
    env: Environment | None  # None: no template job (orphan runners)
    runners: tuple[RunnerView, ...]
    now: int
    creating: int = 0  # creations issued but not yet observed
    deleting: frozenset[str] = frozenset()  # deletions issued but not yet observed
    safe: bool = True
    last_activity: Mapping[str, int] = field(default_factory=dict)  # runner id → ns
    orphan_since: int | None = None
    budget: Budget = Budget()
    settings: PlanSettings = PlanSettings()
    # The adaptive pool size in place of env.prewarming_pool_size; None: static.
    # An adaptive surplus deletes ready idle runners only (see `plan`).
    pool_size: int | None = None


@dataclass(frozen=True)
class PoolCounts:
    idle_ready: int = 0
    idle_starting: int = 0  # starting, or unreadable (counted so we never over-create)
    claimed: int = 0
    lost: int = 0


def count_pool(views: Iterable[RunnerView]) -> PoolCounts:
    """An environment's runners as they are now (what the API shows; a plan's
    own counts leave out the runners it is deleting)."""
    idle_ready = idle_starting = claimed = lost = 0
    for v in views:
        claim = v.job.claim
        if claim is not None:
            if claim.lost_reason is None:
                claimed += 1
            else:
                lost += 1
        if v.claimed:
            continue
        if v.phase is Phase.READY and v.known:
            idle_ready += 1
        elif v.phase is Phase.STARTING or not v.known:
            idle_starting += 1
    return PoolCounts(idle_ready, idle_starting, claimed, lost)


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    budget: Budget
    degraded: bool
    counts: PoolCounts
    wake_at: int | None = None  # ns; the next deadline (expiry, grace, backoff) to look again at
    # Idle runners no longer counted in the pool: this pass's creations replace
    # them. Their deletions are among the actions unless the pass is unsafe.
    replaced: tuple[DeleteRunner, ...] = ()
    deferred: int = 0  # deletions and ended claims an unsafe pass held back


def _claimed_actions(inp: PlanInput, views: list[RunnerView], deadlines: list[int]) -> list[Action]:
    out: list[Action] = []
    s = inp.settings
    for v in views:
        claim = v.job.claim
        assert claim is not None
        if claim.lost_reason is not None:
            if inp.now - claim.lost_at >= s.lost_retention_ns:
                out.append(DeleteRunner(v.id, DeleteReason.LOST_RETENTION))
            else:
                deadlines.append(claim.lost_at + s.lost_retention_ns)
        elif v.reset is not None:
            out.append(EndClaim(v.id, v.job.job_modify_index, v.reset))
        elif claim.timeout > 0:
            expiry = inp.last_activity.get(v.id, claim.claimed_at) + claim.timeout * SECOND
            if inp.now >= expiry:
                out.append(DeleteRunner(v.id, DeleteReason.INACTIVITY_TIMEOUT))
            else:
                deadlines.append(expiry)
    return out


def _next_budget(inp: PlanInput, idle: list[RunnerView], failures: int) -> Budget:
    budget = inp.budget
    s = inp.settings
    recovered = any(
        v.phase is Phase.READY
        and v.alloc is not None
        and v.alloc.create_time > budget.last_failure_at
        for v in idle
    )
    if failures:
        total = budget.failures + failures
        delay = min(s.backoff_cap_ns, s.backoff_base_ns * 2 ** min(total - 1, 32))
        return Budget(failures=total, retry_at=inp.now + delay, last_failure_at=inp.now)
    if recovered and budget.failures:
        return replace(budget, failures=0, retry_at=0)
    return budget


def plan(inp: PlanInput) -> Plan:
    # One walk over the runners: an environment's held runners can be
    # thousands, and a pass runs after every claim.
    claimed: list[RunnerView] = []
    idle: list[RunnerView] = []
    lost = 0
    deleting = inp.deleting
    for v in inp.runners:
        if deleting and v.job.id in deleting:
            continue
        claim = v.job.claim
        if claim is None:
            idle.append(v)
        else:
            claimed.append(v)
            lost += claim.lost_reason is not None
    deadlines: list[int] = []
    actions: list[Action] = _claimed_actions(inp, claimed, deadlines)
    counts = PoolCounts(claimed=len(claimed) - lost, lost=lost)
    env = inp.env
    if env is None:
        if inp.orphan_since is not None:
            if inp.now - inp.orphan_since >= inp.settings.orphan_grace_ns:
                actions += [DeleteRunner(v.id, DeleteReason.ORPHAN) for v in idle if v.known]
            elif idle:
                deadlines.append(inp.orphan_since + inp.settings.orphan_grace_ns)
        return _finish(inp, actions, inp.budget, counts, deadlines)

    pool: list[RunnerView] = []
    failures = 0
    template_hash = env.template_hash
    for v in idle:
        if not v.known:
            pool.append(v)  # unreadable: count it so we never over-create, never touch it
        elif v.job.template_hash != template_hash:
            actions.append(DeleteRunner(v.id, DeleteReason.OUTDATED))
        elif v.phase in (Phase.DEAD, Phase.STOPPING):
            actions.append(DeleteRunner(v.id, DeleteReason.DEAD))
        elif v.failed_to_start:
            actions.append(DeleteRunner(v.id, DeleteReason.FAILED_TO_START))
            failures += 1
        elif (
            v.phase is Phase.STARTING
            and inp.now - v.starting_since > inp.settings.startup_timeout_ns
        ):
            actions.append(DeleteRunner(v.id, DeleteReason.STARTUP_TIMEOUT))
            failures += 1
        else:
            if v.phase is Phase.STARTING:
                deadlines.append(v.starting_since + inp.settings.startup_timeout_ns + 1)
            pool.append(v)
    budget = _next_budget(inp, idle, failures) if inp.safe else inp.budget
    counts = replace(
        counts,
        idle_ready=sum(1 for v in pool if v.phase is Phase.READY),
        idle_starting=sum(1 for v in pool if v.phase is not Phase.READY),
    )
    have = len(pool) + inp.creating
    adaptive = inp.pool_size is not None
    want = env.prewarming_pool_size if inp.pool_size is None else inp.pool_size
    if have > want:
        # Static: starting runners go first (newest first), they serve nobody
        # yet; then the oldest ready ones. Adaptive: a lowered target is a
        # forecast that may turn within the hold, and a starting runner is a
        # job already paid for, so only the oldest ready ones go.
        starting = sorted(
            (v for v in pool if v.phase is not Phase.READY and v.known),
            key=lambda v: v.job.create_index,
            reverse=True,
        )
        ready = sorted(
            (v for v in pool if v.phase is Phase.READY), key=lambda v: v.job.create_index
        )
        surplus = (ready if adaptive else starting + ready)[: have - want]
        actions += [DeleteRunner(v.id, DeleteReason.SURPLUS) for v in surplus]
    elif have < want:
        if inp.now >= budget.retry_at:
            actions.append(CreateRunners(env.id, want - have))
        else:
            deadlines.append(budget.retry_at)
    return _finish(inp, actions, budget, counts, deadlines)


def _finish(
    inp: PlanInput, actions: list[Action], budget: Budget, counts: PoolCounts, deadlines: list[int]
) -> Plan:
    replaced = tuple(
        a for a in actions if isinstance(a, DeleteRunner) and a.reason in REPLACED_REASONS
    )
    kept = actions if inp.safe else [a for a in actions if isinstance(a, CreateRunners)]
    return Plan(
        actions=tuple(kept),
        budget=budget,
        degraded=budget.failures >= inp.settings.degraded_after,
        counts=counts,
        wake_at=min((d for d in deadlines if d > inp.now), default=None),
        replaced=replaced,
        deferred=len(actions) - len(kept),
    )
