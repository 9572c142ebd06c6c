"""observe: reads Nomad's jobs and allocations and keeps an immutable snapshot
of every environment and runner, shared by all passes (an informer cache).

- One refresh serves every environment: passes triggered by the same burst of
  events reuse it (`covers` says up to which event index it is fresh).
- A *full* refresh lists every job and allocation of the namespace; job specs
  are cached by JobModifyIndex, so only new or changed jobs are fetched. It
  runs first, whenever no event stream feeds the observer, after the stream
  (re)connects (events may have been missed meanwhile), when many jobs changed
  at once, and at least every `full_relist_s` as a safety net.
- Otherwise a refresh is *targeted*: events name the jobs whose job or
  allocations changed, and only those are read again, with lists filtered to
  them (`ID == ...`, `JobID == ...`); a named job the list no longer shows was
  deleted. Nothing else is read, so a refresh with nothing changed costs
  nothing, whatever the number of runners. Events still carry no decision:
  they only say which jobs to look at, and the look is a read of Nomad.
- A view is derived again only when its job or one of its allocations
  changed (cached by JobModifyIndex, status and allocation ModifyIndexes).
- A list whose index is older than one already seen (a follower's stale read)
  is discarded, never allowed to move the snapshot backwards; a targeted read
  that is older than the events that named its jobs keeps them to be read again.
- A spec that cannot be read makes the snapshot unsafe: that runner counts
  towards its pool but nothing is deleted in that pass.
- Our own writes are applied to the snapshot at once (`apply_spec`, `forget`),
  so a claim is visible to the next claimer before any list shows it.
- Specs are kept as compressed JSON (about 1 KB a runner instead of about
  16 KB of dicts), which keeps memory and garbage-collection work small at
  10,000 runners.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from controller.clock import Clock
from controller.metrics import Metrics
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
from controller.reconcile.expectations import Expectations

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


@dataclass(frozen=True)
class Snapshot:
    templates: Mapping[int, Template]
    runners: Mapping[str, RunnerView]
    allocs: Mapping[str, tuple[Allocation, ...]]  # runner job id → all its allocations
    jobs_index: int
    allocs_index: int
    covers: int  # every event up to this index happened before the lists were taken
    taken_at: float  # monotonic
    safe: bool = True
    by_env: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    # Per environment: its ready, idle, known runners, oldest (CreateIndex) first.
    ready: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def env_ids(self) -> set[int]:
        return set(self.templates) | set(self.by_env)

    def views(self, env_id: int) -> tuple[RunnerView, ...]:
        return tuple(self.runners[r] for r in self.by_env.get(env_id, ()))

    def claimable(self, env_id: int) -> Iterator[RunnerView]:
        """The environment's ready idle runners, oldest first (kept in order as
        the snapshot changes, so a claim does not sort the pool)."""
        for runner_id in self.ready.get(env_id, ()):
            yield self.runners[runner_id]


EMPTY = Snapshot({}, {}, {}, 0, 0, 0, 0.0)


def _index_by_env(runners: Mapping[str, RunnerView]) -> dict[int, tuple[str, ...]]:
    out: dict[int, list[str]] = defaultdict(list)
    for view in runners.values():
        out[view.env_id].append(view.id)
    return {env: tuple(ids) for env, ids in out.items()}


def _claimable(view: RunnerView) -> bool:
    return view.phase is Phase.READY and view.known and not view.claimed


def _age(view: RunnerView) -> tuple[int, str]:
    return (view.job.create_index, view.id)


def _index_ready(runners: Mapping[str, RunnerView]) -> dict[int, tuple[str, ...]]:
    out: dict[int, list[RunnerView]] = defaultdict(list)
    for view in runners.values():
        if _claimable(view):
            out[view.env_id].append(view)
    return {env: tuple(v.id for v in sorted(views, key=_age)) for env, views in out.items()}


def _update_ready(
    ready: Mapping[int, tuple[str, ...]],
    runners: Mapping[str, RunnerView],
    changed: Iterable[str],
) -> dict[int, tuple[str, ...]]:
    """`ready` after the runners `changed` changed, appeared or went away."""
    by_env: dict[int, list[str]] = defaultdict(list)
    for runner_id in changed:
        env_id = jobs.runner_env_id(runner_id)
        if env_id is not None:
            by_env[env_id].append(runner_id)
    out = dict(ready)
    for env_id, ids in by_env.items():
        current = list(out.get(env_id, ()))
        gone = set(ids)
        if len(ids) == 1:
            if ids[0] in current:
                current.remove(ids[0])
        elif not gone.isdisjoint(current):
            current = [r for r in current if r not in gone]
        for runner_id in ids:
            view = runners.get(runner_id)
            if view is not None and _claimable(view):
                bisect.insort(current, runner_id, key=lambda r: _age(runners[r]))
        if current:
            out[env_id] = tuple(current)
        else:
            out.pop(env_id, None)
    return out


@dataclass(frozen=True)
class _Spec:
    """A cached job spec: its JobModifyIndex and its compressed JSON (decoded
    on demand: a claim reads one spec, a pass none)."""

    jmi: int
    data: bytes
    runner: RunnerJob | None  # parsed once, for runner jobs (status from the list)

    def decode(self) -> JsonDict:
        spec: JsonDict = json.loads(zlib.decompress(self.data))
        return spec


@dataclass
class _Dirty:
    """Event indexes that named a job since it was last read: the newest of
    its job, the newest of its allocations, and the oldest of all."""

    job: int = 0
    allocs: int = 0
    first: int = 0

    def note(self, index: int, is_job: bool) -> None:
        if is_job:
            self.job = max(self.job, index)
        else:
            self.allocs = max(self.allocs, index)
        self.first = min(self.first, index) if self.first else index

    def merge(self, other: _Dirty) -> None:
        self.job = max(self.job, other.job)
        self.allocs = max(self.allocs, other.allocs)
        firsts = [f for f in (self.first, other.first) if f]
        self.first = min(firsts) if firsts else 0


class Observer:
    def __init__(
        self,
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
        self._refresh_lock = threading.Lock()  # one refresh at a time
        self._lock = threading.Lock()  # guards the fields below
        self._heard = threading.Condition(self._lock)  # an event frame was noted
        self._snapshot = EMPTY
        self._specs: dict[str, _Spec] = {}
        # Derived views and what they were derived from.
        self._derived: dict[str, tuple[tuple[Any, ...], RunnerView]] = {}
        self._wanted = 0  # newest event index heard of
        self._dirty: dict[str, _Dirty] = {}  # jobs named by events since the last refresh
        self._stream_connected = False
        self._full_wanted = True  # a full refresh must come next
        self._last_full = float("-inf")
        self._full_indexes = (-1, -1)  # list indexes of the last full refresh
        # Our writes since the current refresh began: the lists it is reading
        # may predate them, so they are laid over its result.
        self._writes: dict[str, JsonDict | None] = {}
        self._observed_once = False
        self.last_error: str | None = None  # why the last refresh failed; None after a success
        self.refreshes = {"full": 0, "targeted": 0, "unchanged": 0}

    # -- what passes and claims read --------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    @property
    def observed_once(self) -> bool:
        return self._observed_once

    def spec(self, job_id: str) -> JsonDict | None:
        """The newest spec we know of the job (a fresh copy)."""
        with self._lock:
            cached = self._specs.get(job_id)
        return cached.decode() if cached is not None else None

    def note_event_index(self, index: int, events: Iterable[Mapping[str, Any]] = ()) -> None:
        """An event frame was received; `events` name the jobs to read again."""
        named: list[tuple[str, bool]] = []
        for event in events:
            topic = event.get("Topic")
            if topic == "Job":
                job_id = str(event.get("Key") or "")
                is_job = True
            elif topic == "Allocation":
                payload = event.get("Payload") or {}
                alloc = payload.get("Allocation") if isinstance(payload, Mapping) else None
                job_id = str((alloc or {}).get("JobID") or "") if isinstance(alloc, Mapping) else ""
                is_job = False
            else:
                continue  # evaluations and nodes change nothing we read
            if jobs.env_id_of(job_id) is not None:
                named.append((job_id, is_job))
        with self._lock:
            for job_id, is_job in named:
                self._dirty.setdefault(job_id, _Dirty()).note(index, is_job)
            self._wanted = max(self._wanted, index)
            self._heard.notify_all()

    def reread(self, job_ids: Collection[str]) -> Snapshot:
        """Read these jobs and their allocations from Nomad now, whether or not
        events named them: an answer about a runner that must not come from a
        view older than what the runner itself just showed (a file operation
        that may have met a reset file system). Raises as `refresh`."""
        with self._lock:
            for job_id in job_ids:
                dirty = self._dirty.setdefault(job_id, _Dirty())
                dirty.note(0, True)
                dirty.note(0, False)
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
            with self._heard:
                if not self._observed_once or self._snapshot.covers >= self._wanted:
                    self._heard.wait(0.25)
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

    def set_stream_connected(self, connected: bool) -> None:
        """Whether an event stream feeds `note_event_index`. Without one every
        refresh is full; after a (re)connection the next one is."""
        with self._lock:
            if connected and not self._stream_connected:
                self._full_wanted = True
            self._stream_connected = connected

    def current(self, max_age_s: float | None = None) -> Snapshot:
        """A snapshot fresh for every event heard of so far (refreshing if needed)."""
        with self._lock:
            snap, wanted = self._snapshot, self._wanted
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
        entry = _entry(job_id, spec)
        with self._lock:
            cached = self._specs.get(job_id)
            if cached is not None and cached.jmi > entry.jmi:
                return
            self._specs[job_id] = entry
            self._writes[job_id] = spec
            self._snapshot = _with_spec(self._snapshot, job_id, spec, entry)

    def forget(self, job_id: str) -> None:
        """A job we just deleted."""
        with self._lock:
            self._specs.pop(job_id, None)
            self._writes[job_id] = None
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
        with self._lock:
            covers = self._wanted
            prev = self._snapshot
            dirty, self._dirty = self._dirty, {}
            full = (
                not self._observed_once
                or self._scoped is None
                or not self._stream_connected
                or self._full_wanted
                or started - self._last_full >= self._full_relist_s
                or len(dirty) > max(TARGETED_MAX_JOBS, len(prev.runners) // 4)
            )
            if full:
                self._full_wanted = False
            self._writes = {}
        try:
            if full:
                snap = self._observe_full(prev, covers, started, dirty)
            else:
                snap = self._observe_targeted(prev, covers, dirty)
        except BaseException:
            self._restore(dirty)
            if full:
                with self._lock:
                    self._full_wanted = True
            raise
        self._metrics.observe_seconds.observe(self._clock.monotonic() - started)
        return snap

    def _restore(self, dirty: Mapping[str, _Dirty]) -> None:
        """Jobs a refresh could not settle are read again next time."""
        with self._lock:
            for job_id, old in dirty.items():
                self._dirty.setdefault(job_id, _Dirty()).merge(old)

    def _observe_full(
        self, prev: Snapshot, covers: int, started: float, dirty: Mapping[str, _Dirty]
    ) -> Snapshot:
        job_list = self._gateway.list_jobs()
        alloc_list = self._list_allocations(prev)
        if self._stale(prev, job_list, alloc_list) or self._behind(dirty, job_list, alloc_list):
            self._restore(dirty)
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
                self._last_full = started
            self._expectations.observe(frozenset(prev.runners), job_list.index)
            self.refreshes["unchanged"] += 1
            return snap
        stubs = {s.id: s for s in job_list.jobs if jobs.env_id_of(s.id) is not None}
        self._expectations.observe(frozenset(stubs), job_list.index)
        specs, unreadable = self._fetch_changed(stubs)
        allocs: dict[str, list[Allocation]] = defaultdict(list)
        for alloc in alloc_list.allocations:
            if alloc.job_id in stubs:
                allocs[alloc.job_id].append(alloc)
        templates: dict[int, Template] = {}
        runners: dict[str, RunnerView] = {}
        all_allocs = {j: tuple(a) for j, a in allocs.items()}
        for job_id, stub in stubs.items():
            view = self._derive(job_id, stub, specs.get(job_id), all_allocs.get(job_id, ()))
            if isinstance(view, Template):
                templates[view.env.id] = view
            elif view is not None:
                runners[job_id] = view
        snap = Snapshot(
            templates=templates,
            runners=runners,
            allocs=all_allocs,
            jobs_index=job_list.index,
            allocs_index=alloc_list.index,
            covers=covers,
            taken_at=self._clock.monotonic(),
            safe=not unreadable,
            by_env=_index_by_env(runners),
            ready=_index_ready(runners),
        )
        self._derived = {j: d for j, d in self._derived.items() if j in runners}
        with self._lock:
            # Keep specs we wrote meanwhile if they are newer than what we read.
            for job_id, entry in specs.items():
                mine = self._specs.get(job_id)
                if mine is None or mine.jmi <= entry.jmi:
                    self._specs[job_id] = entry
            for job_id in list(self._specs):
                if job_id not in stubs:
                    del self._specs[job_id]
            snap = self._lay_writes(snap, specs)
            self._snapshot = snap
            self._observed_once = True
            self._last_full = started
            self._full_indexes = (job_list.index, alloc_list.index)
        if unreadable:
            # Read again by the next refresh, targeted ones too: not only by
            # the next full one, minutes away while events flow.
            self._restore({j: _Dirty(job=job_list.index, first=job_list.index) for j in unreadable})
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

    def _observe_targeted(
        self, prev: Snapshot, covers: int, dirty: Mapping[str, _Dirty]
    ) -> Snapshot:
        assert self._scoped is not None
        if not dirty:
            # Nothing was named since the last refresh: nothing to read.
            with self._lock:
                snap = replace(self._snapshot, covers=covers, taken_at=self._clock.monotonic())
                self._snapshot = snap
            self.refreshes["unchanged"] += 1
            return snap
        ids = sorted(dirty)
        job_list = self._scoped.list_jobs_by_id(ids)
        alloc_list = self._scoped.list_allocations_of_jobs(ids)
        if self._stale(prev, job_list, alloc_list):
            self._restore(dirty)
            return prev
        # Jobs named by events newer than these lists (a lagging follower)
        # cannot be judged from them: they keep their state and are read again.
        behind = self._behind(dirty, job_list, alloc_list)
        if behind:
            self._restore(behind)
            # Not fresh from the oldest event about them on: in particular no
            # creation or deletion of theirs is settled by this read.
            covers = min(covers, min(d.first for d in behind.values()) - 1)
            ids = [j for j in ids if j not in behind]
        wanted = set(ids)
        stubs = {s.id: s for s in job_list.jobs if s.id in wanted}
        specs, unreadable = self._fetch_changed(stubs)
        allocs: dict[str, list[Allocation]] = defaultdict(list)
        for alloc in alloc_list.allocations:
            if alloc.job_id in stubs:
                allocs[alloc.job_id].append(alloc)
        with self._lock:
            # Built on the current snapshot: it holds our writes since `prev`.
            base = self._snapshot
        templates = dict(base.templates)
        runners = dict(base.runners)
        all_allocs = dict(base.allocs)
        membership_changed = False
        for job_id in ids:
            stub = stubs.get(job_id)
            if stub is None:
                # Named by an event and no longer listed: the job is gone.
                env_id = jobs.template_env_id(job_id)
                if env_id is not None:
                    templates.pop(env_id, None)
                elif runners.pop(job_id, None) is not None:
                    membership_changed = True
                all_allocs.pop(job_id, None)
                continue
            job_allocs = tuple(allocs.get(job_id, ()))
            if job_allocs:
                all_allocs[job_id] = job_allocs
            else:
                all_allocs.pop(job_id, None)
            view = self._derive(job_id, stub, specs.get(job_id), job_allocs)
            if isinstance(view, Template):
                templates[view.env.id] = view
            elif view is not None:
                membership_changed |= job_id not in runners
                runners[job_id] = view
        present = _Listed(runners, templates)
        # Every job an event up to `covers` named has been read: the merged
        # snapshot shows every job as of min(covers, list index).
        certified = min(covers, job_list.index)
        self._expectations.observe(present, certified)
        # A safe snapshot had no unknown runner, and our writes make none: only
        # the jobs read now can be unknown (no scan of every runner).
        still_unknown = any(
            not v.known
            for v in ((runners[j] for j in ids if j in runners) if prev.safe else runners.values())
        )
        snap = Snapshot(
            templates=templates,
            runners=runners,
            allocs=all_allocs,
            jobs_index=max(prev.jobs_index, job_list.index),
            allocs_index=max(prev.allocs_index, alloc_list.index),
            covers=covers,
            taken_at=self._clock.monotonic(),
            safe=not unreadable and not still_unknown,
            by_env=_index_by_env(runners) if membership_changed else base.by_env,
            ready=_update_ready(base.ready, runners, ids),
        )
        with self._lock:
            for job_id in ids:
                if job_id not in stubs:
                    self._specs.pop(job_id, None)
                    self._derived.pop(job_id, None)
            for job_id, entry in specs.items():
                mine = self._specs.get(job_id)
                if mine is None or mine.jmi <= entry.jmi:
                    self._specs[job_id] = entry
            snap = self._lay_writes(snap, specs)
            self._snapshot = snap
        if unreadable:
            self._restore({job_id: dirty[job_id] for job_id in unreadable})
        self.refreshes["targeted"] += 1
        return snap

    def _behind(
        self, dirty: Mapping[str, _Dirty], job_list: JobListing, alloc_list: AllocListing
    ) -> dict[str, _Dirty]:
        """The jobs named by events newer than the lists read: a read answered
        from behind them (a lagging follower) cannot show them yet."""
        behind = {
            job_id: d
            for job_id, d in dirty.items()
            if d.job > job_list.index or d.allocs > alloc_list.index
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

    def _lay_writes(self, snap: Snapshot, specs: Mapping[str, _Spec]) -> Snapshot:
        """Our writes since the refresh began, over its result (under `_lock`)."""
        for job_id, written in self._writes.items():
            if written is None:
                snap = _without(snap, job_id)
                continue
            entry = _entry(job_id, written)
            read = specs.get(job_id)
            if read is None or entry.jmi > read.jmi:
                self._specs[job_id] = entry
                snap = _with_spec(snap, job_id, written, entry)
        return snap

    def _derive(
        self,
        job_id: str,
        stub: JobStub,
        spec: _Spec | None,
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
        # Only the refresh (under `_refresh_lock`) reads and writes `_derived`.
        key = (spec.jmi, stub.status, tuple((a.id, a.modify_index) for a in allocs))
        cached = self._derived.get(job_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        # Status is not part of the spec (it changes without a new
        # JobModifyIndex): it comes from the list.
        view = derive_runner(replace(spec.runner, status=stub.status), allocs)
        self._derived[job_id] = (key, view)
        return view

    def _fetch_changed(self, stubs: Mapping[str, JobStub]) -> tuple[dict[str, _Spec], set[str]]:
        """Specs of the listed jobs: cached ones reused, new or changed ones fetched."""
        with self._lock:
            cached = {j: self._specs.get(j) for j in stubs}
        specs: dict[str, _Spec] = {}
        wanted: list[str] = []
        for job_id, stub in stubs.items():
            spec = cached.get(job_id)
            if spec is not None and spec.jmi >= stub.job_modify_index:
                specs[job_id] = spec
            else:
                wanted.append(job_id)
        unreadable: set[str] = set()
        if not wanted:
            return specs, unreadable

        def fetch(job_id: str) -> tuple[str, _Spec | None, bool]:
            with self._lock:
                mine = self._specs.get(job_id)
            if mine is not None and mine.jmi >= stubs[job_id].job_modify_index:
                return job_id, mine, True  # our own write landed since the list
            try:
                spec = self._gateway.get_job(job_id)
            except (NomadUnavailable, NomadAPIError) as exc:
                log.warning("could not read job %s: %s", job_id, exc)
                return job_id, None, False
            return job_id, (_entry(job_id, spec) if spec is not None else None), True

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


def _entry(job_id: str, spec: JsonDict) -> _Spec:
    env_id = jobs.runner_env_id(job_id)
    runner = jobs.runner_from_job(spec, env_id) if env_id is not None else None
    data = zlib.compress(json.dumps(spec, separators=(",", ":")).encode(), 1)
    return _Spec(_jmi(spec), data, runner)


def _with_spec(snap: Snapshot, job_id: str, spec: JsonDict, entry: _Spec) -> Snapshot:
    env_id = jobs.template_env_id(job_id)
    if env_id is not None:
        return replace(snap, templates={**snap.templates, env_id: _template(spec, env_id)})
    old = snap.runners.get(job_id)
    if entry.runner is None or old is None:
        return snap  # a new runner shows up with the next list (its creation is expected)
    runner = replace(entry.runner, status=old.job.status, stop=bool(spec.get("Stop")))
    view = derive_runner(runner, snap.allocs.get(job_id, ()))
    runners = {**snap.runners, job_id: view}
    return replace(snap, runners=runners, ready=_update_ready(snap.ready, runners, (job_id,)))


def _without(snap: Snapshot, job_id: str) -> Snapshot:
    env_id = jobs.template_env_id(job_id)
    if env_id is not None and env_id in snap.templates:
        templates = dict(snap.templates)
        del templates[env_id]
        return replace(snap, templates=templates)
    view = snap.runners.get(job_id)
    if view is not None:
        runners = dict(snap.runners)
        del runners[job_id]
        by_env = dict(snap.by_env)
        left = tuple(r for r in by_env.get(view.env_id, ()) if r != job_id)
        if left:
            by_env[view.env_id] = left
        else:
            by_env.pop(view.env_id, None)
        ready = _update_ready(snap.ready, runners, (job_id,))
        return replace(snap, runners=runners, by_env=by_env, ready=ready)
    return snap


def _jmi(spec: JsonDict) -> int:
    return int(spec.get("JobModifyIndex") or 0)


def _template(spec: JsonDict, env_id: int) -> Template:
    return Template(jobs.environment_from_job(spec, env_id), _jmi(spec), spec)


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
