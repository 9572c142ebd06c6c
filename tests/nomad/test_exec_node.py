"""Exec on the allocation's own node first (as Nomad's Go API client does),
against the simulator's production topology: a client agent as NOMAD_ADDR,
one agent per node, the servers' RPC connection limit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
import requests

from controller.model import Allocation
from controller.nomad.client import NomadClient
from controller.nomad.exec import ExecClient, Exited, Output
from controller.nomad.gateway import NomadUnavailable
from controller.nomad.nodes import NodeDirectory
from nomadsim import SimServer
from tests.helpers import runner_job, wait_until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Requests:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def __call__(self, operation: str, outcome: str, status: str, seconds: float) -> None:
        self.seen.append((operation, outcome, status))

    def count(self, operation: str) -> int:
        return sum(1 for op, _, _ in self.seen if op == operation)


def running_elsewhere(sim: SimServer, gateway: NomadClient, runners: int) -> list[Allocation]:
    """`runners` running allocations, placed by the simulator, on nodes
    other than the entry agent's."""
    for i in range(runners):
        gateway.register_job(runner_job(f"1-{i}"))
    entry_node = next(
        node for node, address in sim.agent_addresses.items() if address == sim.address
    )

    def running() -> list[Allocation] | None:
        allocs = [a for a in gateway.list_allocations().allocations if a.client_status == "running"]
        return allocs if len(allocs) == runners else None

    placed = wait_until(running, timeout=10)
    assert placed is not None
    return [a for a in placed if a.node_name != entry_node]


async def run(client: ExecClient, alloc: Allocation, script: str) -> tuple[int, bytes]:
    out = b""
    async with client.session(alloc.id, "default-task", ["/bin/sh", "-c", script]) as session:
        async for event in session.events():
            if isinstance(event, Output):
                out += event.data
            if isinstance(event, Exited):
                return event.code, out
    raise AssertionError("no exit")


async def test_execs_go_to_the_node_and_leave_the_servers_rpc_limit_alone(
    make_sim: Callable[..., SimServer],
) -> None:
    # A server takes 26 connections from the entry agent (Nomad's smallest
    # limit): forwarded, fewer than 26 execs on other nodes could run at once.
    sim = make_sim(servers=3, entry="client", rpc_max_conns_per_client=26)
    gateway = NomadClient(address=sim.address, retry_max_wait_s=0.05)
    allocs = running_elsewhere(sim, gateway, runners=18)
    assert len(allocs) >= 10
    seen = Requests()
    client = ExecClient(
        address=sim.address, nodes=NodeDirectory(gateway), on_request=seen, retry_max_wait_s=0.05
    )
    executions = [run(client, a, "sleep 1; echo done") for a in allocs for _ in range(3)]
    results = await asyncio.gather(*executions, return_exceptions=True)
    assert results == [(0, b"done\n")] * len(executions)
    assert seen.count("exec_node") == len(executions)
    assert seen.count("exec") == seen.count("exec_fallback") == 0


async def test_an_unreachable_node_agent_falls_back_once_logged(
    make_sim: Callable[..., SimServer], caplog: pytest.LogCaptureFixture
) -> None:
    sim = make_sim(servers=3, entry="client")
    gateway = NomadClient(address=sim.address, retry_max_wait_s=0.05)
    (alloc, *_) = running_elsewhere(sim, gateway, runners=3)

    class Unreachable:
        """Nomad's reads, with every node published at a closed port."""

        def allocation_node(self, alloc_id: str) -> str | None:
            return gateway.allocation_node(alloc_id)

        def node_http_address(self, node_id: str) -> str | None:
            return "127.0.0.1:9"

    seen = Requests()
    client = ExecClient(address=sim.address, nodes=NodeDirectory(Unreachable()), on_request=seen)
    with caplog.at_level(logging.WARNING, logger="controller.nomad.exec"):
        for _ in range(3):
            assert await run(client, alloc, "echo here") == (0, b"here\n")
    # Tried once: the next execs skip the unreachable node for a while.
    assert seen.count("exec_fallback") == 1
    assert seen.count("exec") == 3 and seen.count("exec_node") == 1
    warnings = [r for r in caplog.records if "cannot connect to the Nomad agent" in r.message]
    assert len(warnings) == 1
    assert "127.0.0.1:9" in warnings[0].message


async def test_the_node_read_fails_the_configured_address_serves(
    make_sim: Callable[..., SimServer],
) -> None:
    sim = make_sim(servers=3, entry="client")
    gateway = NomadClient(address=sim.address, retry_max_wait_s=0.05)
    (alloc, *_) = running_elsewhere(sim, gateway, runners=3)
    dead = NomadClient(address="http://127.0.0.1:9", retry_attempts=1)
    seen = Requests()
    client = ExecClient(address=sim.address, nodes=NodeDirectory(dead), on_request=seen)
    assert await run(client, alloc, "echo here") == (0, b"here\n")
    assert seen.count("exec") == 1 and seen.count("exec_node") == 0


async def test_a_restarting_node_agent_is_waited_for_rather_than_fallen_back_from(
    make_sim: Callable[..., SimServer],
) -> None:
    """The node's agent, which took an exec before, refuses connections for
    1 s (it restarts): the next exec waits for it and runs there, where the
    configured address could only answer `No path to node` meanwhile."""
    sim = make_sim(servers=3, entry="client")
    gateway = NomadClient(address=sim.address, retry_max_wait_s=0.05)
    (alloc, *_) = running_elsewhere(sim, gateway, runners=3)
    seen = Requests()
    client = ExecClient(address=sim.address, nodes=NodeDirectory(gateway), on_request=seen)
    assert await run(client, alloc, "echo before") == (0, b"before\n")
    leader = sim.server_addresses["server-1"]
    restart = f"{leader}/_sim/node/{alloc.node_id}/agent-restart?down=1"
    answer = await asyncio.to_thread(requests.post, restart, timeout=5)
    assert answer.ok
    started = asyncio.get_running_loop().time()
    assert await run(client, alloc, "echo after") == (0, b"after\n")
    assert asyncio.get_running_loop().time() - started > 0.5
    assert seen.count("exec_fallback") == 0 and seen.count("exec") == 0


async def test_the_node_observed_serves_when_the_allocation_cannot_be_read(
    make_sim: Callable[..., SimServer],
) -> None:
    """The configured agent restarts: the allocation's node cannot be read
    from it, but the controller observed it, and the node's agent is up."""
    sim = make_sim(servers=3, entry="client")
    gateway = NomadClient(address=sim.address, retry_max_wait_s=0.05)
    (alloc, *_) = running_elsewhere(sim, gateway, runners=3)

    class EntryDown:
        def allocation_node(self, alloc_id: str) -> str | None:
            raise NomadUnavailable("get_allocation: connection refused")

        def node_http_address(self, node_id: str) -> str | None:
            return gateway.node_http_address(node_id)  # cached before, in production

    seen = Requests()
    observed = {alloc.id: alloc.node_id}
    client = ExecClient(
        address=sim.address, nodes=NodeDirectory(EntryDown(), observed.get), on_request=seen
    )
    assert await run(client, alloc, "echo here") == (0, b"here\n")
    assert seen.count("exec_node") == 1 and seen.count("exec") == 0
    unknown = ExecClient(address=sim.address, nodes=NodeDirectory(EntryDown()), on_request=seen)
    assert await run(unknown, alloc, "echo there") == (0, b"there\n")
    assert seen.count("exec") == 1  # nothing observed: the configured address
