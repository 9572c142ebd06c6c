"""Restarts of what a production cluster restarts: servers, a node's client
agent, its Docker daemon and its host (Nomad v1.6.2; docs/simulator.md,
"Restarts", cites the source for each rule).

A client agent restart (`agent`):

- Its listener closes and every connection on it is reset: HTTP requests
  and event streams through it, and exec WebSockets served by it, which end
  without a close frame (client/…/alloc_endpoint.go: the process that held
  them is gone).
- Execs of the node's allocations reached through another agent or a server
  are cut: close 1000 with no reason and no exit frame
  (command/agent/alloc_endpoint.go, a hop behind the HTTP agent read EOF);
  new ones are refused with 1008 `No path to node` until it is back
  (nomad/client_alloc_endpoint.go, `ErrNoNodeConn`).
- Docker keeps the containers, so every allocation and every process in it
  runs on: no Allocation event (since 1.6 the restored client re-sends only
  what changed); what the servers decide meanwhile (a stop, a placement)
  waits for the agent. On its return the node re-registers (`initializing`,
  a NodeRegistration event, then `ready`, a NodeEvent) and the client
  catches up.
- Kept down past the heartbeat TTL (`SimConfig.heartbeat_ttl_ms`): the node is
  marked down, its allocations lost and replaced, while their processes go
  on until the agent returns and kills them.

A Docker restart (`docker`): every running task on the node exits 137 at once
and its client applies the restart policy (a restart in place: same
allocation, Restarts + 1, a fresh file system; or, attempts used up, failed
and rescheduled); the processes of its executions die with the container.

A host reboot (`agent(reboot=True)`): the agent as above, and every container
with it at once; back within the TTL, each task restarts as after a Docker
restart.

A server restart (`server`, `all_servers`): its listener, the streams and
execs bridged through it end; agents that used it move to another after one
dial error; losing the leader gives dial errors until the followers notice,
then requests held for a leader (`leader_for`) until an election, which
needs a quorum up; client updates wait for it and arrive in a burst.

The sockets belong to the server that serves the simulator: it plugs in its
`Listeners`. Without one (an in-process client), a restart does everything
but close and reopen a port."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from nomadsim.client import Client
from nomadsim.clock import SimTime
from nomadsim.config import SimConfig
from nomadsim.driver import Driver
from nomadsim.errors import NomadError, Origin
from nomadsim.events import Subscriber
from nomadsim.frontends import Frontends
from nomadsim.node_endpoint import NodeEndpoint
from nomadsim.records import RUNNING, Node
from nomadsim.state import StateStore
from nomadsim.topology import Agent, Hop

NO_PATH = "No path to node"
NO_LEADER = "No cluster leader"
# A server's RPC port, as the dial errors of Nomad's connection pool name it.
RPC_PORT = 4647


class Listeners(Protocol):
    """An agent's listening socket, as the serving process holds it."""

    def close(self, agent: str) -> None:
        """Stop accepting (connects are refused) and reset every connection."""

    async def open(self, agent: str) -> None:
        """Listen again on the same address."""


@dataclass(eq=False)
class ExecCut:
    """An exec of a node's allocation: the restart of the node's agent, or of
    a server on its way (`servers`), cuts it."""

    node_id: str
    servers: frozenset[str] = frozenset()
    cut: asyncio.Event = field(default_factory=asyncio.Event)


