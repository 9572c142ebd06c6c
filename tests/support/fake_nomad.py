"""The in-memory Nomad of the unit tests: every method of `NomadGateway` (and
the scoped lists of `reads.ScopedLists`, as `NomadClient` has them), for
driving the real Observer, Claims, Actor, LeaderElector and Controller
without HTTP, threads of our own or real time.

It answers what production decoding answers: job stubs are
`decode_job_stub` of the stored spec (which holds every field of a stub),
and every allocation is written as Nomad's JSON and read back through
`decode_allocation` — the brief list of `list_allocation_versions` without
task states and resources, as Nomad sends it. An `Allocation` that decoding
could never produce (say `started_at=0`) is refused when stored.

It enforces what the controller relies on: `EnforceIndex` on register (0 =
the job must not exist; otherwise the job's JobModifyIndex must equal it,
else `IndexConflict`) and Nomad's variable locks (`FakeLocks`, which
replicas share); variables take a ModifyIndex from the one Raft index,
are listed by prefix, deleted with check-and-set, and refused without
items. Every write is recorded so tests can count what the
controller did, every read so they can see what it looked at. Allocations
are set by the test (`put_alloc`, `run`); nothing is scheduled on its own.

Faults and races are injected through the attributes under "what tests set":
hooks called while a request is in flight, unreadable specs, lists answered
by a follower that lags behind, failing lock calls.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from controller.clock import Clock, ManualClock
from controller.model import Allocation
from controller.nomad import jobs
from controller.nomad.decode import decode_allocation, decode_job_stub
from controller.nomad.gateway import (
    AllocListing,
    IndexConflict,
    JobListing,
    Lock,
    LockHeld,
    NomadAPIError,
    VariableStub,
    WriteResult,
)

JsonDict = dict[str, Any]
SECOND = 1_000_000_000


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


# -- allocations as Nomad's JSON -------------------------------------------------------


def go_time(ns: int) -> str:
    """Nanoseconds since the epoch as Go writes a time.Time in JSON (RFC 3339, UTC)."""
    seconds, nanos = divmod(ns, SECOND)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"


def allocation_json(alloc: Allocation, brief: bool = False) -> JsonDict:
    """The allocation as Nomad lists it (`?resources=true&task_states=true`),
    zero values left out as Nomad leaves them out; `brief`: without task
    states and resources (`?task_states=false`)."""
    task: JsonDict = {"State": alloc.client_status, "Restarts": alloc.restarts}
    if alloc.started_at is not None:
        task["StartedAt"] = go_time(alloc.started_at)
    if alloc.last_exit_oom:
        terminated = {"oom_killed": "true", "exit_code": "137"}
        task["Events"] = [{"Type": "Terminated", "Time": alloc.modify_time, "Details": terminated}]
    ports = []
    for mapping in alloc.ports:
        host, _, value = mapping.host_address.rpartition(":")
        ip = host.removeprefix("[").removesuffix("]")
        label = str(mapping.exposed_port)
        ports.append(
            {"Label": label, "Value": int(value), "To": mapping.exposed_port, "HostIP": ip}
        )
    raw: JsonDict = {
        "ID": alloc.id,
        "JobID": alloc.job_id,
        "NodeID": alloc.node_id,
        "NodeName": alloc.node_name,
        "ClientStatus": alloc.client_status,
        "DesiredStatus": alloc.desired_status,
        "DesiredDescription": alloc.desired_description,
        "DesiredTransition": {"Migrate": True} if alloc.migrate else {},
        "CreateIndex": alloc.create_index,
        "ModifyIndex": alloc.modify_index,
        "CreateTime": alloc.create_time,
        "ModifyTime": alloc.modify_time,
        "TaskStates": {} if brief else {jobs.RUNNER_TASK: task},
        "AllocatedResources": {} if brief or not ports else {"Shared": {"Ports": ports}},
    }
    return {key: value for key, value in raw.items() if value}


# -- variable locks -----------------------------------------------------------------------


@dataclass
class Held:
    lock_id: str
    expires: float
    ttl_s: float
    delay_s: float


class FakeLocks:
    """Nomad's variable locks, strictly: dead one TTL after the last acquire or
    renew (Nomad itself waits 2×TTL), then refused to everyone for LockDelay.
    One instance is the server side that several replicas' gateways share."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.held: dict[str, Held] = {}
        self._ids = itertools.count(1)

    def holder(self, path: str) -> str | None:
        h = self.held.get(path)
        return h.lock_id if h is not None and self.clock.monotonic() < h.expires else None

    def acquire(self, path: str, ttl_s: float, lock_delay_s: float) -> Lock:
        now = self.clock.monotonic()
        h = self.held.get(path)
        if h is not None and now < h.expires + h.delay_s:
            raise LockHeld(path)
        lock_id = f"lock-{next(self._ids)}"
        self.held[path] = Held(lock_id, now + ttl_s, ttl_s, lock_delay_s)
        return Lock(path, lock_id)

    def renew(self, lock: Lock) -> None:
        h = self.held.get(lock.path)
        if h is None or h.lock_id != lock.lock_id or self.clock.monotonic() >= h.expires:
            raise LockHeld(lock.path)
        h.expires = self.clock.monotonic() + h.ttl_s

    def blocked(self, path: str) -> bool:
        """Held, or dead and waiting out its LockDelay."""
        h = self.held.get(path)
        return h is not None and self.clock.monotonic() < h.expires + h.delay_s

    def release(self, lock: Lock) -> None:
        h = self.held.get(lock.path)
        if h is not None and h.lock_id == lock.lock_id:
            del self.held[lock.path]

    def steal(self, path: str, ttl_s: float) -> None:
        """Somebody else holds the lock now, for `ttl_s`."""
        self.held[path] = Held("thief", self.clock.monotonic() + ttl_s, ttl_s, 0)


