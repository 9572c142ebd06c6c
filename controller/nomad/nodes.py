"""`NodeDirectory`: the HTTP address of the client agent an allocation runs on.

An exec is served by the agent of the allocation's node; sent anywhere else,
it is forwarded there, through a server, over one more streaming RPC
connection for as long as it runs (capped per agent by Nomad's
`rpc_max_conns_per_client`). Nomad's Go API client therefore opens an exec
on the node's own HTTP address first (`Node.HTTPAddr`) and falls back to the
configured address (api/allocations_exec.go); so do we.

Both reads are cached: an allocation never changes node, and a node's
address changes only when its agent is reconfigured (a stale address fails
to connect, which falls back and forgets it). A failed read answers None:
the caller uses the configured address. When the read of an allocation's
node fails (the configured agent restarting, say), the node the controller
has already observed for it (`observed`) is used instead: the node's own
agent may well be up.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from controller.nomad.errors import NomadError

log = logging.getLogger(__name__)

# Allocations remembered; a warm pool plus its recent claims fit many times.
MAX_ALLOCATIONS = 8192


class NodeReads(Protocol):
    def allocation_node(self, alloc_id: str) -> str | None: ...

    def node_http_address(self, node_id: str) -> str | None: ...


class NodeDirectory:
    """Allocation → node → HTTPAddr, cached (see the module docstring)."""

    def __init__(
        self, reads: NodeReads, observed: Callable[[str], str | None] | None = None
    ) -> None:
        self._reads = reads
        self._observed = observed
        self._alloc_nodes: OrderedDict[str, str] = OrderedDict()
        self._addresses: dict[str, str] = {}

    async def address_of(self, alloc_id: str) -> str | None:
        """host:port of the agent running the allocation, or None when it
        cannot be told (then the configured address serves the exec)."""
        try:
            node = self._alloc_nodes.get(alloc_id)
            if node is None:
                node = await asyncio.to_thread(self._allocation_node, alloc_id)
                if node is None:
                    return None
                self._alloc_nodes[alloc_id] = node
                while len(self._alloc_nodes) > MAX_ALLOCATIONS:
                    self._alloc_nodes.popitem(last=False)
            address = self._addresses.get(node)
            if address is None:
                address = await asyncio.to_thread(self._reads.node_http_address, node)
                if address is None:
                    return None
                self._addresses[node] = address
            return address
        except NomadError as exc:
            log.info("could not read the node of allocation %s: %s", alloc_id, exc)
            return None

    def _allocation_node(self, alloc_id: str) -> str | None:
        try:
            return self._reads.allocation_node(alloc_id)
        except NomadError:
            known = self._observed(alloc_id) if self._observed is not None else None
            if known is None:
                raise
            return known

    def forget(self, address: str) -> None:
        """Read the address of the node(s) at `address` again next time."""
        for node in [n for n, a in self._addresses.items() if a == address]:
            del self._addresses[node]
