"""Stateful property test: the reconcile loop's pure core against a model of
Nomad that misbehaves the way production did.

Hypothesis drives three things in any interleaving:

- **Nomad** (`Nomad`, the truth): places allocations, starts them, restarts
  them in place after a crash (Restarts+1) or an OOM kill (last exit OOM),
  lets them fail (rescheduled by the next placement) or fail before ever
  running, gives a job up, drains a node (old allocation `stop` "alloc is
  being migrated" + new `pending/run` in the same write; new running and old
  complete in either order), loses a node, and lets an operator stop a job.
  Every version of every job and allocation is kept, under one Raft index.
- **The controller's observation** (`View`, what observe.py keeps): a job
  list taken at any index between the last one and now (stale reads; never
  backwards), specs read at once or unreadable, and each allocation seen at
  *some* past version, never newer than the truth and never older than what
  was already seen: events lost, duplicated and reordered. Own writes show at
  once, as `Observer.apply_spec`/`forget` make them.
- **The controller's decisions**: `derive_runner` + `plan` + `Expectations`
  exactly as `Controller.reconcile` calls them, with the actor's re-checks;
  writes may lose their answer (landed, not landed, landing later) or be
  refused. Clients claim (the allocation and restart count the controller
  sees) and release.

After every step the invariants hold: a runner a client holds is never seen
idle, never counted in the pool, never deleted for an idle reason, never
handed out again, and is handed out only on an allocation seen running and
wanted; `EndClaim` lands at most once per claim with a reason that matches
something that happened to the claimed allocation; creations never exceed
what was needed (pool size + refills after claims + replacements of runners
judged dead, failed, timed out or outdated), whatever the lag. When the
faults stop (teardown), Nomad settles and the observation catches up, the
pool converges to exactly `prewarmingPoolSize` ready idle runners and every
claim whose allocation was reset has been ended exactly once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from controller.clock import ManualClock
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
from controller.reconcile.derive import derive_runner
from controller.reconcile.expectations import Expectations
from controller.reconcile.plan import (
    IDLE_ONLY_REASONS,
    REPLACED_REASONS,
    Budget,
    CreateRunners,
    DeleteReason,
    DeleteRunner,
    EndClaim,
    Plan,
    PlanInput,
    PlanSettings,
    plan,
)

ENV_ID = 7
IMAGES = ("python:3.12", "python:3.13")
NODES = ("n1", "n2", "n3")
MIGRATING = "alloc is being migrated"
JOB_UPDATE = "alloc not needed due to job update"
NODE_DOWN = "alloc is lost since its node is down"
# How a drain marks the old allocation: the description (production), the
# DesiredTransition, or both.
MIGRATIONS = ((MIGRATING, False), (MIGRATING, True), ("", True))
EXPECTATION_TIMEOUT_S = 60.0  # the controller's default; the fault phase stays well inside it
# Deadlines short enough to pass inside the fault window.
PLAN_SETTINGS = PlanSettings(startup_timeout_ns=20 * SECOND, lost_retention_ns=30 * SECOND)
INACTIVITY_TIMEOUTS_S = (0, 15)
TICKS_S = (0.03, 0.7, 2.0, 5.0)  # production's gaps between reports, and longer pauses
FAULT_WINDOW_S = 50.0

IDLE_REASONS = IDLE_ONLY_REASONS
# Idle runners the controller judged beyond use: each one justifies a replacement.
REPLACED = REPLACED_REASONS


class Outcome(StrEnum):
    OK = "ok"
    LOST_LANDED = "answer lost, write landed"
    LOST = "answer lost, write never landed"
    LATE = "answer lost, write lands later"
    REFUSED = "refused (an API error)"


# What can happen to each kind of write (the first is what shrinking prefers).
# A deregistration cannot be conditional, so one that lands "later" (after a
# claim) is outside what the controller can guard against; it lands at once or never.
OUTCOMES = {
    "create": (Outcome.OK, Outcome.LOST_LANDED, Outcome.LOST, Outcome.LATE, Outcome.REFUSED),
    "delete": (Outcome.OK, Outcome.LOST_LANDED, Outcome.LOST),
    "end_claim": (Outcome.OK, Outcome.LOST_LANDED, Outcome.LOST, Outcome.LATE),
}


def runner_id(n: int) -> str:
    return f"{ENV_ID}-00000000-0000-0000-0000-{n:012d}"


@dataclass
class ClaimRecord:
    """A claim a client holds, and what the controller told it."""

    job_id: str
    claim: Claim
    seen_modify_index: int  # the version of its allocation the claim was made from
    operator_stopped: bool = False
    released: bool = False
    ended: list[LossReason] = field(default_factory=list)


class Nomad:
    """The truth: jobs and allocations, every version kept, one Raft index."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.index = 100
        self.jobs: dict[str, RunnerJob] = {}
        self.job_log: list[tuple[int, str, RunnerJob | None]] = []
        self.allocs: dict[str, Allocation] = {}
        self.versions: dict[str, list[Allocation]] = {}
        self.gave_up: set[str] = set()
        self._alloc_ids = 0

    def write(self) -> int:
        self.index += 1
        return self.index

    def set_job(self, job: RunnerJob) -> None:
        self.jobs[job.id] = job
        self.job_log.append((self.index, job.id, job))

    def drop_job(self, job_id: str) -> None:
        del self.jobs[job_id]
        self.job_log.append((self.index, job_id, None))
        for alloc in self.allocs_of(job_id):
            if not alloc.client_terminal:
                self.set_alloc(
                    replace(
                        alloc,
                        client_status="complete",
                        desired_status="stop",
                        desired_description=JOB_UPDATE,
                    )
                )

    def set_alloc(self, alloc: Allocation) -> Allocation:
        alloc = replace(alloc, modify_index=self.index, modify_time=self.clock.now_ns())
        self.allocs[alloc.id] = alloc
        self.versions.setdefault(alloc.id, []).append(alloc)
        return alloc

    def new_alloc(self, job_id: str, node: str) -> Allocation:
        self._alloc_ids += 1
        return self.set_alloc(
            Allocation(
                id=f"alloc-{self._alloc_ids}",
                job_id=job_id,
                node_id=node,
                node_name=node,
                create_index=self.index,
                create_time=self.clock.now_ns(),
            )
        )

    def allocs_of(self, job_id: str) -> list[Allocation]:
        return [a for a in self.allocs.values() if a.job_id == job_id]

    def jobs_at(self, index: int) -> dict[str, RunnerJob]:
        out: dict[str, RunnerJob] = {}
        for at, job_id, job in self.job_log:
            if at > index:
                break
            if job is None:
                out.pop(job_id, None)
            else:
                out[job_id] = job
        return out

    def alloc_at(self, alloc_id: str, index: int) -> Allocation | None:
        older = [v for v in self.versions[alloc_id] if v.modify_index <= index]
        return older[-1] if older else None

    def needs_placement(self, job: RunnerJob) -> bool:
        return (
            not job.stop
            and job.id not in self.gave_up
            and not any(
                a.desired_status == "run" and not a.client_terminal for a in self.allocs_of(job.id)
            )
        )

    def refresh_status(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        allocs = self.allocs_of(job_id)
        live = any(not a.client_terminal for a in allocs)
        if (job.stop or job_id in self.gave_up) and not live:
            status = "dead"
        elif any(a.client_status == "running" for a in allocs):
            status = "running"
        else:
            status = "pending"
        if status != job.status:
            self.set_job(replace(job, status=status))  # not a spec change: same JobModifyIndex

    def stop_job(self, job: RunnerJob) -> RunnerJob:
        """Register the job stopped (a new JobModifyIndex); its allocations stop."""
        for alloc in self.allocs_of(job.id):
            if alloc.desired_status == "run" and not alloc.client_terminal:
                self.set_alloc(
                    replace(alloc, desired_status="stop", desired_description=JOB_UPDATE)
                )
        stopped = replace(job, stop=True, job_modify_index=self.index)
        self.set_job(stopped)
        self.refresh_status(job.id)
        return self.jobs[job.id]


@dataclass
class View:
    """What the controller has observed (observe.py's snapshot and spec cache)."""

    jobs_index: int = 0
    allocs_index: int = 0
    listed: dict[str, RunnerJob] = field(default_factory=dict)  # the job list: stubs
    specs: dict[str, RunnerJob] = field(default_factory=dict)  # read, or written by us
    unreadable: set[str] = field(default_factory=set)
    forgotten: set[str] = field(default_factory=set)  # deleted by us since the list
    seen: dict[str, Allocation] = field(default_factory=dict)

    def runners(self) -> tuple[RunnerView, ...]:
        allocs: dict[str, list[Allocation]] = {}
        for alloc in self.seen.values():
            allocs.setdefault(alloc.job_id, []).append(alloc)
        out = []
        for job_id, stub in sorted(self.listed.items()):
            if job_id in self.forgotten:
                continue
            spec = self.specs.get(job_id)
            if spec is None or job_id in self.unreadable:
                unknown = replace(stub, claim=None, template_hash="")
                out.append(RunnerView(job=unknown, phase=Phase.STARTING, known=False))
                continue
            job = replace(spec, status=stub.status)
            out.append(derive_runner(job, tuple(allocs.get(job_id, ()))))
        return tuple(out)

    def runner(self, job_id: str) -> RunnerView | None:
        return next((v for v in self.runners() if v.id == job_id), None)


class ReconcileMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.nomad = Nomad(self.clock)
        self.view = View()
        self.exp = Expectations(self.clock, EXPECTATION_TIMEOUT_S)
        self.env = Environment(id=ENV_ID, image=IMAGES[0])
        self.budget = Budget()
        self.claims: dict[str, ClaimRecord] = {}
        self.activity: dict[str, int] = {}  # runner → last request of its client (ns)
        self.late_creates: dict[str, str] = {}  # job id → template hash it was built from
        self.late_end_claims: list[EndClaim] = []
        self.created = 0  # runner jobs that landed or may still land
        self.pool_slots = 0  # the initial pool size plus every increase
        self.replaced: set[str] = set()  # runners judged beyond use (each may be replaced)
        self._job_ids = 0

    # -- set-up ----------------------------------------------------------------------

    @initialize(size=st.integers(1, 3), held=st.integers(0, 2))
    def warm_pool(self, size: int, held: int) -> None:
        """A full pool, observed, with `held` runners already claimed (and refilled)."""
        self.env = replace(self.env, prewarming_pool_size=size)
        self.pool_slots = size
        self._quiet_pass()
        for _ in range(held):
            self.claim()
        self._quiet_pass()

    def _quiet_pass(self) -> None:
        """Nomad settles, the controller looks and acts, Nomad settles, it looks again."""
        self._settle_nomad()
        self.catch_up()
        self._pass(lambda _: Outcome.OK)
        self._settle_nomad()
        self.catch_up()

    # -- Nomad ----------------------------------------------------------------------------

    def _pick(self, data: st.DataObject, items: list[str]) -> str:
        return data.draw(st.sampled_from(sorted(items)))

    def _held_jobs(self) -> set[str]:
        return {j for j, job in self.nomad.jobs.items() if job.claim is not None}

    def _pick_held_first(self, data: st.DataObject, items: list[str], held: list[str]) -> str:
        """Often one a client holds: that is where faults matter most."""
        if held:
            on_held: bool = data.draw(st.booleans(), label="a held runner's")
            if on_held:
                return self._pick(data, held)
        return self._pick(data, items)

    def _pick_fault(self, data: st.DataObject, allocs: list[str]) -> str:
        """An allocation to hurt."""
        held = [a for a in allocs if self.nomad.allocs[a].job_id in self._held_jobs()]
        return self._pick_held_first(data, allocs, held)

    def _placeable(self) -> list[str]:
        return [j.id for j in self.nomad.jobs.values() if self.nomad.needs_placement(j)]

    def _allocs(self, client: str, desired: str = "run") -> list[str]:
        return [
            a.id
            for a in self.nomad.allocs.values()
            if a.client_status == client and a.desired_status == desired
        ]

    def _stopping(self) -> list[str]:
        return [
            a.id
            for a in self.nomad.allocs.values()
            if a.desired_status == "stop" and not a.client_terminal
        ]

    def _update(self, alloc_id: str, **changes: object) -> Allocation:
        alloc = self.nomad.set_alloc(replace(self.nomad.allocs[alloc_id], **changes))  # type: ignore[arg-type]
        self.nomad.refresh_status(alloc.job_id)
        return alloc

    @precondition(lambda self: bool(self._placeable()))
    @rule(data=st.data(), node=st.sampled_from(NODES))
    def place(self, data: st.DataObject, node: str) -> None:
        """The scheduler places a new job's allocation, or reschedules a failed one."""
        job_id = self._pick(data, self._placeable())
        self.nomad.write()
        self.nomad.new_alloc(job_id, node)
        self.nomad.refresh_status(job_id)

    @precondition(lambda self: bool(self._allocs("pending")))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        alloc_id = self._pick(data, self._allocs("pending"))
        started = self.nomad.allocs[alloc_id].started_at or self.clock.now_ns()
        self.nomad.write()
        self._update(alloc_id, client_status="running", started_at=started)

    @precondition(lambda self: bool(self._stopping()))
    @rule(data=st.data())
    def finish_stopping(self, data: st.DataObject) -> None:
        alloc_id = self._pick(data, self._stopping())
        self.nomad.write()
        self._update(alloc_id, client_status="complete")

    @precondition(lambda self: bool(self._allocs("running")))
    @rule(data=st.data(), oom=st.booleans(), restarting=st.booleans())
    def restart_in_place(self, data: st.DataObject, oom: bool, restarting: bool) -> None:
        """The task crashed (or was OOM-killed) and Nomad restarts it in place."""
        alloc_id = self._pick_fault(data, self._allocs("running"))
        alloc = self.nomad.allocs[alloc_id]
        self.nomad.write()
        self._update(
            alloc_id,
            restarts=alloc.restarts + 1,
            last_exit_oom=oom,
            client_status="pending" if restarting else "running",
        )

    @precondition(lambda self: bool(self._allocs("running")))
    @rule(data=st.data(), oom=st.booleans())
    def fail(self, data: st.DataObject, oom: bool) -> None:
        """Out of restarts: the allocation failed; the scheduler will replace it."""
        alloc_id = self._pick_fault(data, self._allocs("running"))
        self.nomad.write()
        self._update(alloc_id, client_status="failed", last_exit_oom=oom)

    @precondition(lambda self: bool(self._allocs("pending")))
    @rule(data=st.data())
    def fail_to_start(self, data: st.DataObject) -> None:
        alloc_id = self._pick(data, self._allocs("pending"))
        if self.nomad.allocs[alloc_id].started_at is not None:
            return  # a restart that fails is `fail`
        self.nomad.write()
        self._update(alloc_id, client_status="failed")

    def _given_up(self) -> list[str]:
        return [
            j.id
            for j in self.nomad.jobs.values()
            if not j.stop
            and j.id not in self.nomad.gave_up
            and any(a.client_status == "failed" for a in self.nomad.allocs_of(j.id))
            and all(a.client_terminal for a in self.nomad.allocs_of(j.id))
        ]

    @precondition(lambda self: bool(self._given_up()))
    @rule(data=st.data())
    def give_up(self, data: st.DataObject) -> None:
        """Out of reschedules: Nomad will not run the job again (status dead)."""
        job_id = self._pick(data, self._given_up())
        self.nomad.write()
        self.nomad.gave_up.add(job_id)
        self.nomad.refresh_status(job_id)

    def _migratable(self) -> list[str]:
        return [
            a
            for a in self._allocs("running") + self._allocs("pending")
            if not self.nomad.jobs.get(self.nomad.allocs[a].job_id, RunnerJob("", 0, 0)).stop
        ]

    @precondition(lambda self: bool(self._migratable()))
    @rule(data=st.data(), how=st.sampled_from(MIGRATIONS), node=st.sampled_from(NODES))
    def drain(self, data: st.DataObject, how: tuple[str, bool], node: str) -> None:
        """A drain: in ONE write the old allocation is told to stop and its
        replacement is placed (PreviousAllocation is not modelled: derive never
        uses it). New running / old complete then come in either order."""
        alloc_id = self._pick_fault(data, self._migratable())
        description, migrate = how
        self.nomad.write()
        old = self._update(
            alloc_id, desired_status="stop", desired_description=description, migrate=migrate
        )
        self.nomad.new_alloc(old.job_id, node)
        self.nomad.refresh_status(old.job_id)

    def _live_allocs(self) -> list[str]:
        return [a.id for a in self.nomad.allocs.values() if not a.client_terminal]

    @precondition(lambda self: bool(self._live_allocs()))
    @rule(data=st.data())
    def lose_node(self, data: st.DataObject) -> None:
        """A node stops heartbeating: its allocations are lost and replaced in one write."""
        alloc_id = self._pick_fault(data, self._live_allocs())
        node = self.nomad.allocs[alloc_id].node_name
        self.nomad.write()
        for alloc in list(self.nomad.allocs.values()):
            if alloc.node_name != node or alloc.client_terminal:
                continue
            wanted = alloc.desired_status == "run"
            self._update(
                alloc.id, client_status="lost", desired_status="stop", desired_description=NODE_DOWN
            )
            job = self.nomad.jobs.get(alloc.job_id)
            if wanted and job is not None and self.nomad.needs_placement(job):
                self.nomad.new_alloc(alloc.job_id, next(n for n in NODES if n != node))
                self.nomad.refresh_status(alloc.job_id)

    def _running_jobs(self) -> list[str]:
        return [j.id for j in self.nomad.jobs.values() if not j.stop]

    @precondition(lambda self: bool(self._running_jobs()))
    @rule(data=st.data())
    def operator_stops_job(self, data: st.DataObject) -> None:
        """`nomad job stop` by hand, on an idle or a claimed runner."""
        jobs = self._running_jobs()
        job_id = self._pick_held_first(data, jobs, [j for j in jobs if j in self._held_jobs()])
        job = self.nomad.jobs[job_id]
        self.nomad.write()
        self.nomad.stop_job(job)
        record = self.claims.get(job_id)
        if record is not None and job.claim is not None and job.claim.lost_reason is None:
            record.operator_stopped = True

    def _late_writes(self) -> list[str | EndClaim]:
        return [*sorted(self.late_creates), *self.late_end_claims]

    @precondition(lambda self: bool(self._late_writes()))
    @rule(data=st.data())
    def a_late_write_lands(self, data: st.DataObject) -> None:
        """A write whose answer was lost reaches Nomad only now."""
        self._land_late(data.draw(st.sampled_from(self._late_writes())))

    def _land_late(self, write: str | EndClaim) -> None:
        if isinstance(write, EndClaim):
            self.late_end_claims.remove(write)
            self._land_end_claim(write)
        else:
            self._land_create(write, self.late_creates.pop(write))

    @rule(seconds=st.sampled_from(TICKS_S))
    def tick(self, seconds: float) -> None:
        # The faults last less than the expectations' timeout: within it, no
        # lag may cause over-creation (beyond it, a lost write is given up).
        seconds = min(seconds, FAULT_WINDOW_S - self.clock.monotonic())
        if seconds > 0:
            self.clock.advance(seconds)

    # -- the controller's observation ------------------------------------------------------

    def _list(self, jobs_index: int, allocs_index: int, unreadable: set[str]) -> None:
        """observe.py's refresh: a job list, changed specs, an allocation list."""
        view = self.view
        listed = self.nomad.jobs_at(jobs_index)
        self.exp.observe(frozenset(listed), jobs_index)
        view.unreadable = set()
        for job_id, stub in listed.items():
            cached = view.specs.get(job_id)
            if cached is not None and cached.job_modify_index >= stub.job_modify_index:
                continue
            if job_id in unreadable:
                view.unreadable.add(job_id)
                continue
            current = self.nomad.jobs.get(job_id)  # the spec is read after the list
            if current is None:
                view.specs.pop(job_id, None)  # deleted since: shown unknown, still safe
            else:
                view.specs[job_id] = current
        view.specs = {j: s for j, s in view.specs.items() if j in listed}
        view.listed = listed
        view.jobs_index = jobs_index
        view.forgotten = set()
        for alloc_id in self.nomad.versions:
            version = self.nomad.alloc_at(alloc_id, allocs_index)
            seen = view.seen.get(alloc_id)
            if version is not None and (seen is None or version.modify_index > seen.modify_index):
                view.seen[alloc_id] = version
        view.allocs_index = allocs_index

    @rule(data=st.data(), then_reconcile=st.booleans())
    def list_nomad(self, data: st.DataObject, then_reconcile: bool) -> None:
        """A refresh whose lists may lag (a follower's stale read), never backwards."""
        jobs_index = data.draw(st.integers(self.view.jobs_index, self.nomad.index))
        allocs_index = data.draw(st.integers(self.view.allocs_index, self.nomad.index))
        changed = sorted(self.nomad.jobs_at(jobs_index))
        unreadable = data.draw(st.sets(st.sampled_from(changed), max_size=2)) if changed else set()
        self._list(jobs_index, allocs_index, unreadable)
        if then_reconcile:
            self.reconcile(data)

    def _hearable(self) -> list[str]:
        return [
            alloc_id
            for alloc_id, versions in self.nomad.versions.items()
            if alloc_id not in self.view.seen
            or versions[-1].modify_index > self.view.seen[alloc_id].modify_index
        ]

    @precondition(lambda self: bool(self._hearable()))
    @rule(data=st.data(), then_reconcile=st.booleans())
    def hear_allocation(self, data: st.DataObject, then_reconcile: bool) -> None:
        """One allocation seen at some newer version (any version in between
        lost; a version already seen again is a duplicate)."""
        alloc_id = self._pick(data, self._hearable())
        seen = self.view.seen.get(alloc_id)
        versions = [
            v
            for v in self.nomad.versions[alloc_id]
            if seen is None or v.modify_index >= seen.modify_index
        ]
        self.view.seen[alloc_id] = data.draw(st.sampled_from(versions))
        if then_reconcile:
            self.reconcile(data)

    @rule(data=st.data(), then_reconcile=st.booleans())
    def catch_up(self, data: st.DataObject | None = None, then_reconcile: bool = False) -> None:
        self._list(self.nomad.index, self.nomad.index, set())
        if then_reconcile and data is not None:
            self.reconcile(data)

    # -- the controller's pass ------------------------------------------------------------

    @rule(data=st.data())
    def reconcile(self, data: st.DataObject) -> None:
        """A pass (woken by an event, a deadline or the resync) over what is
        observed now; a client may claim between its plan and its writes."""
        claim_meanwhile: bool = data.draw(st.booleans(), label="a claim between plan and act")
        self._pass(
            lambda kind: data.draw(st.sampled_from(OUTCOMES[kind]), label=kind),
            meanwhile=self.claim if claim_meanwhile else None,
        )

    def _pass(
        self, outcome: Callable[[str], Outcome], meanwhile: Callable[[], None] | None = None
    ) -> Plan:
        runners = self.view.runners()
        pending = self.exp.pending(ENV_ID)
        inp = PlanInput(
            env_id=ENV_ID,
            env=self.env,
            runners=runners,
            now=self.clock.now_ns(),
            creating=pending.creating,
            deleting=pending.deleting,
            safe=not self.view.unreadable,
            last_activity=self._last_activity(runners),
            budget=self.budget,
            settings=PLAN_SETTINGS,
        )
        result = plan(inp)
        self.budget = result.budget
        # What a safe pass would have judged beyond use (an unsafe one keeps only
        # its creations, replacements included).
        for action in plan(replace(inp, safe=True)).actions:
            if isinstance(action, DeleteRunner) and action.reason in REPLACED:
                self.replaced.add(action.runner_id)
        self._check_pass(inp, result)
        if meanwhile is not None:
            meanwhile()
        for action in result.actions:
            if isinstance(action, CreateRunners):
                for _ in range(action.count):
                    self._create(outcome("create"))
            elif isinstance(action, DeleteRunner):
                self._delete(action, outcome("delete"))
            else:
                self._end_claim(action, outcome("end_claim"))
        return result

    def _last_activity(self, runners: tuple[RunnerView, ...]) -> dict[str, int]:
        """Claims.last_activity: the last touch, the claim time at least."""
        return {
            v.id: max(self.activity.get(v.id, 0), v.job.claim.claimed_at)
            for v in runners
            if v.job.claim is not None
        }

    def _expired(self, job: RunnerJob) -> bool:
        claim = job.claim
        if claim is None or claim.timeout <= 0 or claim.lost_reason is not None:
            return False
        last = max(self.activity.get(job.id, 0), claim.claimed_at)
        return self.clock.now_ns() >= last + claim.timeout * SECOND

    def _check_pass(self, inp: PlanInput, result: Plan) -> None:
        held = {j for j, job in self.nomad.jobs.items() if job.claim is not None}
        for v in inp.runners:
            if v.known and v.id in held:
                assert v.claimed, f"claimed runner {v.id} seen idle: {v}"
        considered = [v for v in inp.runners if v.id not in inp.deleting]
        claimed = [v for v in considered if v.claimed]
        counts = result.counts
        assert counts.claimed + counts.lost == len(claimed), (counts, claimed)
        idle = [v for v in considered if not v.claimed]
        assert counts.idle_ready + counts.idle_starting <= len(idle)
        assert counts.idle_ready <= sum(
            1 for v in idle if v.known and v.id not in held and v.phase is Phase.READY
        ), f"a claimed runner counted as idle: {counts}"
        for action in result.actions:
            if isinstance(action, DeleteRunner) and action.reason in IDLE_REASONS:
                assert action.runner_id not in held, f"claimed runner planned for {action}"
            if isinstance(action, EndClaim):
                assert action.runner_id in held, f"{action} for a runner nobody holds"

    # -- act (act.py, with its re-checks) ---------------------------------------------------

    def _create(self, outcome: Outcome) -> None:
        self._job_ids += 1
        job_id = runner_id(self._job_ids)
        self.exp.expect_create(ENV_ID, job_id)
        if outcome in (Outcome.OK, Outcome.LOST_LANDED):
            self.created += 1
            index = self._land_create(job_id, self.env.template_hash)
            if outcome is Outcome.OK:
                self.exp.created(job_id, index)
        elif outcome is Outcome.LATE:
            self.late_creates[job_id] = self.env.template_hash
            self.created += 1
        elif outcome is Outcome.REFUSED:
            self.exp.create_failed(job_id)
        # LOST: never lands; stays expected until the timeout (never duplicated)

    def _land_create(self, job_id: str, template_hash: str) -> int:
        """The creation's write reaches Nomad (counted in `created` when issued)."""
        index = self.nomad.write()
        self.nomad.set_job(
            RunnerJob(
                id=job_id,
                env_id=ENV_ID,
                job_modify_index=index,
                create_index=index,
                submit_time=self.clock.now_ns(),
                status="pending",
                template_hash=template_hash,
            )
        )
        return index

    def _delete(self, action: DeleteRunner, outcome: Outcome) -> None:
        runner = self.view.runner(action.runner_id)
        if runner is None:
            return
        if action.reason in IDLE_REASONS and runner.claimed:
            return  # claimed meanwhile: the actor skips it
        if action.reason is DeleteReason.INACTIVITY_TIMEOUT and not self._expired(runner.job):
            return  # touched meanwhile
        self.exp.expect_delete(ENV_ID, action.runner_id)
        if outcome is Outcome.OK:
            index = self._land_delete(action)
            self.exp.deleted(action.runner_id, index)
            self.view.forgotten.add(action.runner_id)
            self.view.specs.pop(action.runner_id, None)
        else:
            if outcome is Outcome.LOST_LANDED:
                self._land_delete(action)
            self.exp.delete_failed(action.runner_id)

    def _land_delete(self, action: DeleteRunner) -> int:
        index = self.nomad.write()
        job = self.nomad.jobs.get(action.runner_id)
        if job is not None:
            if action.reason in IDLE_REASONS:
                assert job.claim is None, f"claimed runner deleted: {action}"
            elif action.reason is DeleteReason.INACTIVITY_TIMEOUT:
                assert self._expired(job), f"claim released before its timeout: {action}"
                self.claims[job.id].released = True
            elif action.reason is DeleteReason.LOST_RETENTION:
                assert job.claim is not None and job.claim.lost_reason is not None, action
                self.claims[job.id].released = True
            self.nomad.drop_job(action.runner_id)
        return index

    def _end_claim(self, action: EndClaim, outcome: Outcome) -> None:
        spec = self.view.specs.get(action.runner_id)
        if spec is None or spec.job_modify_index != action.job_modify_index:
            return  # changed since the plan: the next pass looks again
        if outcome is Outcome.LATE:
            self.late_end_claims.append(action)
            return
        if outcome is Outcome.LOST:
            return
        written = self._land_end_claim(action)
        if outcome is Outcome.OK and written is not None:
            self.view.specs[action.runner_id] = written  # Observer.apply_spec

    def _land_end_claim(self, action: EndClaim) -> RunnerJob | None:
        """A register with EnforceIndex: lost to any change since the plan."""
        job = self.nomad.jobs.get(action.runner_id)
        if job is None or job.job_modify_index != action.job_modify_index:
            return None
        assert job.claim is not None and job.claim.lost_reason is None, (action, job)
        record = self.claims[job.id]
        allowed = self.reasons(record)
        assert action.reason in allowed, (
            f"{job.id} reported {action.reason}, but its claimed allocation "
            f"{record.claim.alloc_id} went through {sorted(allowed) or 'nothing'}"
        )
        record.ended.append(action.reason)
        assert len(record.ended) == 1, f"claim on {job.id} ended twice: {record.ended}"
        self.nomad.write()
        lost = replace(job.claim, lost_reason=action.reason, lost_at=self.clock.now_ns())
        return self.nomad.stop_job(replace(job, claim=lost))

    def reasons(self, record: ClaimRecord) -> set[LossReason]:
        """Every reason that is true of what happened to the claimed allocation
        since the version the claim was made from."""
        out: set[LossReason] = set()
        if record.operator_stopped:
            out.add(LossReason.JOB_STOPPED)
        for v in self.nomad.versions.get(record.claim.alloc_id, []):
            if v.modify_index <= record.seen_modify_index:
                continue
            if v.restarts > record.claim.restarts:
                out.add(LossReason.OOM_KILLED if v.last_exit_oom else LossReason.RESTARTED)
            if v.client_status == "failed":
                out.add(LossReason.OOM_KILLED if v.last_exit_oom else LossReason.RESCHEDULED)
            if v.client_status == "lost":
                out.add(LossReason.LOST)
            if v.desired_status == "stop":
                if v.migrate or MIGRATING in v.desired_description:
                    out.add(LossReason.MIGRATED)
                elif v.client_status != "lost":
                    # stopped with its job; seen before the job's stop is, it reads as lost
                    out |= {LossReason.JOB_STOPPED, LossReason.LOST}
        return out

    # -- clients ---------------------------------------------------------------------------

    @rule(timeout=st.sampled_from(INACTIVITY_TIMEOUTS_S))
    def claim(self, timeout: int = 0) -> None:
        """Claims.claim: the oldest ready idle runner of the current template,
        not being deleted, with an EnforceIndex write."""
        candidates = sorted(
            (
                v
                for v in self.view.runners()
                if not v.claimed
                and v.known
                and v.phase is Phase.READY
                and v.job.template_hash == self.env.template_hash
                and not self.exp.is_deleting(v.id)
            ),
            key=lambda v: v.job.create_index,
        )
        for v in candidates:
            spec = self.view.specs.get(v.id)
            if spec is None or spec.claim is not None or v.alloc is None:
                continue
            # Offered (the claim write is about to be sent): EnforceIndex may still
            # refuse it, but only by luck when the spec happened to change too.
            real = self.nomad.jobs.get(v.id)
            assert real is None or real.claim is None, f"{v.id} offered to a second client"
            assert v.alloc.desired_status == "run" and v.alloc.client_status == "running", (
                f"{v.id} offered on an allocation that is not running and wanted: {v.alloc}"
            )
            if real is None or real.job_modify_index != spec.job_modify_index:
                continue  # IndexConflict: the next runner
            claim = Claim(
                timeout=timeout,
                alloc_id=v.alloc.id,
                restarts=v.alloc.restarts,
                claimed_at=self.clock.now_ns(),
            )
            index = self.nomad.write()
            self.nomad.set_job(replace(real, claim=claim, job_modify_index=index))
            self.view.specs[v.id] = replace(spec, claim=claim, job_modify_index=index)
            self.claims[v.id] = ClaimRecord(v.id, claim, v.alloc.modify_index)
            return

    def _held(self) -> list[str]:
        return [
            r.job_id
            for r in self.claims.values()
            if not r.released and not r.ended and r.job_id in self.nomad.jobs
        ]

    @precondition(lambda self: bool(self._held()))
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        """The client uses its runner: the inactivity timer starts again."""
        self.activity[self._pick(data, self._held())] = self.clock.now_ns()

    def _releasable(self) -> list[str]:
        return [
            r.job_id for r in self.claims.values() if not r.released and r.job_id in self.nomad.jobs
        ]

    @precondition(lambda self: bool(self._releasable()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """The client gives the runner back (or acknowledges its loss)."""
        job_id = self._pick(data, self._releasable())
        runner = self.view.runner(job_id)
        if runner is None or not runner.claimed or self.exp.is_deleting(job_id):
            return  # Claims.release answers False
        self.exp.expect_delete(ENV_ID, job_id)
        index = self.nomad.write()
        self.nomad.drop_job(job_id)
        self.exp.deleted(job_id, index)
        self.view.forgotten.add(job_id)
        self.view.specs.pop(job_id, None)
        self.claims[job_id].released = True

    # -- the environment ---------------------------------------------------------------------

    @rule(size=st.integers(0, 3), new_image=st.booleans())
    def change_environment(self, size: int, new_image: bool) -> None:
        """Resize the pool; with a new image every idle runner is outdated
        (claimed ones keep running as they are)."""
        self.pool_slots += max(0, size - self.env.prewarming_pool_size)
        image = self.env.image
        if new_image:
            image = IMAGES[1] if image == IMAGES[0] else IMAGES[0]
        self.env = replace(self.env, prewarming_pool_size=size, image=image)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def never_created_more_than_needed(self) -> None:
        needed = self.pool_slots + len(self.claims) + len(self.replaced)
        assert self.created <= needed, (
            f"{self.created} runners created, at most {needed} needed "
            f"(pool {self.pool_slots} + {len(self.claims)} claimed "
            f"+ {len(self.replaced)} replaced)"
        )

    # -- when the faults stop ----------------------------------------------------------------

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:
            return  # a step failed: that is the report
        self.converge()

    def _settle_nomad(self) -> None:
        """No more faults: every allocation that should run runs, stopping ones stop."""
        nomad = self.nomad
        for job in list(nomad.jobs.values()):
            if nomad.needs_placement(job):
                nomad.write()
                nomad.new_alloc(job.id, NODES[0])
        for alloc in list(nomad.allocs.values()):
            if alloc.client_terminal:
                continue
            if alloc.desired_status == "stop":
                nomad.write()
                self._update(alloc.id, client_status="complete")
            elif alloc.client_status == "pending":
                nomad.write()
                self._update(
                    alloc.id,
                    client_status="running",
                    started_at=alloc.started_at or self.clock.now_ns(),
                )
        for job_id in list(nomad.jobs):
            nomad.refresh_status(job_id)

    def converge(self) -> None:
        for write in self._late_writes():
            self._land_late(write)
        # Writes that never landed stop being expected.
        self.clock.advance(EXPECTATION_TIMEOUT_S + 1)
        size = self.env.prewarming_pool_size
        for _ in range(50):
            self._settle_nomad()
            self.catch_up()
            result = self._pass(lambda _: Outcome.OK)
            self.never_created_more_than_needed()
            if result.actions:
                continue
            counts = result.counts
            if (counts.idle_ready, counts.idle_starting) == (size, 0):
                break
            assert result.wake_at is not None, f"stuck below the pool size: {counts}"
            self.clock.advance((result.wake_at - self.clock.now_ns()) / SECOND)
        else:
            raise AssertionError(f"no convergence: {result.counts} of {size}")

        ready = []
        for job in self.nomad.jobs.values():
            if job.claim is not None or job.stop:
                continue
            # the truth, not derive's reading of it: the newest allocation Nomad wants running
            wanted = [a for a in self.nomad.allocs_of(job.id) if a.desired_status == "run"]
            current = max(wanted, key=lambda a: a.create_index, default=None)
            assert current is not None and current.client_status == "running", job
            assert job.template_hash == self.env.template_hash, job
            ready.append(job.id)
        assert len(ready) == size, f"{len(ready)} idle runners in Nomad, pool size {size}"
        pending = self.exp.pending(ENV_ID)
        assert (pending.creating, pending.deleting) == (0, frozenset())
        for record in self.claims.values():
            if record.released or record.job_id not in self.nomad.jobs:
                continue
            if self.reasons(record):
                assert len(record.ended) == 1, f"reset claim on {record.job_id} never ended"
            else:
                assert not record.ended


SETTINGS = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays deterministic
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=False,
)


# Passing takes seconds; shrinking a counterexample to a minimal one can take
# minutes, and a timeout would lose it.
@pytest.mark.timeout(600)
def test_reconcile_under_faults() -> None:
    run_state_machine_as_test(ReconcileMachine, settings=SETTINGS)