# -- the gateway --------------------------------------------------------------------------


class FakeNomad:
    """Jobs, allocations and variable locks of one namespace, in memory."""

    def __init__(
        self, clock: Clock | None = None, index: int = 10, locks: FakeLocks | None = None
    ) -> None:
        self.clock: Clock = clock if clock is not None else ManualClock()
        self.index = index  # the Raft index of the last write
        self.specs: dict[str, JsonDict] = {}
        self.allocs: dict[str, Allocation] = {}
        self.locks = locks if locks is not None else FakeLocks(self.clock)

        # -- what tests look at
        self.writes: list[Write] = []
        self.conflicts: list[str] = []  # job ids of registers refused by EnforceIndex
        self.reads: list[str] = []  # "get_job <id>", "list_jobs", ... in call order
        self.lock_calls: list[tuple[str, object]] = []  # ("acquire", (path, ttl, delay)), ...
        self.variables: dict[str, dict[str, str]] = {}  # path → items
        self.variable_indexes: dict[str, int] = {}  # path → ModifyIndex
        self.variable_writes: list[str] = []  # paths, in call order (deletes too)
        self.variable_reads: list[str] = []  # "list <prefix>", "get <path>", in call order

        # -- what tests set
        # Called before a register is applied; may raise (e.g. IndexConflict) to refuse it.
        self.before_register: Callable[[JsonDict, int | None], None] | None = None
        # Called before a deregister is applied (e.g. to act while it is in flight).
        self.before_deregister: Callable[[str], None] | None = None
        # Called before a job is read (e.g. to write while a refresh reads).
        self.before_get: Callable[[str], None] | None = None
        # Called before allocations are listed: a refresh has its job list
        # then, and has installed nothing yet.
        self.before_list_allocations: Callable[[], None] | None = None
        self.unreadable: set[str] = set()  # get_job fails for these
        # A follower behind: the full lists answer at this index.
        self.list_index: int | None = None
        # A follower behind for the scoped lists: they answer from this index,
        # without these jobs; the next `list_allocations_of_jobs` ends it.
        self.lag: tuple[int, set[str]] | None = None
        self.lag_allocs: tuple[int, set[str]] | None = None  # the same, allocations only
        # Lock calls: `lock_failure` is raised by each; `before_lock` runs
        # before the server sees one (a slow request), `after_lock` after (a
        # slow answer).
        self.lock_failure: Exception | None = None
        self.before_lock: Callable[[], None] | None = None
        self.after_lock: Callable[[], None] | None = None

    # -- what tests set up ---------------------------------------------------------------

    def put(self, spec: JsonDict) -> JsonDict:
        """Register a job as somebody else would; returns it as Nomad stores it."""
        self.register_job(spec)
        return copy.deepcopy(self.specs[str(spec["ID"])])

    def put_alloc(self, alloc: Allocation) -> int:
        """Store an allocation as Nomad would after a write; returns the write's index."""
        self.index += 1
        stored = replace(alloc, modify_index=self.index, modify_time=self.clock.now_ns())
        self._answer(stored)  # refuses what Nomad could not answer
        self.allocs[alloc.id] = stored
        return self.index

    def run(self, job_id: str, status: str = "running") -> Allocation:
        """A new allocation `alloc-<job id>` of the job, in `status`."""
        now = self.clock.now_ns()
        alloc = Allocation(
            id=f"alloc-{job_id}",
            job_id=job_id,
            client_status=status,
            create_index=self.index + 1,
            create_time=now,
            started_at=now if status == "running" else None,
        )
        self.put_alloc(alloc)
        return self.allocs[alloc.id]

    def delete(self, job_id: str) -> None:
        """The job purged and its allocations garbage-collected."""
        self.deregister_job(job_id)
        self.allocs = {k: a for k, a in self.allocs.items() if a.job_id != job_id}

    def bump(self) -> int:
        """A write that changes nothing we model (e.g. an evaluation)."""
        self.index += 1
        return self.index

    def set_status(self, job_id: str, status: str) -> None:
        self.index += 1
        self.specs[job_id] = {**self.specs[job_id], "Status": status, "ModifyIndex": self.index}

    # -- what tests look at --------------------------------------------------------------

    @property
    def gets(self) -> list[str]:
        """The job ids read one by one, in order."""
        return [r.split(" ", 1)[1] for r in self.reads if r.startswith("get_job ")]

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

    def lock_names(self) -> list[str]:
        """The lock calls made, by name ("acquire", "renew", "release")."""
        return [name for name, _ in self.lock_calls]

    # -- NomadGateway: jobs ----------------------------------------------------------------

    def list_jobs(self, prefix: str = "", index: int = 0, wait_s: float = 0) -> JobListing:
        self.reads.append("list_jobs")
        stubs = tuple(
            decode_job_stub(spec)  # a spec holds every field of a list stub
            for job_id, spec in sorted(self.specs.items())
            if job_id.startswith(prefix)
        )
        return JobListing(stubs, self._full_list_index())

    def get_job(self, job_id: str) -> JsonDict | None:
        self.reads.append(f"get_job {job_id}")
        if self.before_get is not None:
            self.before_get(job_id)
        if job_id in self.unreadable:
            raise NomadAPIError(500, "rpc error")
        spec = self.specs.get(job_id)
        return copy.deepcopy(spec) if spec is not None else None

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
        spec.setdefault("Type", "service")  # Nomad's default
        self.specs[job_id] = spec
        self.writes.append(Write("register", job_id, self.index, copy.deepcopy(job)))
        return WriteResult(self.index, self.index)

    def deregister_job(
        self, job_id: str, purge: bool = True, ride_through: bool = False
    ) -> WriteResult:
        if self.before_deregister is not None:
            self.before_deregister(job_id)
        self.index += 1
        self.specs.pop(job_id, None)
        self.writes.append(Write("deregister", job_id, self.index))
        return WriteResult(self.index, 0)

    # -- NomadGateway: allocations -----------------------------------------------------------

    def list_allocations(self, index: int = 0, wait_s: float = 0) -> AllocListing:
        self.reads.append("list_allocations")
        self._listing_allocations()
        answers = tuple(self._answer(a) for a in self.allocs.values())
        return AllocListing(answers, self._full_list_index())

    def _listing_allocations(self) -> None:
        if self.before_list_allocations is not None:
            self.before_list_allocations()

    def get_allocation(self, alloc_id: str) -> Allocation | None:
        """The full allocation: with the job it runs, as Nomad reads it."""
        self.reads.append(f"get_allocation {alloc_id}")
        alloc = self.allocs.get(alloc_id)
        if alloc is None:
            return None
        self._answer(alloc)
        raw = allocation_json(alloc)
        spec = self.specs.get(alloc.job_id)
        if spec is not None:
            raw.update(Job=spec, TaskGroup=jobs.RUNNER_GROUP)
        return decode_allocation(raw)

    # -- ScopedLists ------------------------------------------------------------------------

    def list_jobs_by_id(self, job_ids: Collection[str]) -> JobListing:
        self.reads.append(f"list_jobs_by_id {sorted(job_ids)}")
        index, hidden = self.lag or (self.index, set())
        listed = [j for j in sorted(job_ids) if j in self.specs and j not in hidden]
        return JobListing(tuple(decode_job_stub(self.specs[j]) for j in listed), index)

    def list_allocations_of_jobs(self, job_ids: Collection[str]) -> AllocListing:
        self.reads.append(f"list_allocations_of_jobs {sorted(job_ids)}")
        self._listing_allocations()
        index, hidden = self.lag or self.lag_allocs or (self.index, set())
        self.lag = self.lag_allocs = None
        answers = tuple(
            self._answer(a)
            for a in self.allocs.values()
            if a.job_id in job_ids and a.job_id not in hidden
        )
        return AllocListing(answers, index)

    def list_allocation_versions(self) -> AllocListing:
        self.reads.append("list_allocation_versions")
        self._listing_allocations()
        answers = tuple(
            decode_allocation(allocation_json(a, brief=True)) for a in self.allocs.values()
        )
        return AllocListing(answers, self._full_list_index())

    # -- NomadGateway: variable locks -------------------------------------------------------

    def lock_acquire(self, path: str, ttl_s: float, lock_delay_s: float) -> Lock:
        self._lock_call("acquire", (path, ttl_s, lock_delay_s))
        lock = self.locks.acquire(path, ttl_s, lock_delay_s)
        self._lock_answered()
        return lock

    def lock_renew(self, lock: Lock) -> None:
        self._lock_call("renew", lock)
        self.locks.renew(lock)
        self._lock_answered()

    def lock_release(self, lock: Lock) -> None:
        self._lock_call("release", lock)
        self.locks.release(lock)
        self._lock_answered()

    def lock_held(self, path: str) -> bool:
        self._lock_call("held", path)
        held = self.locks.blocked(path)
        self._lock_answered()
        return held

    # -- NomadGateway: variables -------------------------------------------------------------

    def get_variable(self, path: str) -> dict[str, str] | None:
        self.variable_reads.append(f"get {path}")
        items = self.variables.get(path)
        return dict(items) if items is not None else None

    def put_variable(self, path: str, items: dict[str, str]) -> None:
        if not items:
            # Nomad refuses a variable without items.
            raise NomadAPIError(400, "variable missing required Items object")
        self.variable_writes.append(path)
        self.index += 1
        self.variables[path] = dict(items)
        self.variable_indexes[path] = self.index

    def list_variables(self, prefix: str) -> tuple[VariableStub, ...]:
        self.variable_reads.append(f"list {prefix}")
        return tuple(
            VariableStub(path, self.variable_indexes.get(path, 0))
            for path in sorted(self.variables)
            if path.startswith(prefix)
        )

    def delete_variable(self, path: str, modify_index: int | None = None) -> bool:
        current = self.variable_indexes.get(path, 0)
        if modify_index is not None and current != modify_index:
            return False
        self.variable_writes.append(f"delete {path}")
        if path in self.variables:
            self.index += 1
            del self.variables[path]
            del self.variable_indexes[path]
        return True

    # -- inside ------------------------------------------------------------------------------

    def _full_list_index(self) -> int:
        return self.list_index if self.list_index is not None else self.index

    def _answer(self, alloc: Allocation) -> Allocation:
        """The allocation as a list answers it: through Nomad's JSON and our decoding."""
        decoded = decode_allocation(allocation_json(alloc))
        if decoded != alloc:
            raise ValueError(f"Nomad could not answer {alloc}: decoding its JSON gives {decoded}")
        return decoded

    def _lock_call(self, name: str, arg: object) -> None:
        self.lock_calls.append((name, arg))
        if self.before_lock is not None:
            self.before_lock()
        if self.lock_failure is not None:
            raise self.lock_failure

    def _lock_answered(self) -> None:
        if self.after_lock is not None:
            self.after_lock()
