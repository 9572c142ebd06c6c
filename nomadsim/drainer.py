"""Node drains: Nomad's node drainer, reduced to what allocations see.

Setting a drain strategy makes the node ineligible. Service allocations are
then migrated `migrate.max_parallel` at a time (the next batch once the
previous batch's replacements run); batch allocations only when the deadline
forces them (a negative deadline means now, zero means never). Migration is
`DesiredTransition.Migrate` plus a `node-drain` evaluation; the scheduler
stops the old allocation ("alloc is being migrated") and places the new one.
When nothing the drain is responsible for still runs on the node, the drain
is complete: the strategy is removed and the node stays ineligible.

As Nomad's drainer, it depends on the state store plus a narrow interface for
the one write it leaves to the server, the migration (`Migrator`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from nomadsim.clock import SimTime
from nomadsim.encode import SECOND, go_time, group_of, node_events
from nomadsim.records import RUNNING, Alloc, DrainStrategy, Eval, Node
from nomadsim.state import StateStore


class Migrator(Protocol):
    """The write the drainer leaves to the server (Nomad's drainer applies
    AllocUpdateDesiredTransition through raft): mark allocations for
    migration and evaluate their jobs. `AllocEndpoint` is one."""

    def migrate(self, allocs: list[Alloc], triggered_by: str) -> list[Eval]: ...


class Drainer:
    def __init__(self, store: StateStore, time: SimTime, migrator: Migrator) -> None:
        self._store = store
        self._time = time
        self._migrator = migrator
        self._scheduled: set[str] = set()

    def set_drain(
        self, node: Node, deadline_ns: int | None, ignore_system: bool, mark_eligible: bool
    ) -> Node:
        """Set (or with `deadline_ns` None cancel) the node's drain strategy."""
        now = self._time.now_ns()
        if deadline_ns is None:
            strategy = None
            status = "canceled"
            message = "Node drain disabled"
            eligibility = "eligible" if mark_eligible else node.eligibility
        else:
            started = node.drain.started_at if node.drain else now
            force = now + self._time.scaled(deadline_ns) if deadline_ns > 0 else 0
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
        with self._store.txn("NodeUpdateDrain") as tx:
            new = replace(
                node,
                drain=strategy,
                eligibility=eligibility,
                last_drain=last or None,
                events=node_events(node, message, "Drain", tx.index, self._time.now_ns()),
                modify_index=tx.index,
            )
            tx.put_node(new)
        if strategy is not None:
            if strategy.force_deadline:
                delay = (strategy.force_deadline - now) / SECOND
                self._time.timers.call_later(delay, lambda: self.schedule(node.id))
            self.schedule(node.id)
        return new

    def schedule(self, node_id: str) -> None:
        """Look at the node again soon (deduplicated)."""
        if node_id in self._scheduled:
            return
        self._scheduled.add(node_id)
        self._time.timers.call_later(0, lambda: self._tick(node_id))

    def _tick(self, node_id: str) -> None:
        self._scheduled.discard(node_id)
        store = self._store
        node = store.nodes.get(node_id)
        if node is None or node.drain is None:
            return
        now = self._time.now_ns()
        forced = node.drain.deadline_ns < 0 or (
            node.drain.force_deadline != 0 and now >= node.drain.force_deadline
        )
        remaining: list[Alloc] = []
        to_migrate: list[Alloc] = []
        in_flight: dict[tuple[str, str], int] = {}
        for a in store.node_allocs(node_id):
            if a.client_terminal():
                continue
            if a.job_type == "system" and node.drain.ignore_system_jobs:
                continue
            remaining.append(a)
            if a.desired_status != "run":
                # Stopped by a migration: in flight until its replacement runs.
                succ = store.allocs.get(a.next_allocation)
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
            self._migrator.migrate(chosen, "node-drain")
        if not remaining:
            self._complete(node)

    def _complete(self, node: Node) -> None:
        now = self._time.now_ns()
        last = dict(node.last_drain or {})
        last.update({"UpdatedAt": go_time(now), "Status": "complete"})
        with self._store.txn("NodeUpdateDrain") as tx:
            events = node_events(
                node, "Node drain complete", "Drain", tx.index, self._time.now_ns()
            )
            tx.put_node(
                replace(node, drain=None, last_drain=last, events=events, modify_index=tx.index)
            )

    def on_alloc_change(self, alloc: Alloc) -> None:
        """A client reported on the allocation: look again at its node and, for a
        migration's replacement, at the node of the allocation it replaces."""
        node = self._store.nodes.get(alloc.node_id)
        if node is not None and node.drain is not None:
            self.schedule(node.id)
        migration = self._store.migration_of(alloc.id)
        if migration is not None:
            old = self._store.allocs.get(migration.previous_alloc_id)
            if old is not None:
                self.schedule(old.node_id)
