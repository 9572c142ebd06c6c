"""The domain: environments, runner jobs, allocations and the runner views
derived from them.

Everything here is a frozen dataclass with no I/O, so derive and plan (pure
functions over these types) can be tested table by table. `controller/nomad/`
turns Nomad's JSON into these types; nothing else reads Nomad's JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum

SECOND = 1_000_000_000


class Phase(StrEnum):
    """Where a runner is in its life, from all of its allocations at once."""

    STARTING = "starting"  # no allocation running yet (new, migrating, rescheduling)
    READY = "ready"  # its current allocation is running
    STOPPING = "stopping"  # the job is stopped; allocations are still shutting down
    DEAD = "dead"  # nothing runs and nothing will without a new job


class LossReason(StrEnum):
    """Why a claimed runner's file system was reset, told to the client."""

    MIGRATED = "migrated"
    RESCHEDULED = "rescheduled"
    RESTARTED = "restarted"
    OOM_KILLED = "oom_killed"
    JOB_STOPPED = "job_stopped"
    LOST = "lost"
    # An execution that outlived its time limit (or its client) could not be
    # ended: the runner was stopped with everything in it.
    EXECUTION_NOT_STOPPED = "execution_not_stopped"

    @property
    def description(self) -> str:
        """What happened, in the words a client is told."""
        return _LOSS_DESCRIPTIONS[self]


_LOSS_DESCRIPTIONS = {
    LossReason.MIGRATED: "its allocation was migrated to another node; its file system was reset",
    LossReason.RESCHEDULED: "its allocation failed and was replaced; its file system was reset",
    LossReason.RESTARTED: "its task restarted; its file system was reset",
    LossReason.OOM_KILLED: "its task exceeded its memory limit, was killed and restarted; "
    "its file system was reset",
    LossReason.JOB_STOPPED: "its Nomad job was stopped",
    LossReason.LOST: "its node or its allocation was lost; its file system was reset",
    LossReason.EXECUTION_NOT_STOPPED: "an execution could not be ended after its time limit "
    "or its client left, so the runner was stopped",
}


@dataclass(frozen=True)
class Environment:
    """An execution environment: the template every runner of it is built from."""

    id: int
    image: str
    cpu_limit: int = 100  # MHz
    memory_limit: int = 256  # MB
    network_access: bool = False
    exposed_ports: tuple[int, ...] = ()
    prewarming_pool_size: int = 0
    # The site policy its template was written under (a fingerprint; empty
    # for templates Poseidon or an older controller wrote). Not an
    # environment field a client sets or sees, so not compared.
    template_source: str = field(default="", compare=False)

    @property
    def template_hash(self) -> str:
        """Identifies what a runner is built from; the pool size is not part of it,
        so resizing a pool never replaces runners, but a new site policy does."""
        return _template_hash(
            self.image,
            self.cpu_limit,
            self.memory_limit,
            self.network_access,
            tuple(sorted(self.exposed_ports)),
            self.template_source,
        )


# Plan and claims compare it with every runner of an environment: hash each
# shape once, not once per runner.
@functools.lru_cache(maxsize=4096)
def _template_hash(
    image: str, cpu: int, memory: int, network: bool, ports: tuple[int, ...], source: str
) -> str:
    shape: dict[str, object] = {
        "image": image,
        "cpu": cpu,
        "memory": memory,
        "network": network,
        "ports": list(ports),
    }
    if source:  # absent for Poseidon's templates, so their runners keep their hash
        shape["source"] = source
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PortMapping:
    """One exposed container port and where the host publishes it."""

    exposed_port: int
    host_address: str  # "ip:port"


@dataclass(frozen=True)
class Allocation:
    """What derive needs from one Nomad allocation (list stub or full object)."""

    id: str
    job_id: str
    node_id: str = ""
    node_name: str = ""
    client_status: str = "pending"
    desired_status: str = "run"
    desired_description: str = ""
    migrate: bool = False  # DesiredTransition.Migrate
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0  # ns since the epoch
    modify_time: int = 0
    restarts: int = 0  # summed over the allocation's tasks
    last_exit_oom: bool = False  # the newest Terminated task event says OOM killed
    started_at: int | None = None  # ns; first time a task of it started running
    ports: tuple[PortMapping, ...] = ()
    # ns: the shortest time between a restart of one of its tasks being decided
    # (and reported) and the task running again, from the job it runs; 0 when
    # some restart can come at once, None when the read carried no job (lists
    # and event payloads). Not part of the allocation's identity.
    restart_notice_ns: int | None = field(default=None, compare=False)

    @property
    def client_terminal(self) -> bool:
        return self.client_status in ("complete", "failed", "lost")


@dataclass(frozen=True)
class Claim:
    """The claim stored in a runner job's `config` group meta."""

    timeout: int = 0  # inactivity seconds; 0 = never expires
    alloc_id: str = ""  # allocation the claim was made on ("" for adopted Poseidon claims)
    restarts: int = 0  # that allocation's restart count at claim time
    claimed_at: int = 0  # ns since the epoch; 0 when unknown (adopted)
    lost_reason: LossReason | None = None  # set when the controller ended the claim
    lost_at: int = 0


@dataclass(frozen=True)
class RunnerJob:
    """A runner job `E-<uuid>` as observed: its spec fields that matter."""

    id: str
    env_id: int
    job_modify_index: int
    create_index: int = 0
    submit_time: int = 0  # ns; when the current version was registered
    stop: bool = False
    status: str = "pending"
    claim: Claim | None = None  # None = idle (meta `used` is not "true")
    template_hash: str = ""


@dataclass(frozen=True)
class RunnerView:
    """A runner as derive sees it from its job and all of its allocations."""

    job: RunnerJob
    phase: Phase
    alloc: Allocation | None = None  # current: newest allocation whose DesiredStatus is run
    startup_ns: int | None = None  # placement to running, when ready
    starting_since: int = 0  # ns; since when it has been waiting for a running allocation
    failed_to_start: bool = False  # an allocation of it failed before ever running
    reset: LossReason | None = None  # a claimed runner's file system was reset, and why
    known: bool = True  # False when its spec could not be read (count it, never touch it)

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def env_id(self) -> int:
        return self.job.env_id

    @property
    def claimed(self) -> bool:
        return self.job.claim is not None

    @property
    def node_name(self) -> str:
        return self.alloc.node_name if self.alloc else ""

    @property
    def loss(self) -> LossReason | None:
        """Why a claimed runner is lost: the reason recorded in its claim, or a
        reset derived from its allocations and not yet recorded; None when it
        is not lost (or not claimed)."""
        if self.job.claim is None:
            return None
        return self.job.claim.lost_reason or self.reset


@dataclass(frozen=True)
class Template:
    """A template job `template-E` as observed."""

    env: Environment
    job_modify_index: int
    spec: dict[str, object] = field(compare=False, hash=False, repr=False)
