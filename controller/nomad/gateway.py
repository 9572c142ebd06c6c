"""The small interface the reconciler and the API use to reach Nomad.

Everything above `controller/nomad/` depends on `NomadGateway` only, never on
python-nomad or on Nomad's JSON for allocations; tests can substitute any
object with these methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from controller.model import Allocation
from controller.nomad.errors import (
    IndexConflict,
    LockHeld,
    NomadAPIError,
    NomadError,
    NomadUnavailable,
)

__all__ = [
    "IndexConflict",
    "LockHeld",
    "NomadAPIError",
    "NomadError",
    "NomadUnavailable",
]

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class JobStub:
    """One entry of GET /v1/jobs."""

    id: str
    job_modify_index: int
    modify_index: int
    create_index: int
    submit_time: int
    status: str
    stop: bool
    type: str


@dataclass(frozen=True)
class JobListing:
    jobs: tuple[JobStub, ...]
    index: int  # X-Nomad-Index


@dataclass(frozen=True)
class AllocListing:
    allocations: tuple[Allocation, ...]
    index: int  # X-Nomad-Index


@dataclass(frozen=True)
class WriteResult:
    index: int  # the Raft index of the write (X-Nomad-Index / Index)
    job_modify_index: int  # JobModifyIndex after a register; 0 for a deregister
    # Nomad's register warnings, one line each (e.g. memory_max ignored
    # without memory oversubscription); empty when none.
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lock:
    path: str
    lock_id: str


@dataclass(frozen=True)
class VariableStub:
    """One entry of GET /v1/vars: a variable's path and the index of its last write."""

    path: str
    modify_index: int


class NomadGateway(Protocol):
    """Reads and writes in one namespace (the gateway's own)."""

    def list_jobs(self, prefix: str = "", index: int = 0, wait_s: float = 0) -> JobListing:
        """Job stubs, optionally as a blocking query (returns when the index passes `index`)."""
        ...

    def get_job(self, job_id: str) -> JsonDict | None:
        """The full job spec, or None when the job does not exist."""
        ...

    def list_allocations(self, index: int = 0, wait_s: float = 0) -> AllocListing:
        """All allocations of the namespace, with task states and allocated ports."""
        ...

    def get_allocation(self, alloc_id: str) -> Allocation | None:
        """One allocation as Nomad's leader holds it now; None when unknown."""
        ...

    def register_job(self, job: JsonDict, enforce_index: int | None = None) -> WriteResult:
        """Register (create or update) a job. With `enforce_index`, the write only
        succeeds if the job's JobModifyIndex equals it (0 = the job must not exist);
        otherwise IndexConflict."""
        ...

    def deregister_job(
        self, job_id: str, purge: bool = True, ride_through: bool = False
    ) -> WriteResult:
        """Stop (and with purge, delete) a job. A missing job is not an error.
        `ride_through`: a client waits for it (a release), so transient errors
        are retried through a leader election, as a claim's write is."""
        ...

    def lock_acquire(self, path: str, ttl_s: float, lock_delay_s: float) -> Lock:
        """Take the variable lock at `path`; LockHeld if somebody holds it."""
        ...

    def lock_renew(self, lock: Lock) -> None:
        """Renew our lock; LockHeld if it is no longer ours."""
        ...

    def lock_release(self, lock: Lock) -> None:
        """Give the lock up; a lock that is no longer ours is not an error."""
        ...

    def lock_held(self, path: str) -> bool:
        """Whether somebody holds the lock at `path` (or it waits out its
        LockDelay): a read, so a follower can watch for a release cheaply."""
        ...

    def get_variable(self, path: str) -> dict[str, str] | None:
        """The items of the variable at `path`, or None when it does not exist."""
        ...

    def put_variable(self, path: str, items: dict[str, str]) -> None:
        """Create or overwrite the variable at `path` with these items (last writer wins)."""
        ...

    def list_variables(self, prefix: str) -> tuple[VariableStub, ...]:
        """The variables whose path starts with `prefix`, without their items."""
        ...

    def delete_variable(self, path: str, modify_index: int | None = None) -> bool:
        """Delete the variable at `path` (a missing one is not an error). With
        `modify_index`, only if it was not written since (check-and-set);
        False when it was, and nothing was deleted."""
        ...
