"""The controller: a work queue of environment ids fed by Nomad events, API
actions and a resync timer; workers that observe → derive → plan → act one
environment at a time; claims; optional leader election.

Events never carry a decision: an event only says "look at environment E
again" (a Node event: look at all of them). Each pass reads the whole
observed state and the controller's intent, so events that arrive late,
twice, out of order or not at all cannot mislead it; the resync timer covers
lost ones.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.clock import Clock, SystemClock
from controller.logs import log_context
from controller.metrics import CONTROLLER, QUEUE, Metrics
from controller.model import SECOND, Environment, Phase, RunnerView
from controller.nomad import jobs
from controller.nomad.gateway import NomadGateway
from controller.reconcile.act import Actor
from controller.reconcile.claims import Claims, NotLeader, RunnerGuard
from controller.reconcile.expectations import Expectations
from controller.reconcile.leader import LeaderElector
from controller.reconcile.observe import Observer, Snapshot
from controller.reconcile.plan import Budget, PlanInput, PlanSettings, PoolCounts, plan
from controller.reconcile.queue import WorkQueue
from controller.reconcile.ratelimit import TokenBucket

log = logging.getLogger(__name__)

EVENT_TOPICS = ("Job", "Allocation", "Evaluation", "Node")
FULL_RELIST_EVERY = 10  # resync intervals between full re-lists while events flow
PASS_SPACING_MIN_S = 0.02  # see Controller._space_passes


class EventSource(Protocol):
    def start(self) -> None: ...

    def stop(self, timeout_s: float = 5.0) -> None: ...


# (on_events, on_state, start_index) → an event source; None runs on resyncs alone.
StreamFactory = Callable[
    [Callable[[int, list[dict[str, Any]]], None], Callable[[bool], None], int], EventSource
]


@dataclass(frozen=True)
class ControllerSettings:
    resync_interval_s: float = 30.0
    workers: int = 4
    write_concurrency: int = 8
    write_rate_per_s: float = 50.0  # <= 0: unlimited
    max_backoff_s: float = 30.0
    expectation_timeout_s: float = 60.0
    leader_election: bool = False
    leader_lock_path: str = "nomad-runner-controller/leader"
    leader_ttl_s: float = 15.0
    plan: PlanSettings = field(default_factory=PlanSettings)


class Controller:
    def __init__(
        self,
        gateway: NomadGateway,
        settings: ControllerSettings | None = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        stream_factory: StreamFactory | None = None,
    ) -> None:
        self.settings = settings or ControllerSettings()
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.gateway = gateway
        s = self.settings
        self.queue: WorkQueue[int] = WorkQueue(self.clock, cap_s=s.max_backoff_s)
        self.expectations = Expectations(self.clock, s.expectation_timeout_s)
        # With events naming what changed, a full re-list every 10th resync is
        # the safety net for whatever an event stream could still miss.
        self.observer = Observer(
            gateway,
            self.clock,
            self.expectations,
            self.metrics,
            full_relist_s=FULL_RELIST_EVERY * s.resync_interval_s,
        )
        self.guard = RunnerGuard()
        self.elector: LeaderElector | None = None
        if s.leader_election:
            self.elector = LeaderElector(
                gateway, s.leader_lock_path, self.clock, s.leader_ttl_s, self._on_leader_change
            )
        self.claims = Claims(
            gateway,
            self.observer,
            self.expectations,
            self.guard,
            self.clock,
            self.metrics,
            self.ready,
            self.enqueue,
        )
        burst = max(1, int(s.write_rate_per_s)) if s.write_rate_per_s > 0 else 1
        self.actor = Actor(
            gateway,
            self.observer,
            self.expectations,
            self.guard,
            self.claims,
            self.clock,
            self.metrics,
            TokenBucket(s.write_rate_per_s, burst, self.clock),
            s.write_concurrency,
            self.is_leader,
        )
        self._pass_ids = itertools.count(1)
        self._stream_factory = stream_factory
        self._stream: EventSource | None = None
        self._stop = threading.Event()
        self._resync_now = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._budgets: dict[int, Budget] = {}
        self._degraded: set[int] = set()
        self._orphan_since: dict[int, int] = {}
        self._seen_ready: set[str] = set()
        self._gauged: set[int] = set()
        # When this replica last became leader; a snapshot older than that may
        # predate the previous leader's last writes, so we do not serve from it.
        self._leader_since = 0.0 if self.elector is None else float("inf")
        self._added_at: dict[int, float] = {}  # when a waiting key was first added
        self._last_pass: dict[int, tuple[float, float]] = {}  # env → (started, seconds)
        self._stream_was_connected = False
        self.passes = 0
        self.metrics.leader.labels(CONTROLLER).set(1 if self.elector is None else 0)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        if self.elector is not None:
            self.elector.start()
        for n in range(self.settings.workers):
            self._spawn(self._work, f"nrc-worker-{n}")
        self._spawn(self._resync, "nrc-resync")
        self._spawn(lambda: self.observer.follow(self._stop, self.is_leader), "nrc-observe")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._resync_now.set()
        self.queue.shutdown()
        if self._stream is not None:
            self._stream.stop()
        for thread in self._threads:
            thread.join(5)
        self.actor.shutdown()
        if self.elector is not None:
            self.elector.stop()

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def ready(self) -> bool:
        """Serving: leading (or no election) and Nomad observed since then."""
        return (
            self.is_leader()
            and self.observer.observed_once
            and self.observer.snapshot.taken_at >= self._leader_since
        )

    def _on_leader_change(self, leader: bool) -> None:
        self.metrics.leader.labels(CONTROLLER).set(1 if leader else 0)
        self._leader_since = self.clock.monotonic() if leader else float("inf")
        if leader:
            self._resync_now.set()
            return
        # Pool gauges describe what the leader sees; a follower exports none
        # rather than numbers frozen at the moment it lost the lock.
        with self._lock:
            gauged, self._gauged = set(self._gauged), set()
        for env_id in gauged:
            self.metrics.drop_environment(env_id)

    # -- triggers -------------------------------------------------------------------

    def enqueue(self, env_id: int) -> None:
        """Ask for a pass over one environment (deduplicated by the queue)."""
        with self._lock:
            self._added_at.setdefault(env_id, self.clock.monotonic())
        self.metrics.queue_adds.labels(QUEUE).inc()
        self.queue.add(env_id)

    def _resync(self) -> None:
        interval = self.settings.resync_interval_s
        while not self._stop.is_set():
            try:
                snap = self.observer.refresh()
                self.claims.prune(frozenset(snap.runners))
                if self._stream is None and self._stream_factory is not None:
                    start = max(snap.jobs_index, snap.allocs_index) + 1
                    stream = self._stream_factory(self._on_events, self._on_stream, start)
                    # Started before stop() can see it, and stopped here when
                    # stop() came meanwhile: stop() never meets a half-made stream.
                    stream.start()
                    self._stream = stream
                    if self._stop.is_set():
                        stream.stop()
                for env_id in snap.env_ids() | set(self._gauged):
                    self.enqueue(env_id)
            except Exception as exc:
                log.warning("resync failed: %s", exc)
            # Jitter keeps replicas and restarts from listing in lockstep.
            wait = interval * random.uniform(0.9, 1.1)
            self._resync_now.wait(wait)
            self._resync_now.clear()

    def _on_stream(self, connected: bool) -> None:
        self.observer.set_stream_connected(connected)
        self.metrics.event_stream_connected.set(1 if connected else 0)
        if connected and self._stream_was_connected:
            self.metrics.event_stream_reconnects.inc()
        self._stream_was_connected |= connected
        if connected:
            # Whatever happened while disconnected is seen by a full look.
            self._resync_now.set()

    def _on_events(self, index: int, events: list[dict[str, Any]]) -> None:
        self.observer.note_event_index(index, events)
        wanted: set[int] = set()
        for event in events:
            topic = event.get("Topic")
            self.metrics.events.labels(str(topic), str(event.get("Type"))).inc()
            if topic == "Node":
                wanted |= self.observer.snapshot.env_ids()
                continue
            payload = event.get("Payload") or {}
            if topic == "Job":
                job_id = str(event.get("Key") or "")
            else:
                obj = payload.get(str(topic)) or {}
                job_id = str(obj.get("JobID") or "")
            env_id = jobs.env_id_of(job_id)
            if env_id is not None:
                wanted.add(env_id)
        for env_id in wanted:
            self.enqueue(env_id)

    # -- the pass ---------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            env_id = self.queue.get(timeout_s=0.5)
            self.metrics.queue_depth.labels(QUEUE).set(self.queue.depth)
            if env_id is None:
                continue
            started = self.clock.monotonic()
            with self._lock:
                added = self._added_at.pop(env_id, started)
            self.metrics.queue_wait_seconds.labels(QUEUE).observe(started - added)
            with log_context(environment_id=env_id, reconcile_id=next(self._pass_ids)):
                if not self.is_leader():
                    # A follower takes keys off the queue but does not reconcile;
                    # its passes are not counted as reconciles.
                    self.queue.forget(env_id)
                    self.queue.done(env_id)
                    continue
                self._space_passes(env_id)
                try:
                    ok = self.reconcile(env_id)
                except Exception:
                    ok = False
                    log.warning("pass failed; retrying with backoff", exc_info=True)
                if ok:
                    self.queue.forget(env_id)
                    self.metrics.reconcile_total.labels(CONTROLLER, "success").inc()
                else:
                    # A raised error or a write that failed: the pass is retried.
                    self.metrics.reconcile_errors.labels(CONTROLLER).inc()
                    self.metrics.reconcile_total.labels(CONTROLLER, "error").inc()
                    self.metrics.queue_retries.labels(QUEUE).inc()
                    self.queue.add_rate_limited(env_id)
                self.queue.done(env_id)
            self.metrics.queue_work_seconds.labels(QUEUE).observe(self.clock.monotonic() - started)

    def _space_passes(self, env_id: int) -> None:
        """Let passes of one environment start no closer than four times what
        the last one took before its writes (and 20 ms): a pass reads every
        runner of the environment, and under a stream of claims and events
        back-to-back passes would take the CPU the claims need. Whatever
        arrives meanwhile is handled by the pass that follows (the queue keeps
        the key)."""
        with self._lock:
            started, took = self._last_pass.get(env_id, (float("-inf"), 0.0))
        wait = started + max(PASS_SPACING_MIN_S, 4 * took) - self.clock.monotonic()
        if wait > 0:
            self._stop.wait(wait)

    def reconcile(self, env_id: int) -> bool:
        """One pass for one environment. False when some write failed."""
        if not self.is_leader():
            return True
        started = self.clock.monotonic()
        snap = self.observer.current()
        now = self.clock.now_ns()
        template = snap.templates.get(env_id)
        views = snap.views(env_id)
        with self._lock:
            if template is None and views:
                orphan_since = self._orphan_since.setdefault(env_id, now)
            else:
                self._orphan_since.pop(env_id, None)
                orphan_since = None
            budget = self._budgets.get(env_id, Budget())
        pending = self.expectations.pending(env_id)
        result = plan(
            PlanInput(
                env_id=env_id,
                env=template.env if template else None,
                runners=views,
                now=now,
                creating=pending.creating,
                deleting=pending.deleting,
                safe=snap.safe,
                last_activity=self.claims.last_activity(views),
                orphan_since=orphan_since,
                budget=budget,
                settings=self.settings.plan,
            )
        )
        with self._lock:
            self._budgets[env_id] = result.budget
        self._record(env_id, snap, views, result.counts, template is not None, result.degraded)
        if template is not None and pending.creating:
            pool = result.counts.idle_ready + result.counts.idle_starting
            held_back = min(pending.creating, template.env.prewarming_pool_size - pool)
            if held_back > 0:
                # Without the expectation this pass would have created these again.
                self.metrics.guard_hits.labels("expectation").inc(held_back)
        # The pass's own work, without waiting for its writes (spacing, below).
        read = self.clock.monotonic() - started
        failed = self.actor.execute(env_id, result.actions, template) if result.actions else 0
        if result.wake_at is not None:
            self.queue.add_after(env_id, max(0.0, (result.wake_at - now) / SECOND))
            self.metrics.reconcile_total.labels(CONTROLLER, "requeue_after").inc()
        self.passes += 1
        with self._lock:
            self._last_pass[env_id] = (started, read)
        self.metrics.reconcile_seconds.labels(CONTROLLER).observe(self.clock.monotonic() - started)
        return failed == 0

    def _record(
        self,
        env_id: int,
        snap: Snapshot,
        views: tuple[RunnerView, ...],
        counts: PoolCounts,
        exists: bool,
        degraded: bool,
    ) -> None:
        m = self.metrics
        # The newest snapshot, not the pass's: it already shows a claim made
        # while this pass was planning, which the pass's own views predate.
        current = self.observer.snapshot.views(env_id)
        for invariant, n in self.claims.check(current).items():
            if n:
                m.invariant_violations.labels(invariant).inc(n)
        if not exists and not views:
            if env_id in self._gauged:
                self._gauged.discard(env_id)
                m.drop_environment(env_id)
            return
        if env_id not in self._gauged:
            self._gauged.add(env_id)
            m.init_environment(env_id)
        label = str(env_id)
        m.runners.labels(label, "idle").set(counts.idle_ready)
        m.runners.labels(label, "starting").set(counts.idle_starting)
        m.runners.labels(label, "claimed").set(counts.claimed)
        m.runners.labels(label, "lost").set(counts.lost)
        template = snap.templates.get(env_id)
        m.pool_desired.labels(label).set(template.env.prewarming_pool_size if template else 0)
        m.environment_degraded.labels(label).set(1 if degraded else 0)
        with self._lock:
            if degraded:
                self._degraded.add(env_id)
            else:
                self._degraded.discard(env_id)
            for v in views:
                if v.phase is Phase.READY and v.alloc and v.alloc.id not in self._seen_ready:
                    self._seen_ready.add(v.alloc.id)
                    if v.startup_ns is not None:
                        m.runner_startup_seconds.observe(v.startup_ns / SECOND)
            if len(self._seen_ready) > 4 * max(1, len(snap.runners)) + 1000:
                live = {a.id for allocs in snap.allocs.values() for a in allocs}
                self._seen_ready &= live

    # -- what the API uses ---------------------------------------------------------------

    def pool_counts(self, env_id: int) -> PoolCounts:
        """Live counts from the snapshot (a claim shows at once, before any pass)."""
        views = self.observer.snapshot.views(env_id)
        idle = [v for v in views if not v.claimed]
        claims = [v.job.claim for v in views if v.job.claim is not None]
        return PoolCounts(
            idle_ready=sum(1 for v in idle if v.phase is Phase.READY and v.known),
            idle_starting=sum(1 for v in idle if v.phase is Phase.STARTING or not v.known),
            claimed=sum(1 for c in claims if c.lost_reason is None),
            lost=sum(1 for c in claims if c.lost_reason is not None),
        )

    def nomad_error(self) -> str | None:
        """Why Nomad cannot be observed right now, or None."""
        if self.observer.last_error is not None:
            return self.observer.last_error
        if not self.observer.observed_once:
            return "Nomad has not been observed yet"
        return None

    def sync(self) -> None:
        """Re-list Nomad now (e.g. `?fetch=true`); raises when Nomad cannot be read."""
        self.observer.refresh()

    def degraded(self, env_id: int) -> bool:
        with self._lock:
            return env_id in self._degraded

    def environments(self) -> list[Environment]:
        snap = self.observer.snapshot
        return [snap.templates[e].env for e in sorted(snap.templates)]

    def environment(self, env_id: int) -> Environment | None:
        template = self.observer.snapshot.templates.get(env_id)
        return template.env if template else None

    def _known(self) -> Snapshot:
        """The snapshot, listing Nomad first if it never was: before that an
        empty snapshot would say that no environment exists."""
        return self.observer.snapshot if self.observer.observed_once else self.observer.current()

    def put_environment(self, env: Environment) -> bool:
        """Create or replace an environment's template; True when it is new.
        Claimed runners keep running; idle ones built from an older template
        are replaced by the next pass."""
        if not self.is_leader():
            raise NotLeader
        created = self._known().templates.get(env.id) is None
        spec = jobs.template_job(env)
        result = self.gateway.register_job(spec)
        spec["JobModifyIndex"] = result.job_modify_index
        self.observer.apply_spec(spec["ID"], spec)
        self.enqueue(env.id)
        return created

    def delete_environment(self, env_id: int) -> bool:
        """Delete the template; idle runners go at once, claimed ones when released."""
        if not self.is_leader():
            raise NotLeader
        if self._known().templates.get(env_id) is None:
            return False
        self.gateway.deregister_job(jobs.template_job_id(env_id), purge=True)
        self.observer.forget(jobs.template_job_id(env_id))
        with self._lock:
            # Deleted on purpose: no grace period for its idle runners.
            self._orphan_since[env_id] = self.clock.now_ns() - self.settings.plan.orphan_grace_ns
        self.enqueue(env_id)
        return True
