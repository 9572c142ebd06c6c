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
- Both kinds share one build step (`JobReader.read`, in `reads`): fetch the specs that
  changed, derive the views whose job or allocations changed (cached by
  JobModifyIndex, status and allocation ModifyIndexes), and hand the result
  to `snapshot.rebuilt` or `snapshot.merged`.
- A list whose index is older than one already seen (a follower's stale read)
  is discarded, never allowed to move the snapshot backwards; a targeted read
  that is older than the events that named its jobs keeps them to be read again.
- A spec that cannot be read makes the snapshot unsafe: that runner counts
  towards its pool but nothing is deleted in that pass. A spec read that
  finds the job deleted (after the list) leaves it out, as if not listed.
- Our own writes are applied to the snapshot at once (`apply_spec`, `forget`),
  so a claim is visible to the next claimer before any list shows it; a
  refresh that began before a write lays the write over its result. A
  creation's spec is only cached (`remember_created`): the job shows once a
  list shows it, and its spec is not read back.
- Expectations are settled in the same step (under the lock) as the snapshot
  that shows what settled them is installed, and a pass reads both together
  (`snapshot_and_pending`): a creation is counted by the snapshot or as
  pending, never by neither (over-creation) nor by both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from controller.clock import Clock
from controller.metrics import Metrics
from controller.model import RunnerView, Template
from controller.nomad import jobs
from controller.nomad.events import EventRef
from controller.nomad.gateway import (
    AllocListing,
    JobListing,
    NomadGateway,
)
from controller.reconcile import snapshot as snapshots
from controller.reconcile.derive import derive_runner
from controller.reconcile.expectations import Expectations, Pending
from controller.reconcile.heard import Heard, Mentions, Named
from controller.reconcile.reads import TARGETED_MAX_JOBS, JobReader, template_of
from controller.reconcile.snapshot import EMPTY, Snapshot
from controller.reconcile.specs import CachedSpec, Dictionaries, SpecCache, compact

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]

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
        self._clock = clock
        self._expectations = expectations
        self._metrics = metrics
        self._full_relist_s = full_relist_s
        self._heard = Heard()
        self._refresh_lock = threading.Lock()  # one refresh at a time
        self._lock = threading.Lock()  # guards the fields below
        self._snapshot = EMPTY
        self._specs = SpecCache()
        self._dictionaries = Dictionaries()
        self._reader = JobReader(
            gateway=gateway,
            current_specs=self._current_specs,
            dictionaries=self._dictionaries,
            fetch_concurrency=fetch_concurrency,
        )
        self._stream_connected = False
        self._full_wanted = True  # a full refresh must come next
        self._last_full = float("-inf")
        self._full_indexes = (-1, -1)  # list indexes of the last full refresh
        # Our writes since the current refresh began: the lists it is reading
        # may predate them, so they are laid over its result (None: deleted).
        self._writes_meanwhile: dict[str, tuple[JsonDict, CachedSpec] | None] = {}
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
        """An event frame was received; `events` name the jobs to read again.
        A Job event no newer than the spec we hold, about a job the snapshot
        shows, is our own write coming back (`SpecWriter` put the spec it
        wrote, with its JobModifyIndex, in the cache): nothing in it is new,
        so it names nothing to read. A job we created is not shown until a
        list shows it, so its Job event still names it."""
        with self._lock:
            fresh = [
                e
                for e in events
                if not (
                    e.topic == "Job"
                    and e.job_id
                    and self._specs.current_for(e.job_id, index) is not None
                    and self._shown(e.job_id)
                )
            ]
        self._heard.note(index, fresh)

    def _shown(self, job_id: str) -> bool:
        """Whether the snapshot shows the job (a runner, or a template)."""
        if job_id in self._snapshot.runners:
            return True
        env_id = jobs.template_env_id(job_id)
        return env_id is not None and env_id in self._snapshot.templates

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

    def _current_specs(self, listed: Mapping[str, int]) -> dict[str, CachedSpec]:
        """Of the jobs `listed` (id → the JobModifyIndex a list shows), those
        cached at least that new: they need not be read again."""
        with self._lock:
            return {
                job_id: cached
                for job_id, index in listed.items()
                if (cached := self._specs.current_for(job_id, index)) is not None
            }

    def _fresh(self, snap: Snapshot, wanted: int, max_age_s: float | None) -> bool:
        if not self._observed_once or snap.covers < wanted:
            return False
        return max_age_s is None or self._clock.monotonic() - snap.taken_at <= max_age_s

    # -- our own writes -----------------------------------------------------------

    def apply_spec(self, job_id: str, spec: JsonDict) -> None:
        """A spec we just wrote (with its new JobModifyIndex). Cached plain:
        a claim writes on the event loop (see `controller.reconcile.specs`)."""
        cached = CachedSpec.of(job_id, spec, compress=False)
        with self._lock:
            if not self._specs.put_if_newer(job_id, cached):
                return
            self._writes_meanwhile[job_id] = (spec, cached)
            self._snapshot = _with_spec(self._snapshot, job_id, spec, cached)

    def remember_created(self, job_id: str, spec: JsonDict) -> None:
        """The spec of a job we just created (with its JobModifyIndex), so the
        refresh that first lists the job need not read it back (one read of
        Nomad per creation). Unlike `apply_spec` the job is not shown: a
        creation counts as pending until a list shows it (the expectations),
        never both as pending and as a runner."""
        cached = CachedSpec.of(job_id, spec, dictionaries=self._dictionaries)
        with self._lock:
            self._specs.put_if_newer(job_id, cached)

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
        self._compact_specs()
        return snap

    def _compact_specs(self) -> None:
        """Compress the specs our writes cached plain since the last refresh."""
        with self._lock:
            plain = self._specs.plain_entries()
        if not plain:
            return
        compacted = compact(plain, self._dictionaries)
        with self._lock:
            for job_id, (old, new) in compacted.items():
                self._specs.replace_unchanged(job_id, old, new)

    def _observe(self) -> Snapshot:
        started = self._clock.monotonic()
        covers, named = self._heard.take()
        with self._lock:
            prev = self._snapshot
            full = (
                not self._observed_once
                or self._reader.scoped is None
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
        alloc_list = self._reader.list_allocations(prev, self._observed_once)
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
        result = self._reader.read(stubs, stubs, alloc_list)
        snap = snapshots.rebuilt(
            result.read,
            jobs_index=job_list.index,
            allocs_index=alloc_list.index,
            covers=covers,
            taken_at=self._clock.monotonic(),
            safe=not result.unreadable,
        )
        self._reader.keep_only(snap.runners)
        listed_envs = {v.env_id for v in snap.runners.values()}
        with self._lock:
            self._specs.keep_only(stubs)
            self._dictionaries.keep_only(listed_envs)
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

    def _observe_targeted(self, prev: Snapshot, covers: int, named: Named) -> Snapshot:
        scoped = self._reader.scoped
        assert scoped is not None
        if not named:
            # Nothing was named since the last refresh: nothing to read.
            with self._lock:
                snap = replace(self._snapshot, covers=covers, taken_at=self._clock.monotonic())
                self._snapshot = snap
            self.refreshes["unchanged"] += 1
            return snap
        ids = sorted(named)
        job_list = scoped.list_jobs_by_id(ids)
        alloc_list = scoped.list_allocations_of_jobs(ids)
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
        result = self._reader.read(ids, stubs, alloc_list)
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
                if job_id not in stubs or job_id in result.vanished:
                    self._specs.drop(job_id)
                    self._reader.forget([job_id])
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

    def _install(self, snap: Snapshot, specs: Mapping[str, CachedSpec]) -> Snapshot:
        """Make `snap` the snapshot, with the specs read into the cache and our
        writes since the refresh began laid over both (under `_lock`)."""
        for job_id, cached in specs.items():
            self._specs.put_if_newer(job_id, cached)
        for job_id, write in self._writes_meanwhile.items():
            if write is None:
                snap = _without(snap, job_id)
                continue
            written, cached = write
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
        return snapshots.with_template(snap, template_of(spec, env_id))
    old = snap.runners.get(job_id)
    if cached.runner is None or old is None:
        return snap  # a new runner shows up with the next list (its creation is expected)
    # Status is not part of the spec, nor is the job's CreateIndex (a spec we
    # write carries no server fields): the view keeps what the list showed.
    runner = replace(cached.runner, status=old.job.status, create_index=old.job.create_index)
    return snapshots.with_runner(snap, derive_runner(runner, snap.allocs.get(job_id, ())))


def _without(snap: Snapshot, job_id: str) -> Snapshot:
    """The snapshot without a job we deleted."""
    env_id = jobs.template_env_id(job_id)
    if env_id is not None:
        return snapshots.without_template(snap, env_id)
    return snapshots.without_runner(snap, job_id)
