"""The simulator's state store: tables, one global raft-like index, watches
for blocking queries, and an undo log so list reads can lag like a follower's.

It is the one shared mutable thing of the simulator, as Nomad's state store
is of Nomad: the other parts read it and write it, and learn of each other's
writes from it, never through each other.

Every write happens in a transaction (`with store.txn(msg_type) as tx`) that
takes exactly one new index, like one raft apply in Nomad; before it commits,
the status of every job it touched is set (Nomad's setJobStatus). At commit
the changes go to the listeners (the event broker, the task driver) as one
batch, blocked readers of the touched tables wake up, and then the watchers
hear of it (the client, which reacts by writing). All access happens on the
simulator's event loop thread, so nothing here needs a lock."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from nomadsim.records import Alloc, Eval, JobRecord, JsonDict, Migration, Node, Variable

JOBS = "jobs"
JOB_SUMMARY = "job_summary"
ALLOCS = "allocs"
EVALS = "evals"
NODES = "nodes"
VARIABLES = "variables"
TABLES = (JOBS, JOB_SUMMARY, ALLOCS, EVALS, NODES, VARIABLES)

# How many past changes the undo log keeps for stale reads.
UNDO_DEPTH = 4096


@dataclass(frozen=True)
class Change:
    table: str
    key: Any
    before: Any  # None when created
    after: Any  # None when deleted


@dataclass(frozen=True)
class UsageEntry:
    """An allocation's share of its node's resources, as placement counts it."""

    node_id: str
    job_id: str
    cpu: int
    mem: int
    disk: int = 0


def group_demand(group: JsonDict) -> tuple[int, int, int]:
    """What placement reserves for one allocation of the group, as Nomad's
    scheduler counts it: CPU (MHz) and memory (MemoryMB, the reservation:
    MemoryMaxMB is what oversubscription allows beyond it) of its tasks, and
    its ephemeral disk (MB)."""
    cpu = mem = 0
    for task in group.get("Tasks") or []:
        res = task.get("Resources") or {}
        cpu += int(res.get("CPU") or 0)
        mem += int(res.get("MemoryMB") or 0)
    disk = int((group.get("EphemeralDisk") or {}).get("SizeMB") or 0)
    return cpu, mem, disk


def alloc_demand(alloc: Alloc) -> tuple[int, int, int]:
    """What the allocation's group reserves (`group_demand`)."""
    for group in alloc.job.get("TaskGroups") or []:
        if group.get("Name") == alloc.task_group:
            return group_demand(group)
    return 0, 0, 0


@dataclass(frozen=True)
class Commit:
    index: int
    msg_type: str
    changes: tuple[Change, ...]


class Txn:
    def __init__(self, store: StateStore, msg_type: str, index: int) -> None:
        self.store = store
        self.msg_type = msg_type
        self.index = index
        self.changes: list[Change] = []

    def _record(self, table: str, key: Any, after: Any) -> None:
        tbl: dict[Any, Any] = self.store.tables[table]
        before = tbl.get(key)
        if after is None:
            tbl.pop(key, None)
        else:
            tbl[key] = after
        self.changes.append(Change(table, key, before, after))

    def put_job(self, rec: JobRecord) -> None:
        self._record(JOBS, (rec.namespace, rec.id), rec)

    def delete_job(self, namespace: str, job_id: str) -> None:
        self._record(JOBS, (namespace, job_id), None)

    def put_alloc(self, alloc: Alloc) -> None:
        self.store._index_alloc(alloc)
        self._record(ALLOCS, alloc.id, alloc)
        self.store._count_usage(alloc)

    def delete_alloc(self, alloc_id: str) -> None:
        old = self.store.allocs.get(alloc_id)
        if old is not None:
            self.store._unindex_alloc(old)
        self._record(ALLOCS, alloc_id, None)
        self.store._uncount_usage(alloc_id)

    def put_eval(self, ev: Eval) -> None:
        self.store.evals_by_job.setdefault((ev.namespace, ev.job_id), set()).add(ev.id)
        self._record(EVALS, ev.id, ev)

    def put_node(self, node: Node) -> None:
        self._record(NODES, node.id, node)

    def put_variable(self, var: Variable) -> None:
        self._record(VARIABLES, (var.namespace, var.path), var)

    def delete_variable(self, namespace: str, path: str) -> None:
        self._record(VARIABLES, (namespace, path), None)

    def put_migration(self, alloc_id: str, migration: Migration) -> None:
        """Note that the new allocation `alloc_id` replaces another by migration
        (no table of Nomad's: no event, no index of its own)."""
        self.store._migrations[alloc_id] = migration


