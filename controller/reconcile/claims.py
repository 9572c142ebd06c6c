"""Claims: hand a ready idle runner to exactly one client, and take it back.

A claim writes `used=true`, the inactivity timeout and the claim's incarnation
(the allocation and its restart count) into the runner's config meta with
EnforceIndex + JobModifyIndex. Nomad accepts only the first of two writes
based on the same index, so two claimers never win the same runner, across
threads, replicas and restarts; the loser tries the next runner.

Within one process, `RunnerGuard` also keeps a claim and a deletion of the
same runner from overlapping (a deregistration cannot be made conditional).

Inactivity: a claim expires when nothing touched it for its timeout. The
decision to release an expired claim and a client's touch exclude each other
(`begin_expiry` / `touch` under one lock): once the release is decided, every
touch answers "expired" — even while the deregistration is still retried
through a burst of Nomad errors — so no client is ever told its runner is
alive by a process that is deleting it.

Across replicas (leader election on): every replica serves touches and
uses, the leader alone releases. Each replica's activity reaches the leader
through Nomad variables (`activity`); the leader's inactivity timer is the
newest of its own activity and what the last read found, and a read that
failed decides no expiry. The exclusion above holds within the leader only.

Losses: a reset claim is ended by an `EndClaim` write (the reason in meta,
the job stopped) with EnforceIndex. A client is told a loss only once that
write has landed — by the pass, or by its own request (`record_loss`), which
writes it first — so the reason a client hears is the one Nomad records, and
every later answer (from this process or the next) repeats it. Derived
reasons can change as the runner's state moves on (an OOM kill, then a drain
that migrates the allocation): the first write wins and is never rewritten.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import anyio

from controller.clock import Clock
from controller.metrics import Metrics
from controller.model import SECOND, Claim, LossReason, Phase, RunnerView, Template
from controller.nomad import jobs
from controller.nomad.gateway import IndexConflict, NomadAPIError, NomadGateway, NomadUnavailable
from controller.reconcile.expectations import Expectations
from controller.reconcile.observe import Observer
from controller.reconcile.uses import RunnerUse, Uses
from controller.reconcile.waiting import WaitingClaims
from controller.reconcile.writes import SpecWriter

JsonDict = dict[str, Any]

log = logging.getLogger(__name__)


class SharesActivity(Protocol):
    """The other replicas' activity (`activity.SharedActivity`): runner id →
    ns, None when it cannot be known now."""

    def read(self) -> Mapping[str, int] | None: ...

    def known(self) -> Mapping[str, int] | None: ...


class NoRunnerAvailable(Exception):
    """The environment has no ready idle runner right now (the pool refills)."""


class UnknownEnvironment(Exception):
    """No template job exists for the environment."""


class TemplateUnread(Exception):
    """The environment's template job is listed, but its spec could not be
    read from Nomad yet (no leader): it exists, its pool is not known."""

    def __init__(self, env_id: int) -> None:
        super().__init__(env_id)
        self.env_id = env_id


class NotLeader(Exception):
    """This replica does not serve claims: leader election is on and it does not
    hold the lock, or it has not observed Nomad since it took the lock."""


class RunnerGuard:
    """Per-runner exclusion between a claim and a deletion in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claiming: set[str] = set()
        self._deleting: set[str] = set()

    def begin_claim(self, runner_id: str) -> bool:
        with self._lock:
            if runner_id in self._claiming or runner_id in self._deleting:
                return False
            self._claiming.add(runner_id)
            return True

    def end_claim(self, runner_id: str) -> None:
        with self._lock:
            self._claiming.discard(runner_id)

    def begin_delete(self, runner_id: str) -> bool:
        with self._lock:
            if runner_id in self._claiming or runner_id in self._deleting:
                return False
            self._deleting.add(runner_id)
            return True

    def end_delete(self, runner_id: str) -> None:
        with self._lock:
            self._deleting.discard(runner_id)


class LostRace:
    """Set when a claim's write lost to another writer (IndexConflict)."""

    def __init__(self) -> None:
        self.lost = False

    def __bool__(self) -> bool:
        return self.lost


