"""prewarming: the adaptive pool size of each environment — its history
(claims and start-ups), the policy's decision over it, and the history's
home in Nomad.

The protocol: the leader keeps one `History` per environment in memory and
one Nomad variable per environment (`<prefix>/<env id>`, item `history`)
as its copy across restarts and leader changes. A history is read the first
time the leader needs it (`loaded` is false again after losing leadership,
so a new term re-reads what the last leader wrote); an unreadable or
missing one starts empty, and the floor still holds. It is written when a
pass finds it changed and last written at least `save_interval_s` before,
and by `save_all` when the leader hands the lock over. Only the leader
writes; a write lost to a crash costs at most one interval of history.

A claim costs the claim path one append (`record_claim`): claims wait in
`pending` and are folded into the history in one step when a pass decides
or the history is written, so the claim path neither waits for Nomad nor
copies four weeks of buckets. Every replica serves claims, but only the
leader keeps histories: it records its own claims as they are made and, in
each pass, the claims it observes in Nomad that another replica made during
its term (`observe_claims`; a claim released again before the leader saw it
is not counted). A follower records nothing.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Protocol

from controller.clock import Clock
from controller.model import SECOND
from controller.prewarm.history import (
    REAL_TIME,
    ClaimHistory,
    History,
    Timescale,
    from_json,
    record_many,
    record_startup,
    to_json,
)
from controller.prewarm.policy import Decision, PolicyInput, PolicyParams, ceiling_for, target

log = logging.getLogger(__name__)

HISTORY_ITEM = "history"


@dataclass(frozen=True)
class PrewarmSettings:
    adaptive: bool = False  # False: the pool is prewarmingPoolSize, as always
    ceiling_multiple: float = 10.0
    ceiling_cap: int = 100
    variable_prefix: str = "nomad-runner-controller/prewarm"
    save_interval_s: float = 60.0
    params: PolicyParams = field(default_factory=PolicyParams)
    timescale: Timescale = REAL_TIME  # compressed only by tests


class VariableStore(Protocol):
    def get_variable(self, path: str) -> dict[str, str] | None: ...

    def put_variable(self, path: str, items: dict[str, str]) -> None: ...


@dataclass
class _Env:
    history: History
    loaded: bool = False
    pending: list[int] = field(default_factory=list)  # ns, claims not yet in `history`
    counted: set[str] = field(default_factory=set)  # runners whose claim is recorded
    dirty: bool = False
    saved_at: int | None = None  # ns, of our last write
    decision: Decision | None = None


class Prewarmer:
    """Per-environment histories and decisions (see the module docstring)."""

    def __init__(self, *, settings: PrewarmSettings, store: VariableStore, clock: Clock) -> None:
        self.settings = settings
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()  # guards _envs; never held across a Nomad call
        self._envs: dict[int, _Env] = {}
        # Claims made before this term are the last leader's to have recorded.
        self._term_start_ns = clock.now_ns()

    def _new(self) -> _Env:
        return _Env(History(claims=ClaimHistory(scale=self.settings.timescale)))

    def path(self, env_id: int) -> str:
        return f"{self.settings.variable_prefix}/{env_id}"

    def record_claim(self, env_id: int, runner_id: str) -> None:
        """This replica, leading, made a claim: O(1), folded in by the next pass."""
        now = self._clock.now_ns()
        with self._lock:
            env = self._envs.setdefault(env_id, self._new())
            env.pending.append(now)
            env.counted.add(runner_id)

    def observe_claims(self, env_id: int, claimed: dict[str, int]) -> None:
        """The environment's claimed runners as a pass sees them (id → claim
        time, ns): those another replica claimed during this term are recorded.
        Runners no longer claimed are forgotten."""
        with self._lock:
            env = self._envs.setdefault(env_id, self._new())
            for runner_id, claimed_at in claimed.items():
                if runner_id not in env.counted and claimed_at >= self._term_start_ns:
                    env.pending.append(claimed_at)
                    env.counted.add(runner_id)
            env.counted &= claimed.keys()

    def record_startup(self, env_id: int, duration_ns: int) -> None:
        with self._lock:
            env = self._envs.setdefault(env_id, self._new())
            startups = record_startup(env.history.startups, duration_ns)
            env.history = replace(env.history, startups=startups)
            env.dirty = True

    def decide(self, env_id: int, floor: int) -> Decision:
        """The pool size to keep now (reads the history on first use, writes it
        when due)."""
        self._load(env_id)
        now = self._clock.now_ns()
        s = self.settings
        with self._lock:
            env = self._envs[env_id]
            self._fold(env)
            h = env.history
            decision = target(
                PolicyInput(
                    claims=h.claims,
                    startups=h.startups,
                    now=now,
                    floor=floor,
                    ceiling=ceiling_for(floor, s.ceiling_multiple, s.ceiling_cap),
                    hold=h.hold,
                    params=s.params,
                )
            )
            if decision.hold != h.hold:
                env.history = replace(h, hold=decision.hold)
                # A new `needed_at` alone waits for the next write a claim
                # causes: an idle environment is not rewritten every minute.
                # (A hold below the floor reads as the floor.)
                env.dirty |= decision.hold.target != max(h.hold.target, floor)
            env.decision = decision
            due = env.dirty and (
                env.saved_at is None or now - env.saved_at >= s.save_interval_s * SECOND
            )
        if due:
            self._save(env_id)
        return decision

    def decision(self, env_id: int) -> Decision | None:
        """The last decision for the environment (None before its first adaptive pass)."""
        with self._lock:
            env = self._envs.get(env_id)
            return env.decision if env is not None else None

    def history(self, env_id: int) -> History:
        with self._lock:
            env = self._envs.get(env_id)
            if env is None:
                return self._new().history
            self._fold(env)
            return env.history

    def _fold(self, env: _Env) -> None:
        """Pending claims into a loaded history (under the lock)."""
        if not env.loaded or not env.pending:
            return
        env.history = replace(env.history, claims=record_many(env.history.claims, env.pending))
        env.pending = []
        env.dirty = True

    def forget(self, env_id: int) -> None:
        """The environment is gone: nothing of it stays in memory."""
        with self._lock:
            self._envs.pop(env_id, None)

    def save_all(self) -> None:
        """Write every changed history now (the leader hands the lock over)."""
        with self._lock:
            dirty = [env_id for env_id, env in self._envs.items() if env.dirty and env.loaded]
        for env_id in dirty:
            self._save(env_id)

    def unload(self) -> None:
        """No longer the leader: the next term re-reads every history from Nomad.
        Claims recorded since the last write are written by `save_all` first."""
        with self._lock:
            self._envs.clear()
            self._term_start_ns = self._clock.now_ns()

    def _load(self, env_id: int) -> None:
        with self._lock:
            env = self._envs.get(env_id)
            if env is not None and env.loaded:
                return
        try:
            items = self._store.get_variable(self.path(env_id))
        except Exception as exc:
            # Nomad unreachable: decide from what is in memory, read again next pass.
            log.warning("prewarm history of environment %d unreadable: %s", env_id, exc)
            with self._lock:
                self._envs.setdefault(env_id, self._new())
            return
        loaded = self._new().history
        if items is not None and HISTORY_ITEM in items:
            try:
                loaded = from_json(items[HISTORY_ITEM], self.settings.timescale)
            except ValueError as exc:
                log.warning("prewarm history of environment %d discarded: %s", env_id, exc)
        with self._lock:
            env = self._envs.setdefault(env_id, self._new())
            if env.loaded:
                return  # another pass read it meanwhile
            startups = loaded.startups
            for sample in env.history.startups.samples_ms:  # recorded before the read
                startups = record_startup(startups, sample * 1_000_000)
            env.history = History(claims=loaded.claims, startups=startups, hold=loaded.hold)
            env.dirty = env.history.startups != loaded.startups
            env.loaded = True
            self._fold(env)  # claims made before the read

    def _save(self, env_id: int) -> None:
        with self._lock:
            env = self._envs.get(env_id)
            if env is None or not env.loaded:
                return
            self._fold(env)
            text = to_json(env.history)
            env.dirty = False
            env.saved_at = self._clock.now_ns()
        try:
            self._store.put_variable(self.path(env_id), {HISTORY_ITEM: text})
        except Exception as exc:
            log.warning("prewarm history of environment %d not written: %s", env_id, exc)
            with self._lock:
                env.dirty = True