class Restarts:
    def __init__(
        self,
        store: StateStore,
        time: SimTime,
        config: SimConfig,
        nodes: NodeEndpoint,
        client: Client,
        driver: Driver,
        frontends: Frontends,
        rng: random.Random,
        monotonic: Callable[[], float],
    ) -> None:
        self._store = store
        self._time = time
        self._config = config
        self._nodes = nodes
        self._client = client
        self._driver = driver
        self._frontends = frontends
        self._rng = rng
        self._monotonic = monotonic
        self.listeners: Listeners | None = None
        # Node ids whose agent is down now.
        self.agents_down: set[str] = set()
        self._remote: set[ExecCut] = set()
        self._streams: dict[Subscriber, str] = {}
        self._returns: dict[str, asyncio.TimerHandle] = {}
        self._background: set[asyncio.Task[None]] = set()
        # The leader that went away, until the followers notice (monotonic).
        self._old_leader: str | None = None
        self._noticed_at = 0.0
        self._election: asyncio.TimerHandle | None = None
        self._elected = asyncio.Event()
        self._elected.set()
        self._last_election_at = float("-inf")
        # Client agents whose server went away: their next RPC fails once.
        self._stranded: set[str] = set()

    # -- a client agent ---------------------------------------------------------------

    def agent(self, node_id: str, down_s: float, reboot: bool = False) -> Node:
        """Restart the node's client agent, down for `down_s` seconds; with
        `reboot`, the whole host: Docker and every container go with it."""
        node = self._nodes.get(node_id)
        if node.id in self.agents_down:
            raise NomadError(409, f"the agent of node {node.name} is already down")
        if node.status == "down":
            raise NomadError(409, f"node {node.name} is down")
        self.agents_down.add(node.id)
        self._client.agent_down(node.id)
        self._driver.hold(node.id)
        if reboot:
            self._driver.kill_node(node.id)
        if self.listeners is not None:
            self.listeners.close(node.name)
        for remote in [r for r in self._remote if r.node_id == node.id]:
            remote.cut.set()
        timers = self._time.timers
        ttl_s = self._config.heartbeat_ttl_ms / 1000
        if down_s > ttl_s:
            timers.call_later(ttl_s, lambda: self._missed_heartbeats(node.id))
        self._returns[node.id] = timers.call_later(
            down_s, lambda: self._spawn(self._agent_back(node.id, reboot))
        )
        return node

    def _missed_heartbeats(self, node_id: str) -> None:
        if node_id not in self.agents_down:
            return
        # A leader elected meanwhile gave every node the failover TTL.
        grace_until = self._last_election_at + self._config.failover_heartbeat_ttl_ms / 1000
        now = self._monotonic()
        if grace_until > now:
            self._time.timers.call_later(
                grace_until - now, lambda: self._missed_heartbeats(node_id)
            )
            return
        self._nodes.set_status(node_id, "down")

    async def _agent_back(self, node_id: str, reboot: bool) -> None:
        self._returns.pop(node_id, None)
        node = self._store.nodes.get(node_id)
        if node is None:
            return
        if self.listeners is not None:
            await self.listeners.open(node.name)
        self.agents_down.discard(node_id)
        self._nodes.reregister(node_id)
        self._driver.release(node_id)
        self._client.agent_up(node_id)
        if reboot:
            # The restored client finds its containers exited: each task is
            # Terminated and restarted as its policy says (a fresh container).
            self._tasks_exit(node_id)

    def track_exec(self, node_id: str | None, agent: Agent, hop: Hop) -> ExecCut | None:
        """An exec of an allocation on `node_id` arriving at `agent`: raises
        `No path to node` while the node's agent is down. The caller ends the
        exec when the returned cut is set and `forget`s it."""
        if node_id is None:
            return None
        if node_id in self.agents_down:
            raise NomadError(404, NO_PATH)
        servers = set()
        if hop.stream_to is not None:
            servers.add(hop.stream_to)
        node = self._store.nodes.get(node_id)
        if node is not None and node.name != agent.name:
            # A server reaches the node over the connection the node's agent
            # keeps to its own server.
            held_by = self._frontends.server_of(node.name)
            if held_by is not None:
                servers.add(held_by)
        remote = ExecCut(node_id, frozenset(servers))
        self._remote.add(remote)
        return remote

    def forget(self, remote: ExecCut | None) -> None:
        if remote is not None:
            self._remote.discard(remote)

    # -- servers ----------------------------------------------------------------------

    def track_stream(self, sub: Subscriber, server: str | None) -> None:
        """An event stream a client agent bridges to `server`."""
        if server is not None:
            self._streams[sub] = server

    def forget_stream(self, sub: Subscriber) -> None:
        self._streams.pop(sub, None)

    def server(self, name: str, down_s: float, election_s: float | None = None) -> None:
        """Restart the server `name`, down for `down_s` seconds. Losing the
        leader opens an election of `election_s` (SimConfig.election_ms)."""
        frontends = self._frontends
        if name not in frontends.servers:
            raise NomadError(404, f"no server {name!r}; servers: {', '.join(frontends.servers)}")
        if name in frontends.servers_down:
            raise NomadError(409, f"server {name} is already down")
        self._servers_down([name], election_s)
        self._returns[name] = self._time.timers.call_later(
            down_s, lambda: self._spawn(self._servers_back([name], election_s))
        )

    def all_servers(self, down_s: float, election_s: float | None = None) -> None:
        """Restart every server at once (a cluster-wide reboot, #408)."""
        frontends = self._frontends
        if frontends.servers_down:
            down = ", ".join(sorted(frontends.servers_down))
            raise NomadError(409, f"servers down already: {down}")
        names = list(frontends.servers)
        self._servers_down(names, election_s)
        self._returns["servers"] = self._time.timers.call_later(
            down_s, lambda: self._spawn(self._servers_back(names, election_s))
        )

    def _servers_down(self, names: list[str], election_s: float | None) -> None:
        frontends = self._frontends
        frontends.servers_down.update(names)
        for name in names:
            if self.listeners is not None:
                self.listeners.close(name)
        for sub, server in list(self._streams.items()):
            if server in names:
                # The agent's streaming RPC read EOF: its HTTP stream ends.
                sub.queue.put_nowait(None)
                del self._streams[sub]
        for remote in [r for r in self._remote if r.servers & set(names)]:
            remote.cut.set()
        for agent in frontends.agents:
            if frontends.server_of(agent.name) in names:
                self._stranded.add(agent.name)
        if frontends.leader in names:
            self._old_leader = frontends.leader
            self._noticed_at = self._monotonic() + self._config.leader_notice_ms / 1000
            frontends.lead(None)
            self._elected = asyncio.Event()
            self._client.servers_away(True)
            self._elect_later(election_s)

    async def _servers_back(self, names: list[str], election_s: float | None) -> None:
        frontends = self._frontends
        for name in names:
            self._returns.pop(name, None)
            if self.listeners is not None:
                await self.listeners.open(name)
            frontends.servers_down.discard(name)
        self._returns.pop("servers", None)
        if frontends.leader is None and self._election is None:
            self._elect_later(election_s)

    def _quorum(self) -> bool:
        frontends = self._frontends
        up = len(frontends.servers) - len(frontends.servers_down)
        return up > len(frontends.servers) // 2

    def _elect_later(self, election_s: float | None) -> None:
        """An election that ends `election_s` from now, if a quorum is up
        (else it starts once one is back)."""
        if not self._quorum():
            return
        delay = self._config.election_ms / 1000 if election_s is None else election_s
        self._election = self._time.timers.call_later(delay, self._elect)

    def _elect(self) -> None:
        self._election = None
        frontends = self._frontends
        candidates = [s for s in frontends.servers if s not in frontends.servers_down]
        if not self._quorum() or not candidates:
            return
        frontends.lead(self._rng.choice(candidates))
        self._old_leader = None
        self._last_election_at = self._monotonic()
        self._elected.set()
        # Status updates the clients kept meanwhile arrive now, in a burst.
        self._client.servers_away(False)

    async def leader_for(self, agent: Agent, hop: Hop, needs_leader: bool) -> None:
        """What a server RPC meets on its way (http.py calls this before the
        handler): a client agent whose server went away fails once with the
        dial error and moves to another server; a request that needs the
        leader while none leads fails with the dial error while the followers
        still believe in the dead one, then is held until one is elected or
        `rpc_hold_ms` has passed (`No cluster leader`)."""
        frontends = self._frontends
        if agent.name in self._stranded:
            # The agent's own pool failed to dial: wrapped once.
            self._stranded.discard(agent.name)
            gone = agent.server or ""
            others = [s for s in frontends.servers if s not in frontends.servers_down]
            if others:
                frontends.move(agent.name, self._rng.choice(others))
            raise NomadError(500, _dial_error(frontends, gone), origin=Origin.PLAIN, hops=1)
        if not needs_leader or frontends.leader is not None:
            return
        if self._old_leader is not None and self._monotonic() < self._noticed_at:
            # The follower's pool failed to dial the dead leader.
            raise NomadError(500, _dial_error(frontends, self._old_leader), origin=Origin.PLAIN)
        hold_s = self._config.rpc_hold_ms / 1000
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._elected.wait(), hold_s)
        if frontends.leader is None:
            # The follower's own answer: wrapped only by the hops before it.
            raise NomadError(500, NO_LEADER, origin=Origin.PLAIN, hops=hop.pool_hops - 1)

    def servers_view(self) -> dict[str, object]:
        """What /_sim/servers answers."""
        frontends = self._frontends
        return {
            "Leader": frontends.leader,
            "Servers": {
                name: {
                    "Status": "down" if name in frontends.servers_down else "up",
                    "Address": frontends.addresses.get(name),
                }
                for name in frontends.servers
            },
        }

    # -- Docker -----------------------------------------------------------------------

    def docker(self, node_id: str) -> list[str]:
        """Restart the node's Docker daemon: the ids of the allocations whose
        task it killed (exit 137)."""
        node = self._nodes.get(node_id)
        if node.id in self.agents_down:
            raise NomadError(409, f"the agent of node {node.name} is down")
        return self._tasks_exit(node.id)

    def _tasks_exit(self, node_id: str) -> list[str]:
        """Every running task of the node exits 137 (its container is gone)
        and its client applies the restart policy: the allocations hit."""
        killed = []
        for alloc in self._store.node_allocs(node_id):
            running = alloc.client_status == RUNNING and alloc.desired_status == "run"
            if running and self._client.task_exit(alloc.id, 137, oom=False):
                killed.append(alloc.id)
        return killed

    # -- lifecycle --------------------------------------------------------------------

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def stop(self) -> None:
        for handle in self._returns.values():
            handle.cancel()
        self._returns.clear()
        if self._election is not None:
            self._election.cancel()
        self._elected.set()
        for task in self._background:
            task.cancel()


def _dial_error(frontends: Frontends, server: str) -> str:
    """Nomad's connection pool failing to reach `server` (helper/pool)."""
    ip = frontends.by_name[server].ip if server in frontends.by_name else "127.0.0.1"
    return f"failed to get conn: dial tcp {ip}:{RPC_PORT}: connect: connection refused"


async def until_cut(remote: ExecCut | None, work: Callable[[], Awaitable[None]]) -> bool:
    """Run `work` until it ends or `remote` is cut: True when it was cut."""
    if remote is None:
        await work()
        return False
    running = asyncio.ensure_future(work())
    cut = asyncio.ensure_future(remote.cut.wait())
    try:
        await asyncio.wait({running, cut}, return_when=asyncio.FIRST_COMPLETED)
        return not running.done()
    finally:
        for task in (running, cut):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
