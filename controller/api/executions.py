"""Execution routes (Poseidon's): `POST /runners/{id}/execute` stores a
command and answers where to connect; `GET /runners/{id}/websocket` (a
WebSocket) runs it and relays its output as Poseidon's frames.

The WebSocket's refusals are real HTTP answers before the upgrade, in the
API's error shape: 401 without the token (checked first, as Poseidon does),
410 for an unknown, released or lost runner (naming the loss), 404 for an
execution id that is unknown, used or expired, 503 when the replica that
issued it cannot be reached. Only then is the connection accepted and handed
to the relay (`controller.execution.relay`).

An id this replica's store does not hold may be another replica's: with
`issuers` (NRC_API_ADVERTISE_URL and the replicas' key), it is taken from the
replica that issued it (`controller.api.replicas`) and run here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Path, Query, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from controller.api.auth import headers_offer
from controller.api.body import json_body, request_body
from controller.api.drain import RETRY_AFTER_S, SHUTTING_DOWN_MESSAGE, Drain
from controller.api.errors import (
    ApiError,
    error_response,
    from_answer,
    not_serving_message,
    responses,
)
from controller.api.guard import origin_allowed
from controller.api.models import ErrorCode, ExecutionCreated, ExecutionRequest
from controller.api.replicas import IssuerClient, IssuerUnreachable
from controller.dataplane.runners import ClaimedRunners, Unusable
from controller.execution.command import ExecutionRequest as Command
from controller.execution.frames import Frame, encode
from controller.execution.relay import Relay
from controller.execution.store import ExecutionStore, Refused
from controller.reconcile.claims import NotLeader
from controller.reconcile.facade import Pools

ExecutionBody = Annotated[ExecutionRequest, Depends(json_body(ExecutionRequest))]
RunnerId = Annotated[str, Path(description="The runner's id (its Nomad job id).")]
ExecutionId = Annotated[str, Query(description="The id from the websocketUrl of /execute.")]

WEBSOCKET_DESCRIPTION = """\
Connect with a WebSocket upgrade and the API token (as for every route) to run
the command stored by `/execute`. Refusals are plain HTTP answers before the
upgrade: 401, 410 (the runner is unknown, released or lost; the message names
the loss), 404 (the execution id is unknown, already used or expired), 503
(the replica that issued the id cannot be reached; ask `/execute` again).

