"""Node drains: Nomad's node drainer, reduced to what allocations see.

Setting a drain strategy makes the node ineligible. Service allocations are
then migrated `migrate.max_parallel` at a time (the next batch once the
previous batch's replacements run); batch allocations only when the deadline
forces them (a negative deadline means now, zero means never). Migration is
`DesiredTransition.Migrate` plus a `node-drain` evaluation; the scheduler
stops the old allocation ("alloc is being migrated") and places the new one.
When nothing the drain is responsible for still runs on the node, the drain
is complete: the strategy is removed and the node stays ineligible."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nomadsim.encode import SECOND, go_time, group_of
from nomadsim.records import RUNNING, Alloc, DrainStrategy, Eval, Node

if TYPE_CHECKING:
    from nomadsim.core import Simulator


class Drainer:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self._scheduled: set[str] = set()

    def set_drain(
        self, node: Node, deadline_ns: int | None, ignore_system: bool, mark_eligible: bool
    ) -> Node:
        sim = self.sim
        now = sim.clock.now_ns()
        if deadline_ns is None:
            strategy = None
            status = "canceled"
            message = "Node drain disabled"
            eligibility = "eligible" if mark_eligible else node.eligibility
        else:
            started = node.drain.started_at if node.drain else now
            force = now + sim.scaled(deadline_ns) if deadline_ns > 0 else 0
            strategy = DrainStrategy(deadline_ns, ignore_system, force, started)
            status = "draining"
            message = "Node drain strategy updated" if node.drain else "Node drain strategy set"
            eligibility = "ineligible"
        last = dict(node.last_drain or {})
        if strategy is not None and node.drain is None:
            last = {
                "StartedAt": go_time(now),
                "UpdatedAt": go_time(now),
                "Status": status,
                "AccessorID": "",
                "Meta": None,
            }
        elif last:
            last.update({"UpdatedAt": go_time(now), "Status": status})
        with sim.store.txn("NodeUpdateDrain") as tx:
            new = replace(
                node,
                drain=strategy,
                eligibility=eligibility,
                last_drain=last or None,
                events=sim.node_event(node, message, "Drain", tx.index),
                modify_index=tx.index,
            )
            tx.put_node(new)
        if strategy is not None:
            if strategy.force_deadline:
                delay = (strategy.force_deadline - now) / SECOND
                self.sim.timers.call_later(delay, lambda: self.schedule(node.id))
            self.schedule(node.id)
        elif eligibility == "eligible":
            sim.scheduler.unblock_all()
        return new

    def schedule(self, node_id: str) -> None:
        """Look at the node again soon (deduplicated)."""
        if node_id in self._scheduled:
            return
        self._scheduled.add(node_id)
        self.sim.timers.call_later(0, lambda: self._tick(node_id))

    def _tick(self, node_id: str) -> None:
        self._scheduled.discard(node_id)
        sim = self.sim
        node = sim.store.nodes.get(node_id)
        if node is None or node.drain is None:
            return
        now = sim.clock.now_ns()
        forced = node.drain.deadline_ns < 0 or (
            node.drain.force_deadline != 0 and now >= node.drain.force_deadline
        )
        remaining: list[Alloc] = []
        to_migrate: list[Alloc] = []
        in_flight: dict[tuple[str, str], int] = {}
        for a in sim.store.node_allocs(node_id):
            if a.client_terminal():
                continue
            if a.job_type == "system" and node.drain.ignore_system_jobs:
                continue
            remaining.append(a)
            if a.desired_status != "run":
                # Stopped by a migration: in flight until its replacement runs.
                succ = sim.store.allocs.get(a.next_allocation)
                if a.migrate and (succ is None or succ.client_status != RUNNING):
                    key = (a.job_id, a.task_group)
                    in_flight[key] = in_flight.get(key, 0) + 1
                continue
            if a.migrate:
                continue
            to_migrate.append(a)
        chosen: list[Alloc] = []
        for a in to_migrate:
            if a.job_type in ("batch", "sysbatch", "system"):
                if forced:
                    chosen.append(a)
                continue
            key = (a.job_id, a.task_group)
            if forced:
                chosen.append(a)
                continue
            group: dict[str, Any] = group_of(a.job, a.task_group) or {}
            limit = int((group.get("Migrate") or {}).get("MaxParallel") or 1)
            if in_flight.get(key, 0) < limit:
                in_flight[key] = in_flight.get(key, 0) + 1
                chosen.append(a)
        if chosen:
            sim.migrate(chosen, "node-drain")
        if not remaining:
            self._complete(node)

    def _complete(self, node: Node) -> None:
        sim = self.sim
        now = sim.clock.now_ns()
        last = dict(node.last_drain or {})
        last.update({"UpdatedAt": go_time(now), "Status": "complete"})
        with sim.store.txn("NodeUpdateDrain") as tx:
            tx.put_node(
                replace(
                    node,
                    drain=None,
                    last_drain=last,
                    events=sim.node_event(node, "Node drain complete", "Drain", tx.index),
                    modify_index=tx.index,
                )
            )

    def on_alloc_change(self, alloc: Alloc) -> None:
        node = self.sim.store.nodes.get(alloc.node_id)
        if node is not None and node.drain is not None:
            self.schedule(node.id)
        prev = self.sim.migrations.get(alloc.id)
        if prev is not None:
            old = self.sim.store.allocs.get(prev[0])
            if old is not None:
                self.schedule(old.node_id)


def drain_eval(sim: Simulator, alloc: Alloc, triggered_by: str) -> Eval:
    return Eval(
        id=sim.new_id(),
        namespace=alloc.namespace,
        priority=int(alloc.job.get("Priority", 50)),
        type=alloc.job_type,
        triggered_by=triggered_by,
        job_id=alloc.job_id,
        job_modify_index=int(alloc.job.get("ModifyIndex", 0)),
    )
