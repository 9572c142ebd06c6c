"""Restarts of what a production cluster restarts: a node's client agent and
its Docker daemon (Nomad v1.6.2; docs/simulator.md, "Restarts", cites the
source for each rule).

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

The sockets belong to the server that serves the simulator: it plugs in its
`Listeners`. Without one (an in-process client), a restart does everything
but close and reopen a port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from nomadsim.client import Client
from nomadsim.clock import SimTime
from nomadsim.config import SimConfig
from nomadsim.driver import Driver
from nomadsim.errors import NomadError
from nomadsim.node_endpoint import NodeEndpoint
from nomadsim.records import RUNNING, Node
from nomadsim.state import StateStore

NO_PATH = "No path to node"


class Listeners(Protocol):
    """An agent's listening socket, as the serving process holds it."""

    def close(self, agent: str) -> None:
        """Stop accepting (connects are refused) and reset every connection."""

    async def open(self, agent: str) -> None:
        """Listen again on the same address."""


@dataclass(eq=False)
class ExecCut:
    """An exec of a node's allocation reached through another agent: the
    restart of the node's agent cuts it."""

    node_id: str
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
    ) -> None:
        self._store = store
        self._time = time
        self._config = config
        self._nodes = nodes
        self._client = client
        self._driver = driver
        self.listeners: Listeners | None = None
        # Node ids whose agent is down now.
        self.agents_down: set[str] = set()
        self._remote: set[ExecCut] = set()
        self._returns: dict[str, asyncio.TimerHandle] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- a client agent ---------------------------------------------------------------

    def agent(self, node_id: str, down_s: float) -> Node:
        """Restart the node's client agent, down for `down_s` seconds."""
        node = self._nodes.get(node_id)
        if node.id in self.agents_down:
            raise NomadError(409, f"the agent of node {node.name} is already down")
        if node.status == "down":
            raise NomadError(409, f"node {node.name} is down")
        self.agents_down.add(node.id)
        self._client.agent_down(node.id)
        self._driver.hold(node.id)
        if self.listeners is not None:
            self.listeners.close(node.name)
        for remote in [r for r in self._remote if r.node_id == node.id]:
            remote.cut.set()
        timers = self._time.timers
        ttl_s = self._config.heartbeat_ttl_ms / 1000
        if down_s > ttl_s:
            timers.call_later(ttl_s, lambda: self._missed_heartbeats(node.id))
        self._returns[node.id] = timers.call_later(
            down_s, lambda: self._spawn(self._agent_back(node.id))
        )
        return node

    def _missed_heartbeats(self, node_id: str) -> None:
        if node_id in self.agents_down:
            self._nodes.set_status(node_id, "down")

    async def _agent_back(self, node_id: str) -> None:
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

    def track_exec(self, node_id: str | None) -> ExecCut | None:
        """An exec of an allocation on `node_id` arriving at another agent:
        None when it can be served, else raises `No path to node`. The
        caller ends the exec when the returned cut is set and `forget`s it."""
        if node_id is None:
            return None
        if node_id in self.agents_down:
            raise NomadError(404, NO_PATH)
        remote = ExecCut(node_id)
        self._remote.add(remote)
        return remote

    def forget(self, remote: ExecCut | None) -> None:
        if remote is not None:
            self._remote.discard(remote)

    # -- Docker -----------------------------------------------------------------------

    def docker(self, node_id: str) -> list[str]:
        """Restart the node's Docker daemon: the ids of the allocations whose
        task it killed (exit 137)."""
        node = self._nodes.get(node_id)
        if node.id in self.agents_down:
            raise NomadError(409, f"the agent of node {node.name} is down")
        killed = []
        for alloc in self._store.node_allocs(node.id):
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
        for task in self._background:
            task.cancel()


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
