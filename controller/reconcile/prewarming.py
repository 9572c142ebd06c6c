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

Claims that arrive before the history is read are kept aside and recorded
into it once read, so the claim path never waits for Nomad.
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
    record,
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
    early_claims: list[int] = field(default_factory=list)  # ns, before `loaded`
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

    def _new(self) -> _Env:
        return _Env(History(claims=ClaimHistory(scale=self.settings.timescale)))

    def path(self, env_id: int) -> str:
        return f"{self.settings.variable_prefix}/{env_id}"

    def record_claim(self, env_id: int) -> None:
        now = self._clock.now_ns()
        with self._lock:
            env = self._envs.setdefault(env_id, self._new())
            if env.loaded:
                env.history = replace(env.history, claims=record(env.history.claims, now))
                env.dirty = True
            else:
                env.early_claims.append(now)

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
            return env.history if env is not None else self._new().history

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
            claims = loaded.claims
            for t in env.early_claims:
                claims = record(claims, t)
            startups = loaded.startups
            for sample in env.history.startups.samples_ms:  # recorded before the read
                startups = record_startup(startups, sample * 1_000_000)
            env.history = History(claims=claims, startups=startups, hold=loaded.hold)
            env.dirty = bool(env.early_claims or env.history.startups != loaded.startups)
            env.early_claims = []
            env.loaded = True

    def _save(self, env_id: int) -> None:
        with self._lock:
            env = self._envs.get(env_id)
            if env is None or not env.loaded:
                return
            text = to_json(env.history)
            env.dirty = False
            env.saved_at = self._clock.now_ns()
        try:
            self._store.put_variable(self.path(env_id), {HISTORY_ITEM: text})
        except Exception as exc:
            log.warning("prewarm history of environment %d not written: %s", env_id, exc)
            with self._lock:
                env.dirty = True
