"""The simulated Nomad cluster: configuration, the parts that make it up
(state store, scheduler, clients, task driver, drainer, variables, event
broker) and the operations the HTTP layer calls. Every operation runs on the simulator's event
loop; errors are raised as `NomadError` carrying Nomad's status and text."""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from nomadsim.client import Client
from nomadsim.clock import Clock, SystemClock, Timers
from nomadsim.drainer import Drainer, drain_eval
from nomadsim.driver import Driver, ExecRefused, Execution
from nomadsim.encode import (
    JobValidationError,
    alloc_datum,
    alloc_full,
    alloc_stub,
    canonicalize_job,
    go_time,
    group_of,
    job_stub,
    job_summary,
    json_bytes,
)
from nomadsim.events import EventBroker
from nomadsim.gojson import quote
from nomadsim.records import Alloc, Eval, JobRecord, JsonDict, Node
from nomadsim.scheduler import Scheduler
from nomadsim.state import ALLOCS, EVALS, JOBS, Commit, StateStore, Txn
from nomadsim.variables import Variables

ORDERINGS = ("production", "client", "random")
# Fields of a job that are not part of its spec (SpecChanged ignores them).
_NON_SPEC = frozenset(
    {
        "Status",
        "StatusDescription",
        "Stable",
        "Version",
        "SubmitTime",
        "CreateIndex",
        "ModifyIndex",
        "JobModifyIndex",
    }
)


class NomadError(Exception):
    """An error answered the way Nomad answers it: status code and plain text."""

    def __init__(self, status: int, text: str, body: Any = None) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.body = body


@dataclass
class SimConfig:
    """Everything that shapes a simulated cluster. Timings are milliseconds."""

    nodes: int = 3
    seed: int = 0
    startup_delay_ms: float = 500.0
    stop_delay_ms: float = 200.0
    # The management token: every capability. With it or `acl_tokens` set,
    # ACLs are on and every /v1 request needs a known token.
    acl_token: str | None = None
    # More tokens, each with the namespace capabilities it grants in every
    # namespace (`alloc-exec`, `read-job`, ...). Routes other than exec accept
    # any known token; exec needs `alloc-exec`.
    acl_tokens: dict[str, tuple[str, ...]] = field(default_factory=dict)
    heartbeat_interval_ms: float = 30_000.0
    event_buffer_size: int = 100
    # Production ordering: how long after the replacement runs the old one completes.
    migration_stop_lag_ms: float = 30.0
    node_cpu_mhz: int = 64_000
    node_memory_mb: int = 131_072
    # How far behind the leader a stale list read may be.
    stale_lag_ms: float = 500.0
    # Multiplies durations that come from Nomad objects (restart and reschedule
    # delays, drain deadlines, lock TTLs and delays) so tests can run a 10 s
    # lock TTL in 10 ms. 1.0 is real time.
    time_scale: float = 1.0
    # Initial `migration_ordering` fault: production, client or random.
    migration_ordering: str = "production"


@dataclass
class Faults:
    """Fault injection knobs, read and written through /_sim/faults."""

    http_error_rate: float = 0.0
    http_latency_ms: float = 0.0
    stale_read_rate: float = 0.0
    event_duplicate_rate: float = 0.0
    event_stream_cut_every: int = 0
    heartbeat_loss: bool = False
    migration_ordering: str = "production"

    def update(self, raw: Any) -> None:
        """Apply a partial update; ValueError names the first bad key."""
        if not isinstance(raw, dict):
            raise ValueError("faults must be a JSON object")
        known = {f.name: f.type for f in fields(self)}
        staged = {}
        for key, value in raw.items():
            if key not in known:
                raise ValueError(f"unknown fault {key!r}; known: {', '.join(sorted(known))}")
            current = getattr(self, key)
            if isinstance(current, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"{key} must be true or false")
            elif isinstance(current, str):
                if value not in ORDERINGS:
                    raise ValueError(f"{key} must be one of {', '.join(ORDERINGS)}")
            elif isinstance(current, int):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{key} must be a non-negative integer")
            else:
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise ValueError(f"{key} must be a non-negative number")
                if key.endswith("_rate") and value > 1:
                    raise ValueError(f"{key} must be between 0 and 1")
                value = float(value)
            staged[key] = value
        for key, value in staged.items():
            setattr(self, key, value)

    def as_dict(self) -> JsonDict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class _Ports:
    by_alloc: dict[str, list[JsonDict]] = field(default_factory=dict)
    by_node: dict[str, set[int]] = field(default_factory=dict)


