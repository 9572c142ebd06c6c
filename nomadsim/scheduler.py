"""Evaluations and placement: Nomad's generic (service/batch) scheduler, reduced
to what changes allocations.

An evaluation is processed shortly after it is created (never inside the
request that created it): the scheduler compares the job's task groups with
the job's allocations, stops what is not needed (job stopped, count lowered,
node down, migration, destructive update, reschedule), updates unchanged
allocations in place, places what is missing on eligible nodes with capacity,
and commits all of it as one `PlanResult` transaction. Unplaceable allocations
leave a blocked evaluation that is retried when capacity appears.

As Nomad's scheduler, it plans against the state store and writes only to it:
it never calls a client, which learns of what was placed or stopped by
watching the store. Besides the store it uses only a `PortAssigner` and the
`migration_ordering` fault."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from nomadsim.clock import SimTime
from nomadsim.encode import SECOND, alloc_metric, group_of
from nomadsim.records import (
    COMPLETE,
    FAILED,
    LOST,
    Alloc,
    Eval,
    JsonDict,
    Migration,
    Node,
    RescheduleEvent,
)
from nomadsim.state import StateStore, group_demand, stamp_alloc, stamp_eval

NOT_NEEDED = "alloc not needed due to job update"
MIGRATING = "alloc is being migrated"
LOST_DESC = "alloc is lost since its node is down"
RESCHEDULED = "alloc was rescheduled because it failed"
UPDATING = "alloc is being updated due to job update"

# Task-group fields whose change means a task must be restarted (destructive).
DESTRUCTIVE_GROUP_FIELDS = ("Tasks", "Networks", "EphemeralDisk", "Volumes")


@dataclass
class Plan:
    stops: dict[str, Alloc] = field(default_factory=dict)
    places: list[Alloc] = field(default_factory=list)
    updates: list[Alloc] = field(default_factory=list)
    queued: dict[str, int] = field(default_factory=dict)
    failed_groups: dict[str, JsonDict] = field(default_factory=dict)
    followups: list[Eval] = field(default_factory=list)
    # new alloc id -> the migration it is placed by
    migrations: dict[str, Migration] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.stops or self.places or self.updates)


class PortAssigner(Protocol):
    """The part of `Ports` the scheduler uses: whether a node has the ports a
    group asks for, and each placement gets its ports."""

    def fits(self, node: Node, group: JsonDict) -> bool: ...

    def assign(self, alloc_id: str, node: Node, group: JsonDict) -> None: ...


class Scheduler:
    def __init__(
        self,
        store: StateStore,
        time: SimTime,
        new_id: Callable[[], str],
        ports: PortAssigner,
        migration_ordering: Callable[[], str],
    ) -> None:
        self._store = store
        self._time = time
        self._new_id = new_id
        self._ports = ports
        # Which ordering the next migration follows (`production` or `client`).
        self._migration_ordering = migration_ordering
        self.blocked: dict[tuple[str, str], str] = {}  # job -> blocked eval id

    # -- evaluation queue -------------------------------------------------------

    def enqueue(self, eval_id: str, delay_s: float = 0.0) -> None:
        self._time.timers.call_later(delay_s, lambda: self.process(eval_id))

    def unblock_all(self) -> None:
        """Capacity changed: retry every blocked evaluation."""
        blocked, self.blocked = self.blocked, {}
        if not blocked:
            return
        store = self._store
        with store.txn("EvalUpdate") as tx:
            for eval_id in blocked.values():
                ev = store.evals.get(eval_id)
                if ev is not None and ev.status == "blocked":
                    pending = replace(ev, status="pending")
                    tx.put_eval(stamp_eval(pending, tx.index, self._time.now_ns()))
        for eval_id in blocked.values():
            self.enqueue(eval_id)

    def process(self, eval_id: str) -> None:
        store = self._store
        ev = store.evals.get(eval_id)
        if ev is None or ev.status != "pending":
            return
        now = self._time.now_ns()
        if ev.wait_until > now:
            self.enqueue(eval_id, (ev.wait_until - now) / SECOND)
            return
        plan = self.compute(ev, now)
        if plan.followups:
            with store.txn("EvalUpdate") as tx:
                for follow in plan.followups:
                    tx.put_eval(stamp_eval(follow, tx.index, self._time.now_ns()))
            for follow in plan.followups:
                self.enqueue(follow.id, max(0.0, (follow.wait_until - now) / SECOND))
        if not plan.empty():
            # The clients see the stops and placements in this order once it commits.
            with store.txn("ApplyPlanResults") as tx:
                for alloc in [*plan.stops.values(), *plan.updates, *plan.places]:
                    tx.put_alloc(stamp_alloc(alloc, tx.index, now))
                for alloc_id, migration in plan.migrations.items():
                    tx.put_migration(alloc_id, migration)
        blocked_id = ""
        key = (ev.namespace, ev.job_id)
        if plan.failed_groups and key not in self.blocked:
            blocked_id = self._new_id()
        with store.txn("EvalUpdate") as tx:
            done = replace(
                ev,
                status="complete",
                blocked_eval=blocked_id,
                failed_tg_allocs=tuple(plan.failed_groups.items()),
                queued_allocations=tuple(plan.queued.items()),
                snapshot_index=tx.index - 1,
            )
            tx.put_eval(stamp_eval(done, tx.index, self._time.now_ns()))
            if blocked_id:
                blocked = _child_eval(
                    ev,
                    blocked_id,
                    "queued-allocs",
                    "blocked",
                    "created to place remaining allocations",
                )
                tx.put_eval(stamp_eval(blocked, tx.index, self._time.now_ns()))
                self.blocked[key] = blocked_id
        store.set_queued(*key, plan.queued)
        if plan.stops:
            # Stopping frees capacity (Nomad's plan removes stopped allocations
            # from the node at once), so queued placements may now fit.
            self.unblock_all()

    # -- planning -------------------------------------------------------------

    def compute(self, ev: Eval, now: int) -> Plan:
        plan = Plan()
        rec = self._store.job(ev.namespace, ev.job_id)
        allocs = self._store.job_allocs(ev.namespace, ev.job_id)
        if rec is None or rec.stopped:
            for a in allocs:
                if a.desired_status == "run" and not a.client_terminal():
                    plan.stops[a.id] = replace(
                        a, desired_status="stop", desired_description=NOT_NEEDED
                    )
            return plan
        job = rec.spec
        for group in job["TaskGroups"]:
            self._plan_group(
                plan, ev, job, group, [a for a in allocs if a.task_group == group["Name"]], now
            )
        return plan

    def _plan_group(
        self, plan: Plan, ev: Eval, job: JsonDict, group: JsonDict, allocs: list[Alloc], now: int
    ) -> None:
        name = group["Name"]
        count = int(group.get("Count") or 0)
        live: list[Alloc] = []
        # (alloc name, previous alloc, kind) of allocations to place again
        replace_: list[tuple[str, Alloc, str]] = []
        for a in allocs:
            if a.desired_status != "run":
                continue
            node = self._store.nodes.get(a.node_id)
            if node is not None and node.status == "down" and not a.client_terminal():
                plan.stops[a.id] = replace(
                    a,
                    desired_status="stop",
                    desired_description=LOST_DESC,
                    client_status=LOST,
                    client_description="alloc is lost since its node is down",
                )
                replace_.append((a.name, a, "lost"))
                continue
            if a.migrate and not a.client_terminal():
                plan.stops[a.id] = replace(a, desired_status="stop", desired_description=MIGRATING)
                replace_.append((a.name, a, "migrate"))
                continue
            if a.client_status == FAILED:
                when = self._reschedule_time(a, group, now)
                if when is None:
                    live.append(a)  # out of attempts: stays failed, not replaced
                elif when <= now:
                    plan.stops[a.id] = replace(
                        a, desired_status="stop", desired_description=RESCHEDULED
                    )
                    replace_.append((a.name, a, "reschedule"))
                else:
                    live.append(a)
                    if not a.followup_eval_id:
                        follow = _child_eval(
                            ev,
                            self._new_id(),
                            "alloc-failure",
                            "pending",
                            "created for delayed rescheduling",
                            wait_until=when,
                        )
                        plan.followups.append(follow)
                        plan.updates.append(replace(a, followup_eval_id=follow.id))
                continue
            if a.client_status == LOST:
                continue
            if a.client_status == COMPLETE:
                if job["Type"] in ("batch", "sysbatch"):
                    live.append(a)  # finished batch work is done, not replaced
                continue
            old_group = group_of(a.job, name) or {}
            if any(old_group.get(f) != group.get(f) for f in DESTRUCTIVE_GROUP_FIELDS):
                plan.stops[a.id] = replace(a, desired_status="stop", desired_description=UPDATING)
                replace_.append((a.name, a, "update"))
                continue
            if a.job.get("JobModifyIndex") != job["JobModifyIndex"]:
                plan.updates.append(replace(a, job=job))
            live.append(a)

        # Too many: stop the highest-indexed unneeded ones, never-started first.
        total = len(live) + len(replace_)
        if total > count:
            excess = total - count
            drop = min(excess, len(replace_))
            replace_ = replace_[: len(replace_) - drop] if drop else replace_
            excess -= drop
            candidates = sorted(
                (a for a in live if not a.client_terminal()),
                key=lambda a: (a.client_status != "pending", -_name_index(a.name)),
            )
            for a in candidates[:excess]:
                plan.stops[a.id] = replace(a, desired_status="stop", desired_description=NOT_NEEDED)
                plan.updates = [u for u in plan.updates if u.id != a.id]

        used = {a.name for a in live} | {n for n, _, _ in replace_}
        missing = [
            f"{job['ID']}.{name}[{i}]"
            for i in range(count)
            if f"{job['ID']}.{name}[{i}]" not in used
        ]
        slots: list[tuple[str, Alloc | None, str]] = [
            *replace_,
            *((n, None, "new") for n in missing),
        ]
        avoid_nodes = {prev.node_id for _, prev, kind in replace_ if kind in ("migrate", "lost")}
        for alloc_name, prev, kind in slots:
            node = self._pick_node(job, group, plan, avoid_nodes if prev is not None else set())
            if node is None:
                plan.queued[name] = plan.queued.get(name, 0) + 1
                nodes = len(self._store.nodes)
                plan.failed_groups[name] = alloc_metric(nodes, exhausted=nodes)
                continue
            new = self._new_alloc(ev, job, group, alloc_name, node, now)
            if prev is not None:
                new, ordering = self._link(new, prev, kind, group, now)
                plan.stops[prev.id] = replace(plan.stops[prev.id], next_allocation=new.id)
                if kind == "migrate":
                    plan.migrations[new.id] = Migration(prev.id, ordering)
            plan.places.append(new)

    def _link(
        self, new: Alloc, prev: Alloc, kind: str, group: JsonDict, now: int
    ) -> tuple[Alloc, str]:
        """Tie a replacement to the allocation it replaces."""
        if kind == "migrate":
            ordering = self._migration_ordering()
            if ordering == "client":
                return replace(new, previous_allocation=prev.id), ordering
            # As observed in production: no PreviousAllocation on a migration.
            return new, ordering
        if kind == "reschedule":
            policy = group.get("ReschedulePolicy") or {}
            event = RescheduleEvent(
                reschedule_time=now,
                prev_alloc_id=prev.id,
                prev_node_id=prev.node_id,
                delay_ns=_reschedule_delay(policy, len(prev.reschedule_events)),
            )
            return (
                replace(
                    new,
                    previous_allocation=prev.id,
                    reschedule_events=(*prev.reschedule_events, event),
                ),
                "",
            )
        return replace(new, previous_allocation=prev.id), ""

    def _reschedule_time(self, a: Alloc, group: JsonDict, now: int) -> int | None:
        policy = group.get("ReschedulePolicy") or {}
        interval = int(policy.get("Interval") or 0)
        attempts = int(policy.get("Attempts") or 0)
        if not policy.get("Unlimited"):
            recent = [
                e
                for e in a.reschedule_events
                if interval == 0 or now - e.reschedule_time < self._time.scaled(interval)
            ]
            if len(recent) >= attempts:
                return None
        failed_at = max((ts.finished_at for _, ts in a.task_states), default=0) or a.modify_time
        delay = _reschedule_delay(policy, len(a.reschedule_events))
        return failed_at + self._time.scaled(delay)

    def _new_alloc(
        self, ev: Eval, job: JsonDict, group: JsonDict, name: str, node: Node, now: int
    ) -> Alloc:
        alloc_id = self._new_id()
        self._ports.assign(alloc_id, node, group)
        return Alloc(
            id=alloc_id,
            namespace=job["Namespace"],
            eval_id=ev.id,
            name=name,
            node_id=node.id,
            node_name=node.name,
            job_id=job["ID"],
            job=job,
            task_group=group["Name"],
        )

    def _pick_node(
        self, job: JsonDict, group: JsonDict, plan: Plan, avoid: set[str]
    ) -> Node | None:
        """Spread: the eligible node with room that runs the fewest allocations
        of this job, then the least loaded; ties go to the first node. Room is
        what Nomad's scheduler counts: reserved CPU, memory (MemoryMB, not
        MemoryMaxMB) and ephemeral disk against the node's capacity, and free
        ports."""
        cpu, mem, disk = group_demand(group)
        best: tuple[tuple[int, float, int], Node] | None = None
        for order, node in enumerate(self._store.nodes.values()):
            if node.status != "ready" or node.eligibility != "eligible" or node.id in avoid:
                continue
            used_cpu, used_mem, used_disk, same_job = self._node_usage(node.id, job["ID"], plan)
            if (
                used_cpu + cpu > node.cpu_mhz
                or used_mem + mem > node.memory_mb
                or used_disk + disk > node.disk_mb
            ):
                continue
            if not self._ports.fits(node, group):
                continue
            key = (same_job, used_cpu / max(node.cpu_mhz, 1), order)
            if best is None or key < best[0]:
                best = (key, node)
        return best[1] if best else None

    def _node_usage(self, node_id: str, job_id: str, plan: Plan) -> tuple[int, int, int, int]:
        """CPU, memory and disk in use on the node and how many of its allocations
        belong to the job, as the plan would leave them: the allocations that
        hold resources (desired run, not client-terminal) minus those the plan
        stops, plus those it places. From the store's per-node counters, so a
        placement costs the same with 10 or 10,000 allocations on the node."""
        store = self._store
        cpu, mem, disk = store.node_used.get(node_id) or (0, 0, 0)
        same = store.node_job_allocs.get((node_id, job_id), 0)
        for stopped in plan.stops:
            entry = store.usage_of(stopped)
            if entry is not None and entry.node_id == node_id:
                cpu -= entry.cpu
                mem -= entry.mem
                disk -= entry.disk
                if entry.job_id == job_id:
                    same -= 1
        for a in plan.places:
            if a.node_id != node_id:
                continue
            placed_cpu, placed_mem, placed_disk = group_demand(group_of(a.job, a.task_group) or {})
            cpu, mem, disk = cpu + placed_cpu, mem + placed_mem, disk + placed_disk
            if a.job_id == job_id:
                same += 1
        return cpu, mem, disk, same


def _child_eval(
    parent: Eval,
    eval_id: str,
    triggered_by: str,
    status: str,
    description: str,
    wait_until: int = 0,
) -> Eval:
    """An evaluation the scheduler creates while processing `parent`."""
    return Eval(
        id=eval_id,
        namespace=parent.namespace,
        priority=parent.priority,
        type=parent.type,
        triggered_by=triggered_by,
        job_id=parent.job_id,
        job_modify_index=parent.job_modify_index,
        status=status,
        status_description=description,
        wait_until=wait_until,
        previous_eval=parent.id,
    )


def _name_index(name: str) -> int:
    try:
        return int(name.rsplit("[", 1)[1].rstrip("]"))
    except (IndexError, ValueError):
        return 0


def _reschedule_delay(policy: JsonDict, previous: int) -> int:
    delay = int(policy.get("Delay") or 0)
    max_delay = int(policy.get("MaxDelay") or 0)
    function = policy.get("DelayFunction") or "constant"
    if function == "exponential":
        delay = delay * (2**previous)
    elif function == "fibonacci":
        a, b = delay, delay
        for _ in range(previous):
            a, b = b, a + b
        delay = a
    if max_delay and delay > max_delay:
        delay = max_delay
    return delay
