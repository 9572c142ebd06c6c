"""Host ports of allocations: Nomad's NetworkIndex reduced to what placements
see. A group's reserved ports are taken as written; each dynamic port gets the
lowest free port of its node from 20000 up (its `To` -1 meaning the same port
inside). A port is free again once its allocation is client-terminal or
purged; the allocation keeps showing the ports it had."""

from __future__ import annotations

from nomadsim.records import Alloc, JsonDict, Node

DYNAMIC_PORTS = range(20000, 32001)


class Ports:
    def __init__(self) -> None:
        self._by_alloc: dict[str, list[JsonDict]] = {}
        self._used_by_node: dict[str, set[int]] = {}

    def fits(self, node: Node, group: JsonDict) -> bool:
        """Whether the node has a free dynamic port for each the group asks
        for (placements of the evaluation being planned hold theirs already)."""
        used = self._used_by_node.get(node.id, set())
        dynamic = 0
        for network in group.get("Networks") or []:
            dynamic += len(network.get("DynamicPorts") or [])
        # `used` holds the dynamic ports handed out (reserved ones are not
        # tracked: two allocations with one static port are the operator's to avoid).
        return dynamic <= len(DYNAMIC_PORTS) - len(used)

    def assign(self, alloc_id: str, node: Node, group: JsonDict) -> None:
        """Give the allocation placed on `node` the ports its group asks for."""
        used = self._used_by_node.setdefault(node.id, set())
        host_ip = node.address
        ports: list[JsonDict] = []
        for network in group.get("Networks") or []:
            for port in network.get("ReservedPorts") or []:
                ports.append(
                    {
                        "Label": port.get("Label", ""),
                        "Value": int(port.get("Value") or 0),
                        "To": int(port.get("To") or 0),
                        "HostIP": host_ip,
                    }
                )
            for port in network.get("DynamicPorts") or []:
                value = next(p for p in DYNAMIC_PORTS if p not in used)
                used.add(value)
                to = int(port.get("To") or 0)
                ports.append(
                    {
                        "Label": port.get("Label", ""),
                        "Value": value,
                        "To": value if to == -1 else to,
                        "HostIP": host_ip,
                    }
                )
        if ports:
            self._by_alloc[alloc_id] = ports

    def release(self, alloc: Alloc) -> None:
        """Free the allocation's ports on its node."""
        used = self._used_by_node.get(alloc.node_id, set())
        for port in self._by_alloc.get(alloc.id) or []:
            used.discard(port["Value"])

    def of(self, alloc_id: str) -> list[JsonDict]:
        """The allocation's ports (empty when its group asks for none)."""
        return self._by_alloc.get(alloc_id, [])
