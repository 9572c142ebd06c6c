"""The controller, wired: a work queue of environment ids fed by Nomad
events, API actions and a resync timer; a worker running the pool
reconciler over them; claims; optional leader election; and the façade
the API uses.

This module only wires and triggers. Events never carry a decision: an
event only says "look at environment E again" (a Node event: look at all
of them), and the resync timer covers lost ones. What a pass does is in
`reconciler`, how passes are run in `worker`, what the API may ask in
`facade`.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controller.clock import Clock, SystemClock
from controller.metrics import CONTROLLER, Metrics
from controller.nomad import jobs
from controller.nomad.events import EventRef
from controller.nomad.gateway import NomadGateway
from controller.reconcile.act import Actor
from controller.reconcile.activity import SharedActivity, activity_prefix
from controller.reconcile.claims import Claims, RunnerGuard
from controller.reconcile.expectations import Expectations
from controller.reconcile.facade import Pools
from controller.reconcile.leader import LeaderElector
from controller.reconcile.observe import Observer
from controller.reconcile.plan import PlanSettings
from controller.reconcile.prewarming import Prewarmer, PrewarmSettings
from controller.reconcile.queue import WorkQueue
from controller.reconcile.ratelimit import TokenBucket
from controller.reconcile.reconciler import PoolReconciler
from controller.reconcile.waiting import WaitingClaims
from controller.reconcile.worker import Worker
from controller.reconcile.writes import RegistersAsync, SpecWriter

log = logging.getLogger(__name__)

# Not Evaluation: evaluations are not in the snapshot, so their events (two of
# the five frames each job write causes) only woke passes that found nothing new.
EVENT_TOPICS = ("Job", "Allocation", "Node")
FULL_RELIST_EVERY = 10  # resync intervals between full re-lists while events flow


class EventSource(Protocol):
    def start(self) -> None: ...

    def stop(self, timeout_s: float = 5.0) -> None: ...


EventsCallback = Callable[[int, Sequence[EventRef]], None]
# (on_events, on_state, start_index) → an event source; None runs on resyncs alone.
StreamFactory = Callable[[EventsCallback, Callable[[bool], None], int], EventSource]


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
    activity_publish_interval_s: float = 1.0  # leader election only (activity.py)
    claim_wait_s: float = 0.0  # NRC_CLAIM_WAIT (waiting.py); 0: answered at once
    claim_max_waiting: int = 32
    plan: PlanSettings = field(default_factory=PlanSettings)
    prewarm: PrewarmSettings = field(default_factory=PrewarmSettings)
    template: jobs.TemplatePolicy = field(default_factory=jobs.TemplatePolicy)


class Controller:
    def __init__(
        self,
        gateway: NomadGateway,
        settings: ControllerSettings | None = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        stream_factory: StreamFactory | None = None,
        async_gateway: RegistersAsync | None = None,
    ) -> None:
        """`async_gateway`: claims write through it on the API's event loop
        (`controller.nomad.aclient`); without it, on a thread."""
        self.settings = s = settings or ControllerSettings()
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.gateway = gateway
        self.expectations = Expectations(self.clock, s.expectation_timeout_s)
        # With events naming what changed, a full re-list every 10th resync is
        # the safety net for whatever an event stream could still miss.
        self.observer = Observer(
            gateway=gateway,
            clock=self.clock,
            expectations=self.expectations,
            metrics=self.metrics,
            full_relist_s=FULL_RELIST_EVERY * s.resync_interval_s,
        )
        self.writer = SpecWriter(
            gateway=gateway, observer=self.observer, async_gateway=async_gateway
        )
        self.guard = RunnerGuard()
        self.elector: LeaderElector | None = None
        if s.leader_election:
            self.elector = LeaderElector(
                gateway=gateway,
                path=s.leader_lock_path,
                clock=self.clock,
                ttl_s=s.leader_ttl_s,
                on_change=self._on_leader_change,
            )
        # Static pools (the default) keep no history: nothing of it runs.
        self.prewarmer: Prewarmer | None = None
        if s.prewarm.adaptive:
            self.prewarmer = Prewarmer(settings=s.prewarm, store=gateway, clock=self.clock)
        self.claims = Claims(
            gateway=gateway,
            observer=self.observer,
            writer=self.writer,
            expectations=self.expectations,
            guard=self.guard,
            clock=self.clock,
            metrics=self.metrics,
            can_serve=self.ready,
            on_change=self.enqueue,
            on_claim=self._record_claim,
            waiting=WaitingClaims(self.clock, s.claim_wait_s, s.claim_max_waiting),
        )
        burst = max(1, int(s.write_rate_per_s)) if s.write_rate_per_s > 0 else 1
        self.actor = Actor(
            gateway=gateway,
            observer=self.observer,
            expectations=self.expectations,
            guard=self.guard,
            claims=self.claims,
            clock=self.clock,
            metrics=self.metrics,
            rate=TokenBucket(s.write_rate_per_s, burst, self.clock),
            concurrency=s.write_concurrency,
            is_leader=self.is_leader,
            shared=s.leader_election,
        )
        self.reconciler = PoolReconciler(
            observer=self.observer,
            claims=self.claims,
            actor=self.actor,
            clock=self.clock,
            metrics=self.metrics,
            settings=s.plan,
            is_leader=self.is_leader,
            prewarmer=self.prewarmer,
            template=s.template,
            writer=self.writer,
        )
        self.worker: Worker[int] = Worker(
            reconciler=self.reconciler,
            queue=WorkQueue(self.clock, cap_s=s.max_backoff_s),
            clock=self.clock,
            metrics=self.metrics,
            name=CONTROLLER,
            threads=s.workers,
            active=self.is_leader,
        )
        self.queue = self.worker.queue
        self.pools = Pools(
            gateway=gateway,
            observer=self.observer,
            claims=self.claims,
            writer=self.writer,
            reconciler=self.reconciler,
            clock=self.clock,
            metrics=self.metrics,
            is_leader=self.is_leader,
            ready=self.ready,
            enqueue=self.enqueue,
            prewarmer=self.prewarmer,
            template=s.template,
        )
        self._stream_factory = stream_factory
        self._stream: EventSource | None = None
        self._stop = threading.Event()
        self._resync_now = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stream_was_connected = False
        self.metrics.leader.labels(CONTROLLER).set(1 if self.elector is None else 0)
        # Several replicas: a touch through any of them reaches the leader,
        # which alone releases expired claims (activity.py).
        self.activity: SharedActivity | None = None
        if self.elector is not None:
            self.activity = SharedActivity(
                store=gateway,
                prefix=activity_prefix(s.leader_lock_path),
                clock=self.clock,
                metrics=self.metrics,
                interval_s=s.activity_publish_interval_s,
                local=self.claims.local_activity,
                claimed=lambda: (
                    {r for r, v in self.observer.snapshot.runners.items() if v.claimed}
                    if self.observer.observed_once
                    else None
                ),
            )
            self.claims.share_activity(self.activity)

    @property
    def passes(self) -> int:
        return self.reconciler.passes

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        if self.elector is not None:
            self.elector.start()
        self.worker.start()
        self._spawn(self._resync, "nrc-resync")
        # Every replica serves claims from its snapshot: every one follows events.
        self._spawn(lambda: self.observer.follow(self._stop), "nrc-observe")
        if self.activity is not None:
            activity = self.activity
            self._spawn(lambda: activity.run(self._stop), "nrc-activity")  # withdraws at stop

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._resync_now.set()
        self.worker.stop()
        if self._stream is not None:
            self._stream.stop()
        for thread in self._threads:
            thread.join(5)
        self.actor.shutdown()
        if self.prewarmer is not None and self.is_leader():
            self.prewarmer.save_all()  # before the lock is handed over
        if self.elector is not None:
            self.elector.stop()

    def step_down(self) -> None:
        """The start of a drain: the prewarm history saved and the leader lock
        released, so that a follower takes pool upkeep over at once; this
        replica does not run for leader again. Without election (one
        replica) the pools are kept up until the stop. Blocking."""
        if self.elector is None:
            return
        if self.prewarmer is not None and self.is_leader():
            self.prewarmer.save_all()  # before the lock is handed over
        self.elector.stop()

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def _record_claim(self, env_id: int, runner_id: str) -> None:
        """A claim is demand for adaptive prewarming; only the leader keeps
        histories (it observes the followers' claims in its passes)."""
        if self.prewarmer is not None and self.is_leader():
            self.prewarmer.record_claim(env_id, runner_id)

    def ready(self) -> bool:
        """Serving the API: Nomad observed once. Every replica serves, leader or
        not: a claim, a release and a recorded loss are EnforceIndex writes (two
        replicas cannot both win one), and executions and file operations only
        read. Pool upkeep is the leader's alone (`is_leader`)."""
        return self.observer.observed_once

    def _on_leader_change(self, leader: bool) -> None:
        self.metrics.leader.labels(CONTROLLER).set(1 if leader else 0)
        if self.prewarmer is not None:
            # A new term reads the histories the last leader wrote.
            self.prewarmer.unload()
        if leader:
            self._resync_now.set()
        else:
            self.reconciler.drop_gauges()

    # -- triggers -------------------------------------------------------------------

    def enqueue(self, env_id: int) -> None:
        """Ask for a pass over one environment (deduplicated by the queue)."""
        self.worker.add(env_id)

    def _resync(self) -> None:
        interval = self.settings.resync_interval_s
        while not self._stop.is_set():
            try:
                snap = self.observer.refresh()
                self.claims.prune(frozenset(snap.runners))
                if self._stream is None and self._stream_factory is not None:
                    # After the older list: the two may come from views of
                    # different ages (a lagging follower), and an event
                    # between them would otherwise never be heard (chaos
                    # seed 8183: an environment unknown until a full re-list).
                    # Events are hints: one heard twice costs a read.
                    start = min(snap.jobs_index, snap.allocs_index) + 1
                    stream = self._stream_factory(self._on_events, self._on_stream, start)
                    # Started before stop() can see it, and stopped here when
                    # stop() came meanwhile: stop() never meets a half-made stream.
                    stream.start()
                    self._stream = stream
                    if self._stop.is_set():
                        stream.stop()
                for env_id in snap.env_ids() | self.reconciler.gauged():
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

    def _on_events(self, index: int, events: Sequence[EventRef]) -> None:
        self.observer.note_event_index(index, events)
        wanted: set[int] = set()
        for event in events:
            self.metrics.events.labels(event.topic, event.type).inc()
            if event.topic == "Node":
                wanted |= self.observer.snapshot.env_ids()
                continue
            env_id = jobs.env_id_of(event.job_id or "")
            if env_id is not None:
                wanted.add(env_id)
        for env_id in wanted:
            self.enqueue(env_id)
