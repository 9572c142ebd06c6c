"""budget: how many connections the controller opens at once to one Nomad agent.

Nomad's agents answer `429 Too Many Requests` and close the connection once
a client IP holds `http_max_conns_per_client` connections (default 100).
go-connlimit counts a connection from accept until it is closed or upgraded:
a running exec WebSocket no longer counts, its handshake does, and so does
every kept-alive HTTP connection and the event stream. The controller's
connections to one agent are therefore, at any moment:

- the HTTP pool of the NomadClient (to NOMAD_ADDR only), kept alive, and
  the claims' own pool (`controller.nomad.aclient`, on the API's event loop),
  a quarter of it;
- the event stream (to NOMAD_ADDR only), one;
- exec handshakes in flight, to NOMAD_ADDR and to each node's agent.

`NRC_NOMAD_MAX_CONNS_PER_AGENT` (default 80: headroom under Nomad's 100 for
the operator's CLI and agents on the same address, and for connections
go-connlimit still counts while they close) bounds their sum per agent
address. `shares` splits it: the HTTP pools take half of it (at most the
pool size the client needs, 64; a quarter of that is the claims' own), the
event stream one, exec handshakes the
rest on NOMAD_ADDR and the whole budget on any other agent. An exec beyond
its share waits for a handshake to finish, in a queue of at most
`NRC_NOMAD_CONN_QUEUE` waiters per agent; beyond that it is refused at once
(`admit` says `refuse`), which the API answers as 503 `NOMAD_OVERLOAD` with
`Retry-After`, and an execution as an `error` frame.

Pure, in the shape of `prewarm.policy`: `shares` and `admit` are functions
of frozen values; `AgentSlots` is the asyncio shell that holds the counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum

from controller.nomad.errors import ConnectionsExhausted

# Nomad's default `http_max_conns_per_client`.
NOMAD_HTTP_LIMIT = 100
DEFAULT_MAX_CONNS_PER_AGENT = 80
DEFAULT_QUEUE = 256
# The HTTP pool the NomadClient wants when the budget allows it.
MAX_HTTP_POOL = 64
EVENT_STREAMS = 1
# The least budget that leaves each of the three a connection.
MIN_MAX_CONNS = 3


@dataclass(frozen=True)
class BudgetSettings:
    max_conns_per_agent: int = DEFAULT_MAX_CONNS_PER_AGENT
    queue: int = DEFAULT_QUEUE


@dataclass(frozen=True)
class Shares:
    """The budget of one agent address, split (see the module docstring)."""

    http_pool: int  # kept-alive HTTP connections to NOMAD_ADDR (the NomadClient's)
    claim_pool: int  # of those the claims' writer holds (0: claims use the other pool)
    event_stream: int  # to NOMAD_ADDR
    exec_configured: int  # exec handshakes at once to NOMAD_ADDR
    exec_node: int  # exec handshakes at once to any other agent


def shares(settings: BudgetSettings) -> Shares:
    total = max(MIN_MAX_CONNS, settings.max_conns_per_agent)
    http = max(1, min(MAX_HTTP_POOL, total // 2))
    claim_pool = http // 4
    http_pool = http - claim_pool
    exec_configured = max(1, total - http - EVENT_STREAMS)
    return Shares(
        http_pool=http_pool,
        claim_pool=claim_pool,
        event_stream=EVENT_STREAMS,
        exec_configured=exec_configured,
        exec_node=total,
    )


class Admission(StrEnum):
    GO = "go"  # a slot is free: connect now
    WAIT = "wait"  # queue for a slot
    REFUSE = "refuse"  # the queue is full: answer overloaded now


@dataclass(frozen=True)
class AgentState:
    in_flight: int = 0  # handshakes holding a slot
    waiting: int = 0  # callers queued for one


def admit(state: AgentState, slots: int, queue: int) -> Admission:
    """What a new exec handshake to an agent does. A slot goes to the queue
    first: a newcomer takes a free slot only when nobody waits for it."""
    if state.in_flight < slots and state.waiting == 0:
        return Admission.GO
    if state.waiting < queue:
        return Admission.WAIT
    return Admission.REFUSE


class AgentSlots:
    """The budget's counts per agent address, FIFO waiting (asyncio; one loop)."""

    def __init__(self, settings: BudgetSettings, configured_address: str) -> None:
        self.settings = settings
        self.shares = shares(settings)
        self._configured = configured_address.rstrip("/")
        self._in_flight: dict[str, int] = {}
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self.peak: dict[str, int] = {}  # the most handshakes in flight at once, per address
        self.refused = 0

    def slots(self, address: str) -> int:
        configured = address.rstrip("/") == self._configured
        return self.shares.exec_configured if configured else self.shares.exec_node

    def state(self, address: str) -> AgentState:
        return AgentState(self._in_flight.get(address, 0), len(self._waiters.get(address, ())))

    @contextlib.asynccontextmanager
    async def slot(self, address: str) -> AsyncIterator[None]:
        """Hold one of the agent's handshake slots for the block. Raises
        ConnectionsExhausted when the agent's queue is full."""
        decision = admit(self.state(address), self.slots(address), self.settings.queue)
        if decision is Admission.REFUSE:
            self.refused += 1
            raise ConnectionsExhausted(
                f"the controller already has {self.state(address).in_flight} connections "
                f"opening to the Nomad agent at {address} and {self.settings.queue} more "
                "waiting (NRC_NOMAD_MAX_CONNS_PER_AGENT, NRC_NOMAD_CONN_QUEUE); try again shortly",
                503,
            )
        if decision is Admission.WAIT:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            queue = self._waiters.setdefault(address, deque())
            queue.append(waiter)
            try:
                await waiter  # the slot is handed over already counted
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._release(address)  # handed a slot, but we leave: pass it on
                else:
                    with contextlib.suppress(ValueError):  # _release dropped it already
                        queue.remove(waiter)
                raise
        else:
            self._in_flight[address] = self._in_flight.get(address, 0) + 1
        self.peak[address] = max(self.peak.get(address, 0), self._in_flight[address])
        try:
            yield
        finally:
            self._release(address)

    def _release(self, address: str) -> None:
        queue = self._waiters.get(address)
        while queue:
            waiter = queue.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on, still counted
                return
        self._in_flight[address] -= 1
        if not self._in_flight[address]:
            del self._in_flight[address]
