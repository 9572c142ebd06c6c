"""worker: the generic half of the reconcile loop, as controller-runtime
splits it — threads that take keys off the work queue, run a `Reconciler`
on each, and act on the `Result` it returns; nothing here knows what a key
means.

The contract, in controller-runtime's words: `reconcile(key)` reads the
whole state of the key and moves it towards what is wanted; it is called
again for the same key whenever anything might have changed, so it must be
idempotent and may not assume why it was called. It never touches the
queue: it returns a result, and the worker

- forgets the key's backoff when the pass succeeded;
- re-adds the key with per-key exponential backoff when the pass raised or
  some of its writes failed;
- re-adds the key after `requeue_after_s` when the pass asks to look again
  at a known time (a timer, a grace period);
- spaces passes of one key by four times what the last one cost, and by
  20 ms at least (see `_space`).

Reconcile and queue metrics come from here, labelled with the worker's name.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from controller.clock import Clock
from controller.logs import log_context
from controller.metrics import QUEUE, Metrics
from controller.reconcile.queue import WorkQueue

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)

PASS_SPACING_MIN_S = 0.02  # see Worker._space


@dataclass(frozen=True)
class Result:
    """What one pass asks of the worker."""

    requeue_after_s: float | None = None  # look again then, whatever happens meanwhile
    failed_writes: int = 0  # > 0: retried with backoff
    # What the pass cost before waiting on its writes; the next pass of the
    # key starts no sooner than four times this after it.
    cost_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failed_writes == 0


class Reconciler(Protocol[K_contra]):
    def reconcile(self, key: K_contra) -> Result:
        """One idempotent pass over `key` (see the module docstring)."""
        ...


class Worker(Generic[K]):
    def __init__(
        self,
        *,
        reconciler: Reconciler[K],
        queue: WorkQueue[K],
        clock: Clock,
        metrics: Metrics,
        name: str,
        threads: int,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self._reconciler = reconciler
        self.queue = queue
        self._clock = clock
        self._metrics = metrics
        self._name = name
        self._threads_wanted = threads
        self._active = active  # False: keys are taken off the queue but not reconciled
        self._pass_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._added_at: dict[K, float] = {}  # when a waiting key was first added
        self._last_pass: dict[K, tuple[float, float]] = {}  # key → (started, cost)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def add(self, key: K) -> None:
        """Ask for a pass over `key` (deduplicated by the queue)."""
        with self._lock:
            self._added_at.setdefault(key, self._clock.monotonic())
        self._metrics.queue_adds.labels(QUEUE).inc()
        self.queue.add(key)

    def start(self) -> None:
        for n in range(self._threads_wanted):
            thread = threading.Thread(target=self._run, name=f"nrc-worker-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self.queue.shutdown()
        for thread in self._threads:
            thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout_s=0.5)
            self._metrics.queue_depth.labels(QUEUE).set(self.queue.depth)
            if key is None:
                continue
            started = self._clock.monotonic()
            with self._lock:
                added = self._added_at.pop(key, started)
            self._metrics.queue_wait_seconds.labels(QUEUE).observe(started - added)
            with log_context(environment_id=key, reconcile_id=next(self._pass_ids)):
                self._process(key)
            self.queue.done(key)
            self._metrics.queue_work_seconds.labels(QUEUE).observe(
                self._clock.monotonic() - started
            )

    def _process(self, key: K) -> None:
        if not self._active():
            # A follower takes keys off the queue but does not reconcile;
            # its passes are not counted as reconciles.
            self.queue.forget(key)
            return
        self._space(key)
        started = self._clock.monotonic()
        try:
            result = self._reconciler.reconcile(key)
        except Exception:
            log.warning("pass failed; retrying with backoff", exc_info=True)
            result = Result(failed_writes=1)
        else:
            with self._lock:
                self._last_pass[key] = (started, result.cost_s)
            if result.requeue_after_s is not None:
                self.queue.add_after(key, max(0.0, result.requeue_after_s))
                self._metrics.reconcile_total.labels(self._name, "requeue_after").inc()
            self._metrics.reconcile_seconds.labels(self._name).observe(
                self._clock.monotonic() - started
            )
        if result.ok:
            self.queue.forget(key)
            self._metrics.reconcile_total.labels(self._name, "success").inc()
        else:
            # A raised error or a write that failed: the pass is retried.
            self._metrics.reconcile_errors.labels(self._name).inc()
            self._metrics.reconcile_total.labels(self._name, "error").inc()
            self._metrics.queue_retries.labels(QUEUE).inc()
            self.queue.add_rate_limited(key)

    def _space(self, key: K) -> None:
        """Let passes of one key start no closer than four times what the last
        one cost before its writes (and 20 ms): a pass reads every runner of
        the environment, and under a stream of claims and events back-to-back
        passes would take the CPU the claims need. Whatever arrives meanwhile
        is handled by the pass that follows (the queue keeps the key)."""
        with self._lock:
            started, cost = self._last_pass.get(key, (float("-inf"), 0.0))
        wait = started + max(PASS_SPACING_MIN_S, 4 * cost) - self._clock.monotonic()
        if wait > 0:
            self._stop.wait(wait)
