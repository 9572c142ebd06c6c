"""The simulated cluster's agents, and which of them a request passes through.

One `Simulator` holds the cluster's state; the agents are HTTP front-ends
over it, each with a role, as in a production Nomad cluster: `servers`
servers (the first is the leader, the others followers) and one client agent
per node, each listening on an address of its own (its node's `HTTPAddr`).

What an agent does with a request is Nomad's (Nomad v1.6.2):

- A server RPC through a client agent is sent over the client's connection
  pool to the server it talks to (client/rpc.go `Client.RPC`); a follower
  forwards writes, and reads that do not allow `stale`, to the leader
  (nomad/rpc.go `forward`, `forwardLeader`). Each pool hop wraps an uncoded
  error once more (forwarding.py; `rpc error: rpc error: …` after two hops,
  hashicorp/nomad#6676).
- A follower serves a `stale` read from its own state, which may lag.
- The event stream on a server is served from that server's own broker
  (nomad/event_endpoint.go); through a client agent it is a streaming RPC:
  a new TCP connection to the agent's server for as long as the stream
  lasts (command/agent/event_endpoint.go, `RemoteStreamingRpcHandler`).
- Allocation exec on a client agent is local when the allocation is on the
  agent's own node; otherwise the agent opens a streaming RPC connection to
  its server for as long as the exec runs (command/agent/alloc_endpoint.go
  `rpcHandlerForAlloc`, client/rpc.go `streamingRpcConn`). On a server it is
  the server's own streaming handler, which reaches the node over the
  connection the node keeps to the servers.

`hop` decides this as a pure function; http.py and alloc_exec.py act on it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Role(Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    CLIENT = "client"


class Kind(Enum):
    """What a route does, as far as forwarding is concerned."""

    READ = "read"  # a query RPC (blocking or not)
    WRITE = "write"  # a write RPC
    STREAM = "stream"  # the event stream (a streaming RPC)
    EXEC = "exec"  # allocation exec (a streaming RPC to the node)
    LOCAL = "local"  # answered by the agent itself (/v1/agent/self, /_sim)


ENTRIES = tuple(role.value for role in Role)


@dataclass(frozen=True)
class Agent:
    name: str  # server-1…, or the node's name for a client agent
    role: Role
    ip: str  # the address its peers see: per-IP limits count by it
    node: str | None = None  # a client agent's node
    server: str | None = None  # the server a client agent sends its RPCs to


@dataclass(frozen=True)
class Hop:
    # RPC pool hops the request takes; each wraps an uncoded error once.
    pool_hops: int = 0
    # A streaming RPC connection the agent opens to this server for the
    # request's whole duration (counted by the server's RPC limit).
    stream_to: str | None = None
    # Served from a follower's own state, which may lag the leader's.
    follower_view: bool = False


def cluster(servers: int, nodes: int) -> tuple[Agent, ...]:
    """The agents of a cluster: servers first (server-1 leads), then one
    client agent per node (agent-1…), each talking to the servers in turn."""
    if servers < 1:
        raise ValueError("a cluster needs at least one server")
    out = [
        Agent(f"server-{i}", Role.LEADER if i == 1 else Role.FOLLOWER, f"127.0.2.{i}")
        for i in range(1, servers + 1)
    ]
    out += [
        Agent(
            f"agent-{i}",
            Role.CLIENT,
            f"127.0.1.{i}",
            node=f"agent-{i}",
            server=f"server-{(i - 1) % servers + 1}",
        )
        for i in range(1, nodes + 1)
    ]
    return tuple(out)


def hop(
    agent: Agent,
    kind: Kind,
    stale: bool = False,
    server_role: Role | None = None,
    alloc_node: str | None = None,
) -> Hop:
    """How `agent` serves a request of `kind`. `server_role` is the role of
    the server a client agent talks to; `alloc_node` the node an exec's
    allocation runs on."""
    if kind is Kind.LOCAL or agent.role is Role.LEADER:
        return Hop()
    if agent.role is Role.FOLLOWER:
        if kind is Kind.WRITE or (kind is Kind.READ and not stale):
            return Hop(pool_hops=1)  # forwarded to the leader
        return Hop(follower_view=kind is Kind.READ)
    # A client agent.
    if kind is Kind.EXEC:
        if alloc_node is not None and alloc_node == agent.node:
            return Hop()  # its own node's allocation: the local client runs it
        return Hop(stream_to=agent.server)
    if kind is Kind.STREAM:
        return Hop(stream_to=agent.server)
    # Server RPCs go to the agent's server, which serves them as above.
    behind = hop(Agent(agent.server or "", server_role or Role.LEADER, ""), kind, stale)
    return Hop(pool_hops=1 + behind.pool_hops, follower_view=behind.follower_view)
