"""The store's objects as Nomad's API shows them: an allocation with its ports
and its node's address, a job's summary with its queued allocations, and list
entries encoded once per object version.

A list of 10,000 allocations encodes only what changed since the last list:
each entry's JSON is kept for as long as its object is the store's current
version (a stale view's older version is encoded afresh), and dropped at the
commit that writes the object again."""

from __future__ import annotations

from typing import Any

from nomadsim.encode import alloc_datum, alloc_full, alloc_stub, job_stub, job_summary, json_bytes
from nomadsim.ports import Ports
from nomadsim.records import Alloc, JobRecord, JsonDict
from nomadsim.state import ALLOCS, JOBS, Commit, StateStore


class Presenter:
    def __init__(self, store: StateStore, ports: Ports) -> None:
        self._store = store
        self._ports = ports
        self._alloc_stubs: dict[str, dict[tuple[bool, bool], tuple[Alloc, bytes]]] = {}
        self._job_stubs: dict[
            tuple[str, str], dict[bool, tuple[JobRecord, tuple[int, Any], bytes]]
        ] = {}

    def _host_ip(self, alloc: Alloc) -> str:
        node = self._store.nodes.get(alloc.node_id)
        return node.address if node else ""

    def alloc(self, alloc: Alloc, with_job: bool = True) -> JsonDict:
        """The full allocation (GET /v1/allocation/:id, a node's allocations)."""
        return alloc_full(alloc, self._ports.of(alloc.id), self._host_ip(alloc), with_job)

    def alloc_event(self, alloc: Alloc) -> JsonDict:
        """The allocation as an event's payload carries it: without its job."""
        return self.alloc(alloc, with_job=False)

    def alloc_datum(self, alloc: Alloc) -> JsonDict:
        """The allocation as a `filter` expression sees it (every field)."""
        return alloc_datum(alloc, self._ports.of(alloc.id), self._host_ip(alloc))

    def alloc_stub(self, alloc: Alloc, resources: bool, task_states: bool) -> JsonDict:
        return alloc_stub(
            alloc, self._ports.of(alloc.id), self._host_ip(alloc), resources, task_states
        )

    def alloc_stub_json(self, alloc: Alloc, resources: bool, task_states: bool) -> bytes:
        """`alloc_stub` as JSON bytes, cached for the current version of the
        allocation (a stale view's older version is encoded afresh)."""
        flags = (resources, task_states)
        cached = self._alloc_stubs.get(alloc.id)
        if cached is not None:
            hit = cached.get(flags)
            if hit is not None and hit[0] is alloc:
                return hit[1]
        data = json_bytes(self.alloc_stub(alloc, resources, task_states))
        if self._store.allocs.get(alloc.id) is alloc:
            self._alloc_stubs.setdefault(alloc.id, {})[flags] = (alloc, data)
        return data

    def job_stub_json(self, rec: JobRecord, meta: bool, summary: JsonDict | None) -> bytes:
        """A job's list stub as JSON bytes. `summary` None: the current one,
        and the encoding is cached for as long as the job, its allocations
        (the summary index) and its queued counts stay the same."""
        key = (rec.namespace, rec.id)
        version = (
            self._store.summary_index.get(key, 0),
            tuple(sorted(self._store.queued(*key).items())),
        )
        if summary is None:
            cached = self._job_stubs.get(key, {}).get(meta)
            if cached is not None and cached[0] is rec and cached[1] == version:
                return cached[2]
            summary = self.job_summary(rec)
            data = json_bytes(job_stub(rec.spec, summary, meta))
            if self._store.jobs.get(key) is rec:
                self._job_stubs.setdefault(key, {})[meta] = (rec, version, data)
            return data
        return json_bytes(job_stub(rec.spec, summary, meta))

    def job_summary(self, rec: JobRecord, allocs: dict[str, Alloc] | None = None) -> JsonDict:
        """The job's summary over `allocs` (a table view; default the current table)."""
        store = self._store
        key = (rec.namespace, rec.id)
        table = store.allocs if allocs is None else allocs
        ids = store.allocs_by_job.get(key, ())
        return job_summary(
            rec.spec,
            [table[i] for i in ids if i in table],
            store.queued(*key),
            store.summary_index.get(key, 0),
        )

    def on_commit(self, commit: Commit) -> None:
        """Drop the encodings of every object the commit wrote (a store listener)."""
        for change in commit.changes:
            if change.table == ALLOCS:
                self._alloc_stubs.pop(change.key, None)
            elif change.table == JOBS:
                self._job_stubs.pop(change.key, None)
