"""reads: how a refresh reads jobs — the lists limited to given jobs, the
allocations of the namespace read briefly once observed, the specs fetched
only when new or changed, and the views derived again only when their job
or allocations changed. Both refreshes of the observer, full and targeted,
build their snapshot from one `JobReader.read`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from controller.model import Allocation, Phase, RunnerJob, RunnerView, Template
from controller.nomad import jobs
from controller.nomad.gateway import (
    AllocListing,
    JobListing,
    JobStub,
    NomadAPIError,
    NomadGateway,
    NomadUnavailable,
)
from controller.reconcile.derive import derive_runner
from controller.reconcile.snapshot import Read, Snapshot
from controller.reconcile.specs import CachedSpec, Dictionaries

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]

# A refresh touching more jobs than this is done with one big list rather
# than many filtered ones.
TARGETED_MAX_JOBS = 500


@runtime_checkable
class ScopedLists(Protocol):
    """Lists limited to given jobs. A gateway without them gets full refreshes only."""

    def list_jobs_by_id(self, job_ids: Collection[str]) -> JobListing:
        """Stubs of those of the jobs that exist."""
        ...

    def list_allocations_of_jobs(self, job_ids: Collection[str]) -> AllocListing:
        """Every allocation of the jobs, as `list_allocations` returns them."""
        ...

    def list_allocation_versions(self) -> AllocListing:
        """Every allocation of the namespace without task states or resources
        (IDs, jobs and ModifyIndexes are what matter)."""
        ...


# What a runner view was derived from: a view is derived again only when this changes.
_DerivedFrom = tuple[int, str, tuple[tuple[str, int], ...]]


@dataclass(frozen=True)
class JobsRead:
    """The outcome of `JobReader.read`: what the snapshot gets, the specs read,
    the jobs whose spec could not be read, and those listed but found deleted."""

    read: Read
    specs: Mapping[str, CachedSpec]
    unreadable: set[str]
    vanished: set[str] = field(default_factory=set)


class JobReader:
    """Reads for the observer. `current_specs` answers, from the observer's
    spec cache (under its lock), which of the given jobs (id → the
    JobModifyIndex a list shows) are cached at least that new."""

    def __init__(
        self,
        *,
        gateway: NomadGateway,
        current_specs: Callable[[Mapping[str, int]], dict[str, CachedSpec]],
        dictionaries: Dictionaries | None = None,
        fetch_concurrency: int = 8,
    ) -> None:
        self._gateway = gateway
        self.scoped = gateway if isinstance(gateway, ScopedLists) else None
        self._current_specs = current_specs
        self._dictionaries = dictionaries  # the specs fetched are compressed against them
        self._fetch_concurrency = fetch_concurrency
        # Only refreshes (one at a time) read and write it.
        self._derived: dict[str, tuple[_DerivedFrom, RunnerView]] = {}

    def forget(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._derived.pop(job_id, None)

    def keep_only(self, runner_ids: Collection[str]) -> None:
        self._derived = {j: d for j, d in self._derived.items() if j in runner_ids}

    def list_allocations(self, prev: Snapshot, observed_once: bool) -> AllocListing:
        """Every allocation of the namespace. Once observed, from a brief list
        (no task states, no resources: about a quarter of the bytes) plus a
        full read of only the jobs whose allocations are new, changed (another
        ModifyIndex) or gone; the others are the same as already decoded."""
        if self.scoped is None or not observed_once:
            return self._gateway.list_allocations()
        brief = self.scoped.list_allocation_versions()
        known = {a.id: a for allocs in prev.allocs.values() for a in allocs}
        listed = {a.id for a in brief.allocations}
        changed = {
            a.job_id
            for a in brief.allocations
            if (old := known.get(a.id)) is None or old.modify_index != a.modify_index
        }
        changed |= {a.job_id for a in known.values() if a.id not in listed}
        changed = {j for j in changed if jobs.env_id_of(j) is not None}
        allocations = [
            known[a.id] for a in brief.allocations if a.job_id not in changed and a.id in known
        ]
        if not changed:
            return AllocListing(tuple(allocations), brief.index)
        if len(changed) > TARGETED_MAX_JOBS:
            # After a long disconnection: one full list beats hundreds of
            # filtered ones.
            return self._gateway.list_allocations()
        detail = self.scoped.list_allocations_of_jobs(changed)
        # The details are at least as new as the brief list (the lower index
        # of the two marks a stale read).
        return AllocListing(tuple(allocations) + detail.allocations, min(brief.index, detail.index))

    def read(
        self, ids: Iterable[str], stubs: Mapping[str, JobStub], alloc_list: AllocListing
    ) -> JobsRead:
        """The build step of both refreshes: for the jobs `ids` (those not in
        `stubs` are gone), their specs (cached ones reused, new or changed
        ones fetched), allocations and derived templates and views. A job whose
        spec read answers "not found" was deleted after the list: it is gone
        too, not unknown (nothing to count in its pool, no reason to make the
        snapshot unsafe; a refresh overlapping our own deletions lists them)."""
        specs, unreadable, vanished = self._fetch_changed(stubs)
        if vanished:
            stubs = {j: s for j, s in stubs.items() if j not in vanished}
        by_job: dict[str, list[Allocation]] = defaultdict(list)
        for alloc in alloc_list.allocations:
            if alloc.job_id in stubs:
                by_job[alloc.job_id].append(alloc)
        templates: dict[int, Template] = {}
        runners: dict[str, RunnerView] = {}
        allocs: dict[str, tuple[Allocation, ...]] = {}
        gone_templates: list[int] = []
        gone_runners: list[str] = []
        unread_templates: list[int] = []
        for job_id in ids:
            stub = stubs.get(job_id)
            if stub is None:
                # Named by an event and no longer listed: the job is gone.
                env_id = jobs.template_env_id(job_id)
                if env_id is not None:
                    gone_templates.append(env_id)
                else:
                    gone_runners.append(job_id)
                continue
            job_allocs = tuple(by_job.get(job_id, ()))
            allocs[job_id] = job_allocs
            view = self._derive(job_id, stub, specs.get(job_id), job_allocs)
            if isinstance(view, Template):
                templates[view.env.id] = view
            elif view is not None:
                runners[job_id] = view
            elif (env_id := jobs.template_env_id(job_id)) is not None:
                unread_templates.append(env_id)
        read = Read(templates, runners, allocs, gone_templates, gone_runners, unread_templates)
        return JobsRead(read, specs, unreadable, vanished)

    def _derive(
        self,
        job_id: str,
        stub: JobStub,
        spec: CachedSpec | None,
        allocs: tuple[Allocation, ...],
    ) -> Template | RunnerView | None:
        """The template or runner view of a listed job (its spec read or cached)."""
        env_id = jobs.template_env_id(job_id)
        if env_id is not None:
            return template_of(spec.decode(), env_id) if spec is not None else None
        env_id = jobs.runner_env_id(job_id)
        assert env_id is not None
        if spec is None or spec.runner is None:
            return unknown_view(stub, env_id, allocs)
        derived_from = (
            spec.modify_index,
            stub.status,
            tuple((a.id, a.modify_index) for a in allocs),
        )
        cached = self._derived.get(job_id)
        if cached is not None and cached[0] == derived_from:
            return cached[1]
        # Status is not part of the spec (it changes without a new
        # JobModifyIndex): it comes from the list. So do the indexes and
        # times Nomad sets: a spec we wrote and cached carries none of them.
        runner = replace(
            spec.runner,
            status=stub.status,
            create_index=stub.create_index,
            submit_time=stub.submit_time,
        )
        view = derive_runner(runner, allocs)
        self._derived[job_id] = (derived_from, view)
        return view

    def _fetch_changed(
        self, stubs: Mapping[str, JobStub]
    ) -> tuple[dict[str, CachedSpec], set[str], set[str]]:
        """Specs of the listed jobs (cached ones reused, new or changed ones
        fetched), the jobs whose read failed, and those it found deleted."""
        specs: dict[str, CachedSpec] = {}
        wanted: list[str] = []
        current = self._current_specs({j: s.job_modify_index for j, s in stubs.items()})
        for job_id in stubs:
            cached = current.get(job_id)
            if cached is not None:
                specs[job_id] = cached
            else:
                wanted.append(job_id)
        unreadable: set[str] = set()
        vanished: set[str] = set()
        if not wanted:
            return specs, unreadable, vanished

        def fetch(job_id: str) -> tuple[str, CachedSpec | None, bool]:
            mine = self._current_specs({job_id: stubs[job_id].job_modify_index}).get(job_id)
            if mine is not None:
                return job_id, mine, True  # our own write landed since the list
            try:
                spec = self._gateway.get_job(job_id)
            except (NomadUnavailable, NomadAPIError) as exc:
                log.warning("could not read job %s: %s", job_id, exc)
                return job_id, None, False
            if spec is None:
                return job_id, None, True
            return job_id, CachedSpec.of(job_id, spec, dictionaries=self._dictionaries), True

        if len(wanted) == 1:
            results = [fetch(wanted[0])]
        else:
            workers = min(self._fetch_concurrency, len(wanted))
            with ThreadPoolExecutor(workers, thread_name_prefix="nrc-fetch") as pool:
                results = list(pool.map(fetch, wanted))
        for job_id, spec, ok in results:
            if spec is not None:
                specs[job_id] = spec
            elif ok:
                vanished.add(job_id)  # deleted between the list and the read
            else:
                unreadable.add(job_id)
        return specs, unreadable, vanished


def template_of(spec: JsonDict, env_id: int) -> Template:
    return Template(jobs.environment_from_job(spec, env_id), jobs.modify_index(spec), spec)


def unknown_view(stub: JobStub, env_id: int, allocs: tuple[Allocation, ...]) -> RunnerView:
    job = RunnerJob(
        id=stub.id,
        env_id=env_id,
        job_modify_index=stub.job_modify_index,
        create_index=stub.create_index,
        submit_time=stub.submit_time,
        stop=stub.stop,
        status=stub.status,
    )
    return RunnerView(job=job, phase=Phase.STARTING, known=False)
