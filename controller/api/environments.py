"""Execution environment routes: list, show, create or replace, delete, and
the pool statistics.

An environment is its Nomad template job; the controller keeps
`prewarmingPoolSize` ready idle runners of it. Reads answer from the
controller's last observation of Nomad (`?fetch=true` reads the template jobs
from Nomad first, whether or not an event named them yet);
writes go to Nomad at once and wake the environment's pass.
"""

from __future__ import annotations

import logging
import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response

from controller.api.body import json_body, request_body
from controller.api.errors import ApiError, responses
from controller.api.models import (
    MAX_ID,
    PREWARM_REASONS,
    EnvironmentList,
    EnvironmentRequest,
    EnvironmentStatistics,
    ExecutionEnvironment,
    Prewarming,
    PrewarmingForecast,
    PrewarmReason,
)
from controller.model import Environment
from controller.reconcile.facade import Pools

log = logging.getLogger(__name__)

EnvironmentId = Annotated[
    int, Path(ge=0, le=MAX_ID, description="Id of the execution environment (non-negative).")
]
Fetch = Annotated[
    bool,
    Query(
        description="Read the template jobs from Nomad before answering; otherwise the "
        "controller's last observation (kept current by Nomad's event stream) is returned."
    ),
]
EnvironmentBody = Annotated[EnvironmentRequest, Depends(json_body(EnvironmentRequest))]

REPLACE_DESCRIPTION = """\
Creates the environment if it does not exist (201) and replaces it otherwise
(204). Replacing never touches claimed runners: they keep running as they are
until released. Idle runners built from the old image, limits, network or
ports are replaced by new ones; changing only `prewarmingPoolSize` resizes the
pool without replacing any runner. `cpuLimit` is rounded up to a whole MHz;
without `networkAccess` no port is published and the environment is stored
with `exposedPorts: []`.
"""


def to_body(env: Environment) -> ExecutionEnvironment:
    return ExecutionEnvironment(
        id=env.id,
        image=env.image,
        prewarmingPoolSize=env.prewarming_pool_size,
        cpuLimit=env.cpu_limit,
        memoryLimit=env.memory_limit,
        networkAccess=env.network_access,
        exposedPorts=list(env.exposed_ports),
    )


def from_body(env_id: int, body: EnvironmentRequest) -> Environment:
    """The environment a PUT to `env_id` asks for (`body.id`, if given, is checked)."""
    return Environment(
        id=env_id,
        image=body.image,
        cpu_limit=math.ceil(body.cpuLimit),
        memory_limit=body.memoryLimit,
        network_access=body.networkAccess,
        exposed_ports=tuple(sorted(body.exposedPorts)) if body.networkAccess else (),
        prewarming_pool_size=body.prewarmingPoolSize,
    )


