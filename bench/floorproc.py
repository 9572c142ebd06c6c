"""The floor of a claim, for `ratios`: `POST /api/v1/runners` served by the
stack the controller serves it with (uvicorn with the controller's HTTP
protocol, FastAPI, the same body model and answer model) and answered after
the same Nomad write (the job with the claim in its meta, registered with
EnforceIndex through the controller's `AsyncJobWriter`), but with nothing of
the controller behind it: no snapshot, no event stream, no reconcile, no
refill. What this process costs per claim is what any design within the
mission (one Python process, FastAPI and uvicorn, Nomad written over HTTP)
pays before it does any work of its own.

Its jobs are runner-layout jobs whose ids start with `BENCH_FLOOR_PREFIX`,
registered by the benchmark before it starts; each is read once at start,
and every request takes a job nobody is writing, writes it and hands it back
with the index Nomad answered. `GET /readyz` answers 200 once they are read.

With `BENCH_FLOOR_IDLE_OF=E` it claims a controller's own runners instead:
the idle runners of environment E when it starts (their specs and running
allocations read once), each once, with the claim a controller writes (the
allocation and its restarts); when none is left it answers 503. The
controller beside it sees the claims as any replica's and refills its pool:
this is an API that observes nothing and is handed runners, with the upkeep
in a process of its own (`ratios`, "beside the upkeep").

On its own jobs it can also refill (`ratios`, "the floor and its refill"):
after `GET /_bench/refill?on=1`, each claim's answer is followed by the
registration of one new runner job (`REFILL_PREFIX`, not a runner id), the
least Nomad work a warm pool asks for per claim, with no observation and
no pass; `GET /_bench/refill?on=0` waits for the registrations under way,
deletes every job it made (so the simulator's nodes keep room for the
controller's pool) and answers once they are gone.

Settings from the environment: `NOMAD_ADDR`, `NRC_API_PORT`,
`BENCH_FLOOR_PREFIX`, `BENCH_FLOOR_IDLE_OF`. SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import requests
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from bench.simproc import environment
from controller.api import head_deadline
from controller.api.errors import ApiError, error_response
from controller.api.models import RunnerCreated
from controller.api.runners import RunnerBody
from controller.model import Claim
from controller.nomad import jobs
from controller.nomad.aclient import AsyncJobWriter
from controller.nomad.budget import BudgetSettings, shares
from controller.nomad.client import NomadClient
from controller.nomad.connection import NomadConnection
from controller.nomad.decode import decode_allocation
from controller.nomad.gateway import JsonDict

# A free job: its spec, its JobModifyIndex, and for a controller's runner
# its running allocation and that allocation's restarts (None: a floor job).
Free = tuple[JsonDict, int, tuple[str, int] | None]

REFILL_PREFIX = "floor-refill-"


@dataclass(frozen=True)
class Refill:
    """How the floor refills: a new job's spec by id, and how a job it made
    is deleted again (blocking; run on a thread)."""

    spec: Callable[[str], JsonDict]
    delete: Callable[[str], object]


def read_jobs(nomad: str, prefix: str) -> deque[Free]:
    """Every job whose id starts with `prefix`, with its JobModifyIndex."""
    with requests.Session() as http:
        stubs = http.get(f"{nomad}/v1/jobs", params={"prefix": prefix}, timeout=30).json()
        free: deque[Free] = deque()
        for stub in stubs:
            spec = http.get(f"{nomad}/v1/job/{stub['ID']}", timeout=30).json()
            free.append((spec, jobs.modify_index(spec), None))
    if not free:
        raise SystemExit(f"no job with the prefix {prefix!r} in {nomad}")
    return free


def read_idle_runners(nomad: str, env_id: int) -> deque[Free]:
    """The idle runners of environment `env_id` whose allocation runs."""
    with requests.Session() as http:
        running: dict[str, tuple[str, int]] = {}
        for raw in http.get(f"{nomad}/v1/allocations", timeout=30).json():
            # Decoded as the controller decodes it: the restarts it claims with.
            alloc = decode_allocation(raw)
            if alloc.client_status == "running" and alloc.desired_status == "run":
                running[alloc.job_id] = (alloc.id, alloc.restarts)
        stubs = http.get(f"{nomad}/v1/jobs", params={"prefix": f"{env_id}-"}, timeout=30).json()
        free: deque[Free] = deque()
        for stub in stubs:
            if jobs.runner_env_id(stub["ID"]) != env_id or stub["ID"] not in running:
                continue
            spec = http.get(f"{nomad}/v1/job/{stub['ID']}", timeout=30).json()
            if spec.get("Stop") or jobs.runner_from_job(spec, env_id).claim is not None:
                continue
            free.append((spec, jobs.modify_index(spec), running[stub["ID"]]))
    if not free:
        raise SystemExit(f"no idle runner of environment {env_id} in {nomad}")
    return free


def app(
    writer: AsyncJobWriter,
    free: deque[Free],
    *,
    once: bool = False,
    refill: Refill | None = None,
) -> FastAPI:
    """`once`: each job is claimed once (a controller's runners), else they
    are written round and round. `refill`: how a new job is made after each
    claim while refilling is on (`GET /_bench/refill`, see the module docstring)."""
    api = FastAPI()
    available = asyncio.Semaphore(len(free))
    refilling = [False]
    creations: set[asyncio.Task[object]] = set()
    created: list[str] = []

    async def create(refill: Refill) -> None:
        job_id = f"{REFILL_PREFIX}{uuid.uuid4()}"
        created.append(job_id)
        await writer.register_job(refill.spec(job_id))

    if refill is not None:

        @api.get("/_bench/refill")
        async def switch(on: bool) -> Response:
            refilling[0] = on
            if not on:
                await asyncio.gather(*creations, return_exceptions=True)
                while created:
                    await asyncio.to_thread(refill.delete, created.pop())
            return Response(status_code=200)

    @api.exception_handler(ApiError)
    async def refused(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.headers)

    @api.get("/readyz")
    def readyz() -> Response:
        return Response(status_code=200)

    @api.post("/api/v1/runners", response_model=RunnerCreated)
    async def provide(body: RunnerBody) -> RunnerCreated:
        if once and not free:
            raise ApiError(503, "no idle runner left")
        async with available:
            spec, index, alloc = free.popleft()
            try:
                claim = Claim(
                    timeout=body.inactivityTimeout,
                    alloc_id=alloc[0] if alloc is not None else str(spec["ID"]),
                    restarts=alloc[1] if alloc is not None else 0,
                    claimed_at=time.time_ns(),
                )
                written = await writer.register_job(jobs.with_claim(spec, claim), index)
                index = written.job_modify_index or index
            finally:
                if not once:
                    free.append((spec, index, alloc))
        if refill is not None and refilling[0]:
            task = asyncio.get_running_loop().create_task(create(refill))
            creations.add(task)
            task.add_done_callback(creations.discard)
        return RunnerCreated(runnerId=str(spec["ID"]), mappedPorts=[])

    return api


def refill_job(job_id: str) -> JsonDict:
    """A new idle runner job as the controller creates it from a template
    (the environment's id only names its layout: `job_id` is no runner id)."""
    env = environment(0, 0)
    return jobs.runner_job(jobs.template_job(env), env, job_id)


def main() -> None:
    nomad = os.environ["NOMAD_ADDR"]
    idle_of = os.environ.get("BENCH_FLOOR_IDLE_OF")
    if idle_of:
        free = read_idle_runners(nomad, int(idle_of))
    else:
        free = read_jobs(nomad, os.environ.get("BENCH_FLOOR_PREFIX", "floor-"))
    # As many kept-alive connections as the controller's claims write through.
    pool = shares(BudgetSettings()).claim_pool
    writer = AsyncJobWriter(NomadConnection(address=nomad), connections=pool)
    refill = Refill(refill_job, NomadClient(NomadConnection(address=nomad)).deregister_job)
    config = uvicorn.Config(
        app(writer, free, once=True) if idle_of else app(writer, free, refill=refill),
        host="127.0.0.1",
        port=int(os.environ["NRC_API_PORT"]),
        log_config=None,
        access_log=False,
        http=head_deadline.protocol(10.0),  # NRC_API_REQUEST_HEAD_TIMEOUT's default
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
