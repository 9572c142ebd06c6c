"""observe: reads Nomad's jobs and allocations into the shared `Snapshot`
(an informer cache) and keeps it fresh for every event heard of.

- One refresh serves every environment: passes triggered by the same burst of
  events reuse it (`covers` says up to which event index it is fresh).
- A *full* refresh lists every job and allocation of the namespace; job specs
  are cached by JobModifyIndex (`specs`), so only new or changed jobs are
  fetched. It runs first, whenever no event stream feeds the observer, after
  the stream (re)connects (events may have been missed meanwhile), when many
  jobs changed at once, and at least every `full_relist_s` as a safety net.
- Otherwise a refresh is *targeted*: events name the jobs whose job or
  allocations changed (`heard`), and only those are read again, with lists
  filtered to them (`ID == ...`, `JobID == ...`); a named job the list no
  longer shows was deleted. Nothing else is read, so a refresh with nothing
  changed costs nothing, whatever the number of runners. Events still carry
  no decision: they only say which jobs to look at, and the look is a read
  of Nomad.
- Both kinds share one build step (`_read_jobs`): fetch the specs that
  changed, derive the views whose job or allocations changed (cached by
  JobModifyIndex, status and allocation ModifyIndexes), and hand the result
  to `snapshot.rebuilt` or `snapshot.merged`.
- A list whose index is older than one already seen (a follower's stale read)
  is discarded, never allowed to move the snapshot backwards; a targeted read
  that is older than the events that named its jobs keeps them to be read again.
- A spec that cannot be read makes the snapshot unsafe: that runner counts
  towards its pool but nothing is deleted in that pass.
- Our own writes are applied to the snapshot at once (`apply_spec`, `forget`),
  so a claim is visible to the next claimer before any list shows it; a
  refresh that began before a write lays the write over its result.
- Expectations are settled in the same step (under the lock) as the snapshot
  that shows what settled them is installed, and a pass reads both together
  (`snapshot_and_pending`): a creation is counted by the snapshot or as
  pending, never by neither (over-creation) nor by both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from controller.clock import Clock
from controller.metrics import Metrics
from controller.model import Allocation, Phase, RunnerJob, RunnerView, Template
from controller.nomad import jobs
from controller.nomad.events import EventRef
from controller.nomad.gateway import (
    AllocListing,
    JobListing,
    JobStub,
    NomadAPIError,
    NomadGateway,
    NomadUnavailable,
)
from controller.reconcile import snapshot as snapshots
from controller.reconcile.derive import derive_runner
from controller.reconcile.expectations import Expectations, Pending
from controller.reconcile.heard import Heard, Mentions, Named
from controller.reconcile.snapshot import EMPTY, Read, Snapshot
from controller.reconcile.specs import CachedSpec, SpecCache

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]

# A targeted refresh of more jobs than this (or than a quarter of all runners)
# is done as a full one: a few big lists beat many filtered ones.
TARGETED_MAX_JOBS = 500
# Reads behind the events already heard are retried this often, waiting
# 1, 2, 3 × this long in between, before a pass goes on with what it has.
STALE_RETRIES = 3
STALE_RETRY_WAIT_S = 0.05
# `follow`: how long after the first event of a burst it refreshes (the rest
# of the burst joins the same refresh), and the least time between refreshes
# (at least as long as the last refresh took).
FOLLOW_BATCH_S = 0.005
FOLLOW_MIN_INTERVAL_S = 0.01
FOLLOW_BACKOFF_S = 0.5


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
class _JobsRead:
    """The outcome of `_read_jobs`: what the snapshot gets, the specs read,
    and the jobs whose spec could not be read."""

    read: Read
    specs: Mapping[str, CachedSpec]
    unreadable: set[str]


class Observer:
    def __init__(
        self,
        *,
        gateway: NomadGateway,
        clock: Clock,
        expectations: Expectations,
        metrics: Metrics,
        fetch_concurrency: int = 8,
        full_relist_s: float = 300.0,
    ) -> None:
        self._gateway = gateway
        self._scoped = gateway if isinstance(gateway, ScopedLists) else None
        self._clock = clock
        self._expectations = expectations
        self._metrics = metrics
        self._fetch_concurrency = fetch_concurrency
        self._full_relist_s = full_relist_s
        self._heard = Heard()
        self._refresh_lock = threading.Lock()  # one refresh at a time
        self._lock = threading.Lock()  # guards the fields below
        self._snapshot = EMPTY
        self._specs = SpecCache()
        # Only the refresh (under `_refresh_lock`) reads and writes `_derived`.
        self._derived: dict[str, tuple[_DerivedFrom, RunnerView]] = {}
        self._stream_connected = False
        self._full_wanted = True  # a full refresh must come next
        self._last_full = float("-inf")
        self._full_indexes = (-1, -1)  # list indexes of the last full refresh
        # Our writes since the current refresh began: the lists it is reading
        # may predate them, so they are laid over its result (None: deleted).
        self._writes_meanwhile: dict[str, JsonDict | None] = {}
        self._observed_once = False
        self.last_error: str | None = None  # why the last refresh failed; None after a success
        self.refreshes = {"full": 0, "targeted": 0, "unchanged": 0}

    # -- what passes and claims read --------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def snapshot_and_pending(self, env_id: int) -> tuple[Snapshot, Pending]:
        """The snapshot and the environment's expectations, read together.

        A refresh settles expectations in the same step as it installs the
        snapshot that shows what settled them, so in this pair every creation
        is counted once: by the snapshot or as pending. Read apart, a pass
        could take the snapshot before a refresh installs its successor and
        the expectations after the refresh settled them, and create again."""
        with self._lock:
            return self._snapshot, self._expectations.pending(env_id)

    @property
    def observed_once(self) -> bool:
        return self._observed_once

    def spec(self, job_id: str) -> JsonDict | None:
        """The newest spec we know of the job (a fresh copy)."""
        with self._lock:
            cached = self._specs.get(job_id)
        return cached.decode() if cached is not None else None

    def note_event_index(self, index: int, events: Iterable[EventRef] = ()) -> None:
        """An event frame was received; `events` name the jobs to read again."""
        self._heard.note(index, events)

    def reread(self, job_ids: Collection[str]) -> Snapshot:
        """Read these jobs and their allocations from Nomad now, whether or not
        events named them: an answer about a runner that must not come from a
        view older than what the runner itself just showed (a file operation
        that may have met a reset file system). Raises as `refresh`."""
        self._heard.name(job_ids)
        return self.refresh()

    def follow(self, stop: threading.Event, active: Callable[[], bool] = lambda: True) -> None:
        """Refresh soon after events name something newer than the snapshot,
        until `stop` is set (run it on a thread of its own). Passes refresh
        when they start anyway, but a pass busy with its writes (a pool of
        hundreds filling at the write rate) would leave ready runners unseen,
        and unclaimable, until it ends; this keeps the snapshot within a few
        milliseconds of the events, whatever the passes do. `active` false
        (a follower replica) pauses it."""
        while not stop.is_set():
            if not self._heard.wait_for_news(self._covered, 0.25):
                continue
            stop.wait(FOLLOW_BATCH_S)  # let the rest of a burst arrive
            if stop.is_set() or not active():
                continue
            began = time.monotonic()
            try:
                self.current()
            except Exception as exc:
                log.debug("refresh after events failed: %s", exc)
                stop.wait(FOLLOW_BACKOFF_S)
            # At most half of the time refreshing: under a burst of events the
            # refreshes get longer and gather more of them each.
            stop.wait(max(FOLLOW_MIN_INTERVAL_S, time.monotonic() - began))

    def _covered(self) -> float:
        """Up to which event index the snapshot is fresh (nothing before the
        first refresh: `follow` leaves that one to the passes)."""
        return self.snapshot.covers if self._observed_once else float("inf")

    def set_stream_connected(self, connected: bool) -> None:
        """Whether an event stream feeds `note_event_index`. Without one every
        refresh is full; after a (re)connection the next one is."""
        with self._lock:
            if connected and not self._stream_connected:
                self._full_wanted = True
            self._stream_connected = connected

    def current(self, max_age_s: float | None = None) -> Snapshot:
        """A snapshot fresh for every event heard of so far (refreshing if needed)."""
        wanted = self._heard.newest
        snap = self.snapshot
        if self._fresh(snap, wanted, max_age_s):
            return snap
        with self._refresh_lock:
            # Passes woken by the same events queue up here: the first one's
            # refresh serves them all.
            snap = self.snapshot
            if self._fresh(snap, wanted, max_age_s):
                return snap
            for attempt in range(STALE_RETRIES + 1):
                snap = self._refresh_locked()
                if snap.covers >= wanted or attempt == STALE_RETRIES:
                    return snap
                # A read answered from behind events already heard (a lagging
                # follower): nothing else may wake this pass, so read again soon.
                time.sleep(STALE_RETRY_WAIT_S * (attempt + 1))
            return snap

    def _fresh(self, snap: Snapshot, wanted: int, max_age_s: float | None) -> bool:
        if not self._observed_once or snap.covers < wanted:
            return False
        return max_age_s is None or self._clock.monotonic() - snap.taken_at <= max_age_s

    # -- our own writes -----------------------------------------------------------

    def apply_spec(self, job_id: str, spec: JsonDict) -> None:
        """A spec we just wrote (with its new JobModifyIndex)."""
        cached = CachedSpec.of(job_id, spec)
        with self._lock:
            if not self._specs.put_if_newer(job_id, cached):
                return
            self._writes_meanwhile[job_id] = spec
            self._snapshot = _with_spec(self._snapshot, job_id, spec, cached)

    def forget(self, job_id: str) -> None:
        """A job we just deleted."""
        with self._lock:
            self._specs.drop(job_id)
            self._writes_meanwhile[job_id] = None
            self._snapshot = _without(self._snapshot, job_id)

    # -- refresh ------------------------------------------------------------------

    def refresh(self, full: bool = False) -> Snapshot:
        """Read Nomad and rebuild the snapshot (full or targeted, see the module
        docstring; `full` forces a full one). Raises NomadUnavailable /
        NomadAPIError when a list fails (the pass retries)."""
        with self._refresh_lock:
            if full:
                with self._lock:
                    self._full_wanted = True
            return self._refresh_locked()

    def _refresh_locked(self) -> Snapshot:
        try:
            snap = self._observe()
        except Exception as exc:
            self.last_error = str(exc) or type(exc).__name__
            raise
        self.last_error = None
        return snap

    def _observe(self) -> Snapshot:
        started = self._clock.monotonic()
        covers, named = self._heard.take()
        with self._lock:
            prev = self._snapshot
            full = (
                not self._observed_once
                or self._scoped is None
                or not self._stream_connected
                or self._full_wanted
                or started - self._last_full >= self._full_relist_s
                or len(named) > max(TARGETED_MAX_JOBS, len(prev.runners) // 4)
            )
            if full:
                self._full_wanted = False
            self._writes_meanwhile = {}
        try:
            if full:
                snap = self._observe_full(prev, covers, started, named)
            else:
                snap = self._observe_targeted(prev, covers, named)
        except BaseException:
            self._heard.put_back(named)
            if full:
                with self._lock:
                    self._full_wanted = True
            raise
        self._metrics.observe_seconds.observe(self._clock.monotonic() - started)
        return snap

    def _observe_full(self, prev: Snapshot, covers: int, started: float, named: Named) -> Snapshot:
        job_list = self._gateway.list_jobs()
        alloc_list = self._list_allocations(prev)
        if self._stale(prev, job_list, alloc_list) or self._behind(named, job_list, alloc_list):
            self._heard.put_back(named)
            with self._lock:
                self._full_wanted = True
            return prev
        if (
            self._observed_once
            and prev.safe
            and (job_list.index, alloc_list.index) == self._full_indexes
        ):
            # Nothing changed since the last full look (the indexes say so):
            # keep the derived snapshot, only note that it is fresh. (Targeted
            # refreshes move the snapshot's indexes without listing everything,
            # so only a full list's indexes can say this.)
            with self._lock:
                # The current snapshot, not `prev`: it has our writes since.
                snap = replace(self._snapshot, covers=covers, taken_at=self._clock.monotonic())
                self._snapshot = snap
                self._expectations.observe(frozenset(prev.runners), job_list.index)
                self._last_full = started
            self.refreshes["unchanged"] += 1
            return snap
        stubs = {s.id: s for s in job_list.jobs if jobs.env_id_of(s.id) is not None}
        result = self._read_jobs(stubs, stubs, alloc_list)
        snap = snapshots.rebuilt(
            result.read,
            jobs_index=job_list.index,
            allocs_index=alloc_list.index,
            covers=covers,
            taken_at=self._clock.monotonic(),
            safe=not result.unreadable,
        )
        self._derived = {j: d for j, d in self._derived.items() if j in snap.runners}
        with self._lock:
            self._specs.keep_only(stubs)
            snap = self._install(snap, result.specs)
            self._expectations.observe(frozenset(stubs), job_list.index)
            self._observed_once = True
            self._last_full = started
            self._full_indexes = (job_list.index, alloc_list.index)
        if result.unreadable:
            # Read again by the next refresh, targeted ones too: not only by
            # the next full one, minutes away while events flow.
            self._heard.put_back(
                {j: Mentions(job=job_list.index, first=job_list.index) for j in result.unreadable}
            )
        self.refreshes["full"] += 1
        return snap

    def _list_allocations(self, prev: Snapshot) -> AllocListing:
        """Every allocation of the namespace. Once observed, from a brief list
        (no task states, no resources: about a quarter of the bytes) plus a
        full read of only the jobs whose allocations are new, changed (another
        ModifyIndex) or gone; the others are the same as already decoded."""
        if self._scoped is None or not self._observed_once:
            return self._gateway.list_allocations()
        brief = self._scoped.list_allocation_versions()
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
        detail = self._scoped.list_allocations_of_jobs(changed)
        # The details are at least as new as the brief list (the lower index
        # of the two marks a stale read).
        return AllocListing(tuple(allocations) + detail.allocations, min(brief.index, detail.index))

    def _observe_targeted(self, prev: Snapshot, covers: int, named: Named) -> Snapshot:
        assert self._scoped is not None
        if not named:
            # Nothing was named since the last refresh: nothing to read.
            with self._lock:
                snap = replace(self._snapshot, covers=covers, taken_at=self._clock.monotonic())
                self._snapshot = snap
            self.refreshes["unchanged"] += 1
            return snap
        ids = sorted(named)
        job_list = self._scoped.list_jobs_by_id(ids)
        alloc_list = self._scoped.list_allocations_of_jobs(ids)
        if self._stale(prev, job_list, alloc_list):
            self._heard.put_back(named)
            return prev
        # Jobs named by events newer than these lists (a lagging follower)
        # cannot be judged from them: they keep their state and are read again.
        behind = self._behind(named, job_list, alloc_list)
        if behind:
            self._heard.put_back(behind)
            # Not fresh from the oldest event about them on: in particular no
            # creation or deletion of theirs is settled by this read.
            covers = min(covers, min(m.first for m in behind.values()) - 1)
            ids = [j for j in ids if j not in behind]
        wanted = set(ids)
        stubs = {s.id: s for s in job_list.jobs if s.id in wanted}
        result = self._read_jobs(ids, stubs, alloc_list)
        with self._lock:
            # Built on the current snapshot: it holds our writes since `prev`.
            base = self._snapshot
        merged = snapshots.merged(
            base,
            result.read,
            jobs_index=job_list.index,
            allocs_index=alloc_list.index,
            covers=covers,
            taken_at=self._clock.monotonic(),
            safe=True,
        )
        # A safe snapshot had no unknown runner, and our writes make none: only
        # the jobs read now can be unknown (no scan of every runner).
        still_unknown = any(
            not v.known
            for v in (
                (merged.runners[j] for j in ids if j in merged.runners)
                if prev.safe
                else merged.runners.values()
            )
        )
        snap = replace(merged, safe=not result.unreadable and not still_unknown)
        with self._lock:
            for job_id in ids:
                if job_id not in stubs:
                    self._specs.drop(job_id)
                    self._derived.pop(job_id, None)
            snap = self._install(snap, result.specs)
            # Every job an event up to `covers` named has been read: the merged
            # snapshot shows every job as of min(covers, list index).
            self._expectations.observe(
                _Listed(merged.runners, merged.templates), min(covers, job_list.index)
            )
        if result.unreadable:
            self._heard.put_back({job_id: named[job_id] for job_id in result.unreadable})
        self.refreshes["targeted"] += 1
        return snap

    def _read_jobs(
        self, ids: Iterable[str], stubs: Mapping[str, JobStub], alloc_list: AllocListing
    ) -> _JobsRead:
        """The build step of both refreshes: for the jobs `ids` (those not in
        `stubs` are gone), their specs (cached ones reused, new or changed
        ones fetched), allocations and derived templates and views."""
        specs, unreadable = self._fetch_changed(stubs)
        by_job: dict[str, list[Allocation]] = defaultdict(list)
        for alloc in alloc_list.allocations:
            if alloc.job_id in stubs:
                by_job[alloc.job_id].append(alloc)
        templates: dict[int, Template] = {}
        runners: dict[str, RunnerView] = {}
        allocs: dict[str, tuple[Allocation, ...]] = {}
        gone_templates: list[int] = []
        gone_runners: list[str] = []
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
        read = Read(templates, runners, allocs, gone_templates, gone_runners)
        return _JobsRead(read, specs, unreadable)

    def _install(self, snap: Snapshot, specs: Mapping[str, CachedSpec]) -> Snapshot:
        """Make `snap` the snapshot, with the specs read into the cache and our
        writes since the refresh began laid over both (under `_lock`)."""
        for job_id, cached in specs.items():
            self._specs.put_if_newer(job_id, cached)
        for job_id, written in self._writes_meanwhile.items():
            if written is None:
                snap = _without(snap, job_id)
                continue
            cached = CachedSpec.of(job_id, written)
            if self._specs.put_if_newer(job_id, cached):
                snap = _with_spec(snap, job_id, written, cached)
        self._snapshot = snap
        return snap

    def _behind(
        self, named: Named, job_list: JobListing, alloc_list: AllocListing
    ) -> dict[str, Mentions]:
        """The jobs named by events newer than the lists read: a read answered
        from behind them (a lagging follower) cannot show them yet."""
        behind = {
            job_id: m
            for job_id, m in named.items()
            if m.job > job_list.index or m.allocs > alloc_list.index
        }
        if behind:
            self._metrics.guard_hits.labels("stale_list").inc()
        return behind

    def _stale(self, prev: Snapshot, job_list: JobListing, alloc_list: AllocListing) -> bool:
        if self._observed_once and (
            job_list.index < prev.jobs_index or alloc_list.index < prev.allocs_index
        ):
            # A follower answered from behind what we have already seen.
            self._metrics.guard_hits.labels("stale_list").inc()
            log.debug(
                "discarding stale lists (jobs %d < %d or allocations %d < %d)",
                job_list.index,
                prev.jobs_index,
                alloc_list.index,
                prev.allocs_index,
            )
            return True
        return False

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
            return _template(spec.decode(), env_id) if spec is not None else None
        env_id = jobs.runner_env_id(job_id)
        assert env_id is not None
        if spec is None or spec.runner is None:
            return _unknown(stub, env_id, allocs)
        derived_from = (
            spec.modify_index,
            stub.status,
            tuple((a.id, a.modify_index) for a in allocs),
        )
        cached = self._derived.get(job_id)
        if cached is not None and cached[0] == derived_from:
            return cached[1]
        # Status is not part of the spec (it changes without a new
        # JobModifyIndex): it comes from the list.
        view = derive_runner(replace(spec.runner, status=stub.status), allocs)
        self._derived[job_id] = (derived_from, view)
        return view

    def _fetch_changed(
        self, stubs: Mapping[str, JobStub]
    ) -> tuple[dict[str, CachedSpec], set[str]]:
        """Specs of the listed jobs: cached ones reused, new or changed ones fetched."""
        specs: dict[str, CachedSpec] = {}
        wanted: list[str] = []
        with self._lock:
            for job_id, stub in stubs.items():
                cached = self._specs.current_for(job_id, stub.job_modify_index)
                if cached is not None:
                    specs[job_id] = cached
                else:
                    wanted.append(job_id)
        unreadable: set[str] = set()
        if not wanted:
            return specs, unreadable

        def fetch(job_id: str) -> tuple[str, CachedSpec | None, bool]:
            with self._lock:
                mine = self._specs.current_for(job_id, stubs[job_id].job_modify_index)
            if mine is not None:
                return job_id, mine, True  # our own write landed since the list
            try:
                spec = self._gateway.get_job(job_id)
            except (NomadUnavailable, NomadAPIError) as exc:
                log.warning("could not read job %s: %s", job_id, exc)
                return job_id, None, False
            return job_id, (CachedSpec.of(job_id, spec) if spec is not None else None), True

        if len(wanted) == 1:
            results = [fetch(wanted[0])]
        else:
            workers = min(self._fetch_concurrency, len(wanted))
            with ThreadPoolExecutor(workers, thread_name_prefix="nrc-fetch") as pool:
                results = list(pool.map(fetch, wanted))
        for job_id, spec, ok in results:
            if spec is not None:
                specs[job_id] = spec
            elif not ok:
                unreadable.add(job_id)
            # ok and None: deleted between the list and the read; it is gone.
        return specs, unreadable


@dataclass(frozen=True)
class _Listed:
    """The jobs of a merged snapshot, as expectations ask about them (without
    copying every runner id into a set on each targeted refresh)."""

    runners: Mapping[str, RunnerView]
    templates: Mapping[int, Template]

    def __contains__(self, job_id: object) -> bool:
        if not isinstance(job_id, str):
            return False
        env_id = jobs.template_env_id(job_id)
        return job_id in self.runners if env_id is None else env_id in self.templates


def _with_spec(snap: Snapshot, job_id: str, spec: JsonDict, cached: CachedSpec) -> Snapshot:
    """The snapshot showing a spec we wrote."""
    env_id = jobs.template_env_id(job_id)
    if env_id is not None:
        return snapshots.with_template(snap, _template(spec, env_id))
    old = snap.runners.get(job_id)
    if cached.runner is None or old is None:
        return snap  # a new runner shows up with the next list (its creation is expected)
    # Status is not part of the spec: the view keeps the one the list showed.
    runner = replace(cached.runner, status=old.job.status)
    return snapshots.with_runner(snap, derive_runner(runner, snap.allocs.get(job_id, ())))


def _without(snap: Snapshot, job_id: str) -> Snapshot:
    """The snapshot without a job we deleted."""
    env_id = jobs.template_env_id(job_id)
    if env_id is not None:
        return snapshots.without_template(snap, env_id)
    return snapshots.without_runner(snap, job_id)


def _template(spec: JsonDict, env_id: int) -> Template:
    return Template(jobs.environment_from_job(spec, env_id), jobs.modify_index(spec), spec)


def _unknown(stub: JobStub, env_id: int, allocs: tuple[Allocation, ...]) -> RunnerView:
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