Server frames are JSON text frames, as Poseidon sends them: `{"type":"start"}`,
then `{"type":"stdout","data":…}` / `{"type":"stderr","data":…}`, then exactly
one of `{"type":"exit","data":<0–255>}`, `{"type":"timeout"}` or
`{"type":"error","data":…}` (`"the allocation was OOM Killed"` exactly when it
was; otherwise the reason, such as the runner's loss), then close 1000. The
client's text frames go to the command's stdin verbatim. The time limit counts
from the connect; on a timeout or a disconnect every process of the execution
is ended. A plain GET without an upgrade is answered 426.
"""


@dataclass(frozen=True)
class WebSocketUrls:
    """How `websocketUrl` is built: the scheme (`ws`, or `wss` behind TLS), and
    whether a proxy's X-Forwarded-Proto / X-Forwarded-Host are believed."""

    scheme: str = "ws"
    trust_proxy_headers: bool = False

    def url(self, request: Request, path: str, execution_id: str) -> str:
        scheme = self.scheme
        host = request.headers.get("host") or f"{request.url.hostname}:{request.url.port}"
        if self.trust_proxy_headers:
            proto = _first(request.headers.get("x-forwarded-proto"))
            if proto in ("https", "wss"):
                scheme = "wss"
            elif proto in ("http", "ws"):
                scheme = "ws"
            host = _first(request.headers.get("x-forwarded-host")) or host
        return f"{scheme}://{host}{path}?{urlencode({'executionID': execution_id})}"


def _first(value: str | None) -> str:
    # A chain of proxies appends: the first value is the client's.
    return value.split(",")[0].strip() if value else ""


class _Client:
    """The accepted WebSocket as the relay's `Client`."""

    def __init__(self, websocket: WebSocket) -> None:
        self._ws = websocket

    async def send(self, frame: Frame) -> None:
        await self._ws.send_text(encode(frame))

    async def receive(self) -> bytes | None:
        while True:
            try:
                message = await self._ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return None
            if message["type"] == "websocket.disconnect":
                return None
            text = message.get("text")
            if text is not None:
                return str(text).encode("utf-8")
            # Binary frames are not Poseidon's input: dropped, as Poseidon does.

    async def close(self) -> None:
        await self._ws.close(1000)


def router(
    controller: Pools,
    runners: ClaimedRunners,
    relay: Relay,
    store: ExecutionStore,
    dependencies: list[Any],
    api_token: str | None,
    urls: WebSocketUrls,
    prefix: str,
    allowed_origins: tuple[str, ...] = (),
    issuers: IssuerClient | None = None,
    drain: Drain | None = None,
) -> APIRouter:
    api = APIRouter(prefix="/runners", tags=["runner"])

    @api.post(
        "/{runnerId}/execute",
        summary="Execute a command",
        description=(
            "Stores the command and answers the WebSocket URL that runs it (once; unused "
            "URLs expire). Restarts the runner's inactivity timer."
        ),
        response_model=ExecutionCreated,
        responses=responses(400, 410, 413, 429, 503),
        openapi_extra=request_body(ExecutionRequest, "The command and how to run it."),
        dependencies=dependencies,
    )
    async def execute(
        runnerId: RunnerId, body: ExecutionBody, request: Request
    ) -> ExecutionCreated:
        await runners.claimed_async(runnerId)
        try:
            execution = store.add(
                runnerId,
                Command(
                    command=body.command,
                    time_limit_s=body.timeLimit,
                    privileged=body.privilegedExecution,
                    environment=dict(body.environment),
                ),
            )
        except Refused as exc:
            raise ApiError(exc.status, exc.message) from None
        path = f"{prefix}/runners/{runnerId}/websocket"
        return ExecutionCreated(websocketUrl=urls.url(request, path, execution.id))

    @api.get(
        "/{runnerId}/websocket",
        summary="Run the execution (WebSocket)",
        description=WEBSOCKET_DESCRIPTION,
        status_code=426,
        response_class=JSONResponse,
        responses={
            101: {"description": "Switching Protocols: the execution runs (frames above)."},
            **responses(401, 404, 410, 426, 503),
        },
        dependencies=dependencies,
    )
    def websocket_handshake(runnerId: RunnerId, executionID: ExecutionId) -> JSONResponse:
        # Only reached without an upgrade: the WebSocket route takes upgrades.
        raise ApiError(426, "connect with a WebSocket upgrade to run the execution")

    @api.websocket("/{runnerId}/websocket")
    async def websocket(websocket: WebSocket, runnerId: str) -> None:
        if not origin_allowed(websocket.headers.get("origin"), allowed_origins):
            # A web page's script, whatever it holds: browsers send Origin.
            await _deny(
                websocket, ApiError(403, "this Origin may not connect (NRC_API_ALLOWED_ORIGINS)")
            )
            return
        if api_token is not None and not headers_offer(websocket.headers, api_token):
            await _deny(websocket, ApiError(401, "authentication required: send the API token"))
            return
        execution_id = websocket.query_params.get("executionID", "")
        if drain is not None and issuers is not None and drain.draining:
            # Ids are shared: one this replica cannot run to its end goes to
            # a replica that can (the balancer's retry), which takes it from here.
            pending = store.peek(runnerId, execution_id)
            limit = pending.request.time_limit_s if pending is not None else 0
            if not drain.finishes(limit, asyncio.get_running_loop().time()):
                await _deny(
                    websocket,
                    ApiError(
                        503,
                        f"{SHUTTING_DOWN_MESSAGE}: its time limit would outlast the drain",
                        ErrorCode.SHUTTING_DOWN,
                        headers={"Retry-After": str(RETRY_AFTER_S)},
                    ),
                )
                return
        try:
            view = await runners.claimed_async(runnerId)
            execution = store.take(runnerId, execution_id)
            if execution is None and issuers is not None:
                execution = await issuers.take(runnerId, execution_id)
            if execution is None:
                raise ApiError(404, "execution id unknown, already used or expired")
            use = runners.begin(view, "execution")
        except Unusable as refused:
            await _deny(websocket, from_answer(refused.answer))
            return
        except ApiError as exc:
            await _deny(websocket, exc)
            return
        except IssuerUnreachable:
            await _deny(
                websocket,
                ApiError(
                    503,
                    "the replica that issued this execution id cannot be reached: "
                    "ask /execute for a new one",
                    headers={"Retry-After": "1"},
                ),
            )
            return
        except NotLeader:
            await _deny(
                websocket, ApiError(503, not_serving_message(controller), ErrorCode.NOT_LEADER)
            )
            return
        claim = view.job.claim
        assert claim is not None
        async with use:
            await websocket.accept()
            await relay.run(execution, claim.alloc_id, _Client(websocket), use)

    return api


async def _deny(websocket: WebSocket, error: ApiError) -> None:
    """The refusal as a plain HTTP answer before the upgrade."""
    response = error_response(error.status, error.message, error.code, error.headers)
    if error.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    await websocket.send_denial_response(response)
