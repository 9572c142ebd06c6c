"""The simulator's tables: immutable records, replaced (never mutated) on
every write, the way Nomad's memdb stores copies. Immutability is what lets
`state.py` keep an undo log for stale reads and hand objects to encoders and
the event broker without copying."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JsonDict = dict[str, Any]

# Nomad's allocation client statuses.
PENDING = "pending"
RUNNING = "running"
COMPLETE = "complete"
FAILED = "failed"
LOST = "lost"
TERMINAL_CLIENT = frozenset({COMPLETE, FAILED, LOST})


@dataclass(frozen=True)
class TaskEvent:
    type: str
    time: int
    message: str = ""
    display_message: str = ""
    details: tuple[tuple[str, str], ...] = ()
    fails_task: bool = False
    restart_reason: str = ""
    exit_code: int = 0
    signal: int = 0
    kill_timeout: int = 0
    kill_reason: str = ""
    start_delay: int = 0
    driver_message: str = ""


@dataclass(frozen=True)
class TaskState:
    state: str = PENDING  # pending | running | dead
    failed: bool = False
    restarts: int = 0
    last_restart: int = 0  # unix ns, 0 = never
    started_at: int = 0
    finished_at: int = 0
    events: tuple[TaskEvent, ...] = ()


@dataclass(frozen=True)
class RescheduleEvent:
    reschedule_time: int
    prev_alloc_id: str
    prev_node_id: str
    delay_ns: int


@dataclass(frozen=True)
class Alloc:
    id: str
    namespace: str
    eval_id: str
    name: str
    node_id: str
    node_name: str
    job_id: str
    job: JsonDict  # the job version this allocation runs (shared, never mutated)
    task_group: str
    desired_status: str = "run"
    desired_description: str = ""
    migrate: bool | None = None  # DesiredTransition.Migrate
    reschedule: bool | None = None  # DesiredTransition.Reschedule
    client_status: str = PENDING
    client_description: str = ""
    task_states: tuple[tuple[str, TaskState], ...] = ()
    previous_allocation: str = ""
    next_allocation: str = ""
    reschedule_events: tuple[RescheduleEvent, ...] = ()
    followup_eval_id: str = ""
    create_index: int = 0
    modify_index: int = 0
    alloc_modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0

    @property
    def job_version(self) -> int:
        return int(self.job.get("Version", 0))

    @property
    def job_type(self) -> str:
        return str(self.job.get("Type", "service"))

    def terminal(self) -> bool:
        """Nomad's TerminalStatus: desired stop/evict or a terminal client status."""
        return self.desired_status in ("stop", "evict") or self.client_status in TERMINAL_CLIENT

    def client_terminal(self) -> bool:
        return self.client_status in TERMINAL_CLIENT

    def task_state(self, task: str) -> TaskState:
        return dict(self.task_states).get(task, TaskState())


@dataclass(frozen=True)
class Migration:
    """What a replacement placed by a migration follows: the allocation it
    replaces and the migration ordering chosen for it (`production`: the old
    one completes shortly after the new one runs; `client`: the new one waits
    for the old one to stop)."""

    previous_alloc_id: str
    ordering: str


@dataclass(frozen=True)
class Eval:
    id: str
    namespace: str
    priority: int
    type: str
    triggered_by: str
    job_id: str
    job_modify_index: int = 0
    node_id: str = ""
    node_modify_index: int = 0
    status: str = "pending"
    status_description: str = ""
    wait_until: int = 0  # unix ns
    previous_eval: str = ""
    blocked_eval: str = ""
    failed_tg_allocs: tuple[tuple[str, JsonDict], ...] = ()
    queued_allocations: tuple[tuple[str, int], ...] = ()
    snapshot_index: int = 0
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0


@dataclass(frozen=True)
class DrainStrategy:
    deadline_ns: int
    ignore_system_jobs: bool
    force_deadline: int  # unix ns, 0 = none
    started_at: int


@dataclass(frozen=True)
class Node:
    id: str
    secret_id: str
    name: str
    datacenter: str
    http_addr: str
    cpu_mhz: int
    memory_mb: int
    disk_mb: int = 4_194_304  # for allocations' ephemeral disks
    status: str = "ready"
    eligibility: str = "eligible"
    drain: DrainStrategy | None = None
    last_drain: JsonDict | None = None
    events: tuple[JsonDict, ...] = ()
    status_updated_at: int = 0  # unix seconds
    create_index: int = 0
    modify_index: int = 0
    # The node's own IP (its fingerprinted address: port HostIPs, attributes);
    # HTTPAddr is where its client agent listens.
    ip: str = ""

    @property
    def address(self) -> str:
        return self.ip or self.http_addr.split(":")[0]


@dataclass(frozen=True)
class VariableLock:
    id: str
    ttl_ns: int
    lock_delay_ns: int


@dataclass(frozen=True)
class Variable:
    namespace: str
    path: str
    items: tuple[tuple[str, str], ...] = ()
    lock: VariableLock | None = None
    create_index: int = 0
    create_time: int = 0
    modify_index: int = 0
    modify_time: int = 0


@dataclass(frozen=True)
class JobRecord:
    """A registered job: the current version plus every earlier version."""

    namespace: str
    id: str
    spec: JsonDict  # canonical Job JSON of the current version, index fields included
    versions: tuple[JsonDict, ...] = field(default=())

    @property
    def stopped(self) -> bool:
        return bool(self.spec.get("Stop"))
