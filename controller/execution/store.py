"""Execution ids between `POST /runners/{id}/execute` and the WebSocket connect.

An id is one-shot (the connect takes it; a second connect with it is 404, as
in Poseidon) and belongs to one runner. Unlike Poseidon, an id nobody
connects expires after a set time, so abandoned requests do not pile up for
the runner's whole life. Ids live in this process only: a client whose
controller restarted between the two calls asks for a new one (404). With
replicas that share a key, an id names this process (`ids`), and another
replica takes the execution from here through `take` (`controller.api.replicas`):
this store stays the one place that makes an id one-shot and expiring.

Bounded: ids waiting for their connect per runner and in all (`Limits`; a
request beyond is `Refused`, 429), and a command's size as the runner gets
it (`Limits.max_command_bytes`, measured by the caller's `measure`: the
largest argument of the exec, which Linux caps at 128 KiB, MAX_ARG_STRLEN).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from controller.clock import Clock
from controller.execution.command import ExecutionRequest
from controller.execution.ids import nonce_of


@dataclass(frozen=True)
class Execution:
    id: str
    runner_id: str
    request: ExecutionRequest
    expires_at: float  # monotonic seconds

    @property
    def marker(self) -> str:
        """What names the execution inside the runner (its processes' marker,
        its stderr FIFO): the random part of the id only, so the program sees
        no replica's address."""
        return nonce_of(self.id)


# Linux's limit on one argument of a program (MAX_ARG_STRLEN, 32 pages):
# a longer `bash -c` script cannot start.
MAX_ARG_BYTES = 128 * 1024


@dataclass(frozen=True)
class Limits:
    max_pending_per_runner: int = 16
    max_pending: int = 256
    max_command_bytes: int = 64 * 1024


class Refused(Exception):
    """The request is not stored: `status` 400 (too large) or 429 (too many)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ExecutionStore:
    def __init__(
        self,
        clock: Clock,
        ttl_s: float,
        limits: Limits | None = None,
        measure: Callable[[ExecutionRequest], int] | None = None,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self._clock = clock
        self._new_id = new_id or (lambda: secrets.token_hex(16))
        self._ttl_s = ttl_s
        self._limits = limits or Limits()
        self._measure = measure
        self._lock = threading.Lock()
        self._pending: dict[str, Execution] = {}

    def add(self, runner_id: str, request: ExecutionRequest) -> Execution:
        """The stored execution; Refused beyond the limits."""
        limits = self._limits
        if self._measure is not None:
            size = self._measure(request)
            if size > limits.max_command_bytes:
                raise Refused(
                    400,
                    f"the command and environment take {size} bytes as the runner's shell "
                    f"gets them, more than {limits.max_command_bytes} "
                    "(NRC_EXECUTION_MAX_COMMAND_SIZE)",
                )
        now = self._clock.monotonic()
        execution = Execution(self._new_id(), runner_id, request, now + self._ttl_s)
        with self._lock:
            self._drop_expired(now)
            if len(self._pending) >= limits.max_pending:
                raise Refused(
                    429,
                    f"{limits.max_pending} executions wait for their connect already "
                    "(NRC_EXECUTION_MAX_PENDING): connect to those first",
                )
            mine = sum(1 for e in self._pending.values() if e.runner_id == runner_id)
            if mine >= limits.max_pending_per_runner:
                raise Refused(
                    429,
                    f"{mine} executions of this runner wait for their connect already "
                    "(NRC_EXECUTION_MAX_PENDING_PER_RUNNER): connect to those first",
                )
            self._pending[execution.id] = execution
        return execution

    def take(self, runner_id: str, execution_id: str) -> Execution | None:
        """The execution, removed; None when unknown, taken, expired or another runner's."""
        with self._lock:
            execution = self._find(runner_id, execution_id)
            if execution is not None:
                del self._pending[execution_id]
            return execution

    def peek(self, runner_id: str, execution_id: str) -> Execution | None:
        """The execution `take` would answer, left in place."""
        with self._lock:
            return self._find(runner_id, execution_id)

    def _find(self, runner_id: str, execution_id: str) -> Execution | None:
        """Under the lock: the pending, unexpired execution of that runner."""
        self._drop_expired(self._clock.monotonic())
        execution = self._pending.get(execution_id)
        return execution if execution is not None and execution.runner_id == runner_id else None

    def waiting(self) -> int:
        """Ids that may still be taken (the expired ones dropped)."""
        now = self._clock.monotonic()
        with self._lock:
            self._drop_expired(now)
            return len(self._pending)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, e in self._pending.items() if e.expires_at <= now]:
            del self._pending[key]