class Claims:
    def __init__(
        self,
        *,
        gateway: NomadGateway,
        observer: Observer,
        writer: SpecWriter,
        expectations: Expectations,
        guard: RunnerGuard,
        clock: Clock,
        metrics: Metrics,
        can_serve: Callable[[], bool],
        on_change: Callable[[int], None],
        on_claim: Callable[[int, str], None] = lambda env_id, runner_id: None,
        waiting: WaitingClaims | None = None,
    ) -> None:
        self._gateway = gateway
        self._observer = observer
        self._writer = writer
        self._expectations = expectations
        self._guard = guard
        self._clock = clock
        self._metrics = metrics
        self._can_serve = can_serve
        self._on_change = on_change
        self._on_claim = on_claim  # the demand an adaptive pool is sized from
        self._waiting = waiting or WaitingClaims(clock, 0.0, 0)
        self._lock = threading.Lock()
        self._activity: dict[str, int] = {}
        # Claims whose release for inactivity is decided: final, touches refused.
        self._expiring: set[str] = set()
        # Executions and file operations in flight: a runner in use is never inactive.
        self.uses = Uses(on_end=self._use_ending)
        # Claims this process handed out (runner id → claimed_at), to check that
        # Nomad never shows them taken over by another writer or idle again.
        self._handed: dict[str, int] = {}
        # Timers are not in Nomad: after a restart they count from our start,
        # so a claim is never released earlier than its client could expect.
        self._started_ns = clock.now_ns()
        self._shared: SharesActivity | None = None  # one replica: none

    def share_activity(self, shared: SharesActivity) -> None:
        """Several replicas: expiries also count the others' activity."""
        self._shared = shared

    def local_activity(self) -> tuple[dict[str, int], frozenset[str]]:
        """This process's activity (runner id → ns) and the runners it uses now."""
        busy = frozenset(use.runner_id for use in self.uses.in_flight())
        with self._lock:
            return dict(self._activity), busy

    def claim(self, env_id: int, timeout_s: int) -> RunnerView:
        template, started = self._claim_begins(env_id)
        view = self._first_claimable(env_id, timeout_s)
        if view is None:
            view = self._after_miss(env_id, template, timeout_s)
        return self._claimed(env_id, view, started)

    async def claim_async(self, env_id: int, timeout_s: int) -> RunnerView:
        """`claim` on the event loop: the write is awaited, not run on a
        thread; only a claim that waits for a runner (NRC_CLAIM_WAIT) does."""
        template, started = self._claim_begins(env_id)
        view: RunnerView | None = None
        for candidate in self._candidates(env_id):
            if not self._guard.begin_claim(candidate):
                continue
            try:
                prepared = self._prepare(candidate, timeout_s)
                if prepared is None:
                    continue
                spec, index, claim = prepared
                with self._writing(candidate) as lost_race:
                    await self._writer.register_async(spec, enforce_index=index)
                if not lost_race:
                    view = self._written(candidate, claim)
            finally:
                self._guard.end_claim(candidate)
            if view is not None:
                break
        if view is None:
            # On the API's worker threads (anyio's, as a synchronous route runs):
            # NRC_CLAIM_MAX_WAITING of them may wait at once, not the default
            # executor's few, which the data plane's reads share.
            view = await anyio.to_thread.run_sync(self._after_miss, env_id, template, timeout_s)
        return self._claimed(env_id, view, started)

    def _claim_begins(self, env_id: int) -> tuple[Template, float]:
        if not self._can_serve():
            raise NotLeader
        started = self._clock.monotonic()
        snap = self._observer.snapshot
        template = snap.templates.get(env_id)
        if template is None:
            if env_id in snap.unread_templates:
                raise TemplateUnread(env_id)
            raise UnknownEnvironment(env_id)
        return template, started

    def _after_miss(self, env_id: int, template: Template, timeout_s: int) -> RunnerView | None:
        """No runner was claimable: counted as a miss, the pool told, and the
        claim waits for one if it may (blocking)."""
        # A miss for adaptive prewarming even if a wait serves it.
        self._metrics.prewarm_misses.labels(str(env_id)).inc()
        self._on_change(env_id)
        if template.env.prewarming_pool_size <= 0:
            return None
        return self._waiting.serve(env_id, lambda: self._first_claimable(env_id, timeout_s))

    def _claimed(self, env_id: int, view: RunnerView | None, started: float) -> RunnerView:
        if view is None:
            self._metrics.claims.labels("empty").inc()
            raise NoRunnerAvailable(env_id)
        self._metrics.claims.labels("claimed").inc()
        self._metrics.claim_seconds.observe(self._clock.monotonic() - started)
        self._on_claim(env_id, view.id)
        self._on_change(env_id)
        return view

    def _candidates(self, env_id: int) -> Iterator[str]:
        """Ready idle runners of the environment that may be claimed, oldest
        first (the snapshot keeps them in that order), lazily: the first one
        claimed ends the search."""
        snap = self._observer.snapshot
        template = snap.templates.get(env_id)
        if template is None:
            return
        for v in snap.claimable(env_id):
            if (
                not v.claimed
                and v.known
                and v.phase is Phase.READY
                and v.job.template_hash == template.env.template_hash
                and not self._expectations.is_deleting(v.id)
            ):
                yield v.id

    def _first_claimable(self, env_id: int, timeout_s: int) -> RunnerView | None:
        """Claim the oldest ready runner of the environment that can be claimed
        now; None when there is none."""
        for candidate in self._candidates(env_id):
            if not self._guard.begin_claim(candidate):
                continue
            try:
                view = self._try_claim(candidate, timeout_s)
            finally:
                self._guard.end_claim(candidate)
            if view is not None:
                return view
        return None

    def _try_claim(self, runner_id: str, timeout_s: int) -> RunnerView | None:
        prepared = self._prepare(runner_id, timeout_s)
        if prepared is None:
            return None
        spec, index, claim = prepared
        with self._writing(runner_id) as lost_race:
            self._writer.register(spec, enforce_index=index)
        return None if lost_race else self._written(runner_id, claim)

    def _prepare(self, runner_id: str, timeout_s: int) -> tuple[JsonDict, int, Claim] | None:
        """The claimed spec to write over the runner's newest known version
        (its JobModifyIndex), and the claim; None when it cannot be claimed
        after all (call with the guard held)."""
        # Re-read under the guard: the snapshot may have moved since we chose.
        current = self._observer.snapshot.runners.get(runner_id)
        spec = self._observer.spec(runner_id)
        if current is None or spec is None or current.claimed or current.alloc is None:
            return None
        if current.phase is not Phase.READY or jobs.runner_from_job(spec, current.env_id).claim:
            return None  # the spec is the newest we know: never claim over a claim
        claim = Claim(
            timeout=timeout_s,
            alloc_id=current.alloc.id,
            restarts=current.alloc.restarts,
            claimed_at=self._clock.now_ns(),
        )
        return jobs.with_claim(spec, claim), jobs.modify_index(spec), claim

    @contextlib.contextmanager
    def _writing(self, runner_id: str) -> Iterator[LostRace]:
        """Around a claim's write: a Nomad failure is counted and raised; a
        race lost to another writer is counted and sets the flag."""
        lost = LostRace()
        try:
            yield lost
        except (NomadUnavailable, NomadAPIError):
            self._metrics.claims.labels("error").inc()
            raise
        except IndexConflict:
            # Somebody else changed it first (another claimer, a replica): next one.
            self._metrics.claims.labels("conflict").inc()
            log.info("claim of %s lost a race; trying the next runner", runner_id)
            lost.lost = True

    def _written(self, runner_id: str, claim: Claim) -> RunnerView | None:
        """The claimed runner once its write landed (None: not visible)."""
        with self._lock:
            self._activity[runner_id] = claim.claimed_at
        view = self._observer.snapshot.runners.get(runner_id)
        if view is None or view.job.claim != claim:
            # Deleted under us after the write (it cannot be: the guard is held).
            log.error("claim of %s written but not visible in the snapshot", runner_id)
            return None
        with self._lock:
            self._handed[runner_id] = claim.claimed_at
        return view

    def end_claim(self, runner_id: str, job_modify_index: int, reason: LossReason) -> bool:
        """Write the loss of a reset claim (EndClaim) if the job is still at
        `job_modify_index`; False when it changed since (nothing written).
        Raises IndexConflict when Nomad has a newer version than we know, and
        NomadUnavailable / NomadAPIError when the write fails."""
        now = self._clock.now_ns()
        if not self._rewrite(
            runner_id, job_modify_index, lambda spec: jobs.with_lost(spec, reason, now)
        ):
            return False
        self._metrics.runner_losses.labels(reason.value).inc()
        # One line per loss, a warning: the client is told, nothing to fix here.
        log.warning(
            "claimed runner %s lost: %s",
            runner_id,
            reason,
            extra={"runner_id": runner_id, "reason": reason.value},
        )
        return True

    def retire(self, view: RunnerView) -> bool:
        """Stop an idle runner over the version `view` shows (EnforceIndex)
        before it is deleted, where other replicas hand runners out too: a
        claim one of them wrote since makes this fail (IndexConflict,
        raised), and once this has landed their claims of it fail, or find
        it stopped. A deregistration cannot be made conditional; this write
        can. False when the spec held is not the one `view` shows (nothing
        written; the next pass decides). Raises NomadUnavailable /
        NomadAPIError when the write fails."""
        return self._rewrite(view.id, view.job.job_modify_index, jobs.with_stop)

    def _rewrite(
        self, runner_id: str, job_modify_index: int, change: Callable[[JsonDict], JsonDict]
    ) -> bool:
        """Register `change` of the runner's spec over `job_modify_index`
        (EnforceIndex) if that is the version we hold; False, with nothing
        written, when it is not. Raises as the register does."""
        spec = self._observer.spec(runner_id)
        if spec is None or jobs.modify_index(spec) != job_modify_index:
            return False
        self._writer.register(change(spec), enforce_index=job_modify_index)
        return True

    def record_loss(self, view: RunnerView) -> LossReason | None:
        """The loss of a claimed runner as Nomad records it, written now if the
        controller has derived a reset that no pass has written yet; None when
        the runner was deleted meanwhile (it is gone).

        A client must never be told a reason that is not recorded: another
        answer (after a restart, say) would derive the reason anew from a
        state that has moved on. Raises NomadUnavailable / NomadAPIError when
        Nomad cannot take the write, IndexConflict when the job kept changing
        under three attempts (the client is asked to retry)."""
        claim = view.job.claim
        assert claim is not None
        if claim.lost_reason is not None:
            return claim.lost_reason
        assert view.reset is not None
        return self.write_loss(view, view.reset)

    def write_loss(self, view: RunnerView, reason: LossReason) -> LossReason | None:
        """End the claim with `reason` unless somebody ended it first; the loss
        Nomad then records (None: the runner is gone). A conflicting write is
        read back from Nomad and the write tried again on it, three times at
        most. Raises as `record_loss`."""
        if not self._can_serve():
            raise NotLeader
        job_modify_index = view.job.job_modify_index
        for _ in range(3):
            try:
                if self.end_claim(view.id, job_modify_index, reason):
                    return reason
            except IndexConflict:
                pass  # somebody wrote first (a pass, most likely): read what
            spec = self._gateway.get_job(view.id)
            if spec is None:
                return None
            self._observer.apply_spec(view.id, spec)
            runner = jobs.runner_from_job(spec, view.env_id)
            if runner.claim is None:
                return None
            if runner.claim.lost_reason is not None:
                return runner.claim.lost_reason
            job_modify_index = jobs.modify_index(spec)
        raise IndexConflict(f"runner {view.id} kept changing while its loss was recorded")

    def lookup(self, runner_id: str) -> RunnerView | None:
        return self._observer.snapshot.runners.get(runner_id)

    def touch(self, runner_id: str) -> bool:
        """A request touched the runner: its inactivity timer starts again.
        False when its release for inactivity is already decided (it expired)."""
        with self._lock:
            if runner_id in self._expiring:
                return False
            self._activity[runner_id] = self._clock.now_ns()
            return True

    def begin_use(self, runner_id: str, what: str) -> RunnerUse | None:
        """A use of the runner (an execution, a file operation) starts: its
        timer stays fresh until the use ends. None (and nothing started) when
        the runner already expired."""
        with self._lock:
            if runner_id in self._expiring:
                return None
            return self.uses.begin(runner_id, what)

    def _use_ending(self, runner_id: str) -> None:
        """A use ends: the timer counts again from now."""
        with self._lock:
            if runner_id not in self._expiring:
                self._activity[runner_id] = self._clock.now_ns()

    def begin_expiry(self, view: RunnerView, now_ns: int) -> bool:
        """Decide the release of an expired claim; False if it is not (or no
        longer) expired. From then on `touch` refuses the runner."""
        with self._lock:
            if not self._expired_locked(view, now_ns):
                return False
            self._expiring.add(view.id)
            return True

    def last_activity(self, views: Iterable[RunnerView]) -> dict[str, int]:
        """When each claimed runner with an inactivity timer was last touched,
        through this replica or (leader election on) any other (claim time or
        our start at least). Reads the other replicas' activity from Nomad
        when it is due. A pass asks about every runner of its environment, and
        the held ones without a timer can be thousands: they are passed over."""
        timed = [v for v in views if _may_expire(v)]
        if not timed:
            return {}  # an environment without timers reads nothing
        remote = self._shared.read() if self._shared is not None else {}
        with self._lock:
            return self._last_activity_locked(timed, remote)

    def _last_activity_locked(
        self, views: Iterable[RunnerView], remote: Mapping[str, int] | None
    ) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in views:
            if v.job.claim is None:
                continue
            floor = max(v.job.claim.claimed_at, self._started_ns)
            if remote is None or self.uses.busy(v.id):
                # In use here, or the others' activity unknown: active now.
                floor = max(floor, self._clock.now_ns())
            elif v.id in remote:
                floor = max(floor, remote[v.id])
            out[v.id] = max(self._activity.get(v.id, 0), floor)
        return out

    def _expired_locked(self, view: RunnerView, now_ns: int) -> bool:
        if not _may_expire(view):
            return False
        if view.id in self._expiring:
            return True
        remote = self._shared.known() if self._shared is not None else {}
        last = self._last_activity_locked([view], remote)[view.id]
        assert view.job.claim is not None
        return now_ns >= last + view.job.claim.timeout * SECOND

    def lookup_claimed(self, runner_id: str) -> RunnerView | None:
        """The runner, read again from Nomad first when this replica's snapshot
        does not show it claimed: every replica serves, and another may have
        claimed it a moment ago (its client's next request can reach us before
        the event does). Only ids that can name a runner are read. Raises as
        `Observer.reread`."""
        view = self._observer.snapshot.runners.get(runner_id)
        if (view is None or not view.claimed) and jobs.runner_env_id(runner_id) is not None:
            self._observer.reread([runner_id])
            view = self._observer.snapshot.runners.get(runner_id)
        return view

    def release(self, runner_id: str) -> bool:
        """End a claim (deregister with purge). False when there is no such claim."""
        if not self._can_serve():
            raise NotLeader
        view = self.lookup_claimed(runner_id)
        if view is None or not view.claimed or self._expectations.is_deleting(runner_id):
            return False
        self._expectations.expect_delete(view.env_id, runner_id)
        try:
            result = self._gateway.deregister_job(runner_id, purge=True, ride_through=True)
        except Exception:
            self._expectations.delete_failed(runner_id)
            raise
        self._expectations.deleted(runner_id, result.index)
        self._observer.forget(runner_id)
        self.forget(runner_id)
        self._metrics.jobs_deleted.labels("released").inc()
        self._on_change(view.env_id)
        return True

    def forget(self, runner_id: str) -> None:
        with self._lock:
            self._activity.pop(runner_id, None)
            self._handed.pop(runner_id, None)
            self._expiring.discard(runner_id)

    def check(self, views: Iterable[RunnerView]) -> dict[str, int]:
        """Invariant violations among the runners this process handed out:
        claimed by another writer since, or seen idle. A runner that vanished
        (deleted, released elsewhere) is simply forgotten."""
        found = {"claimed_twice": 0, "claimed_in_pool": 0}
        seen: set[str] = set()
        with self._lock:
            for view in views:
                claimed_at = self._handed.get(view.id)
                if claimed_at is None or not view.known:
                    continue
                seen.add(view.id)
                claim = view.job.claim
                if claim is None:
                    found["claimed_in_pool"] += 1
                    log.error("runner %s that we handed out is idle again", view.id)
                    del self._handed[view.id]
                elif claim.claimed_at != claimed_at:
                    found["claimed_twice"] += 1
                    log.error("runner %s that we handed out was claimed again", view.id)
                    del self._handed[view.id]
        return found

    def prune(self, present: set[str] | frozenset[str]) -> None:
        """Forget runners no longer in Nomad."""
        with self._lock:
            for runner_id in [r for r in self._handed if r not in present]:
                del self._handed[runner_id]
            for runner_id in [r for r in self._activity if r not in present]:
                del self._activity[runner_id]
            self._expiring &= present


def _may_expire(view: RunnerView) -> bool:
    """A claim with an inactivity timeout, not ended by a loss."""
    claim = view.job.claim
    return claim is not None and claim.timeout > 0 and claim.lost_reason is None
