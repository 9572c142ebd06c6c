"""Runner routes: claim one (`POST /runners`), look at it, give it back.

A runner is handed to one client only (the controller's claim is an
EnforceIndex write). Every request that touches a claimed runner restarts its
inactivity timer. A runner whose file system was reset while claimed (migrated,
restarted, OOM-killed, rescheduled, its node lost) is *lost*: it answers 410
with the reason until the client deletes it, which acknowledges the loss.
Whether a runner may be used is decided by `dataplane.runners.ClaimedRunners`
for these routes, executions and files alike.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Response

from controller.api.body import json_body, request_body
from controller.api.errors import ApiError, from_answer, responses
from controller.api.models import (
    ErrorCode,
    MappedPort,
    RunnerCreated,
    RunnerRequest,
    RunnerStatus,
)
from controller.dataplane import answers
from controller.dataplane.runners import ClaimedRunners
from controller.model import SECOND
from controller.reconcile.claims import NoRunnerAvailable, UnknownEnvironment
from controller.reconcile.facade import Pools

log = logging.getLogger(__name__)


RunnerId = Annotated[
    str, Path(description="The runner's id (its Nomad job id).", examples=["7-<uuid>"])
]

RunnerBody = Annotated[RunnerRequest, Depends(json_body(RunnerRequest))]


def claimed_at(ns: int) -> datetime | None:
    if ns <= 0:
        return None  # adopted from Poseidon: the claim time is unknown
    seconds, rest = divmod(ns, SECOND)
    return datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=rest // 1000)


def router(controller: Pools, runners: ClaimedRunners, dependencies: list[Any]) -> APIRouter:
    api = APIRouter(prefix="/runners", tags=["runner"], dependencies=dependencies)

    @api.post(
        "",
        summary="Provide a runner",
        description=(
            "Hands a ready idle runner of the environment to the client; the pool refills. "
            "An empty pool is 500 NOMAD_OVERLOAD (Poseidon's code): retry later."
        ),
        response_model=RunnerCreated,
        responses=responses(400, 404, 413, 500, 503),
        openapi_extra=request_body(RunnerRequest, "The environment and the inactivity timeout."),
    )
    async def provide(body: RunnerBody) -> RunnerCreated:
        env_id = body.executionEnvironmentId
        try:
            # On the event loop: no thread hop for a claim (docs/performance.md).
            view = await controller.claim_async(env_id, body.inactivityTimeout)
        except UnknownEnvironment:
            raise ApiError(404, f"execution environment {env_id} does not exist") from None
        except NoRunnerAvailable:
            raise ApiError(
                500,
                f"no idle runner of execution environment {env_id} is ready; retry later",
                ErrorCode.NOMAD_OVERLOAD,
            ) from None
        log.info(
            "claimed runner %s of environment %s",
            view.id,
            env_id,
            extra={"runner_id": view.id, "environment_id": env_id},
        )
        ports = view.alloc.ports if view.alloc else ()
        return RunnerCreated(
            runnerId=view.id,
            mappedPorts=[
                MappedPort(exposedPort=p.exposed_port, hostAddress=p.host_address) for p in ports
            ],
        )

    @api.get(
        "/{runnerId}",
        summary="Show a claimed runner",
        description=(
            "Not part of Poseidon's API. Where the runner runs and since when it is claimed. "
            "Restarts its inactivity timer."
        ),
        response_model=RunnerStatus,
        responses=responses(410, 503),
    )
    async def show(runnerId: RunnerId) -> RunnerStatus:
        view = await runners.claimed_async(runnerId)
        claim = view.job.claim
        assert claim is not None
        return RunnerStatus(
            runnerId=view.id,
            executionEnvironmentId=view.env_id,
            status=view.phase,
            allocationId=view.alloc.id if view.alloc else None,
            nodeName=view.node_name or None,
            claimedAt=claimed_at(claim.claimed_at),
            inactivityTimeout=claim.timeout,
        )

    @api.delete(
        "/{runnerId}",
        summary="Destroy the runner",
        description=(
            "The runner is no longer in use and is destroyed. Deleting a lost runner "
            "acknowledges its loss (204)."
        ),
        status_code=204,
        response_class=Response,
        responses={
            204: {"description": "The runner was released."},
            **responses(410, 500, 503),
        },
    )
    def destroy(runnerId: RunnerId) -> Response:
        runner_id = runnerId
        view = controller.lookup(runner_id)
        if not controller.release(runner_id):
            raise from_answer(answers.ended(runner_id, None))
        env_id = view.env_id if view else None
        log.info(
            "released runner %s of environment %s",
            runner_id,
            env_id,
            extra={"runner_id": runner_id, "environment_id": env_id},
        )
        return Response(status_code=204)

    return api
