"""The hop between replicas for an execution id issued by another one.

A `websocketUrl` answered by one replica may be connected to on any other
behind a load balancer. The id names its issuer and is signed with the key
the replicas share (`controller.execution.ids`); the replica the connect
reaches takes the execution from the issuer's store over the internal route
`POST /internal/v1/executions/{id}?runnerId=…` and runs it itself. Nothing
is written to Nomad per execution.

- `IssuerClient.take` (the side the connect reached): an id whose signature
  is wrong is None (404) before any outbound call; otherwise one POST to the
  issuer, signed over the id, the runner and the wall-clock second, with a
  2 s timeout; the issuer's 404 is None, no answer or any other answer is
  `IssuerUnreachable` (503).
- `internal_router` (the issuer's side): a signed take within the window is
  answered with the execution, taken from the store (so once: a replayed id
  is 404 here, and so on every replica); unknown, used, expired or another
  runner's ids are 404; a take without a valid signature is 403. The route
  is not in the OpenAPI description and is not behind the API token; the
  drain lets it through, so ids a replica issued just before SIGTERM are
  still taken from it.

aiohttp is the HTTP client here, as for a claim's write to Nomad
(`controller.nomad.aclient`), and nowhere else in the controller.
"""

from __future__ import annotations

import json
import logging
import ssl
from typing import Annotated, Any

import aiohttp
from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse

from controller.api.errors import error_response
from controller.clock import Clock
from controller.execution.command import ExecutionRequest
from controller.execution.ids import Signer
from controller.execution.store import Execution, ExecutionStore
from controller.model import SECOND

log = logging.getLogger(__name__)

INTERNAL_PREFIX = "/internal/v1"
TIME_HEADER = "X-NRC-Replica-Time"
SIGNATURE_HEADER = "X-NRC-Replica-Signature"
TAKE_TIMEOUT_S = 2.0


class IssuerUnreachable(Exception):
    """The issuing replica did not answer the take (503 to the client)."""


def _wall_s(clock: Clock) -> float:
    return clock.now_ns() / SECOND


def execution_json(execution: Execution) -> dict[str, Any]:
    request = execution.request
    return {
        "runnerId": execution.runner_id,
        "command": request.command,
        "timeLimit": request.time_limit_s,
        "privilegedExecution": request.privileged,
        "environment": dict(request.environment),
    }


def execution_from_json(
    body: Any, execution_id: str, runner_id: str, clock: Clock
) -> Execution | None:
    """The issuer's answer as an execution to run here; None when malformed."""
    if not isinstance(body, dict):
        return None
    command, limit = body.get("command"), body.get("timeLimit")
    privileged, environment = body.get("privilegedExecution"), body.get("environment")
    if (
        body.get("runnerId") != runner_id
        or not isinstance(command, str)
        or not isinstance(limit, int)
        or isinstance(limit, bool)
        or limit < 0
        or not isinstance(privileged, bool)
        or not isinstance(environment, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in environment.items())
    ):
        return None
    request = ExecutionRequest(command, limit, privileged, dict(environment))
    # Runs at once: the issuer's expiry was checked by its take.
    return Execution(execution_id, runner_id, request, clock.monotonic())


class IssuerClient:
    """Takes executions this replica did not issue from the replica that did."""

    def __init__(
        self,
        signer: Signer,
        clock: Clock,
        timeout_s: float = TAKE_TIMEOUT_S,
    ) -> None:
        self.signer = signer
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        # Built once: a TLS context per take would cost more than the take.
        self._tls = ssl.create_default_context()

    async def take(self, runner_id: str, execution_id: str) -> Execution | None:
        """The execution, taken from its issuer; None when the id is not one
        the replicas signed, is this replica's own, or the issuer has no such
        execution (used, expired, another runner's)."""
        issuer = self.signer.issuer_of(execution_id)
        if issuer is None or issuer == self.signer.url:
            return None
        at = int(_wall_s(self._clock))
        headers = {
            TIME_HEADER: str(at),
            SIGNATURE_HEADER: self.signer.take_signature(execution_id, runner_id, at),
        }
        url = f"{issuer.rstrip('/')}{INTERNAL_PREFIX}/executions/{execution_id}"
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout, trust_env=False) as session,
                session.post(
                    url, params={"runnerId": runner_id}, headers=headers, ssl=self._tls
                ) as response,
            ):
                status = response.status
                text = await response.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("could not take execution from %s: %s", issuer, type(exc).__name__)
            raise IssuerUnreachable(issuer) from None
        if status == 404:
            return None
        if status != 200:
            log.warning("%s answered %d to a take", issuer, status)
            raise IssuerUnreachable(issuer)
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        execution = execution_from_json(body, execution_id, runner_id, self._clock)
        if execution is None:
            log.warning("%s answered a take with a malformed execution", issuer)
            raise IssuerUnreachable(issuer)
        return execution


def internal_router(store: ExecutionStore, signer: Signer, clock: Clock) -> APIRouter:
    api = APIRouter(prefix=INTERNAL_PREFIX, include_in_schema=False)

    @api.post("/executions/{executionId}")
    def take(
        executionId: str,
        runnerId: Annotated[str, Query()],
        at: Annotated[str, Header(alias=TIME_HEADER)] = "",
        signature: Annotated[str, Header(alias=SIGNATURE_HEADER)] = "",
    ) -> JSONResponse:
        if not signer.take_authentic(executionId, runnerId, at, signature, _wall_s(clock)):
            return error_response(403, "not a replica's take (key or clock differs)")
        execution = store.take(runnerId, executionId)
        if execution is None:
            return error_response(404, "execution id unknown, already used or expired")
        return JSONResponse(execution_json(execution))

    return api
