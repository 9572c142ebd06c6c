"""observe: lists Nomad's jobs and allocations and keeps an immutable snapshot
of every environment and runner, shared by all passes (an informer cache).

- One refresh serves every environment: passes triggered by the same burst of
  events reuse it (`covers` says up to which event index it is fresh).
- Job specs are cached by JobModifyIndex: only new or changed jobs are fetched.
- A list whose index is older than one already seen (a follower's stale read)
  is discarded, never allowed to move the snapshot backwards.
- A spec that cannot be read makes the snapshot unsafe: that runner counts
  towards its pool but nothing is deleted in that pass.
- Our own writes are applied to the snapshot at once (`apply_spec`, `forget`),
  so a claim is visible to the next claimer before any list shows it.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from controller.clock import Clock
from controller.metrics import Metrics
from controller.model import Allocation, Phase, RunnerJob, RunnerView, Template
from controller.nomad import jobs
from controller.nomad.gateway import JobStub, NomadAPIError, NomadGateway, NomadUnavailable
from controller.reconcile.derive import derive_runner
from controller.reconcile.expectations import Expectations

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]


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

    def env_ids(self) -> set[int]:
        return set(self.templates) | set(self.by_env)

    def views(self, env_id: int) -> tuple[RunnerView, ...]:
        return tuple(self.runners[r] for r in self.by_env.get(env_id, ()))


EMPTY = Snapshot({}, {}, {}, 0, 0, 0, 0.0)


def _index_by_env(runners: Mapping[str, RunnerView]) -> dict[int, tuple[str, ...]]:
    out: dict[int, list[str]] = defaultdict(list)
    for view in runners.values():
        out[view.env_id].append(view.id)
    return {env: tuple(ids) for env, ids in out.items()}


class Observer:
    def __init__(
        self,
        gateway: NomadGateway,
        clock: Clock,
        expectations: Expectations,
        metrics: Metrics,
        fetch_concurrency: int = 8,
    ) -> None:
        self._gateway = gateway
        self._clock = clock
        self._expectations = expectations
        self._metrics = metrics
        self._fetch_concurrency = fetch_concurrency
        self._refresh_lock = threading.Lock()  # one refresh at a time
        self._lock = threading.Lock()  # guards the fields below
        self._snapshot = EMPTY
        self._specs: dict[str, JsonDict] = {}
        self._wanted = 0  # newest event index heard of
        # Our writes since the current refresh began: the lists it is reading
        # may predate them, so they are laid over its result.
        self._writes: dict[str, JsonDict | None] = {}
        self._observed_once = False
        self.last_error: str | None = None  # why the last refresh failed; None after a success

    # -- what passes and claims read --------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    @property
    def observed_once(self) -> bool:
        return self._observed_once

    def spec(self, job_id: str) -> JsonDict | None:
        with self._lock:
            return self._specs.get(job_id)

    def note_event_index(self, index: int) -> None:
        with self._lock:
            self._wanted = max(self._wanted, index)

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
            return self._refresh_locked()

    def _fresh(self, snap: Snapshot, wanted: int, max_age_s: float | None) -> bool:
        if not self._observed_once or snap.covers < wanted:
            return False
        return max_age_s is None or self._clock.monotonic() - snap.taken_at <= max_age_s

    # -- our own writes -----------------------------------------------------------

    def apply_spec(self, job_id: str, spec: JsonDict) -> None:
        """A spec we just wrote (with its new JobModifyIndex)."""
        with self._lock:
            cached = self._specs.get(job_id)
            if cached is not None and _jmi(cached) > _jmi(spec):
                return
            self._specs[job_id] = spec
            self._writes[job_id] = spec
            self._snapshot = _with_spec(self._snapshot, job_id, spec)

    def forget(self, job_id: str) -> None:
        """A job we just deleted."""
        with self._lock:
            self._specs.pop(job_id, None)
            self._writes[job_id] = None
            self._snapshot = _without(self._snapshot, job_id)

    # -- refresh ------------------------------------------------------------------

    def refresh(self) -> Snapshot:
        """List jobs and allocations and rebuild the snapshot. Raises
        NomadUnavailable / NomadAPIError when a list fails (the pass retries)."""
        with self._refresh_lock:
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
        with self._lock:
            covers = self._wanted
            prev = self._snapshot
            self._writes = {}
        started = self._clock.monotonic()
        job_list = self._gateway.list_jobs()
        alloc_list = self._gateway.list_allocations()
        if (
            self._observed_once
            and prev.safe
            and (job_list.index, alloc_list.index)
            == (
                prev.jobs_index,
                prev.allocs_index,
            )
        ):
            # Nothing changed since the last look (the indexes say so): keep
            # the derived snapshot, only note that it is fresh.
            with self._lock:
                # The current snapshot, not `prev`: it has our writes since.
                snap = replace(self._snapshot, covers=covers, taken_at=self._clock.monotonic())
                self._snapshot = snap
            self._expectations.observe(frozenset(prev.runners), job_list.index)
            return snap
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
            return prev
        stubs = {s.id: s for s in job_list.jobs if jobs.env_id_of(s.id) is not None}
        self._expectations.observe(frozenset(stubs), job_list.index)
        specs, unreadable = self._fetch_changed(stubs)
        allocs: dict[str, list[Allocation]] = defaultdict(list)
        for alloc in alloc_list.allocations:
            if alloc.job_id in stubs:
                allocs[alloc.job_id].append(alloc)
        templates: dict[int, Template] = {}
        runners: dict[str, RunnerView] = {}
        for job_id, stub in stubs.items():
            env_id = jobs.template_env_id(job_id)
            spec = specs.get(job_id)
            if env_id is not None:
                if spec is not None:
                    templates[env_id] = _template(spec, env_id)
                continue
            env_id = jobs.runner_env_id(job_id)
            assert env_id is not None
            runner_allocs = tuple(allocs.get(job_id, ()))
            if spec is None:
                runners[job_id] = _unknown(stub, env_id, runner_allocs)
                continue
            runner = jobs.runner_from_job(spec, env_id)
            # Status is not part of the spec (it changes without a new
            # JobModifyIndex): it comes from the list.
            runner = replace(runner, status=stub.status)
            runners[job_id] = derive_runner(runner, runner_allocs)
        snap = Snapshot(
            templates=templates,
            runners=runners,
            allocs={j: tuple(a) for j, a in allocs.items()},
            jobs_index=job_list.index,
            allocs_index=alloc_list.index,
            covers=covers,
            taken_at=self._clock.monotonic(),
            safe=not unreadable,
            by_env=_index_by_env(runners),
        )
        with self._lock:
            # Keep specs we wrote meanwhile if they are newer than what we read.
            for job_id, spec in specs.items():
                mine = self._specs.get(job_id)
                if mine is None or _jmi(mine) <= _jmi(spec):
                    self._specs[job_id] = spec
            for job_id in list(self._specs):
                if job_id not in stubs:
                    del self._specs[job_id]
            for job_id, written in self._writes.items():
                if written is None:
                    snap = _without(snap, job_id)
                elif _jmi(written) > _jmi(specs.get(job_id) or {}):
                    self._specs[job_id] = written
                    snap = _with_spec(snap, job_id, written)
            self._snapshot = snap
            self._observed_once = True
        self._metrics.observe_seconds.observe(self._clock.monotonic() - started)
        return snap

    def _fetch_changed(self, stubs: Mapping[str, JobStub]) -> tuple[dict[str, JsonDict], set[str]]:
        """Specs of all listed jobs: cached ones reused, new or changed ones fetched."""
        with self._lock:
            cached = dict(self._specs)
        specs: dict[str, JsonDict] = {}
        wanted: list[str] = []
        for job_id, stub in stubs.items():
            spec = cached.get(job_id)
            if spec is not None and _jmi(spec) >= stub.job_modify_index:
                specs[job_id] = spec
            else:
                wanted.append(job_id)
        unreadable: set[str] = set()
        if not wanted:
            return specs, unreadable

        def fetch(job_id: str) -> tuple[str, JsonDict | None, bool]:
            try:
                return job_id, self._gateway.get_job(job_id), True
            except (NomadUnavailable, NomadAPIError) as exc:
                log.warning("could not read job %s: %s", job_id, exc)
                return job_id, None, False

        workers = min(self._fetch_concurrency, len(wanted))
        with ThreadPoolExecutor(workers, thread_name_prefix="nrc-fetch") as pool:
            for job_id, spec, ok in pool.map(fetch, wanted):
                if spec is not None:
                    specs[job_id] = spec
                elif not ok:
                    unreadable.add(job_id)
                # ok and None: deleted between the list and the read; it is gone.
        return specs, unreadable


def _with_spec(snap: Snapshot, job_id: str, spec: JsonDict) -> Snapshot:
    env_id = jobs.template_env_id(job_id)
    if env_id is not None:
        return replace(snap, templates={**snap.templates, env_id: _template(spec, env_id)})
    env_id = jobs.runner_env_id(job_id)
    old = snap.runners.get(job_id)
    if env_id is None or old is None:
        return snap  # a new runner shows up with the next list (its creation is expected)
    runner = replace(
        jobs.runner_from_job(spec, env_id), status=old.job.status, stop=bool(spec.get("Stop"))
    )
    view = derive_runner(runner, snap.allocs.get(job_id, ()))
    return replace(snap, runners={**snap.runners, job_id: view})


def _without(snap: Snapshot, job_id: str) -> Snapshot:
    env_id = jobs.template_env_id(job_id)
    if env_id is not None and env_id in snap.templates:
        templates = dict(snap.templates)
        del templates[env_id]
        return replace(snap, templates=templates)
    if job_id in snap.runners:
        runners = dict(snap.runners)
        del runners[job_id]
        return replace(snap, runners=runners, by_env=_index_by_env(runners))
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