def router(controller: Pools, dependencies: list[Any], max_pool_size: int) -> APIRouter:
    api = APIRouter(
        prefix="/execution-environments", tags=["execution environment"], dependencies=dependencies
    )

    def found(env_id: int) -> Environment:
        env = controller.environment(env_id)
        if env is None:
            raise ApiError(404, f"execution environment {env_id} does not exist")
        return env

    @api.get(
        "",
        summary="List execution environments",
        response_model=EnvironmentList,
        responses=responses(400, 500),
    )
    def list_all(fetch: Fetch = False) -> EnvironmentList:
        if fetch:
            controller.fetch_environments()
        return EnvironmentList(
            executionEnvironments=[to_body(e) for e in controller.environments()]
        )

    @api.get(
        "/{executionEnvironmentId}",
        summary="Show an execution environment",
        response_model=ExecutionEnvironment,
        responses=responses(400, 404, 500),
    )
    def show(executionEnvironmentId: EnvironmentId, fetch: Fetch = False) -> ExecutionEnvironment:
        if fetch:
            controller.fetch_environments(executionEnvironmentId)
        return to_body(found(executionEnvironmentId))

    @api.get(
        "/{executionEnvironmentId}/prewarming",
        summary="Show how large the environment's pool is kept, and why",
        description="Under NRC_PREWARM_POLICY=adaptive, the pool size the controller keeps "
        "and the forecast demand behind it (docs/prewarming.md); under static, "
        "prewarmingPoolSize.",
        response_model=Prewarming,
        responses=responses(400, 404, 500),
    )
    def prewarming(executionEnvironmentId: EnvironmentId) -> Prewarming:
        p = controller.prewarming(executionEnvironmentId)
        if p is None:
            raise ApiError(404, f"execution environment {executionEnvironmentId} does not exist")
        d = p.decision
        forecast = None
        if d is not None:
            f = d.forecast
            forecast = PrewarmingForecast(
                claimsPerSecond=f.rate,
                component=f.component.value,
                steadyClaimsPerSecond=f.steady_rate,
                seasonalClaimsPerSecond=f.seasonal_rate,
                panicClaimsPerSecond=f.panic_rate,
                leadTimeSeconds=f.lead_time_ns / 1e9,
                expectedClaims=f.expected,
                safetyStock=f.safety,
            )
        reason: PrewarmReason = "static"
        if p.adaptive:
            reason = "floor" if d is None else PREWARM_REASONS[d.reason.value]
        return Prewarming(
            id=executionEnvironmentId,
            policy="adaptive" if p.adaptive else "static",
            prewarmingPoolSize=p.floor,
            ceiling=p.ceiling,
            target=p.target,
            reason=reason,
            forecast=forecast,
        )

    @api.put(
        "/{executionEnvironmentId}",
        summary="Create or replace the execution environment",
        description=REPLACE_DESCRIPTION,
        status_code=201,
        response_class=Response,
        responses={
            201: {"description": "The execution environment did not exist and was created."},
            204: {"description": "The execution environment was replaced."},
            **responses(400, 413, 500, 503),
        },
        openapi_extra=request_body(EnvironmentRequest, "The new execution environment."),
    )
    def put(
        executionEnvironmentId: EnvironmentId,
        body: EnvironmentBody,
    ) -> Response:
        if body.id is not None and body.id != executionEnvironmentId:
            raise ApiError(
                400,
                f"invalid request: id: {body.id} differs from the id in the path "
                f"({executionEnvironmentId})",
            )
        if body.prewarmingPoolSize > max_pool_size:
            raise ApiError(
                400,
                f"invalid request: prewarmingPoolSize: {body.prewarmingPoolSize} exceeds "
                f"the maximum of {max_pool_size}",
            )
        created = controller.put_environment(from_body(executionEnvironmentId, body))
        log.info(
            "%s environment %s (pool %s)",
            "created" if created else "replaced",
            executionEnvironmentId,
            body.prewarmingPoolSize,
            extra={"environment_id": executionEnvironmentId},
        )
        return Response(status_code=201 if created else 204)

    @api.delete(
        "/{executionEnvironmentId}",
        summary="Delete the execution environment",
        description="Idle runners are removed at once; claimed ones when they are released.",
        status_code=204,
        response_class=Response,
        responses={
            204: {"description": "The execution environment was deleted."},
            **responses(400, 404, 500, 503),
        },
    )
    def delete(executionEnvironmentId: EnvironmentId) -> Response:
        if not controller.delete_environment(executionEnvironmentId):
            raise ApiError(404, f"execution environment {executionEnvironmentId} does not exist")
        log.info(
            "deleted environment %s",
            executionEnvironmentId,
            extra={"environment_id": executionEnvironmentId},
        )
        return Response(status_code=204)

    return api


def statistics_router(controller: Pools, dependencies: list[Any]) -> APIRouter:
    api = APIRouter(prefix="/statistics", tags=["miscellaneous"], dependencies=dependencies)

    @api.get(
        "/execution-environments",
        summary="Availability and usage of runners per execution environment",
        description="Keyed by environment id. Counts are live: a claim shows at once.",
        response_model=dict[str, EnvironmentStatistics],
        responses=responses(500),
    )
    def statistics() -> dict[str, EnvironmentStatistics]:
        out: dict[str, EnvironmentStatistics] = {}
        for env in controller.environments():
            counts = controller.pool_counts(env.id)
            out[str(env.id)] = EnvironmentStatistics(
                id=env.id,
                prewarmingPoolSize=env.prewarming_pool_size,
                idleRunners=counts.idle_ready,
                usedRunners=counts.claimed,
            )
        return out

    return api
