"""Execution ids between `POST /runners/{id}/execute` and the WebSocket connect.

An id is one-shot (the connect takes it; a second connect with it is 404, as
in Poseidon) and belongs to one runner. Unlike Poseidon, an id nobody
connects expires after a set time, so abandoned requests do not pile up for
the runner's whole life. Ids live in this process only: a client whose
controller restarted between the two calls asks for a new one (404).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass

from controller.clock import Clock
from controller.execution.command import ExecutionRequest


@dataclass(frozen=True)
class Execution:
    id: str
    runner_id: str
    request: ExecutionRequest
    expires_at: float  # monotonic seconds


class ExecutionStore:
    def __init__(self, clock: Clock, ttl_s: float) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._pending: dict[str, Execution] = {}

    def add(self, runner_id: str, request: ExecutionRequest) -> Execution:
        now = self._clock.monotonic()
        execution = Execution(secrets.token_hex(16), runner_id, request, now + self._ttl_s)
        with self._lock:
            self._drop_expired(now)
            self._pending[execution.id] = execution
        return execution

    def take(self, runner_id: str, execution_id: str) -> Execution | None:
        """The execution, removed; None when unknown, taken, expired or another runner's."""
        now = self._clock.monotonic()
        with self._lock:
            self._drop_expired(now)
            execution = self._pending.get(execution_id)
            if execution is None or execution.runner_id != runner_id:
                return None
            del self._pending[execution_id]
            return execution

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, e in self._pending.items() if e.expires_at <= now]:
            del self._pending[key]
