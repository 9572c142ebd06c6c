"""Nomad Variables with check-and-set and locks.

Locks follow nomad/locks.go: the leader keeps a timer of 2×TTL from the last
acquire or renew; when it fires the lock is dead (renew and acquire answer
409) and after a further LockDelay the server removes the lock from the
variable. Renewing is not a raft write, so it does not move ModifyIndex."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nomadsim.clock import SimTime
from nomadsim.encode import SECOND
from nomadsim.encode import variable as encode
from nomadsim.records import Variable, VariableLock
from nomadsim.state import StateStore

if TYPE_CHECKING:
    import asyncio

PATH_RE = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")
MIN_TTL = 10 * SECOND
MAX_TTL = 24 * 3600 * SECOND
DEFAULT_TTL = 15 * SECOND


class VariableError(Exception):
    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body


_UNITS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": SECOND,
    "m": 60 * SECOND,
    "h": 3600 * SECOND,
}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


def parse_go_duration(text: str) -> int:
    """Go's time.ParseDuration, in nanoseconds. Raises ValueError."""
    if text == "0":
        return 0
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    pos = 0
    total = 0.0
    for m in _DURATION_RE.finditer(body):
        if m.start() != pos:
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(body):
        raise ValueError(f"invalid duration {text!r}")
    return sign * int(total)


def lock_duration(value: Any, default: int) -> int:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise ValueError("invalid duration")
    if isinstance(value, int):
        return value
    return parse_go_duration(str(value))


def validate_path(path: str) -> None:
    if not path:
        raise VariableError(400, "missing variable path")
    if not PATH_RE.match(path):
        raise VariableError(400, f'invalid path "{path}"')


class Variables:
    def __init__(self, store: StateStore, time: SimTime, new_id: Callable[[], str]) -> None:
        self._store = store
        self._time = time
        self._new_id = new_id
        # (ns, path) -> timer that kills the lock 2×TTL after the last acquire/renew
        self._ttl_timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        # locks whose TTL ran out and that are waiting out their LockDelay
        self._dead: set[tuple[str, str]] = set()

    def _zero(self, ns: str, path: str) -> dict[str, Any]:
        return {
            "Namespace": ns,
            "Path": path,
            "CreateIndex": 0,
            "CreateTime": 0,
            "ModifyIndex": 0,
            "ModifyTime": 0,
        }

    def get(self, ns: str, path: str) -> Variable | None:
        return self._store.variables.get((ns, path))

    def put(
        self, ns: str, path: str, items: dict[str, str], cas: int | None, lock_id: str | None
    ) -> Variable:
        validate_path(path)
        if not items:
            raise VariableError(400, "variable missing required Items object")
        current = self.get(ns, path)
        if cas is not None:
            if current is None and cas != 0:
                raise VariableError(409, "cas conflict", self._zero(ns, path))
            if current is not None and current.modify_index != cas:
                raise VariableError(409, "cas conflict", encode(current, lock_id=True))
        if current is not None and current.lock is not None and current.lock.id != lock_id:
            raise VariableError(409, "attempting to modify locked variable", self._zero(ns, path))
        return self._write(ns, path, current, items=tuple(sorted(items.items())))

    def delete(self, ns: str, path: str, cas: int | None) -> None:
        validate_path(path)
        current = self.get(ns, path)
        if cas is not None:
            if current is None and cas != 0:
                raise VariableError(409, "cas conflict", self._zero(ns, path))
            if current is not None and current.modify_index != cas:
                raise VariableError(409, "cas conflict", encode(current, lock_id=True))
        if current is None:
            return
        if current.lock is not None:
            raise VariableError(409, "attempting to modify locked variable", self._zero(ns, path))
        with self._store.txn("VarApply") as tx:
            tx.delete_variable(ns, path)

    def _write(self, ns: str, path: str, current: Variable | None, **changes: Any) -> Variable:
        now = self._time.now_ns()
        with self._store.txn("VarApply") as tx:
            base = current or Variable(
                namespace=ns, path=path, create_index=tx.index, create_time=now
            )
            new = replace(base, modify_index=tx.index, modify_time=now, **changes)
            tx.put_variable(new)
        return new

    # -- locks ------------------------------------------------------------------

    def acquire(
        self, ns: str, path: str, items: dict[str, str] | None, ttl: Any, delay: Any
    ) -> Variable:
        validate_path(path)
        try:
            ttl_ns = lock_duration(ttl, DEFAULT_TTL)
            delay_ns = lock_duration(delay, DEFAULT_TTL)
        except ValueError as exc:
            raise VariableError(400, f"invalid lock duration: {exc}") from None
        if ttl_ns < 0 or delay_ns < 0:
            raise VariableError(
                400, "1 error occurred:\n\t* Lock delay and TTL must be positive\n\n"
            )
        if not MIN_TTL <= ttl_ns <= MAX_TTL:
            raise VariableError(
                400, "1 error occurred:\n\t* TTL must be between 10 seconds and 24 hours\n\n"
            )
        current = self.get(ns, path)
        if current is not None and current.lock is not None:
            raise VariableError(409, "lock held", self._zero(ns, path))
        lock = VariableLock(id=self._new_id(), ttl_ns=ttl_ns, lock_delay_ns=delay_ns)
        changes: dict[str, Any] = {"lock": lock}
        if items:
            changes["items"] = tuple(sorted(items.items()))
        new = self._write(ns, path, current, **changes)
        self._arm(ns, path, lock)
        return new

    def renew(self, ns: str, path: str, lock_id: str) -> Variable:
        validate_path(path)
        current = self.get(ns, path)
        if current is None:
            raise VariableError(404, "variable doesn't exist")
        if current.lock is None:
            raise VariableError(409, "variable doesn't hold a lock")
        if current.lock.id != lock_id or (ns, path) in self._dead:
            raise VariableError(409, "attempting to modify locked variable")
        self._arm(ns, path, current.lock)
        return current

    def release(self, ns: str, path: str, lock_id: str) -> Variable:
        validate_path(path)
        current = self.get(ns, path)
        if current is None:
            raise VariableError(500, "variable doesn't exist")
        if current.lock is None:
            raise VariableError(500, "variable doesn't hold a lock")
        if current.lock.id != lock_id:
            raise VariableError(409, "attempting to modify locked variable", self._zero(ns, path))
        self._disarm(ns, path)
        return self._write(ns, path, current, lock=None)

    def _arm(self, ns: str, path: str, lock: VariableLock) -> None:
        key = (ns, path)
        self._time.timers.cancel(self._ttl_timers.pop(key, None))
        self._ttl_timers[key] = self._time.timers.call_later(
            self._time.scaled(2 * lock.ttl_ns) / SECOND, lambda: self._expire(key, lock)
        )

    def _disarm(self, ns: str, path: str) -> None:
        key = (ns, path)
        self._time.timers.cancel(self._ttl_timers.pop(key, None))
        self._dead.discard(key)

    def _expire(self, key: tuple[str, str], lock: VariableLock) -> None:
        self._ttl_timers.pop(key, None)
        current = self.get(*key)
        if current is None or current.lock is None or current.lock.id != lock.id:
            return
        self._dead.add(key)
        self._time.timers.call_later(
            self._time.scaled(lock.lock_delay_ns) / SECOND,
            lambda: self._remove(key, lock),
        )

    def _remove(self, key: tuple[str, str], lock: VariableLock) -> None:
        self._dead.discard(key)
        current = self.get(*key)
        if current is None or current.lock is None or current.lock.id != lock.id:
            return
        self._write(key[0], key[1], current, lock=None)
