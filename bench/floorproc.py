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
Settings from the environment: `NOMAD_ADDR`, `NRC_API_PORT`,
`BENCH_FLOOR_PREFIX`. SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque

import requests
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from controller.api import head_deadline
from controller.api.errors import ApiError, error_response
from controller.api.models import RunnerCreated
from controller.api.runners import RunnerBody
from controller.model import Claim
from controller.nomad import jobs
from controller.nomad.aclient import AsyncJobWriter
from controller.nomad.budget import BudgetSettings, shares
from controller.nomad.connection import NomadConnection
from controller.nomad.gateway import JsonDict


def read_jobs(nomad: str, prefix: str) -> deque[tuple[JsonDict, int]]:
    """Every job whose id starts with `prefix`, with its JobModifyIndex."""
    with requests.Session() as http:
        stubs = http.get(f"{nomad}/v1/jobs", params={"prefix": prefix}, timeout=30).json()
        free: deque[tuple[JsonDict, int]] = deque()
        for stub in stubs:
            spec = http.get(f"{nomad}/v1/job/{stub['ID']}", timeout=30).json()
            free.append((spec, jobs.modify_index(spec)))
    if not free:
        raise SystemExit(f"no job with the prefix {prefix!r} in {nomad}")
    return free


def app(writer: AsyncJobWriter, free: deque[tuple[JsonDict, int]]) -> FastAPI:
    api = FastAPI()
    available = asyncio.Semaphore(len(free))

    @api.exception_handler(ApiError)
    async def refused(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.headers)

    @api.get("/readyz")
    def readyz() -> Response:
        return Response(status_code=200)

    @api.post("/api/v1/runners", response_model=RunnerCreated)
    async def provide(body: RunnerBody) -> RunnerCreated:
        async with available:
            spec, index = free.popleft()
            try:
                claim = Claim(
                    timeout=body.inactivityTimeout,
                    alloc_id=str(spec["ID"]),
                    claimed_at=time.time_ns(),
                )
                written = await writer.register_job(jobs.with_claim(spec, claim), index)
                index = written.job_modify_index or index
            finally:
                free.append((spec, index))
        return RunnerCreated(runnerId=str(spec["ID"]), mappedPorts=[])

    return api


def main() -> None:
    nomad = os.environ["NOMAD_ADDR"]
    free = read_jobs(nomad, os.environ.get("BENCH_FLOOR_PREFIX", "floor-"))
    # As many kept-alive connections as the controller's claims write through.
    pool = shares(BudgetSettings()).claim_pool
    writer = AsyncJobWriter(NomadConnection(address=nomad), connections=pool)
    config = uvicorn.Config(
        app(writer, free),
        host="127.0.0.1",
        port=int(os.environ["NRC_API_PORT"]),
        log_config=None,
        access_log=False,
        http=head_deadline.protocol(10.0),  # NRC_API_REQUEST_HEAD_TIMEOUT's default
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