class StateStore:
    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self.index = 1
        self.jobs: dict[tuple[str, str], JobRecord] = {}
        self.allocs: dict[str, Alloc] = {}
        self.evals: dict[str, Eval] = {}
        self.nodes: dict[str, Node] = {}
        self.variables: dict[tuple[str, str], Variable] = {}
        self.tables: dict[str, dict[Any, Any]] = {
            JOBS: self.jobs,
            ALLOCS: self.allocs,
            EVALS: self.evals,
            NODES: self.nodes,
            VARIABLES: self.variables,
        }
        self.table_index: dict[str, int] = dict.fromkeys(TABLES, 1)
        # Secondary indexes Nomad's memdb keeps too.
        self.allocs_by_job: dict[tuple[str, str], set[str]] = {}
        self.allocs_by_node: dict[str, set[str]] = {}
        # Order of first insertion into the allocation table (the table's own
        # iteration order), for answers built from the indexes above.
        self.alloc_seq: dict[str, int] = {}
        self._alloc_counter = itertools.count()
        self.summary_index: dict[tuple[str, str], int] = {}
        # What placement needs, kept up to date on every allocation write
        # instead of scanning a node's allocations per placement: per node the
        # CPU and memory of its allocations that hold resources (desired run,
        # not client-terminal), how many of them each job has, and what each
        # such allocation was counted with.
        self.node_used: dict[str, list[int]] = {}
        self.node_job_allocs: dict[tuple[str, str], int] = {}
        self._usage: dict[str, UsageEntry] = {}
        self.jobs_ever_registered = 0
        self.evals_by_job: dict[tuple[str, str], set[str]] = {}
        # Beside the tables: the migration each replacement follows, and per job
        # the allocations its last evaluation could not place (the summary's
        # Queued), as the scheduler left them.
        self._migrations: dict[str, Migration] = {}
        self._queued: dict[tuple[str, str], dict[str, int]] = {}
        self._listeners: list[Callable[[Commit], None]] = []
        self._watchers: list[Callable[[Commit], None]] = []
        self._waiters: dict[str, set[asyncio.Future[None]]] = {t: set() for t in TABLES}
        # (index, monotonic time, change) newest last, for stale reads.
        self._undo: deque[tuple[int, float, Change]] = deque(maxlen=UNDO_DEPTH)
        self._in_txn = False
        # Set at shutdown: blocking queries then answer at once.
        self.closed = False

    # -- writes ---------------------------------------------------------------

    def add_listener(self, fn: Callable[[Commit], None]) -> None:
        """Call `fn` with every commit while it commits, before blocked readers
        wake. A listener must not write: every listener sees the commits in
        index order."""
        self._listeners.append(fn)

    def watch(self, fn: Callable[[Commit], None]) -> None:
        """Call `fn` with every commit once it is complete (its listeners ran,
        its blocked readers are awake), as a blocking query of Nomad's client
        would return. A watcher may write; its write commits, and is told to
        the watchers, before the next watcher hears of the first commit."""
        self._watchers.append(fn)

    @contextmanager
    def txn(self, msg_type: str) -> Iterator[Txn]:
        if self._in_txn:
            raise RuntimeError("nested state transaction")
        self._in_txn = True
        tx = Txn(self, msg_type, self.index + 1)
        try:
            yield tx
            if tx.changes:
                self._set_job_statuses(tx)
        finally:
            self._in_txn = False
        if not tx.changes:
            return
        self.index = tx.index
        now = self._monotonic()
        touched: set[str] = set()
        for ch in tx.changes:
            touched.add(ch.table)
            self.table_index[ch.table] = tx.index
            self._undo.append((tx.index, now, ch))
            if ch.table == ALLOCS:
                a = ch.after or ch.before
                self.summary_index[(a.namespace, a.job_id)] = tx.index
                self.table_index[JOB_SUMMARY] = tx.index
                touched.add(JOB_SUMMARY)
        commit = Commit(tx.index, msg_type, tuple(tx.changes))
        for fn in self._listeners:
            fn(commit)
        for table in touched:
            for fut in self._waiters[table]:
                if not fut.done():
                    fut.set_result(None)
            self._waiters[table].clear()
        for fn in self._watchers:
            fn(commit)

    # -- job status (Nomad's setJobStatus, v1.9.6+) -----------------------------

    def _set_job_statuses(self, tx: Txn) -> None:
        jobs: set[tuple[str, str]] = set()
        for ch in tx.changes:
            if ch.table in (ALLOCS, EVALS):
                obj = ch.after or ch.before
                jobs.add((obj.namespace, obj.job_id))
            elif ch.table == JOBS and ch.after is not None:
                jobs.add(ch.key)
        for key in sorted(jobs):
            rec = self.jobs.get(key)
            if rec is None:
                continue
            status = self.job_status(rec)
            if status != rec.spec["Status"]:
                spec = dict(rec.spec)
                spec["Status"] = status
                spec["ModifyIndex"] = tx.index
                tx.put_job(replace(rec, spec=spec))

    def job_status(self, rec: JobRecord) -> str:
        spec = rec.spec
        periodic = spec.get("Periodic") or {}
        if spec["Type"] == "system" or periodic.get("Enabled") or spec.get("ParameterizedJob"):
            return "dead" if rec.stopped else "running"
        # Unsorted and stopping at the first live allocation: this runs on every write.
        allocs = self.allocs
        ids = self.allocs_by_job.get((rec.namespace, rec.id), ())
        if any(not allocs[i].terminal() for i in ids):
            return "running"
        has_eval = False
        for ev in self.job_evals(rec.namespace, rec.id):
            if ev.status in ("pending", "blocked"):
                return "pending"
            has_eval = True
        if has_eval or rec.stopped:
            return "dead"
        return "pending"

    def _index_alloc(self, alloc: Alloc) -> None:
        if alloc.id not in self.alloc_seq:
            self.alloc_seq[alloc.id] = next(self._alloc_counter)
        self.allocs_by_job.setdefault((alloc.namespace, alloc.job_id), set()).add(alloc.id)
        self.allocs_by_node.setdefault(alloc.node_id, set()).add(alloc.id)

    def _unindex_alloc(self, alloc: Alloc) -> None:
        self.alloc_seq.pop(alloc.id, None)
        self.allocs_by_job.get((alloc.namespace, alloc.job_id), set()).discard(alloc.id)
        self.allocs_by_node.get(alloc.node_id, set()).discard(alloc.id)

    def _count_usage(self, alloc: Alloc) -> None:
        self._uncount_usage(alloc.id)
        if alloc.desired_status != "run" or alloc.client_terminal():
            return
        cpu, mem, disk = alloc_demand(alloc)
        entry = UsageEntry(alloc.node_id, alloc.job_id, cpu, mem, disk)
        self._usage[alloc.id] = entry
        used = self.node_used.setdefault(alloc.node_id, [0, 0, 0])
        used[0] += cpu
        used[1] += mem
        used[2] += disk
        key = (alloc.node_id, alloc.job_id)
        self.node_job_allocs[key] = self.node_job_allocs.get(key, 0) + 1

    def _uncount_usage(self, alloc_id: str) -> None:
        entry = self._usage.pop(alloc_id, None)
        if entry is None:
            return
        used = self.node_used[entry.node_id]
        used[0] -= entry.cpu
        used[1] -= entry.mem
        used[2] -= entry.disk
        key = (entry.node_id, entry.job_id)
        left = self.node_job_allocs[key] - 1
        if left:
            self.node_job_allocs[key] = left
        else:
            del self.node_job_allocs[key]

    def usage_of(self, alloc_id: str) -> UsageEntry | None:
        """What the allocation counts towards its node's usage (None: nothing)."""
        return self._usage.get(alloc_id)

    def set_queued(self, namespace: str, job_id: str, queued: dict[str, int]) -> None:
        """Allocations per task group that the job's last evaluation could not place."""
        self._queued[(namespace, job_id)] = queued

    # -- reads ----------------------------------------------------------------

    def job(self, namespace: str, job_id: str) -> JobRecord | None:
        return self.jobs.get((namespace, job_id))

    def job_allocs(self, namespace: str, job_id: str) -> list[Alloc]:
        ids = self.allocs_by_job.get((namespace, job_id), ())
        return sorted((self.allocs[i] for i in ids), key=lambda a: a.create_index)

    def node_allocs(self, node_id: str) -> list[Alloc]:
        ids = self.allocs_by_node.get(node_id, ())
        return sorted((self.allocs[i] for i in ids), key=lambda a: a.create_index)

    def job_evals(self, namespace: str, job_id: str) -> list[Eval]:
        ids = self.evals_by_job.get((namespace, job_id), ())
        return sorted((self.evals[i] for i in ids), key=lambda e: e.create_index)

    def queued(self, namespace: str, job_id: str) -> dict[str, int]:
        return self._queued.get((namespace, job_id), {})

    def migration_of(self, alloc_id: str) -> Migration | None:
        """The migration the allocation was placed by, None when it was not."""
        return self._migrations.get(alloc_id)

    def max_index(self, *tables: str) -> int:
        return max(self.table_index[t] for t in tables)

    def view(self, table: str, at_index: int) -> dict[Any, Any]:
        """The table as a follower that has applied up to `at_index` sees it."""
        current: dict[Any, Any] = self.tables[table]
        newer = [ch for idx, _, ch in self._undo if idx > at_index and ch.table == table]
        if not newer:
            return current
        snapshot = dict(current)
        for ch in reversed(newer):
            if ch.before is None:
                snapshot.pop(ch.key, None)
            else:
                snapshot[ch.key] = ch.before
        return snapshot

    def index_at(self, seconds_ago: float) -> int:
        """The newest index committed at least `seconds_ago` seconds ago."""
        cutoff = self._monotonic() - seconds_ago
        result = self.index
        for idx, when, _ in reversed(self._undo):
            if when <= cutoff:
                return min(result, idx)
            result = idx - 1
        return max(1, result)

    # -- blocking queries -----------------------------------------------------

    async def wait_for_change(self, tables: Iterable[str], timeout: float) -> None:
        """Return when any of `tables` is written to, or after `timeout` seconds
        (at once when the store is closed)."""
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        tables = tuple(tables)
        for t in tables:
            self._waiters[t].add(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            pass
        finally:
            for t in tables:
                self._waiters[t].discard(fut)

    def wake_all(self) -> None:
        """Release every blocked reader and block no later one (shutdown)."""
        self.closed = True
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
            waiters.clear()


def stamp_alloc(alloc: Alloc, index: int, now_ns: int, client: bool = False) -> Alloc:
    """Set the index fields Nomad sets when an allocation is written.

    AllocModifyIndex moves only on server-side changes, not on client updates."""
    if alloc.create_index == 0:
        return replace(
            alloc,
            create_index=index,
            modify_index=index,
            alloc_modify_index=index,
            create_time=now_ns,
            modify_time=now_ns,
        )
    if client:
        return replace(alloc, modify_index=index, modify_time=now_ns)
    return replace(alloc, modify_index=index, alloc_modify_index=index, modify_time=now_ns)


def stamp_eval(ev: Eval, index: int, now_ns: int) -> Eval:
    """Set the index and time fields Nomad sets when an evaluation is written."""
    if ev.create_index == 0:
        return replace(
            ev, create_index=index, modify_index=index, create_time=now_ns, modify_time=now_ns
        )
    return replace(ev, modify_index=index, modify_time=now_ns)
