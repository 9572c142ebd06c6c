"""The agents' HTTP front-ends over the one simulated state: which agent
listens where, what each request's hop is, and the connection limits they
share (topology.py decides, connlimit.py counts).

The listeners themselves are sockets the server binds (server.py); a
request finds its agent by the local port it arrived on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from nomadsim.config import SimConfig
from nomadsim.connlimit import HttpLimits, RpcLimits
from nomadsim.records import JsonDict
from nomadsim.topology import Agent, Hop, Kind, Role, cluster, hop


class Frontends:
    def __init__(self, config: SimConfig) -> None:
        self.agents = cluster(config.servers, config.nodes)
        self.by_name = {agent.name: agent for agent in self.agents}
        self.entry = self._entry(config.entry)
        self.http = HttpLimits(config.http_max_conns_per_client)
        held: dict[str, list[str]] = {a.name: [] for a in self.agents if a.role is not Role.CLIENT}
        for agent in self.agents:
            if agent.server is not None:
                held[agent.server].append(agent.ip)
        self.rpc = RpcLimits(config.rpc_max_conns_per_client, held)
        self.addresses: dict[str, str] = {}
        self._by_port: dict[int, Agent] = {}
        self.forwarded: dict[str, int] = {}
        # Who leads now (None: an election is on), which servers are down,
        # and the server each client agent sends its RPCs to (restarts.py
        # moves them); `_now` holds every agent with its current role and server.
        self.leader: str | None = self.agents[0].name
        self.servers_down: set[str] = set()
        self._server_of = {a.name: a.server for a in self.agents if a.server is not None}
        self._now: dict[str, Agent] = {}
        self._refresh()

    @property
    def servers(self) -> list[str]:
        return [a.name for a in self.agents if a.role is not Role.CLIENT]

    def server_of(self, agent: str) -> str | None:
        """The server a client agent sends its RPCs to now."""
        return self._server_of.get(agent)

    def lead(self, leader: str | None) -> None:
        """`leader` leads from now on (None: no server leads)."""
        self.leader = leader
        self._refresh()

    def move(self, agent: str, server: str) -> None:
        """The client agent sends its RPCs to `server` from now on."""
        self._server_of[agent] = server
        self._refresh()

    def _refresh(self) -> None:
        now = {}
        for agent in self.agents:
            if agent.role is Role.CLIENT:
                now[agent.name] = replace(agent, server=self._server_of[agent.name])
            else:
                role = Role.LEADER if agent.name == self.leader else Role.FOLLOWER
                now[agent.name] = replace(agent, role=role)
        self._now = now

    def _entry(self, role: str) -> Agent:
        wanted = Role(role)
        for agent in self.agents:
            if agent.role is wanted:
                return agent
        raise ValueError(f"no {role} to enter by: a follower needs at least two servers")

    def bind(self, name: str, address: str, port: int) -> None:
        """The agent `name` listens on `address` (http://host:port)."""
        self.addresses[name] = address
        self._by_port[port] = self.by_name[name]

    def agent_of(self, scope: Mapping[str, Any]) -> Agent:
        """The agent whose listener the request arrived on, with its role
        and server now (the leader for a request that came another way, e.g.
        an in-process test client)."""
        server = scope.get("server")
        if server is not None:
            agent = self._by_port.get(int(server[1]))
            if agent is not None:
                return self._now[agent.name]
        return self._now[self.leader or self.agents[0].name]

    def hop(
        self, agent: Agent, kind: Kind, stale: bool = False, alloc_node: str | None = None
    ) -> Hop:
        server_role = self._now[agent.server].role if agent.server else None
        result = hop(agent, kind, stale, server_role, alloc_node)
        if result.pool_hops:
            self.forwarded[agent.name] = self.forwarded.get(agent.name, 0) + 1
        return result

    def node_http_addr(self, node: str) -> str | None:
        """The node's HTTPAddr (host:port of its client agent), once bound."""
        address = self.addresses.get(node)
        return address.removeprefix("http://") if address else None

    def node_ip(self, node: str) -> str:
        agent = self.by_name.get(node)
        return agent.ip if agent is not None else "127.0.0.1"

    def connections(self) -> JsonDict:
        """What /_sim/connections answers: limits, and per listener and per
        server the connections now, at peak and refused."""
        http: JsonDict = {}
        for port, agent in sorted(self._by_port.items(), key=lambda item: item[1].name):
            http[agent.name] = {
                "Role": agent.role.value,
                "Address": self.addresses[agent.name],
                **self.http.gauge(port).as_dict(),
            }
        return {
            "Limits": {
                "HTTPMaxConnsPerClient": self.http.limit,
                "RPCMaxConnsPerClient": self.rpc.limit,
                "RPCMaxStreamsPerClient": self.rpc.stream_limit,
            },
            "Entry": self.entry.name,
            "HTTP": http,
            "RPC": self.rpc.as_dict(),
            "Forwarded": dict(sorted(self.forwarded.items())),
        }
