"""controller.nomad.budget (the split and the admission, table-tested; the
per-agent slots) and the exec client under Nomad's connection limit: a 429
or a cut handshake is retried, then a typed error — never a bare exception."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from controller.model import Allocation
from controller.nomad.budget import (
    Admission,
    AgentSlots,
    AgentState,
    BudgetSettings,
    Shares,
    admit,
    shares,
)
from controller.nomad.client import NomadClient
from controller.nomad.errors import ConnectionsExhausted, ExecOverloaded, ExecUnreachable
from controller.nomad.exec import ExecClient
from nomadsim import SimServer
from tests.helpers import Http, runner_job, wait_until
from tests.nomad.test_exec_node import Requests, run
from tests.support.refusing_agent import RefusingAgent

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("total", "expected"),
    [
        (80, Shares(30, claim_pool=10, event_stream=1, exec_configured=39, exec_node=80)),
        (100, Shares(38, claim_pool=12, event_stream=1, exec_configured=49, exec_node=100)),
        (200, Shares(48, claim_pool=16, event_stream=1, exec_configured=135, exec_node=200)),
        (7, Shares(3, claim_pool=0, event_stream=1, exec_configured=3, exec_node=7)),
        (3, Shares(1, claim_pool=0, event_stream=1, exec_configured=1, exec_node=3)),
    ],
)
def test_shares(total: int, expected: Shares) -> None:
    assert shares(BudgetSettings(max_conns_per_agent=total)) == expected
    split = shares(BudgetSettings(max_conns_per_agent=total))
    pools = split.http_pool + split.claim_pool
    assert pools + split.event_stream + split.exec_configured <= max(3, total)


@pytest.mark.parametrize(
    ("in_flight", "waiting", "slots", "queue", "expected"),
    [
        (0, 0, 2, 4, Admission.GO),
        (1, 0, 2, 4, Admission.GO),
        (2, 0, 2, 4, Admission.WAIT),
        (1, 1, 2, 4, Admission.WAIT),  # somebody waits: no overtaking
        (2, 3, 2, 4, Admission.WAIT),
        (2, 4, 2, 4, Admission.REFUSE),
        (2, 0, 2, 0, Admission.REFUSE),  # no queue at all
    ],
)
def test_admit(in_flight: int, waiting: int, slots: int, queue: int, expected: Admission) -> None:
    assert admit(AgentState(in_flight, waiting), slots, queue) is expected


async def test_slots_queue_in_order_and_refuse_beyond_the_queue() -> None:
    budget = AgentSlots(BudgetSettings(max_conns_per_agent=3, queue=2), "http://nomad:4646")
    assert budget.slots("http://nomad:4646") == 1 and budget.slots("http://node:4646") == 3
    order: list[str] = []
    release = asyncio.Event()

    async def hold(name: str) -> None:
        async with budget.slot("http://nomad:4646"):
            order.append(name)
            await release.wait()

    first = asyncio.ensure_future(hold("a"))
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(hold(n)) for n in ("b", "c")]
    await asyncio.sleep(0)
    assert budget.state("http://nomad:4646") == AgentState(1, 2)
    with pytest.raises(ConnectionsExhausted, match="NRC_NOMAD_CONN_QUEUE"):
        async with budget.slot("http://nomad:4646"):
            pass
    # A waiter that leaves gives its place up; nothing leaks.
    waiting[0].cancel()
    release.set()
    await asyncio.gather(first, waiting[1], return_exceptions=True)
    assert order == ["a", "c"]
    assert budget.state("http://nomad:4646") == AgentState(0, 0)
    assert budget.refused == 1 and budget.peak["http://nomad:4646"] == 1


@pytest.fixture
def agent_in_front(make_sim: Callable[..., SimServer]) -> Iterator[Callable[..., RefusingAgent]]:
    agents: list[RefusingAgent] = []

    def start(sim: SimServer, **kwargs: object) -> RefusingAgent:
        agent = RefusingAgent(sim.address, **kwargs).start()  # type: ignore[arg-type]
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()


async def test_a_429_handshake_is_retried_then_succeeds(
    make_sim: Callable[..., SimServer], agent_in_front: Callable[..., RefusingAgent]
) -> None:
    sim = make_sim()
    alloc = one_running(sim)
    agent = agent_in_front(sim, refuse=2)
    seen = Requests()
    client = ExecClient(address=agent.address, on_request=seen, retry_max_wait_s=0.05)
    assert await run(client, alloc, "echo ok") == (0, b"ok\n")
    assert [s for op, _, s in seen.seen if op == "exec"] == ["429", "429", "101"]


@pytest.mark.parametrize("cut", [False, True], ids=["429", "cut"])
async def test_a_persistent_refusal_is_a_typed_error(
    make_sim: Callable[..., SimServer], agent_in_front: Callable[..., RefusingAgent], cut: bool
) -> None:
    sim = make_sim()
    alloc = one_running(sim)
    agent = agent_in_front(sim, refuse=None, cut=cut)
    client = ExecClient(address=agent.address, retry_attempts=3, retry_max_wait_s=0.05)
    with pytest.raises(ExecUnreachable if cut else ExecOverloaded) as raised:
        await run(client, alloc, "echo ok")
    assert agent.refused == 3
    if not cut:
        assert "too many concurrent connections" in raised.value.reason


def one_running(sim: SimServer) -> Allocation:
    gateway = NomadClient(address=sim.address)
    gateway.register_job(runner_job("1-a"))

    def running() -> Allocation | None:
        allocs = gateway.list_allocations().allocations
        return next((a for a in allocs if a.client_status == "running"), None)

    alloc = wait_until(running)
    assert alloc is not None
    return alloc


def test_the_http_pool_never_exceeds_its_share(make_sim: Callable[..., SimServer]) -> None:
    sim = make_sim()
    client = NomadClient(address=sim.address, connections=3)
    index = client.list_jobs().index
    threads = [
        threading.Thread(target=lambda: client.list_jobs(index=index, wait_s=0.3))
        for _ in range(12)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    entry = Http(sim.address).request("GET", "/_sim/connections").json()
    (agent,) = (a for a in entry["HTTP"].values() if a["Address"] == sim.address)
    # Twelve blocking queries at once went over three connections (the
    # fourth below is this very request, opened after they ended).
    assert agent["Peak"] <= 3 + 1, agent
    assert agent["Refused"] == 0
