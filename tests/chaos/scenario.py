"""The seeded scenario generator: a seed ⇒ one chaos scenario.

Pure and deterministic: `generate(seed)` draws every choice from
`random.Random(seed)`, so a seed always yields the same cluster, the same
environments and the same timeline of actions. What it cannot fix is the
interleaving: the controller, the simulator and the actors run on their own
threads, so a replay repeats the actions, not the exact order in which Nomad
and the controller see them.

Two parts of a scenario draw from random streams of their own, derived
from the seed, so that adding them left every seed's other steps as they
were: the clients' use of the data plane (executions and file operations,
`_DATA_PLANE`) and the maintenance night's restarts (`_MAINTENANCE`).

Targets that only exist at run time (which allocation to OOM-kill, which
claim to release) are drawn as a `pick` number, resolved against what exists
when the step runs (`pick % len(candidates)`, over a sorted list).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

OPERATOR = "operator"
ORDERINGS = ("production", "client")
# The programs a client runs (tests/chaos/executions.py says what each does).
PROGRAMS = ("exit", "stdin", "stderr", "timeout", "background", "disconnect")
# Offsets of the derived random streams (see the module docstring).
_DATA_PLANE = 7_919
_MAINTENANCE = 46

# The seeds CI runs (tests/chaos/conftest.py): fixed, so CI is repeatable;
# together they cover every kind of action (tests/chaos/test_scenario.py checks that).
CI_SEEDS = (1, 4, 6, 7, 13, 17, 23, 28)

# Every kind of thing a scenario can do; the CI seeds must cover all of them.
KINDS = (
    "claim",
    "claim_burst",
    "claim_with_timeout",
    "claim_keepalive",
    "release",
    "touch",
    "env_create",
    "env_resize",
    "env_update",
    "env_delete",
    "drain_production",
    "drain_client",
    "node_down",
    "oom",
    "crash",
    "crash_loop",
    "alloc_stop",
    "controller_kill",
    "controller_drain",
    "stream_cut",
    "duplicate_events",
    "heartbeat_loss",
    "no_leader",
    "stale_reads",
    *(f"execute_{p}" for p in PROGRAMS),
    "list_files",
    "agent_restart",
    "agent_lost",
    "docker_restart",
    "host_reboot",
    "server_restart",
    "leader_restart",
    "servers_restart",
    "write_eof",
    "stream_stall",
)


@dataclass(frozen=True)
class EnvSpec:
    """An execution environment as the scenario PUTs it."""

    id: int
    image: str
    pool: int
    cpu: int = 100
    memory: int = 128
    network: bool = False
    ports: tuple[int, ...] = ()

    def body(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "image": self.image,
            "prewarmingPoolSize": self.pool,
            "cpuLimit": self.cpu,
            "memoryLimit": self.memory,
            "networkAccess": self.network,
            "exposedPorts": list(self.ports),
        }


# -- actions -------------------------------------------------------------------------


@dataclass(frozen=True)
class PutEnv:
    env: EnvSpec
    why: str  # create | resize | update


@dataclass(frozen=True)
class DeleteEnv:
    env_id: int


@dataclass(frozen=True)
class Drain:
    node: int  # index into the nodes sorted by name
    ordering: str  # production | client


@dataclass(frozen=True)
class Undrain:
    node: int


@dataclass(frozen=True)
class NodeDown:
    node: int


@dataclass(frozen=True)
class NodeUp:
    node: int


@dataclass(frozen=True)
class KillTask:
    target: str  # claimed | idle: whose running allocation
    pick: int
    oom: bool
    times: int  # > 1: crash it again each time it is back (until Nomad reschedules it)


@dataclass(frozen=True)
class StopAlloc:
    target: str
    pick: int


@dataclass(frozen=True)
class RestartController:
    """SIGKILL the controller (or, `graceful`, SIGTERM it and wait for its
    drain to end), wait `downtime` seconds, start a new one."""

    downtime: float
    graceful: bool = False


@dataclass(frozen=True)
class RestartAgent:
    """Restart a node's client agent (down `down` seconds); `reboot`: the
    whole host, Docker and its containers with it."""

    node: int
    down: float
    reboot: bool = False


@dataclass(frozen=True)
class RestartDocker:
    node: int


@dataclass(frozen=True)
class RestartServer:
    which: str  # follower | leader | all
    down: float


@dataclass(frozen=True)
class SetFaults:
    name: str  # the fault window's kind, for the log
    values: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True)
class Claim:
    env_id: int
    timeout: int  # inactivity timeout in seconds, 0 = none
    parallel: int = 1  # that many claims at once
    keepalive: bool = False  # the client touches it every 0.25 s until its steps end


@dataclass(frozen=True)
class Release:
    pick: int


@dataclass(frozen=True)
class Touch:
    pick: int


@dataclass(frozen=True)
class Execute:
    """Run `program` (one of PROGRAMS) on a held runner; it prints, then
    exits with, `code`. A client that holds none claims one of `env_id` first."""

    pick: int
    program: str
    code: int
    env_id: int


@dataclass(frozen=True)
class ListFiles:
    pick: int


Action = (
    PutEnv
    | DeleteEnv
    | Drain
    | Undrain
    | NodeDown
    | NodeUp
    | KillTask
    | StopAlloc
    | RestartController
    | RestartAgent
    | RestartDocker
    | RestartServer
    | SetFaults
    | Claim
    | Release
    | Touch
    | Execute
    | ListFiles
)


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the timeline starts
    actor: str  # OPERATOR or client-N
    action: Action
    kind: str  # one of KINDS, or "recover" / "fault_end" for the undoing steps


@dataclass(frozen=True)
class Scenario:
    seed: int
    nodes: int
    stale_lag_ms: float
    envs: tuple[EnvSpec, ...]  # created (and filled) before the timeline starts
    steps: tuple[Step, ...]
    duration: float
    clients: tuple[str, ...] = field(default=("client-1", "client-2", "client-3"))

    def kinds(self) -> set[str]:
        return {s.kind for s in self.steps}

    def env_ids(self) -> tuple[int, ...]:
        return tuple(e.id for e in self.envs)

    def steps_of(self, actor: str) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.actor == actor)

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: {self.nodes} nodes, stale lag {self.stale_lag_ms:.0f} ms, "
            f"{len(self.steps)} steps over {self.duration:.1f} s",
        ]
        lines += [f"  env {e}" for e in self.envs]
        lines += [f"  {s.at:6.2f}s {s.actor:9} {s.action}" for s in self.steps]
        return "\n".join(lines)


# -- the generator -------------------------------------------------------------------

# Operator actions and their weights.
_OPERATOR_KINDS = (
    ("env_resize", 3),
    ("env_update", 2),
    ("env_delete", 1),
    ("env_create", 2),
    ("drain_production", 2),
    ("drain_client", 2),
    ("node_down", 2),
    ("oom", 3),
    ("crash", 3),
    ("crash_loop", 1),
    ("alloc_stop", 2),
    ("controller_kill", 2),
    ("controller_drain", 1),
    ("stream_cut", 1),
    ("duplicate_events", 1),
    ("heartbeat_loss", 1),
    ("no_leader", 2),
    ("stale_reads", 2),
)
_FAULT_DEFAULTS: dict[str, tuple[tuple[str, Any], ...]] = {
    "stream_cut": (("event_stream_cut_every", 0),),
    "duplicate_events": (("event_duplicate_rate", 0.0),),
    "heartbeat_loss": (("heartbeat_loss", False),),
    "no_leader": (("http_error_rate", 0.0),),
    "stale_reads": (("stale_read_rate", 0.0),),
    "write_eof": (("write_eof_rate", 0.0),),
    "stream_stall": (("event_stream_stall", False),),
}
# How long the simulator's servers wait for a node's heartbeat (its
# SimConfig.heartbeat_ttl_ms in tests/chaos/run.py), and how long a restarted
# agent stays down: within it, and past it for `agent_lost`.
HEARTBEAT_TTL_S = 2.0
AGENT_DOWN_S = (0.3, 1.5)
AGENT_LOST_DOWN_S = 3.0


class _Generator:
    def __init__(self, seed: int, duration: float) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.duration = duration
        self.steps: list[Step] = []
        self.nodes = self.rng.choice((2, 3))
        # When a disruption holds each node: (from, until).
        self.node_busy: list[list[tuple[float, float]]] = [[] for _ in range(self.nodes)]
        self.fault_until: dict[str, float] = {}
        self.image_version = 0

    def env(self, env_id: int) -> EnvSpec:
        rng = self.rng
        network = rng.random() < 0.4
        return EnvSpec(
            id=env_id,
            image="python:3.12",
            pool=rng.randint(3, 6),
            memory=rng.choice((128, 256)),
            network=network,
            ports=(8080,) if network else (),
        )

    def run(self) -> Scenario:
        rng = self.rng
        envs = tuple(self.env(10 + i) for i in range(rng.choice((2, 3))))
        current: dict[int, EnvSpec | None] = {e.id: e for e in envs}
        clients = ("client-1", "client-2", "client-3")
        self.client_steps(clients, [e.id for e in envs])
        for at in sorted(rng.uniform(0.2, self.duration) for _ in range(rng.randint(12, 18))):
            self.operator_step(at, current)
        self.data_plane_steps(clients, [e.id for e in envs])
        self.maintenance_steps()
        steps = sorted(self.steps, key=lambda s: (s.at, s.actor))
        return Scenario(
            seed=self.seed,
            nodes=self.nodes,
            stale_lag_ms=rng.choice((200.0, 400.0, 800.0)),
            envs=envs,
            steps=tuple(steps),
            duration=self.duration,
            clients=clients,
        )

    def client_steps(self, clients: tuple[str, ...], env_ids: list[int]) -> None:
        rng = self.rng
        for _ in range(rng.randint(14, 24)):
            at = rng.uniform(0.1, self.duration)
            actor = rng.choice(clients)
            r = rng.random()
            action: Action
            if r < 0.5:
                timeout = rng.choice((0, 0, 0, 1, 2))
                parallel = rng.choice((1, 1, 1, 2, 4))
                keepalive = timeout > 0 and rng.random() < 0.5
                action = Claim(rng.choice(env_ids), timeout, parallel, keepalive)
                if parallel > 1:
                    kind = "claim_burst"
                elif keepalive:
                    kind = "claim_keepalive"
                else:
                    kind = "claim_with_timeout" if timeout else "claim"
            elif r < 0.75:
                action, kind = Release(rng.randrange(1 << 16)), "release"
            else:
                action, kind = Touch(rng.randrange(1 << 16)), "touch"
            self.steps.append(Step(at, actor, action, kind))

    def data_plane_steps(self, clients: tuple[str, ...], env_ids: list[int]) -> None:
        """What students do with the runners they hold: run programs, list files."""
        rng = random.Random(self.seed * 1_000_003 + _DATA_PLANE)
        for _ in range(rng.randint(8, 14)):
            at = rng.uniform(0.2, self.duration)
            actor = rng.choice(clients)
            action: Action
            if rng.random() < 0.25:
                action, kind = ListFiles(rng.randrange(1 << 16)), "list_files"
            else:
                program = rng.choice(PROGRAMS)
                code = rng.choice((0, 1, 3, 42))
                action = Execute(rng.randrange(1 << 16), program, code, rng.choice(env_ids))
                kind = f"execute_{program}"
            self.steps.append(Step(at, actor, action, kind))

    def maintenance_steps(self) -> None:
        """The maintenance night's restarts, with the two faults a restart
        leaves behind (a write of unknown outcome, a stalled stream). One
        server restart at a time, so that a quorum stays or comes back; a node
        is restarted only while no other disruption holds it."""
        rng = random.Random(self.seed * 1_000_003 + _MAINTENANCE)
        kinds = (
            ("agent_restart", 4),
            ("agent_lost", 1),
            ("docker_restart", 2),
            ("host_reboot", 2),
            ("server_restart", 2),
            ("leader_restart", 2),
            ("servers_restart", 1),
            ("write_eof", 1),
            ("stream_stall", 1),
        )
        names, weights = zip(*kinds, strict=True)
        servers_until = 0.0
        for at in sorted(rng.uniform(0.3, self.duration) for _ in range(rng.randint(3, 5))):
            kind = rng.choices(names, weights)[0]
            if kind in ("server_restart", "leader_restart", "servers_restart"):
                if at < servers_until:
                    continue
                down = rng.uniform(0.2, 1.0)
                servers_until = at + down + 1.5
                which = {"server_restart": "follower", "leader_restart": "leader"}.get(kind, "all")
                self.add(at, RestartServer(which, down), kind)
            elif kind in ("write_eof", "stream_stall"):
                if self.fault_until.get(kind, 0.0) > at:
                    continue
                end = at + rng.uniform(0.3, 1.5)
                self.fault_until[kind] = end + 0.05
                value: Any = rng.choice((0.3, 0.6)) if kind == "write_eof" else True
                name = "write_eof_rate" if kind == "write_eof" else "event_stream_stall"
                self.add(at, SetFaults(kind, ((name, value),)), kind)
                self.add(end, SetFaults(kind, _FAULT_DEFAULTS[kind]), "fault_end")
            else:
                if kind == "docker_restart":
                    down = 0.0
                elif kind == "agent_lost":
                    down = AGENT_LOST_DOWN_S
                else:
                    down = rng.uniform(*AGENT_DOWN_S)
                until = at + down + 1.0
                node = self.free_node(at, until, rng)
                if node is None:
                    continue
                self.hold(node, at, until)
                if kind == "docker_restart":
                    self.add(at, RestartDocker(node), kind)
                else:
                    self.add(at, RestartAgent(node, down, reboot=kind == "host_reboot"), kind)

    def add(self, at: float, action: Action, kind: str) -> None:
        self.steps.append(Step(at, OPERATOR, action, kind))

    def free_node(
        self, at: float, until: float | None = None, rng: random.Random | None = None
    ) -> int | None:
        """A node no disruption uses from `at` to `until`, if taking it keeps
        one node serving all that time."""
        end = at if until is None else until

        def busy(i: int) -> bool:
            return any(start <= end and at < stop for start, stop in self.node_busy[i])

        held = sum(1 for i in range(self.nodes) if busy(i))
        free = [i for i in range(self.nodes) if not busy(i)]
        if held + 1 >= self.nodes or not free:
            return None
        return (rng or self.rng).choice(free)

    def hold(self, node: int, at: float, until: float) -> None:
        self.node_busy[node].append((at, until))

    def operator_step(self, at: float, current: dict[int, EnvSpec | None]) -> None:
        rng = self.rng
        kinds, weights = zip(*_OPERATOR_KINDS, strict=True)
        kind = rng.choices(kinds, weights)[0]
        live = sorted(e for e, spec in current.items() if spec is not None)
        gone = sorted(e for e, spec in current.items() if spec is None)
        if kind == "env_delete" and len(live) <= 1:
            kind = "env_resize"
        if kind == "env_create" and not gone:
            kind = "env_update"
        if kind in ("env_resize", "env_update", "env_delete"):
            env_id = rng.choice(live)
            spec = current[env_id]
            assert spec is not None
            if kind == "env_resize":
                sizes = [n for n in range(1, 7) if n != spec.pool]
                new = EnvSpec(**{**spec.__dict__, "pool": rng.choice(sizes)})
                self.add(at, PutEnv(new, "resize"), kind)
            elif kind == "env_update":
                self.image_version += 1
                new = EnvSpec(
                    **{
                        **spec.__dict__,
                        "image": f"python:3.12-r{self.image_version}",
                        "memory": rng.choice((128, 256)),
                    }
                )
                self.add(at, PutEnv(new, "update"), kind)
            else:
                new = None
                self.add(at, DeleteEnv(env_id), kind)
            current[env_id] = new
        elif kind == "env_create":
            env_id = rng.choice(gone)
            new = self.env(env_id)
            current[env_id] = new
            self.add(at, PutEnv(new, "create"), kind)
        elif kind in ("drain_production", "drain_client", "node_down"):
            node = self.free_node(at)
            if node is None:
                self.add(at, KillTask("claimed", rng.randrange(1 << 16), False, 1), "crash")
                return
            back = at + rng.uniform(0.4, 1.5)
            self.hold(node, at, back + 0.05)
            if kind == "node_down":
                self.add(at, NodeDown(node), kind)
                self.add(back, NodeUp(node), "recover")
            else:
                self.add(at, Drain(node, kind.removeprefix("drain_")), kind)
                self.add(back, Undrain(node), "recover")
        elif kind in ("oom", "crash", "crash_loop"):
            target = rng.choice(("claimed", "idle"))
            times = 4 if kind == "crash_loop" else 1
            self.add(at, KillTask(target, rng.randrange(1 << 16), kind == "oom", times), kind)
        elif kind == "alloc_stop":
            target = rng.choice(("claimed", "idle"))
            self.add(at, StopAlloc(target, rng.randrange(1 << 16)), kind)
        elif kind == "controller_kill":
            self.add(at, RestartController(rng.choice((0.0, 0.0, 0.3))), kind)
        elif kind == "controller_drain":
            self.add(at, RestartController(0.0, graceful=True), kind)
        else:
            if self.fault_until.get(kind, 0.0) > at:
                # That fault is on already: kill a task instead.
                self.add(at, KillTask("idle", rng.randrange(1 << 16), True, 1), "oom")
                return
            values = self.fault_values(kind)
            end = at + rng.uniform(0.5, 2.0) if kind != "no_leader" else at + rng.uniform(0.2, 0.8)
            self.fault_until[kind] = end + 0.05
            self.add(at, SetFaults(kind, values), kind)
            self.add(end, SetFaults(kind, _FAULT_DEFAULTS[kind]), "fault_end")

    def fault_values(self, kind: str) -> tuple[tuple[str, Any], ...]:
        rng = self.rng
        if kind == "stream_cut":
            return (("event_stream_cut_every", rng.randint(1, 8)),)
        if kind == "duplicate_events":
            return (("event_duplicate_rate", rng.choice((0.3, 0.6, 1.0))),)
        if kind == "heartbeat_loss":
            return (("heartbeat_loss", True),)
        if kind == "no_leader":
            return (("http_error_rate", rng.choice((0.2, 0.4, 0.6))),)
        return (("stale_read_rate", rng.choice((0.3, 0.6, 0.9))),)


def generate(seed: int, duration: float = 6.0) -> Scenario:
    """The scenario of `seed` (always the same one)."""
    return _Generator(seed, duration).run()
