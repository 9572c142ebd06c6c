"""Expectations: creations and deletions the controller has issued but not yet
seen in a list (agent-sandbox's warm-pool idea, client-go's ControllerExpectations).

A list can lag behind our own writes (a follower's stale read, a list that
started before the write). Until a list whose index is at least the write's
index has been observed, a creation still counts towards the pool and a
deletion still removes the runner from it, so a lagging list never causes
over-creation or a double delete. Each expectation also times out, so a lost
write cannot block an environment for ever.

`observe` is called by the observer as it installs the snapshot built from
the list, and passes read `pending` with that snapshot
(`Observer.snapshot_and_pending`): settled before the snapshot that shows
the runner, a creation would be counted by neither.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Container
from dataclasses import dataclass

from controller.clock import Clock

log = logging.getLogger(__name__)

_UNKNOWN = 1 << 62  # the write has not answered yet: no list can satisfy it


@dataclass
class _Expectation:
    env_id: int
    index: int
    deadline: float


@dataclass(frozen=True)
class Pending:
    creating: int
    deleting: frozenset[str]


class Expectations:
    def __init__(self, clock: Clock, timeout_s: float = 60.0) -> None:
        self._clock = clock
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._creates: dict[str, _Expectation] = {}
        self._deletes: dict[str, _Expectation] = {}

    def _new(self, env_id: int) -> _Expectation:
        return _Expectation(env_id, _UNKNOWN, self._clock.monotonic() + self._timeout)

    # Before the write: it counts from the moment it may have happened.
    def expect_create(self, env_id: int, job_id: str) -> None:
        with self._lock:
            self._creates[job_id] = self._new(env_id)

    def expect_delete(self, env_id: int, job_id: str) -> None:
        with self._lock:
            self._deletes[job_id] = self._new(env_id)

    # After the write: the index a list must reach to show it.
    def created(self, job_id: str, index: int) -> None:
        self._written(self._creates, job_id, index)

    def deleted(self, job_id: str, index: int) -> None:
        self._written(self._deletes, job_id, index)

    def _written(self, table: dict[str, _Expectation], job_id: str, index: int) -> None:
        with self._lock:
            exp = table.get(job_id)
            if exp is not None:
                exp.index = index

    # The write failed for certain: it will never show.
    def create_failed(self, job_id: str) -> None:
        with self._lock:
            self._creates.pop(job_id, None)

    def delete_failed(self, job_id: str) -> None:
        with self._lock:
            self._deletes.pop(job_id, None)

    def observe(self, present: Container[str], list_index: int) -> None:
        """A job list at `list_index` showing `present`: settle what it proves."""
        now = self._clock.monotonic()
        with self._lock:
            for job_id, exp in list(self._creates.items()):
                if job_id in present or list_index >= exp.index:
                    del self._creates[job_id]
                elif now > exp.deadline:
                    log.warning("creation of %s not observed in time; no longer expected", job_id)
                    del self._creates[job_id]
            for job_id, exp in list(self._deletes.items()):
                if list_index >= exp.index and job_id not in present:
                    del self._deletes[job_id]
                elif now > exp.deadline:
                    log.warning("deletion of %s not observed in time; no longer expected", job_id)
                    del self._deletes[job_id]

    def pending(self, env_id: int) -> Pending:
        with self._lock:
            return Pending(
                creating=sum(1 for e in self._creates.values() if e.env_id == env_id),
                deleting=frozenset(j for j, e in self._deletes.items() if e.env_id == env_id),
            )

    def is_deleting(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._deletes
