"""15. What one register costs the controller, by HTTP client (issue 22).

A claim is one register with EnforceIndex. This measures the CPU the
calling process spends per register — what the controller pays for each
claim's write, apart from everything else a claim does — through three
clients, in the same process on one event loop (uvloop, as the API runs),
against the simulator in a process of its own:

- `requests on a thread`: `NomadClient.register_job` (python-nomad, requests,
  tenacity) run by `asyncio.to_thread`, as a synchronous route runs;
- `httpx`: httpx's asynchronous client on the event loop;
- `aiohttp`: `controller.nomad.aclient.AsyncJobWriter`, what claims use.

20 tasks at once, each re-registering a job of its own with the index the
previous write answered (never a conflict), rounds alternating between the
clients so that all see the same machine. CPU is `time.process_time()` of
this process; wall time is reported beside it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import uvloop

from bench.common import Result, start_sim
from controller.nomad.aclient import AsyncJobWriter
from controller.nomad.client import NomadClient, register_body
from controller.nomad.connection import NomadConnection
from tests.helpers import runner_job
from tests.support.processes import child_processes

TASKS = 20
CONNECTIONS = 10
Register = Callable[[dict[str, Any], int], Awaitable[int]]


def _job(i: int, n: int) -> dict[str, Any]:
    job = runner_job(f"15-{i:08d}-0000-4000-8000-000000000000")
    job["Meta"] = {"n": str(n)}
    return job


async def _round(register: Register, indexes: list[int], per_task: int) -> tuple[float, float]:
    async def task(i: int) -> None:
        for n in range(per_task):
            indexes[i] = await register(_job(i, n), indexes[i])

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(TASKS)))
    return time.process_time() - cpu, time.perf_counter() - wall


async def _measure(address: str, per_task: int, rounds: int) -> dict[str, dict[str, Any]]:
    sync = NomadClient(address=address, connections=CONNECTIONS)
    indexes = [sync.register_job(_job(i, -1)).job_modify_index for i in range(TASKS)]
    writer = AsyncJobWriter(NomadConnection(address=address), connections=CONNECTIONS)
    limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    plain = httpx.AsyncClient(base_url=address, limits=limits, trust_env=False)

    async def on_a_thread(job: dict[str, Any], index: int) -> int:
        return (await asyncio.to_thread(sync.register_job, job, index)).job_modify_index

    async def with_httpx(job: dict[str, Any], index: int) -> int:
        body = json.dumps(register_body(job, "default", index))
        answer = await plain.put(
            "/v1/jobs",
            params={"namespace": "default"},
            content=body,
            headers={"Content-Type": "application/json"},
        )
        answer.raise_for_status()
        return int(answer.json()["JobModifyIndex"])

    async def with_aiohttp(job: dict[str, Any], index: int) -> int:
        return (await writer.register_job(job, index)).job_modify_index

    clients: dict[str, Register] = {
        "requests on a thread": on_a_thread,
        "httpx": with_httpx,
        "aiohttp": with_aiohttp,
    }
    spent: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
    try:
        for register in clients.values():  # warm-up: connections, imports
            await _round(register, indexes, 2)
        for _ in range(rounds):
            for name, register in clients.items():
                spent[name].append(await _round(register, indexes, per_task))
    finally:
        await writer.aclose()
        await plain.aclose()
        sync.close()
    registers = TASKS * per_task
    return {
        name: {
            "cpu_ms_per_register": [round(cpu * 1000 / registers, 4) for cpu, _ in runs],
            "wall_ms_per_register": [round(wall * 1000 / registers, 4) for _, wall in runs],
            "cpu_ms_median": round(
                sorted(cpu for cpu, _ in runs)[len(runs) // 2] * 1000 / registers, 4
            ),
        }
        for name, runs in spent.items()
    }


def run(quick: bool = False) -> Result:
    result = Result("clients", "CPU per register by HTTP client (a claim's write)")
    per_task, rounds = (10, 3) if quick else (25, 5)
    with child_processes() as procs:
        _, sim = start_sim(procs, nodes=3)
        measured = uvloop.run(_measure(sim.address, per_task, rounds))
    result.details = {
        "tasks": TASKS,
        "connections": CONNECTIONS,
        "registers_per_round": TASKS * per_task,
        "rounds": rounds,
        "clients": measured,
    }
    thread = measured["requests on a thread"]["cpu_ms_median"]
    for name, figures in measured.items():
        result.add(
            f"CPU per register: {name}",
            figures["cpu_ms_median"],
            "ms",
            note=f"{figures['cpu_ms_median'] / thread:.2f}× requests on a thread; median of "
            f"{rounds} rounds of {TASKS * per_task}",
        )
    return result
