"""act: carries a plan's actions out as Nomad writes, with bounded concurrency
and a global write rate, each recorded in metrics and expectations.

Every write re-checks what it is about to change, because time passed since
the plan: a deletion of an idle runner skips one that has been claimed
meanwhile (and holds the RunnerGuard so no claim can start during it), an
inactivity release skips a runner touched meanwhile (and from its decision
on refuses touches), and ending a claim is a
register with EnforceIndex, so it loses to any other change.

The RunnerGuard and the snapshot only know this process's claims. Where
other replicas hand runners out too (`shared`: leader election on), a claim
one of them has just written may not show yet, so an idle runner that could
be claimed is first stopped with EnforceIndex (`Claims.retire`): a claim
written since makes that fail and the runner stays; once it has landed, a
claim of it fails. Only then is it deregistered.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from controller.clock import Clock
from controller.metrics import Metrics
from controller.model import RunnerView, Template
from controller.nomad import jobs
from controller.nomad.gateway import IndexConflict, NomadAPIError, NomadGateway, NomadUnavailable
from controller.reconcile.claims import Claims, RunnerGuard
from controller.reconcile.expectations import Expectations
from controller.reconcile.observe import Observer
from controller.reconcile.plan import (
    IDLE_ONLY_REASONS,
    CreateRunners,
    DeleteReason,
    DeleteRunner,
    EndClaim,
    Plan,
)
from controller.reconcile.ratelimit import TokenBucket
from controller.reconcile.snapshot import is_claimable

log = logging.getLogger(__name__)


class Actor:
    def __init__(
        self,
        *,
        gateway: NomadGateway,
        observer: Observer,
        expectations: Expectations,
        guard: RunnerGuard,
        claims: Claims,
        clock: Clock,
        metrics: Metrics,
        rate: TokenBucket,
        concurrency: int = 8,
        is_leader: Callable[[], bool] = lambda: True,
        shared: bool = False,
    ) -> None:
        """`shared`: other replicas may claim this controller's runners."""
        self._gateway = gateway
        self._observer = observer
        self._expectations = expectations
        self._guard = guard
        self._claims = claims
        self._clock = clock
        self._metrics = metrics
        self._rate = rate
        self._is_leader = is_leader
        self._shared = shared
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="nrc-write")

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def execute(self, env_id: int, plan: Plan, template: Template | None) -> int:
        """Run the plan's actions; return how many writes failed (the pass is then retried)."""
        # An unsafe pass holds every deletion back, a safe one none.
        deferred = "; its deletion waits for a safe pass" if plan.deferred else ""
        for replaced in plan.replaced:
            # Said before any write: a replacement may be created and the
            # process killed before the deletion lands (retried through a
            # burst of 500s, say), or the deletion may wait for a safe pass
            # while the environment is deleted meanwhile. This line is what
            # then shows the runner was replaced, not over-created (the chaos
            # suite counts it).
            log.info(
                "replacing runner %s (%s)%s",
                replaced.runner_id,
                replaced.reason,
                deferred,
                extra={"runner_id": replaced.runner_id, "environment_id": env_id},
            )
        futures: list[Future[bool]] = []
        for action in plan.actions:
            if isinstance(action, CreateRunners):
                if template is None:
                    continue
                for _ in range(action.count):
                    futures.append(self._pool.submit(self._create, env_id, template))
            elif isinstance(action, DeleteRunner):
                futures.append(self._pool.submit(self._delete, env_id, action))
            else:
                futures.append(self._pool.submit(self._end_claim, action))
        return sum(1 for f in futures if not f.result())

    def _write_allowed(self) -> bool:
        # A replica that lost the lock stops at once, even mid-pass.
        return self._is_leader() and self._rate.acquire(timeout_s=30.0)

    def _record(self, action: str, outcome: str) -> None:
        self._metrics.nomad_writes.labels(action, outcome).inc()

    def _create(self, env_id: int, template: Template) -> bool:
        if not self._write_allowed():
            return False
        job_id = jobs.runner_job_id(env_id, str(uuid.uuid4()))
        spec = jobs.runner_job(template.spec, template.env, job_id)
        self._expectations.expect_create(env_id, job_id)
        try:
            result = self._gateway.register_job(spec, enforce_index=0)
        except NomadUnavailable as exc:
            # The write may have landed: keep expecting it until a list or the
            # timeout says otherwise, so it is never created twice.
            self._record("create", "unavailable")
            log.warning("creating runner %s: %s", job_id, exc)
            return False
        except (NomadAPIError, IndexConflict) as exc:
            self._expectations.create_failed(job_id)
            self._record("create", "error")
            log.warning("creating runner %s: %s", job_id, exc)
            return False
        self._observer.remember_created(
            job_id, jobs.with_modify_index(spec, result.job_modify_index)
        )
        self._expectations.created(job_id, result.index)
        self._record("create", "ok")
        self._metrics.jobs_created.labels(str(env_id)).inc()
        return True

    def _delete(self, env_id: int, action: DeleteRunner) -> bool:
        runner_id = action.runner_id
        if not self._guard.begin_delete(runner_id):
            return True  # a claim is in flight: the next pass decides again
        try:
            view = self._observer.snapshot.runners.get(runner_id)
            if view is None:
                return True
            if action.reason in IDLE_ONLY_REASONS and view.claimed:
                log.info("not deleting %s (%s): it was claimed meanwhile", runner_id, action.reason)
                return True
            # Decided under the claims' lock: a touch after this point is refused,
            # so no client hears "alive" from a runner being deleted.
            if action.reason is DeleteReason.INACTIVITY_TIMEOUT and not self._claims.begin_expiry(
                view, self._clock.now_ns()
            ):
                return True
            if not self._write_allowed():
                return False
            if self._shared and action.reason in IDLE_ONLY_REASONS and is_claimable(view):
                retired = self._retire(view, action.reason)
                if retired is not True:
                    return retired is None
                if not self._write_allowed():
                    return False  # stopped: a later pass deletes it as dead
            self._expectations.expect_delete(env_id, runner_id)
            try:
                result = self._gateway.deregister_job(runner_id, purge=True)
            except (NomadUnavailable, NomadAPIError) as exc:
                self._expectations.delete_failed(runner_id)
                self._record("delete", "error")
                log.warning("deleting runner %s (%s): %s", runner_id, action.reason, exc)
                return False
            self._expectations.deleted(runner_id, result.index)
            self._observer.forget(runner_id)
            self._claims.forget(runner_id)
            self._record("delete", "ok")
            self._metrics.jobs_deleted.labels(action.reason.value).inc()
            log.info(
                "deleted runner %s (%s)",
                runner_id,
                action.reason,
                extra={"runner_id": runner_id, "environment_id": env_id},
            )
            return True
        finally:
            self._guard.end_delete(runner_id)

    def _retire(self, view: RunnerView, reason: DeleteReason) -> bool | None:
        """`Claims.retire` before an idle runner is deleted: True once it is
        stopped; None when it changed since the plan (claimed through another
        replica, say: nothing to retry, the next pass decides); False when
        the write failed (the pass is retried)."""
        try:
            if not self._claims.retire(view):
                return None
        except IndexConflict:
            self._record("retire", "conflict")
            log.info("not deleting %s (%s): it changed meanwhile", view.id, reason)
            return None
        except (NomadUnavailable, NomadAPIError) as exc:
            self._record("retire", "error")
            log.warning("stopping runner %s before its deletion (%s): %s", view.id, reason, exc)
            return False
        self._record("retire", "ok")
        return True

    def _end_claim(self, action: EndClaim) -> bool:
        if not self._write_allowed():
            return False
        try:
            written = self._claims.end_claim(
                action.runner_id, action.job_modify_index, action.reason
            )
        except IndexConflict:
            self._record("end_claim", "conflict")
            return True
        except (NomadUnavailable, NomadAPIError) as exc:
            self._record("end_claim", "error")
            log.warning("ending claim on %s (%s): %s", action.runner_id, action.reason, exc)
            return False
        if written:
            self._record("end_claim", "ok")
        # else: changed since the plan; the next pass looks again
        return True
