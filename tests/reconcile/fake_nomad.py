"""An in-memory Nomad behind the `NomadGateway` interface, for driving the real
controller (Observer, Claims, Actor, queue) without HTTP, threads of our own
or real time.

It keeps what the controller reads — job specs with Nomad's server fields,
allocations, one global Raft index — and enforces what it relies on:
`EnforceIndex` on register (0 = the job must not exist; otherwise the job's
JobModifyIndex must equal it, else `IndexConflict`). Every write is recorded
so tests can count what the controller did. Allocations are set by the test
(`put_alloc`); nothing is scheduled on its own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from controller.clock import Clock
from controller.model import Allocation
from controller.nomad import jobs
from controller.nomad.gateway import (
    AllocListing,
    IndexConflict,
    JobListing,
    JobStub,
    Lock,
    WriteResult,
)

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Write:
    """One accepted write: `register` (with the spec as sent) or `deregister`."""

    kind: str
    job_id: str
    index: int
    spec: JsonDict | None = None

    @property
    def meta(self) -> dict[str, str]:
        for group in (self.spec or {}).get("TaskGroups") or []:
            if group.get("Name") == jobs.CONFIG_GROUP:
                return {str(k): str(v) for k, v in (group.get("Meta") or {}).items()}
        return {}

    @property
    def lost_reason(self) -> str | None:
        """The reason when this write ended a claim (EndClaim), else None."""
        return self.meta.get(jobs.META_LOST_REASON) if self.kind == "register" else None


class NoLocks:
    """The lock half of the gateway, for fakes of tests that run no leader election."""

    def lock_acquire(self, path: str, ttl_s: float, lock_delay_s: float) -> Lock:
        raise NotImplementedError

    def lock_renew(self, lock: Lock) -> None:
        raise NotImplementedError

    def lock_release(self, lock: Lock) -> None:
        raise NotImplementedError


class FakeNomad(NoLocks):
    """Jobs and allocations of one namespace, in memory."""

    def __init__(self, clock: Clock, index: int = 10) -> None:
        self.clock = clock
        self.index = index
        self.specs: dict[str, JsonDict] = {}
        self.allocs: dict[str, Allocation] = {}
        self.writes: list[Write] = []
        self.conflicts: list[str] = []  # job ids of registers refused by EnforceIndex
        # Called before a register is applied; may raise (e.g. IndexConflict) to refuse it.
        self.before_register: Callable[[JsonDict, int | None], None] | None = None
        # Called before a deregister is applied (e.g. to act while it is in flight).
        self.before_deregister: Callable[[str], None] | None = None

    # -- what tests set up and look at ------------------------------------------------

    def put_alloc(self, alloc: Allocation) -> int:
        """Store an allocation as Nomad would after a write; returns the write's index."""
        self.index += 1
        self.allocs[alloc.id] = replace(
            alloc, modify_index=self.index, modify_time=self.clock.now_ns()
        )
        return self.index

    def bump(self) -> int:
        """A write that changes nothing we model (e.g. an evaluation)."""
        self.index += 1
        return self.index

    def set_status(self, job_id: str, status: str) -> None:
        self.index += 1
        self.specs[job_id] = {**self.specs[job_id], "Status": status, "ModifyIndex": self.index}

    def runner_ids(self, env_id: int) -> list[str]:
        return sorted(j for j in self.specs if jobs.runner_env_id(j) == env_id)

    def registered(self, job_id: str) -> list[Write]:
        return [w for w in self.writes if w.kind == "register" and w.job_id == job_id]

    def created(self) -> list[str]:
        """Runner jobs registered for the first time, in order."""
        seen: set[str] = set()
        out: list[str] = []
        for w in self.writes:
            if w.kind == "register" and jobs.runner_env_id(w.job_id) is not None:
                if w.job_id not in seen:
                    out.append(w.job_id)
                seen.add(w.job_id)
        return out

    def deregistered(self) -> list[str]:
        return [w.job_id for w in self.writes if w.kind == "deregister"]

    def end_claims(self, job_id: str) -> list[str]:
        """The reasons of every accepted EndClaim write on the job."""
        reasons = [w.lost_reason for w in self.registered(job_id)]
        return [r for r in reasons if r]

    # -- NomadGateway -----------------------------------------------------------------------

    def list_jobs(self, prefix: str = "", index: int = 0, wait_s: float = 0) -> JobListing:
        stubs = tuple(
            JobStub(
                id=s["ID"],
                job_modify_index=s["JobModifyIndex"],
                modify_index=s["ModifyIndex"],
                create_index=s["CreateIndex"],
                submit_time=s["SubmitTime"],
                status=s["Status"],
                stop=bool(s.get("Stop")),
                type=str(s.get("Type", "batch")),
            )
            for job_id, s in sorted(self.specs.items())
            if job_id.startswith(prefix)
        )
        return JobListing(stubs, self.index)

    def get_job(self, job_id: str) -> JsonDict | None:
        spec = self.specs.get(job_id)
        return copy.deepcopy(spec) if spec is not None else None

    def list_allocations(self, index: int = 0, wait_s: float = 0) -> AllocListing:
        return AllocListing(tuple(self.allocs.values()), self.index)

    def register_job(self, job: JsonDict, enforce_index: int | None = None) -> WriteResult:
        job_id = str(job["ID"])
        if self.before_register is not None:
            self.before_register(job, enforce_index)
        old = self.specs.get(job_id)
        if enforce_index is not None:
            current = int(old["JobModifyIndex"]) if old is not None else 0
            if current != enforce_index:
                self.conflicts.append(job_id)
                raise IndexConflict(
                    f"Enforcing job modify index {enforce_index}: job exists with "
                    f"conflicting job modify index: {current}"
                )
        self.index += 1
        spec = copy.deepcopy(job)
        spec.update(
            JobModifyIndex=self.index,
            ModifyIndex=self.index,
            CreateIndex=old["CreateIndex"] if old is not None else self.index,
            SubmitTime=self.clock.now_ns(),
            Status=old["Status"] if old is not None else "pending",
            Version=old["Version"] + 1 if old is not None else 0,
        )
        spec.setdefault("Stop", False)
        self.specs[job_id] = spec
        self.writes.append(Write("register", job_id, self.index, copy.deepcopy(job)))
        return WriteResult(self.index, self.index)

    def deregister_job(self, job_id: str, purge: bool = True) -> WriteResult:
        if self.before_deregister is not None:
            self.before_deregister(job_id)
        self.index += 1
        self.specs.pop(job_id, None)
        self.writes.append(Write("deregister", job_id, self.index))
        return WriteResult(self.index, 0)