class Simulator:
    def __init__(self, config: SimConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or SimConfig()
        self.clock: Clock = clock or SystemClock()
        self.rng = random.Random(self.config.seed)
        # Faults draw from their own stream so that injecting them does not
        # change the IDs and placements of the same calls.
        self.fault_rng = random.Random(self.config.seed + 1)
        self.faults = Faults()
        self.faults.update({"migration_ordering": self.config.migration_ordering})
        self.store = StateStore(self.clock.monotonic)
        self.store.pre_commit = self._set_job_statuses
        self.broker = EventBroker(self.encode_alloc_event, self.config.event_buffer_size)
        self.store.add_listener(self.broker.on_commit)
        self.scheduler = Scheduler(self)
        self.client = Client(self)
        self.drainer = Drainer(self)
        self.variables = Variables(self)
        self.driver = Driver(self)
        self.store.add_listener(self.driver.on_commit)
        self.migrations: dict[str, tuple[str, str]] = {}
        self.queued: dict[tuple[str, str], dict[str, int]] = {}
        self._ports = _Ports()
        self._timers: Timers | None = None
        self.requests: dict[str, int] = {}
        self.stopped = False
        # Encoded list entries, reused until their object is written again: a
        # list of 10,000 allocations encodes only what changed since the last.
        self._alloc_stubs: dict[str, dict[tuple[bool, bool], tuple[Alloc, bytes]]] = {}
        self._job_stubs: dict[
            tuple[str, str], dict[bool, tuple[JobRecord, tuple[int, Any], bytes]]
        ] = {}
        self.store.add_listener(self._drop_encodings)

    # -- lifecycle --------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the event loop and register the nodes."""
        self._timers = Timers(loop)
        self.driver.start(loop)
        for i in range(1, self.config.nodes + 1):
            now = self.clock.now_ns()
            with self.store.txn("NodeRegister") as tx:
                node = Node(
                    id=self.new_id(),
                    secret_id=self.new_id(),
                    name=f"agent-{i}",
                    datacenter="dc1",
                    http_addr=f"127.0.1.{i}:4646",
                    cpu_mhz=self.config.node_cpu_mhz,
                    memory_mb=self.config.node_memory_mb,
                    status_updated_at=now // 1_000_000_000,
                    events=(
                        {
                            "Message": "Node registered",
                            "Subsystem": "Cluster",
                            "Details": None,
                            "Timestamp": go_time(now),
                            "CreateIndex": 0,
                        },
                    ),
                    create_index=tx.index,
                    modify_index=tx.index,
                )
                tx.put_node(node)

    def stop(self) -> None:
        """Stop serving long requests: open event streams and blocked queries
        end, and from now on new ones end at once (the HTTP server still
        accepts connections until uvicorn notices it should exit). Every
        process exec started is killed, its exec stream ended. Idempotent."""
        self.stopped = True
        self.broker.close_all()
        self.store.wake_all()
        if self._timers is not None:
            self._timers.cancel_all()
        self.driver.close()

    # -- ACL tokens -------------------------------------------------------------

    @property
    def acl_enabled(self) -> bool:
        return self.config.acl_token is not None or bool(self.config.acl_tokens)

    def token_known(self, token: str | None) -> bool:
        return token is not None and (
            token == self.config.acl_token or token in self.config.acl_tokens
        )

    def token_allows(self, token: str | None, capability: str) -> bool:
        """Whether the token grants the namespace capability (anything with
        ACLs off or for the management token; nothing for no token)."""
        if not self.acl_enabled or (token is not None and token == self.config.acl_token):
            return True
        return capability in self.config.acl_tokens.get(token or "", ())

    @property
    def timers(self) -> Timers:
        if self._timers is None:
            raise RuntimeError("simulator not started")
        return self._timers

    # -- small shared helpers ---------------------------------------------------

    def scaled(self, ns: int) -> int:
        """A duration from a Nomad object (policy delay, deadline, TTL) in the
        simulator's time: multiplied by `time_scale`."""
        return int(ns * self.config.time_scale)

    def new_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def stamp_eval(self, ev: Eval, index: int) -> Eval:
        now = self.clock.now_ns()
        if ev.create_index == 0:
            return replace(
                ev, create_index=index, modify_index=index, create_time=now, modify_time=now
            )
        return replace(ev, modify_index=index, modify_time=now)

    def node_event(
        self, node: Node, message: str, subsystem: str, index: int
    ) -> tuple[JsonDict, ...]:
        event = {
            "Message": message,
            "Subsystem": subsystem,
            "Details": None,
            "Timestamp": go_time(self.clock.now_ns()),
            "CreateIndex": index,
        }
        return (*node.events, event)[-10:]  # Nomad keeps the last 10 node events

    def migration_ordering(self) -> str:
        ordering = self.faults.migration_ordering
        if ordering == "random":
            return self.fault_rng.choice(("production", "client"))
        return ordering

    def node_usage(self, node_id: str, job_id: str, plan: Any) -> tuple[int, int, int]:
        """CPU and memory in use on the node and how many of its allocations
        belong to the job, as the plan would leave them: the allocations that
        hold resources (desired run, not client-terminal) minus those the plan
        stops, plus those it places. From the store's per-node counters, so a
        placement costs the same with 10 or 10,000 allocations on the node."""
        store = self.store
        cpu, mem = store.node_used.get(node_id) or (0, 0)
        same = store.node_job_allocs.get((node_id, job_id), 0)
        for stopped in plan.stops:
            entry = store.usage_of(stopped)
            if entry is not None and entry.node_id == node_id:
                cpu -= entry.cpu
                mem -= entry.mem
                if entry.job_id == job_id:
                    same -= 1
        for a in plan.places:
            if a.node_id != node_id:
                continue
            group = group_of(a.job, a.task_group) or {}
            for task in group.get("Tasks") or []:
                res = task.get("Resources") or {}
                cpu += int(res.get("CPU") or 0)
                mem += int(res.get("MemoryMB") or 0)
            if a.job_id == job_id:
                same += 1
        return cpu, mem, same

    def assign_ports(self, alloc_id: str, node: Node, group: JsonDict) -> None:
        used = self._ports.by_node.setdefault(node.id, set())
        host_ip = node.http_addr.split(":")[0]
        ports: list[JsonDict] = []
        for network in group.get("Networks") or []:
            for port in network.get("ReservedPorts") or []:
                ports.append(
                    {
                        "Label": port.get("Label", ""),
                        "Value": int(port.get("Value") or 0),
                        "To": int(port.get("To") or 0),
                        "HostIP": host_ip,
                    }
                )
            for port in network.get("DynamicPorts") or []:
                value = next(p for p in range(20000, 32001) if p not in used)
                used.add(value)
                to = int(port.get("To") or 0)
                ports.append(
                    {
                        "Label": port.get("Label", ""),
                        "Value": value,
                        "To": value if to == -1 else to,
                        "HostIP": host_ip,
                    }
                )
        if ports:
            self._ports.by_alloc[alloc_id] = ports

    def release_ports(self, alloc: Alloc) -> None:
        ports = self._ports.by_alloc.get(alloc.id) or []
        used = self._ports.by_node.get(alloc.node_id, set())
        for p in ports:
            used.discard(p["Value"])

    def host_ip(self, alloc: Alloc) -> str:
        node = self.store.nodes.get(alloc.node_id)
        return node.http_addr.split(":")[0] if node else ""

    def encode_alloc(self, alloc: Alloc, with_job: bool = True) -> JsonDict:
        return alloc_full(
            alloc, self._ports.by_alloc.get(alloc.id, []), self.host_ip(alloc), with_job
        )

    def encode_alloc_event(self, alloc: Alloc) -> JsonDict:
        return self.encode_alloc(alloc, with_job=False)

    def alloc_datum(self, alloc: Alloc) -> JsonDict:
        """The allocation as a `filter` expression sees it (every field)."""
        return alloc_datum(alloc, self._ports.by_alloc.get(alloc.id, []), self.host_ip(alloc))

    def encode_alloc_stub(self, alloc: Alloc, resources: bool, task_states: bool) -> JsonDict:
        return alloc_stub(
            alloc,
            self._ports.by_alloc.get(alloc.id, []),
            self.host_ip(alloc),
            resources,
            task_states,
        )

    def alloc_stub_json(self, alloc: Alloc, resources: bool, task_states: bool) -> bytes:
        """`encode_alloc_stub` as JSON bytes, cached for the current version of
        the allocation (a stale view's older version is encoded afresh)."""
        flags = (resources, task_states)
        cached = self._alloc_stubs.get(alloc.id)
        if cached is not None:
            hit = cached.get(flags)
            if hit is not None and hit[0] is alloc:
                return hit[1]
        data = json_bytes(self.encode_alloc_stub(alloc, resources, task_states))
        if self.store.allocs.get(alloc.id) is alloc:
            self._alloc_stubs.setdefault(alloc.id, {})[flags] = (alloc, data)
        return data

    def job_stub_json(self, rec: JobRecord, meta: bool, summary: JsonDict | None) -> bytes:
        """A job's list stub as JSON bytes. `summary` None: the current one,
        and the encoding is cached for as long as the job, its allocations
        (the summary index) and its queued counts stay the same."""
        key = (rec.namespace, rec.id)
        version = (
            self.store.summary_index.get(key, 0),
            tuple(sorted(self.queued.get(key, {}).items())),
        )
        if summary is None:
            cached = self._job_stubs.get(key, {}).get(meta)
            if cached is not None and cached[0] is rec and cached[1] == version:
                return cached[2]
            summary = self.job_summary(rec)
            data = json_bytes(job_stub(rec.spec, summary, meta))
            if self.store.jobs.get(key) is rec:
                self._job_stubs.setdefault(key, {})[meta] = (rec, version, data)
            return data
        return json_bytes(job_stub(rec.spec, summary, meta))

    def job_summary(self, rec: JobRecord, allocs: dict[str, Alloc] | None = None) -> JsonDict:
        """The job's summary over `allocs` (a table view; default the current table)."""
        ns, job_id = rec.namespace, rec.id
        table = self.store.allocs if allocs is None else allocs
        ids = self.store.allocs_by_job.get((ns, job_id), ())
        return job_summary(
            rec.spec,
            [table[i] for i in ids if i in table],
            self.queued.get((ns, job_id), {}),
            self.store.summary_index.get((ns, job_id), 0),
        )

    def _drop_encodings(self, commit: Commit) -> None:
        for change in commit.changes:
            if change.table == ALLOCS:
                self._alloc_stubs.pop(change.key, None)
            elif change.table == JOBS:
                self._job_stubs.pop(change.key, None)

    def after_client_update(self, alloc: Alloc) -> None:
        self.drainer.on_alloc_change(alloc)
        if alloc.client_terminal():
            self.release_ports(alloc)
            self.scheduler.unblock_all()

    # -- job status (Nomad's setJobStatus, v1.9.6+) ------------------------------

    def _set_job_statuses(self, tx: Txn) -> None:
        jobs: set[tuple[str, str]] = set()
        for ch in tx.changes:
            if ch.table in (ALLOCS, EVALS):
                obj = ch.after or ch.before
                jobs.add((obj.namespace, obj.job_id))
            elif ch.table == JOBS and ch.after is not None:
                jobs.add(ch.key)
        for key in sorted(jobs):
            rec = self.store.jobs.get(key)
            if rec is None:
                continue
            status = self.job_status(rec)
            if status != rec.spec["Status"]:
                spec = dict(rec.spec)
                spec["Status"] = status
                spec["ModifyIndex"] = tx.index
                tx.put_job(replace(rec, spec=spec))

    def job_status(self, rec: JobRecord) -> str:
        spec = rec.spec
        periodic = spec.get("Periodic") or {}
        if spec["Type"] == "system" or periodic.get("Enabled") or spec.get("ParameterizedJob"):
            return "dead" if rec.stopped else "running"
        # Unsorted and stopping at the first live allocation: this runs on every write.
        allocs = self.store.allocs
        ids = self.store.allocs_by_job.get((rec.namespace, rec.id), ())
        if any(not allocs[i].terminal() for i in ids):
            return "running"
        has_eval = False
        for ev in self.store.job_evals(rec.namespace, rec.id):
            if ev.status in ("pending", "blocked"):
                return "pending"
            has_eval = True
        if has_eval or rec.stopped:
            return "dead"
        return "pending"

    # -- jobs -------------------------------------------------------------------

    def register_job(self, raw: Any, namespace: str, enforce: bool, enforce_index: int) -> JsonDict:
        if not isinstance(raw, dict):
            raise NomadError(400, "Job must be specified")
        job_id = raw.get("ID")
        if not job_id or not isinstance(job_id, str):
            raise NomadError(400, "Job ID hasn't been provided")
        existing = self.store.job(namespace, job_id)
        if enforce:
            if enforce_index == 0 and existing is not None:
                raise NomadError(500, "Enforcing job modify index 0: job already exists")
            if enforce_index != 0 and existing is None:
                raise NomadError(
                    500, f"Enforcing job modify index {enforce_index}: job does not exist"
                )
            if existing is not None and existing.spec["JobModifyIndex"] != enforce_index:
                raise NomadError(
                    500,
                    f"Enforcing job modify index {enforce_index}: job exists with conflicting "
                    f"job modify index: {existing.spec['JobModifyIndex']}",
                )
        try:
            spec = canonicalize_job(raw, namespace)
        except JobValidationError as exc:
            raise NomadError(500, str(exc)) from None
        now = self.clock.now_ns()
        periodic = (spec.get("Periodic") or {}).get("Enabled") or spec.get("ParameterizedJob")
        if existing is not None and not _spec_changed(existing.spec, spec):
            # Nomad skips the job write for an unchanged spec but still evaluates.
            ev = self._new_eval(existing.spec, "job-register")
            with self.store.txn("EvalUpdate") as tx:
                ev = replace(ev, job_modify_index=existing.spec["JobModifyIndex"])
                tx.put_eval(self.stamp_eval(ev, tx.index))
            self.scheduler.enqueue(ev.id)
            return _register_response(ev.id, tx.index, existing.spec["JobModifyIndex"], tx.index)
        eval_id = ""
        with self.store.txn("JobRegister") as tx:
            spec["Version"] = existing.spec["Version"] + 1 if existing else 0
            spec["CreateIndex"] = existing.spec["CreateIndex"] if existing else tx.index
            spec["ModifyIndex"] = tx.index
            spec["JobModifyIndex"] = tx.index
            spec["SubmitTime"] = now
            spec["Status"] = existing.spec["Status"] if existing else "pending"
            versions = (*existing.versions, spec) if existing else (spec,)
            tx.put_job(JobRecord(namespace, job_id, spec, versions))
            if existing is None:
                self.store.jobs_ever_registered += 1
            if not periodic:
                ev = replace(self._new_eval(spec, "job-register"), job_modify_index=tx.index)
                eval_id = ev.id
                tx.put_eval(self.stamp_eval(ev, tx.index))
        if eval_id:
            self.scheduler.enqueue(eval_id)
        return _register_response(eval_id, tx.index if eval_id else 0, tx.index, tx.index)

    def _new_eval(self, spec: JsonDict, triggered_by: str, eval_type: str = "") -> Eval:
        return Eval(
            id=self.new_id(),
            namespace=spec["Namespace"],
            priority=int(spec.get("Priority") or 50),
            type=eval_type or spec["Type"],
            triggered_by=triggered_by,
            job_id=spec["ID"],
        )

    def deregister_job(self, namespace: str, job_id: str, purge: bool) -> JsonDict:
        rec = self.store.job(namespace, job_id)
        if rec is None:
            return _deregister_response("", 0, 0, 0)
        # Nomad's deregistration evaluation is always of type service.
        ev = self._new_eval(rec.spec, "job-deregister", eval_type="service")
        with self.store.txn("JobDeregister") as tx:
            ev = replace(ev, job_modify_index=tx.index)
            if purge:
                for alloc in self.store.job_allocs(namespace, job_id):
                    self.client.forget(alloc.id)
                    self.release_ports(alloc)
                    tx.delete_alloc(alloc.id)
                tx.delete_job(namespace, job_id)
                modify_index = rec.spec["JobModifyIndex"]
            else:
                spec = dict(rec.spec)
                spec.update(
                    Stop=True,
                    Version=spec["Version"] + 1,
                    ModifyIndex=tx.index,
                    JobModifyIndex=tx.index,
                    SubmitTime=self.clock.now_ns(),
                )
                tx.put_job(replace(rec, spec=spec, versions=(*rec.versions, spec)))
                modify_index = tx.index
            tx.put_eval(self.stamp_eval(ev, tx.index))
        self.scheduler.enqueue(ev.id)
        if purge:
            self.scheduler.unblock_all()
        return _deregister_response(ev.id, tx.index, modify_index, tx.index)

    def evaluate_job(self, namespace: str, job_id: str) -> JsonDict:
        rec = self.store.job(namespace, job_id)
        if rec is None:
            raise NomadError(404, "job not found")
        ev = self._new_eval(rec.spec, "job-register")
        with self.store.txn("EvalUpdate") as tx:
            ev = replace(ev, job_modify_index=rec.spec["ModifyIndex"])
            tx.put_eval(self.stamp_eval(ev, tx.index))
        self.scheduler.enqueue(ev.id)
        return {
            "EvalID": ev.id,
            "EvalCreateIndex": tx.index,
            "JobModifyIndex": rec.spec["JobModifyIndex"],
            "Warnings": "",
            "Index": tx.index,
            "LastContact": 0,
            "KnownLeader": False,
            "NextToken": "",
        }

    # -- allocations ------------------------------------------------------------

    def migrate(self, allocs: list[Alloc], triggered_by: str) -> list[Eval]:
        """Set DesiredTransition.Migrate and evaluate each job once."""
        evals: dict[tuple[str, str], Eval] = {}
        with self.store.txn("AllocUpdateDesiredTransition") as tx:
            for a in allocs:
                tx.put_alloc(
                    replace(a, migrate=True, modify_index=tx.index, modify_time=self.clock.now_ns())
                )
                key = (a.namespace, a.job_id)
                if key not in evals:
                    rec = self.store.job(*key)
                    ev = drain_eval(self, a, triggered_by)
                    if rec is not None:
                        ev = replace(ev, job_modify_index=rec.spec["ModifyIndex"])
                    evals[key] = ev
                    tx.put_eval(self.stamp_eval(ev, tx.index))
        for ev in evals.values():
            self.scheduler.enqueue(ev.id)
        return [self.store.evals[e.id] for e in evals.values()]

    def stop_alloc(self, alloc_id: str) -> JsonDict:
        alloc = self.store.allocs.get(alloc_id)
        if alloc is None:
            raise NomadError(404, "allocation not found")
        (ev,) = self.migrate([alloc], "alloc-stop")
        return {"EvalID": ev.id, "Index": ev.create_index}

    def task_exit(self, alloc_id: str, oom: bool) -> None:
        alloc = self.store.allocs.get(alloc_id)
        if alloc is None:
            raise NomadError(404, "alloc not found")
        if not self.client.task_exit(alloc_id, 137 if oom else 1, oom):
            raise NomadError(
                409,
                f"allocation {alloc_id} has no running task (client status {alloc.client_status})",
            )

    # -- exec -------------------------------------------------------------------

    def exec(
        self, alloc_id: str, task: str, command: list[str], tty: bool, token: str | None
    ) -> Execution:
        """Start a command in an allocation's task. The checks and texts of
        Nomad's server (nomad/client_alloc_endpoint.go exec), in its order,
        then its client's (driver.py). Errors without a code in Nomad,
        `Permission denied` among them, are 500 here as they are there."""
        # Authenticate: a token that resolves to nothing is refused before the
        # allocation is looked up; no token at all is the anonymous token.
        if self.acl_enabled and token and not self.token_known(token):
            raise NomadError(500, "Permission denied")  # structs.ErrPermissionDenied
        alloc = self.store.allocs.get(alloc_id)
        if alloc is None:
            # structs.NewErrUnknownAllocation: ErrUnknownAllocationPrefix + " %q"
            raise NomadError(404, f"Unknown allocation {quote(alloc_id)}")
        if not self.token_allows(token, "alloc-exec"):
            raise NomadError(500, "Permission denied")
        if alloc.client_terminal():
            raise NomadError(
                400,
                f"exec not possible, client status of allocation {alloc.id} "
                f"is {alloc.client_status}",
            )
        node = self.store.nodes.get(alloc.node_id)
        if node is None:
            raise NomadError(400, f"Unknown node {quote(alloc.node_id)}")
        if node.status != "ready":
            # The server holds no connection to a node that stopped heartbeating.
            raise NomadError(404, "No path to node")  # structs.ErrNoNodeConn
        try:
            return self.driver.exec(
                alloc, task, command, tty, lambda cap: self.token_allows(token, cap)
            )
        except ExecRefused as exc:
            raise NomadError(exc.status, exc.text) from None

    def exec_processes(self, alloc_id: str) -> list[int]:
        """Live processes the allocation's executions started (marker scan)."""
        return self.driver.processes(alloc_id)

    def task_dir(self, alloc_id: str, task: str | None = None) -> Path | None:
        """The working directory of the allocation's task (the group's first
        by default) while it runs, else None."""
        return self.driver.task_dir(alloc_id, task)

    @property
    def setuser_path(self) -> str:
        """Absolute path of the simulator's stand-in for `/sbin/setuser`."""
        return self.driver.setuser_path

    # -- nodes ------------------------------------------------------------------

    def node(self, node_id: str) -> Node:
        node = self.store.nodes.get(node_id)
        if node is None:
            raise NomadError(404, "node not found")
        return node

    def drain_node(self, node_id: str, spec: Any, mark_eligible: bool) -> JsonDict:
        node = self.node(node_id)
        if spec is None:
            deadline = None
            ignore = False
        else:
            if not isinstance(spec, dict):
                raise NomadError(400, "DrainSpec must be an object or null")
            deadline = spec.get("Deadline", 0)
            if isinstance(deadline, bool) or not isinstance(deadline, int):
                raise NomadError(400, "DrainSpec.Deadline must be an integer of nanoseconds")
            ignore = bool(spec.get("IgnoreSystemJobs", False))
        new = self.drainer.set_drain(node, deadline, ignore, mark_eligible)
        return _node_update_response(new.modify_index)

    def set_eligibility(self, node_id: str, eligibility: Any) -> JsonDict:
        node = self.node(node_id)
        if eligibility not in ("eligible", "ineligible"):
            raise NomadError(400, f'invalid scheduling eligibility "{eligibility}"')
        if eligibility == "eligible" and node.drain is not None:
            raise NomadError(
                500, "can not set node's scheduling eligibility to eligible while it is draining"
            )
        with self.store.txn("NodeUpdateEligibility") as tx:
            tx.put_node(
                replace(
                    node,
                    eligibility=eligibility,
                    modify_index=tx.index,
                    events=self.node_event(
                        node, f"Node marked as {eligibility}", "Cluster", tx.index
                    ),
                )
            )
        if eligibility == "eligible":
            self.scheduler.unblock_all()
        return _node_update_response(tx.index)

    def set_node_status(self, node_id: str, status: str) -> None:
        node = self.node(node_id)
        if node.status == status:
            return
        message = "Node heartbeat missed" if status == "down" else "Node reregistered by heartbeat"
        with self.store.txn("NodeUpdateStatus") as tx:
            tx.put_node(
                replace(
                    node,
                    status=status,
                    modify_index=tx.index,
                    status_updated_at=self.clock.now_ns() // 1_000_000_000,
                    events=self.node_event(node, message, "Cluster", tx.index),
                )
            )
        if status == "down":
            self.client.on_node_down(node_id)
            jobs: dict[tuple[str, str], Alloc] = {}
            for a in self.store.node_allocs(node_id):
                if not a.terminal():
                    jobs.setdefault((a.namespace, a.job_id), a)
            if jobs:
                with self.store.txn("EvalUpdate") as tx:
                    evals = []
                    for a in jobs.values():
                        ev = replace(
                            drain_eval(self, a, "node-update"),
                            node_id=node_id,
                            node_modify_index=tx.index - 1,
                        )
                        evals.append(ev)
                        tx.put_eval(self.stamp_eval(ev, tx.index))
                for ev in evals:
                    self.scheduler.enqueue(ev.id)
        else:
            self.scheduler.unblock_all()

    # -- introspection ----------------------------------------------------------

    def stats(self) -> JsonDict:
        jobs: dict[str, int] = {}
        for rec in self.store.jobs.values():
            jobs[rec.spec["Status"]] = jobs.get(rec.spec["Status"], 0) + 1
        allocs: dict[str, int] = {}
        for a in self.store.allocs.values():
            allocs[a.client_status] = allocs.get(a.client_status, 0) + 1
        return {
            "Index": self.store.index,
            "Requests": dict(sorted(self.requests.items())),
            "Jobs": jobs,
            "Allocations": allocs,
            "JobsRegisteredTotal": self.store.jobs_ever_registered,
            "EventFramesPublished": self.broker.published,
            "EventSubscribers": self.broker.subscribers,
        }


def _spec_changed(old: JsonDict, new: JsonDict) -> bool:
    return any(old.get(k) != new.get(k) for k in new if k not in _NON_SPEC)


def _register_response(
    eval_id: str, eval_index: int, job_modify_index: int, index: int
) -> JsonDict:
    return {
        "EvalID": eval_id,
        "EvalCreateIndex": eval_index,
        "JobModifyIndex": job_modify_index,
        "Warnings": "",
        "Index": index,
        "LastContact": 0,
        "KnownLeader": False,
        "NextToken": "",
    }


def _deregister_response(
    eval_id: str, eval_index: int, job_modify_index: int, index: int
) -> JsonDict:
    return {
        "EvalID": eval_id,
        "EvalCreateIndex": eval_index,
        "JobModifyIndex": job_modify_index,
        "VolumeEvalID": "",
        "VolumeEvalIndex": 0,
        "Index": index,
        "LastContact": 0,
        "KnownLeader": False,
        "NextToken": "",
    }


def _node_update_response(index: int) -> JsonDict:
    """NodeDrainUpdateResponse, which the eligibility endpoint answers too."""
    return {"NodeModifyIndex": index, "EvalIDs": None, "EvalCreateIndex": 0, "Index": index}
