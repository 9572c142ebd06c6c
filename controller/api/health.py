"""Operational routes: Poseidon's `/api/v1/health` and `/api/v1/version`, and
for orchestrators `/healthz` (the process is alive), `/readyz` (this replica
serves claims) and `/metrics` (Prometheus), at the root. None needs a token.

`/api/v1/health` answers 204 only when Nomad is observed, this replica serves
(every replica does once it has observed Nomad), and every pool holds at
least `pool_alert_threshold` of its size in ready idle runners; otherwise 503
with the first problem's code. Both it and `/readyz` say whether this replica
leads (`X-Nrc-Role` / `role`): the leader alone keeps the pools up.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controller.api.drain import SHUTTING_DOWN_MESSAGE, Drain
from controller.api.errors import ApiError, not_serving_message, responses
from controller.api.models import ErrorCode, Readiness, Status
from controller.reconcile.facade import Pools

ROLE_HEADER = "X-Nrc-Role"


def role(controller: Pools) -> Literal["leader", "follower"]:
    return "leader" if controller.is_leader() else "follower"


def depleting(controller: Pools, threshold: float) -> str | None:
    """Why some pool is below the threshold, or None."""
    for env in controller.environments():
        size = env.prewarming_pool_size
        if size <= 0:
            continue
        idle = controller.pool_counts(env.id).idle_ready
        if idle / size < threshold:
            return (
                f"the prewarming pool of execution environment {env.id} is depleting: "
                f"{idle} of {size} runners ready"
            )
    return None


def api_router(controller: Pools, pool_alert_threshold: float, version: str) -> APIRouter:
    api = APIRouter(tags=["miscellaneous"])

    @api.get(
        "/health",
        summary="Check if the API is available",
        description=(
            "503 NOMAD_UNREACHABLE when Nomad cannot be observed, NOT_LEADER when this "
            "replica does not serve yet, PREWARMING_POOL_DEPLETING when a pool holds fewer "
            f"ready idle runners than {pool_alert_threshold:g} of its size. The `X-Nrc-Role` "
            "header says whether this replica leads (keeps the pools up) or follows."
        ),
        status_code=204,
        response_class=Response,
        responses={204: {"description": "Everything okay."}, **responses(500, 503)},
    )
    def health() -> Response:
        if controller.nomad_error() is not None:
            raise ApiError(503, "Nomad cannot be observed", ErrorCode.NOMAD_UNREACHABLE)
        headers = {ROLE_HEADER: role(controller)}
        if not controller.ready():
            raise ApiError(503, not_serving_message(controller), ErrorCode.NOT_LEADER, headers)
        problem = depleting(controller, pool_alert_threshold)
        if problem is not None:
            raise ApiError(503, problem, ErrorCode.PREWARMING_POOL_DEPLETING, headers)
        return Response(status_code=204, headers=headers)

    @api.get(
        "/version",
        summary="Retrieve the version",
        description="The release of nomad-runner-controller, as a JSON string.",
        response_model=str,
        responses=responses(500),
    )
    def get_version() -> str:
        return version

    return api


def root_router(controller: Pools, drain: Drain | None = None) -> APIRouter:
    api = APIRouter(tags=["operations"])

    @api.get(
        "/healthz",
        summary="Liveness: the process answers",
        response_model=Status,
        responses=responses(500),
    )
    def healthz() -> Status:
        return Status(status="ok")

    @api.get(
        "/readyz",
        summary="Readiness: this replica serves claims",
        description=(
            "503 SHUTTING_DOWN once this replica drains (SIGTERM), NOMAD_UNREACHABLE when "
            "Nomad cannot be observed, NOT_LEADER when this replica has not observed Nomad "
            "yet. Every replica serves once it has; `role` says which one leads."
        ),
        response_model=Readiness,
        responses=responses(500, 503),
    )
    def readyz() -> Readiness:
        if drain is not None and drain.draining:
            raise ApiError(503, SHUTTING_DOWN_MESSAGE, ErrorCode.SHUTTING_DOWN)
        if controller.nomad_error() is not None:
            raise ApiError(503, "Nomad cannot be observed", ErrorCode.NOMAD_UNREACHABLE)
        if not controller.ready():
            raise ApiError(503, not_serving_message(controller), ErrorCode.NOT_LEADER)
        return Readiness(status="ok", role=role(controller))

    @api.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={
            200: {
                "description": "The controller's nrc_* metrics in Prometheus' text format.",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **responses(500),
        },
    )
    def metrics() -> Response:
        return Response(
            generate_latest(controller.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    return api
