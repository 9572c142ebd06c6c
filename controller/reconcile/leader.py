"""Leader election over a Nomad variable lock, so that of several controller
replicas only one reconciles at a time.

The lock's TTL is the lease. `is_leader()` is computed from the clock on every
call: it is True only while less than one TTL has passed since the start of
the last successful acquire or renew. Timing from the *start* of the request
is conservative (the server renewed no earlier than that), and computing it on
demand means a replica whose renewals hang stops acting the moment its lease
may have run out, without waiting for its own elector thread to notice. The
server keeps a lock for longer than one TTL and then refuses it to everyone
for a further LockDelay, so by the time another replica can acquire it, this
one has long stopped claiming leadership.

`on_change` is a notification from whichever thread runs `step()`; it may
lag `is_leader()`, which is the authority callers must check before acting.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from controller.clock import Clock
from controller.nomad.gateway import Lock, LockHeld, NomadAPIError, NomadUnavailable

log = logging.getLogger(__name__)

RENEW_FRACTION = 0.7  # of the TTL between renewals while leading
ACQUIRE_FRACTION = 1.1  # of the TTL between acquire attempts while following
# While following, the lock is read this often: a leader that steps down
# (a drain) releases it, and a follower takes it within about this long. A
# read is cheap for Nomad; an acquire attempt is a Raft write.
WATCH_S = 0.5
RETRY_FRACTION = 0.1  # of the TTL between renewals after one failed
# Nomad refuses lock TTLs under 10 s. A shorter lease (tests, fast failover
# after a clean stop) is still safe: we stop claiming leadership after our own
# TTL, long before the server would hand the lock to anyone else.
NOMAD_MIN_TTL_S = 10.0


class LockGateway(Protocol):
    """The part of `NomadGateway` the elector uses; any NomadGateway is one."""

    def lock_acquire(self, path: str, ttl_s: float, lock_delay_s: float) -> Lock: ...

    def lock_renew(self, lock: Lock) -> None: ...

    def lock_release(self, lock: Lock) -> None: ...

    def lock_held(self, path: str) -> bool: ...


class LeaderElector:
    """Holds (or keeps trying to take) the variable lock at `path`."""

    def __init__(
        self,
        gateway: LockGateway,
        path: str,
        clock: Clock,
        ttl_s: float = 15.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self._gateway = gateway
        self._path = path
        self._clock = clock
        self._ttl_s = ttl_s
        self._on_change = on_change
        # Guards the lease state; never held across a call to Nomad.
        self._mu = threading.Lock()
        self._lock: Lock | None = None
        self._lease_start: float | None = None  # start of the last successful acquire/renew
        self._last_error: str | None = None
        self._reported = False  # the last value given to on_change
        # The last acquire found the lock held by another replica: watch it
        # with reads rather than try again (a write) until it is free.
        self._held_elsewhere = False
        # Keeps on_change calls in the order the changes happened when stop()
        # and the elector thread report at once; reentrant so on_change may
        # itself call stop().
        self._report_mu = threading.RLock()
        # Serialises steps (the thread's and any a test drives) without
        # blocking is_leader() behind a slow request.
        self._step_mu = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> str:
        return self._path

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    def is_leader(self) -> bool:
        """True only while this replica's lease is certainly still valid."""
        with self._mu:
            return self._valid_locked(self._clock.monotonic())

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Run `step()` on a daemon thread until `stop()`."""
        if self._thread is not None:
            raise RuntimeError("leader elector already started")
        self._thread = threading.Thread(
            target=self._run, name=f"leader-elector:{self._path}", daemon=True
        )
        self._thread.start()

    def stop(self, join_timeout_s: float = 1.0) -> None:
        """Stop the thread and give the lock up (best effort) so a peer can take
        over at once instead of waiting for the lease to run out."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # A thread stuck in a slow request must not hold up shutdown: it
            # checks the stop flag when the request returns and gives up then.
            thread.join(join_timeout_s)
        self._give_up("stopped", release=True)

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            try:
                delay = self.step()
            except Exception:
                # The elector must outlive any bug in a gateway or callback.
                log.exception("leader election step failed")
                delay = RETRY_FRACTION * self._ttl_s

    # -- one iteration -------------------------------------------------------

    def step(self) -> float:
        """Run one iteration: acquire, renew, or notice the lease ran out.
        Returns the seconds until the next iteration is due."""
        with self._step_mu:
            if self._stop.is_set():
                return self._ttl_s
            with self._mu:
                lock = self._lock
                expired = lock is not None and not self._valid_locked(self._clock.monotonic())
                why = self._last_error
            if lock is None:
                return self._acquire()
            if expired:
                # Release in case the server still has it (the failures were
                # ours to reach it): the lock is then free at once, rather
                # than after the server's expiry plus LockDelay.
                reason = "could not renew the lock within its TTL"
                self._give_up(f"{reason} ({why})" if why else reason, release=True)
                return 0.0
            return self._renew(lock)

    def _acquire(self) -> float:
        retry = ACQUIRE_FRACTION * self._ttl_s
        if self._held_elsewhere:
            # Following: read until the lock is free, then try for it.
            try:
                if self._gateway.lock_held(self._path):
                    return min(WATCH_S, retry)
            except (NomadUnavailable, NomadAPIError) as e:
                log.warning("could not read leader lock %s: %s", self._path, e)
                return retry
        start = self._clock.monotonic()
        try:
            server_ttl = max(self._ttl_s, NOMAD_MIN_TTL_S)
            lock = self._gateway.lock_acquire(self._path, server_ttl, server_ttl)
        except LockHeld:
            log.debug("leader lock %s is held by another replica", self._path)
            self._held_elsewhere = True
            return min(WATCH_S, retry)
        except (NomadUnavailable, NomadAPIError) as e:
            log.warning("could not try to acquire leader lock %s: %s", self._path, e)
            return retry
        with self._mu:
            stopped = self._stop.is_set()
            if not stopped:
                self._lock = lock
                self._lease_start = start
                self._last_error = None
        if stopped:
            # stop() ran while we were asking; it could not release what it
            # did not know we held.
            self._release(lock)
            return self._ttl_s
        self._report("")
        return RENEW_FRACTION * self._ttl_s

    def _renew(self, lock: Lock) -> float:
        start = self._clock.monotonic()
        try:
            self._gateway.lock_renew(lock)
        except LockHeld:
            with self._mu:
                if self._lock is lock:
                    self._lock = None
                    self._lease_start = None
            self._report("the lock is no longer ours")
            return ACQUIRE_FRACTION * self._ttl_s
        except (NomadUnavailable, NomadAPIError) as e:
            log.warning("could not renew leader lock %s: %s", self._path, e)
            with self._mu:
                self._last_error = str(e)
                left = self._time_left_locked(self._clock.monotonic())
            # Retry soon, but wake exactly when the lease runs out so the
            # loss is reported (and the lock released) without delay.
            return max(0.0, min(RETRY_FRACTION * self._ttl_s, left))
        with self._mu:
            if self._lock is lock:
                self._lease_start = start
                self._last_error = None
        self._report("")
        return RENEW_FRACTION * self._ttl_s

    # -- helpers --------------------------------------------------------------

    def _give_up(self, why: str, release: bool) -> None:
        with self._mu:
            lock = self._lock
            self._lock = None
            self._lease_start = None
        if release and lock is not None:
            self._release(lock)
        self._report(why)

    def _release(self, lock: Lock) -> None:
        try:
            self._gateway.lock_release(lock)
        except (NomadUnavailable, NomadAPIError, LockHeld) as e:
            log.warning("could not release leader lock %s: %s", self._path, e)

    def _report(self, why: str) -> None:
        """Tell on_change (and the log) if leadership changed since last told."""
        with self._report_mu:
            with self._mu:
                leader = self._valid_locked(self._clock.monotonic())
                if leader == self._reported:
                    return
                self._reported = leader
            if leader:
                log.info("became leader (lock %s)", self._path)
            else:
                log.info("lost leadership: %s", why or "lease expired")
            if self._on_change is not None:
                self._on_change(leader)

    def _time_left_locked(self, now: float) -> float:
        if self._lock is None or self._lease_start is None:
            return 0.0
        return self._lease_start + self._ttl_s - now

    def _valid_locked(self, now: float) -> bool:
        return self._time_left_locked(now) > 0
