"""`create_app`: the HTTP API over the controller's façade (`Pools`).

The API is Poseidon's (0.2.2) for runners, execution environments, statistics,
health and version, under `/api/v1`, plus `GET /api/v1/runners/{id}` and, at
the root, `/healthz`, `/readyz` and `/metrics`. It never talks to Nomad
itself: every route calls the controller, which owns all state. With
`issuers`, replicas take each other's execution ids over
`/internal/v1/executions/{id}` (`controller.api.replicas`; not in the OpenAPI
description).

Layers, outermost first: `CatchAll` (500 UNKNOWN for anything unhandled),
`TrustedHost` (400, `guard`), `BrowserOrigin` (403, `guard`), `DrainGate`
(503 SHUTTING_DOWN for new work while the replica drains), `BodyLimit`
(413), `UploadGate`, FastAPI's exception handlers (`controller.api.errors`),
token authentication on the protected routers, then the routes.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from controller.api import (
    environments,
    errors,
    executions,
    files,
    health,
    openapi,
    runners,
    streamed,
)
from controller.api.auth import require_token
from controller.api.body import (
    MAX_BODY_BYTES,
    BodyLimit,
    BodyTooLarge,
    RouteLimit,
    too_large_message,
)
from controller.api.drain import Drain, DrainGate
from controller.api.executions import WebSocketUrls
from controller.api.guard import BrowserOrigin, TrustedHost
from controller.api.replicas import IssuerClient, internal_router
from controller.api.uploads import BodyIdle, UploadGate, UploadSettings
from controller.execution.service import Executions, NoExec
from controller.execution.service import executions as default_executions
from controller.files.service import Files, FileSettings
from controller.reconcile.facade import Pools

API_PREFIX = "/api/v1"


def package_version() -> str:
    try:
        return importlib.metadata.version("nomad-runner-controller")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


PACKAGE_VERSION = package_version()

DESCRIPTION = """\
Keeps warm pools of sandbox runners on HashiCorp Nomad and hands them to
clients. Compatible with Poseidon's API 0.2.2 for runners (execution through
`/execute` and the `/websocket` WebSocket, files through `/files` and
`/files/raw`), execution environments, statistics, health and version.

Errors are `{"message": ..., "errorCode": ...}`; `errorCode` is one of
Poseidon's codes, or `NOT_LEADER` (503) when this replica does not serve.
Invalid requests are 400, bodies over 1 MiB 413 (PATCH /files: over
NRC_FILES_MAX_UPLOAD, 100 MiB by default).
"""

TAGS = [
    {"name": "runner", "description": "A unit of execution."},
    {"name": "execution environment", "description": "A template for runners."},
    {"name": "miscellaneous", "description": "Poseidon's health, version and statistics."},
    {"name": "operations", "description": "Probes and metrics for orchestrators."},
]


def create_app(
    pools: Pools,
    *,
    api_token: str | None = None,
    max_pool_size: int = 10_000,
    pool_alert_threshold: float = 0.5,
    version: str = PACKAGE_VERSION,
    execution: Executions | None = None,
    websocket_urls: WebSocketUrls | None = None,
    file_service: Files | None = None,
    max_upload_bytes: int = FileSettings().max_upload_bytes,
    allowed_hosts: frozenset[str] | None = None,
    allowed_origins: tuple[str, ...] = (),
    upload_settings: UploadSettings | None = None,
    drain: Drain | None = None,
    issuers: IssuerClient | None = None,
) -> FastAPI:
    """The API application; the caller runs it (uvicorn) and owns the controller.
    Without `execution`, executions end with an error frame (no Nomad exec).
    `allowed_hosts`: the trusted `Host` names (None: any); `allowed_origins`:
    the browser origins the API and its execution WebSocket accept (`guard`); `issuers`:
    how execution ids of other replicas are taken (None: ids stay local)."""
    if max_pool_size < 0:
        raise ValueError("max_pool_size must not be negative")
    if not 0.0 <= pool_alert_threshold <= 1.0:
        raise ValueError("pool_alert_threshold must be between 0 and 1")
    app = FastAPI(
        title="nomad-runner-controller",
        version=version,
        description=DESCRIPTION,
        openapi_tags=TAGS,
        docs_url=None,
        redoc_url=None,
        separate_input_output_schemas=False,
        redirect_slashes=False,  # `/runners/` is an unknown route, not a redirect
    )
    protected: list[Any] = [] if api_token is None else [Depends(require_token(api_token))]
    execution = execution or default_executions(pools, None)
    app.include_router(runners.router(pools, execution.runners, protected), prefix=API_PREFIX)
    app.include_router(
        executions.router(
            pools,
            execution.runners,
            execution.relay,
            execution.store,
            protected,
            api_token,
            websocket_urls or WebSocketUrls(),
            API_PREFIX,
            allowed_origins,
            issuers,
            drain,
        ),
        prefix=API_PREFIX,
    )
    if issuers is not None:
        app.include_router(internal_router(execution.store, issuers.signer, pools.clock))
    file_service = file_service or Files(NoExec(), pools.metrics)
    app.include_router(
        files.router(execution.runners, file_service, pools.metrics, protected, max_upload_bytes),
        prefix=API_PREFIX,
    )
    app.include_router(environments.router(pools, protected, max_pool_size), prefix=API_PREFIX)
    app.include_router(environments.statistics_router(pools, protected), prefix=API_PREFIX)
    app.include_router(health.api_router(pools, pool_alert_threshold, version), prefix=API_PREFIX)
    app.include_router(health.root_router(pools, drain))
    errors.install(app, pools)
    streamed.install_log_filter()

    async def body_too_large(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, BodyTooLarge)
        return errors.error_response(413, too_large_message(exc.limit))

    # json_body answers 413 itself; this covers any other reader of the body
    app.add_exception_handler(BodyTooLarge, body_too_large)

    async def body_idle(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, BodyIdle)
        return errors.error_response(408, str(exc))

    app.add_exception_handler(BodyIdle, body_idle)
    upload_path = re.compile(f"{API_PREFIX}/runners/[^/]+/files")
    app.add_middleware(
        UploadGate, method="PATCH", path=upload_path, settings=upload_settings or UploadSettings()
    )
    uploads = RouteLimit("PATCH", upload_path, max_upload_bytes)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, routes=[uploads])
    if drain is not None:
        app.add_middleware(DrainGate, drain=drain, prefix=API_PREFIX)
    app.add_middleware(BrowserOrigin, allowed=allowed_origins)
    app.add_middleware(TrustedHost, allowed=allowed_hosts)
    app.add_middleware(errors.CatchAll)

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi.build(
                app, description=DESCRIPTION, max_pool_size=max_pool_size
            )
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]
    return app
