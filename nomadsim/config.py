"""What shapes a simulated cluster (`SimConfig`, given when it is built) and the
fault injection knobs (`Faults`, changed at run time through /_sim/faults)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from nomadsim.records import JsonDict

# How a migration's replacement and the allocation it replaces are ordered
# (the `migration_ordering` fault): as observed in production, as Nomad's
# client code path does it, or either at random per migration.
ORDERINGS = ("production", "client", "random")


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
    # How long the servers wait for a node's heartbeat before they mark it
    # down: its TTL plus heartbeat_grace, 20-30 s with up to 100 clients
    # (nomad/heartbeat.go). An agent kept down longer (restarts.py) loses its
    # node's allocations.
    heartbeat_ttl_ms: float = 25_000.0
    # After an election the new leader gives every node this long before it
    # can be marked down (failover_heartbeat_ttl, nomad/heartbeat.go).
    failover_heartbeat_ttl_ms: float = 300_000.0
    # A leader restart (restarts.py): how long the followers keep forwarding
    # to the dead leader before they notice (raft's heartbeat timeout, 1-2 s),
    # how long until a new leader is elected (2-5 s for one failure), and how
    # long a server holds a request that needs a leader before it answers
    # `No cluster leader` (RPCHoldTimeout, nomad/rpc.go).
    leader_notice_ms: float = 1000.0
    election_ms: float = 3000.0
    rpc_hold_ms: float = 5000.0
    event_buffer_size: int = 100
    # Production ordering: how long after the replacement runs the old one completes.
    migration_stop_lag_ms: float = 30.0
    node_cpu_mhz: int = 64_000
    node_memory_mb: int = 131_072
    # What placement counts ephemeral disks against (Nomad's default disk is
    # 300 MB per allocation: 4 TiB leaves CPU or memory the binding limit).
    node_disk_mb: int = 4_194_304
    # Nomad's scheduler configuration `memory_oversubscription_enabled`, on as
    # in Poseidon's clusters: with it a task may use up to its MemoryMaxMB
    # (placement counts MemoryMB only); without it MemoryMaxMB is ignored and
    # a register that sets one answers a warning.
    memory_oversubscription: bool = True
    # A task running `sleep` (what runners run) is PID 1 of its container and
    # ignores every signal but SIGKILL, as in Docker: stopping it takes its
    # kill_timeout (Nomad's default 5 s) unless its kill_signal is SIGKILL.
    # False: every stop takes stop_delay_ms only.
    kill_timeouts: bool = True
    # How long a client's change of an allocation (a task started, restarted,
    # killed) takes to reach the servers: Nomad's client sends its updates
    # every 200 ms (allocSyncIntv) and the server commits them in 50 ms
    # batches. The node (the driver) lives the change at once. 0: at once.
    client_sync_ms: float = 0.0
    # How far behind the leader a stale list read may be.
    stale_lag_ms: float = 500.0
    # Multiplies durations that come from Nomad objects (restart and reschedule
    # delays, drain deadlines, lock TTLs and delays) so tests can run a 10 s
    # lock TTL in 10 ms. 1.0 is real time.
    time_scale: float = 1.0
    # Initial `migration_ordering` fault: production, client or random.
    migration_ordering: str = "production"
    # The production topology (topology.py): servers (the first leads), one
    # client agent per node, and the agent whose address is the entry
    # (`client`, `leader` or `follower`).
    servers: int = 3
    entry: str = "client"
    # Nomad's per-client connection limits (connlimit.py); 0 = unlimited.
    http_max_conns_per_client: int = 100
    rpc_max_conns_per_client: int = 100
    # As root: exec'd commands run as a Docker exec does (the container's
    # user, Docker's default capabilities as the bounding set) and setuser
    # switches to a real unprivileged uid. Off, or not root: as the simulator.
    docker_users: bool = True
    # Nomad <= 1.8 with Docker: once an exec's output has ended its stdin is
    # closed, and input sent then ends the exec without its exit frame.
    docker_stdin_close_on_exit: bool = True


@dataclass
class Faults:
    """Fault injection knobs, read and written through /_sim/faults."""

    http_error_rate: float = 0.0
    http_latency_ms: float = 0.0
    stale_read_rate: float = 0.0
    event_duplicate_rate: float = 0.0
    event_stream_cut_every: int = 0
    heartbeat_loss: bool = False
    # Every open event stream sends nothing at all, frames or heartbeats,
    # without closing (its host gone, no FIN): what it holds back flows again
    # once the fault is off, if the client is still there.
    event_stream_stall: bool = False
    migration_ordering: str = "production"
    # Share of forwarded writes answered 500 `rpc error: EOF` (the leader died
    # with the write in flight, nomad/rpc.go), of which `write_eof_applied_rate`
    # were committed all the same: an answer of unknown outcome.
    write_eof_rate: float = 0.0
    write_eof_applied_rate: float = 0.5

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
