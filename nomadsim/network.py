"""The seam between the simulator's restarts and the sockets its agents
listen on.

A restart is decided against the simulated state (which agent, for how
long, what happens to its allocations) but felt on the network: the agent's
listener refuses connections (a process that exited) or leaves them
unanswered (a host that is gone), and the connections that arrived on it end.
The parts that decide restarts depend on this narrow protocol only; the
server (server.py) implements it over its listening sockets. Without a
server (an in-process test client) nothing listens, so `Unplugged` only
remembers which agents are down."""

from __future__ import annotations

from typing import Protocol


class AgentNetwork(Protocol):
    def stop(self, agent: str, *, hang: bool = False) -> None:
        """Take the agent's listener down and end the connections that
        arrived on it: refused and reset, or with `hang` (a host that is
        gone) unanswered until `start`."""

    def start(self, agent: str) -> None:
        """Listen for the agent again, on the same address."""

    def is_up(self, agent: str) -> bool:
        """Whether the agent's listener is accepting connections."""


class Unplugged:
    """An `AgentNetwork` with no sockets: only the agents' up/down state."""

    def __init__(self) -> None:
        self._down: set[str] = set()

    def stop(self, agent: str, *, hang: bool = False) -> None:
        self._down.add(agent)

    def start(self, agent: str) -> None:
        self._down.discard(agent)

    def is_up(self, agent: str) -> bool:
        return agent not in self._down
