"""reconciler: the domain half of the reconcile loop — one pass over one
environment (observe → plan → act), and the per-environment state the
passes carry from one to the next: the failure budget, since when an
environment has runners but no template, and what its gauges show.

A pass reads the whole observed state and the controller's intent, so
events that arrive late, twice, out of order or not at all cannot mislead
it. It returns a `worker.Result` and never touches the queue.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from controller.clock import Clock
from controller.metrics import Metrics
from controller.model import SECOND, Phase, RunnerView, Template
from controller.nomad import jobs
from controller.nomad.gateway import IndexConflict, NomadAPIError, NomadUnavailable
from controller.reconcile.expectations import Pending
from controller.reconcile.plan import Budget, Plan, PlanInput, PlanSettings, PoolCounts, plan
from controller.reconcile.prewarming import Prewarmer
from controller.reconcile.snapshot import Snapshot
from controller.reconcile.worker import Result

log = logging.getLogger(__name__)

# How soon a pass that held deletions back (an unsafe snapshot) looks again.
DEFERRED_RETRY_S = 1.0


class Observes(Protocol):
    @property
    def snapshot(self) -> Snapshot: ...

    def current(self, max_age_s: float | None = None) -> Snapshot: ...

    def snapshot_and_pending(self, env_id: int) -> tuple[Snapshot, Pending]: ...


class Acts(Protocol):
    def execute(self, env_id: int, plan: Plan, template: Template | None) -> int: ...


class WritesSpecs(Protocol):
    def register(
        self, spec: jobs.JsonDict, *, enforce_index: int | None = None
    ) -> jobs.JsonDict: ...


class KnowsClaims(Protocol):
    def last_activity(self, views: tuple[RunnerView, ...]) -> dict[str, int]: ...

    def check(self, views: tuple[RunnerView, ...]) -> dict[str, int]: ...


class PoolReconciler:
    def __init__(
        self,
        *,
        observer: Observes,
        claims: KnowsClaims,
        actor: Acts,
        clock: Clock,
        metrics: Metrics,
        settings: PlanSettings,
        is_leader: Callable[[], bool],
        prewarmer: Prewarmer | None = None,
        template: jobs.TemplatePolicy | None = None,
        writer: WritesSpecs | None = None,
    ) -> None:
        self._observer = observer
        self._claims = claims
        self._actor = actor
        self._clock = clock
        self._metrics = metrics
        self._settings = settings
        self._is_leader = is_leader
        self._prewarmer = prewarmer  # None: static pools (prewarmingPoolSize)
        self._template = template or jobs.TemplatePolicy()
        self._writer = writer  # None: templates written under another policy are kept
        self._lock = threading.Lock()  # guards the per-environment state below
        self._budgets: dict[int, Budget] = {}
        self._degraded: set[int] = set()
        self._orphan_since: dict[int, int] = {}
        self._seen_ready: set[str] = set()  # allocations whose start-up time is recorded
        self._gauged: set[int] = set()  # environments with pool gauges
        self._idle_since: dict[int, tuple[int, int]] = {}  # env → (ns, idle runners) at last pass
        self.passes = 0

    def reconcile(self, env_id: int) -> Result:
        """One pass for one environment (see the module docstring)."""
        if not self._is_leader():
            return Result()
        started = self._clock.monotonic()
        self._observer.current()
        # The newest snapshot with the expectations it does not show yet, read
        # together (the snapshot `current` returned may already be settled).
        snap, pending = self._observer.snapshot_and_pending(env_id)
        now = self._clock.now_ns()
        template = snap.templates.get(env_id)
        if template is not None and self._outdated(template):
            # The next pass sees the new template and rolls the idle runners.
            ok = self._rewrite(template)
            return Result(requeue_after_s=0.0 if ok else None, failed_writes=0 if ok else 1)
        views = snap.views(env_id)
        with self._lock:
            if template is None and views:
                orphan_since = self._orphan_since.setdefault(env_id, now)
            else:
                self._orphan_since.pop(env_id, None)
                orphan_since = None
            budget = self._budgets.get(env_id, Budget())
        decision = None
        if template is not None and self._prewarmer is not None:
            claimed = {v.id: v.job.claim.claimed_at for v in views if v.job.claim is not None}
            self._prewarmer.observe_claims(env_id, claimed)
            decision = self._prewarmer.decide(env_id, template.env.prewarming_pool_size)
        result = plan(
            PlanInput(
                env_id=env_id,
                env=template.env if template else None,
                runners=views,
                now=now,
                creating=pending.creating,
                deleting=pending.deleting,
                safe=snap.safe,
                last_activity=self._claims.last_activity(views),
                orphan_since=orphan_since,
                budget=budget,
                settings=self._settings,
                pool_size=decision.target if decision is not None else None,
            )
        )
        with self._lock:
            self._budgets[env_id] = result.budget
        self._record(env_id, snap, views, result.counts, template is not None, result.degraded)
        if decision is not None and env_id in self.gauged():
            label = str(env_id)
            self._metrics.prewarm_target.labels(label).set(decision.target)
            self._metrics.prewarm_forecast.labels(label).set(decision.forecast.rate)
        if template is not None and pending.creating:
            pool = result.counts.idle_ready + result.counts.idle_starting
            wanted = decision.target if decision else template.env.prewarming_pool_size
            held_back = min(pending.creating, wanted - pool)
            if held_back > 0:
                # Without the expectation this pass would have created these again.
                self._metrics.guard_hits.labels("expectation").inc(held_back)
        # The pass's own work, without waiting for its writes (spacing).
        cost = self._clock.monotonic() - started
        failed = self._actor.execute(env_id, result, template) if result.actions else 0
        self.passes += 1
        # Plan's deadlines, and when the policy's target may change unprompted.
        policy_wake = decision.wake_at if decision is not None else None
        wakes = [w for w in (result.wake_at, policy_wake) if w is not None]
        requeue = (min(wakes) - now) / SECOND if wakes else None
        if result.deferred:
            # The spec that made the snapshot unsafe is read again by the next
            # refresh; the held-back deletions need not wait for the resync.
            requeue = min(requeue, DEFERRED_RETRY_S) if requeue is not None else DEFERRED_RETRY_S
        return Result(requeue_after_s=requeue, failed_writes=failed, cost_s=cost)

    def _outdated(self, template: Template) -> bool:
        """Written by us under another site policy (new settings or a new
        template file). Templates without a policy (Poseidon's, or an older
        controller's) are kept as they are until the environment's next PUT:
        adopting a namespace replaces no runner."""
        source = template.env.template_source
        return self._writer is not None and source not in ("", self._template.fingerprint)

    def _rewrite(self, template: Template) -> bool:
        assert self._writer is not None
        spec = jobs.template_job(template.env, self._template)
        try:
            # Over the version we read: a PUT meanwhile wins (it used the new policy).
            self._writer.register(spec, enforce_index=template.job_modify_index)
        except IndexConflict:
            return True
        except (NomadUnavailable, NomadAPIError) as exc:
            log.warning("rewriting template %s under the new policy: %s", jobs.job_id(spec), exc)
            return False
        log.info("template %s rewritten under the current template policy", jobs.job_id(spec))
        return True

    def orphaned_now(self, env_id: int) -> None:
        """The environment's template was deleted on purpose: no grace period
        for its idle runners."""
        with self._lock:
            self._orphan_since[env_id] = self._clock.now_ns() - self._settings.orphan_grace_ns

    def degraded(self, env_id: int) -> bool:
        with self._lock:
            return env_id in self._degraded

    def gauged(self) -> set[int]:
        """Environments whose gauges are exported (a pass over each removes
        them once the environment is gone)."""
        with self._lock:
            return set(self._gauged)

    def drop_gauges(self) -> None:
        """Export no pool gauges: they describe what the leader sees, and a
        follower's would be frozen at the moment it lost the lock."""
        with self._lock:
            gauged, self._gauged = set(self._gauged), set()
            self._idle_since.clear()  # a follower's time is nobody's cost
        for env_id in gauged:
            self._metrics.drop_environment(env_id)

    def _record(
        self,
        env_id: int,
        snap: Snapshot,
        views: tuple[RunnerView, ...],
        counts: PoolCounts,
        exists: bool,
        degraded: bool,
    ) -> None:
        m = self._metrics
        # The newest snapshot, not the pass's: it already shows a claim made
        # while this pass was planning, which the pass's own views predate.
        current = self._observer.snapshot.views(env_id)
        for invariant, n in self._claims.check(current).items():
            if n:
                m.invariant_violations.labels(invariant).inc(n)
        if not exists and not views:
            with self._lock:
                was_gauged = env_id in self._gauged
                self._gauged.discard(env_id)
                self._idle_since.pop(env_id, None)
            if was_gauged:
                m.drop_environment(env_id)
            return
        with self._lock:
            new = env_id not in self._gauged
            self._gauged.add(env_id)
        if new:
            m.init_environment(env_id)
        label = str(env_id)
        now = self._clock.now_ns()
        idle = counts.idle_ready + counts.idle_starting
        with self._lock:
            since, was_idle = self._idle_since.get(env_id, (now, 0))
            self._idle_since[env_id] = (now, idle)
        if now > since:
            # What the pool cost since the last pass, at the count seen then.
            m.idle_runner_seconds.labels(label).inc(was_idle * (now - since) / SECOND)
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
                        if self._prewarmer is not None:
                            self._prewarmer.record_startup(env_id, v.startup_ns)
            if len(self._seen_ready) > 4 * max(1, len(snap.runners)) + 1000:
                live = {a.id for allocs in snap.allocs.values() for a in allocs}
                self._seen_ready &= live
