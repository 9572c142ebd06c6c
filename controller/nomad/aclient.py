"""`AsyncJobWriter`: a runner job's register on the API's event loop.

A claim is one register with EnforceIndex. Through `NomadClient` it needs a
thread of its own (python-nomad and requests block), and under load the
hand-off to that thread and back, and forty threads passing the GIL to each
other, cost more CPU than the claim itself (docs/performance.md). This writer
sends the same request through httpx's asynchronous client: kept-alive
connections (as many as the HTTP pool's share of the connection budget),
the same URL, token, namespace, region and TLS (`NomadConnection`), the same
errors (`errors.classify`), retries (`errors.retry_kwargs`) and request
metrics as `NomadClient.register_job`.

The httpx client belongs to the event loop it was made on; a writer used
from another loop (a test client's) makes one for that loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx
import tenacity

from controller.nomad.client import CONNECTIONS, Outcome, register_body, write_result
from controller.nomad.connection import NomadConnection, RequestHook, report_request
from controller.nomad.errors import (
    IndexConflict,
    Kind,
    NomadAPIError,
    NomadUnavailable,
    classify,
    retry_kwargs,
)
from controller.nomad.gateway import WriteResult

JsonDict = dict[str, Any]

log = logging.getLogger(__name__)


class AsyncJobWriter:
    def __init__(
        self,
        connection: NomadConnection,
        *,
        timeout_s: float = 10.0,
        retry_attempts: int = 5,
        retry_max_wait_s: float = 2.0,
        on_request: RequestHook | None = None,
        connections: int = CONNECTIONS,
    ) -> None:
        self.connection = connection
        self._timeout_s = timeout_s
        self._on_request = on_request
        self._connections = max(1, connections)
        self._retry = retry_kwargs(retry_attempts, retry_max_wait_s, before_sleep=_log_retry)
        self._params = {"namespace": connection.namespace}
        if connection.region:
            self._params["region"] = connection.region
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            limits = httpx.Limits(
                max_connections=self._connections, max_keepalive_connections=self._connections
            )
            verify: Any = self.connection.ssl_context if self.connection.tls else True
            self._client = httpx.AsyncClient(
                base_url=self.connection.address,
                headers={"Content-Type": "application/json", **self.connection.headers},
                timeout=self._timeout_s,
                limits=limits,
                verify=verify,
                trust_env=False,
            )
            self._loop = loop
        return self._client

    async def register_job(self, job: JsonDict, enforce_index: int | None = None) -> WriteResult:
        """As `NomadClient.register_job`."""
        body = json.dumps(register_body(job, self.connection.namespace, enforce_index))
        async for attempt in tenacity.AsyncRetrying(**self._retry):
            with attempt:
                return await self._attempt(body)
        raise AssertionError("tenacity re-raises the last error")

    async def _attempt(self, body: str) -> WriteResult:
        started = time.monotonic()
        outcome: Outcome = "error"
        status = "none"
        try:
            response = await self._http().put("/v1/jobs", params=self._params, content=body)
            status = str(response.status_code)
            if response.status_code >= 400:
                text = response.text
                if classify(response.status_code, text) is Kind.INDEX_CONFLICT:
                    outcome = "conflict"
                    raise IndexConflict(text)
                raise NomadAPIError(response.status_code, text)
            try:
                answer = response.json() if response.content else None
            except ValueError:
                raise NomadAPIError(
                    response.status_code, f"undecodable answer: {response.text[:200]!r}"
                ) from None
            outcome = "ok"
            return write_result(answer, response.headers.get("X-Nomad-Index", "0"))
        except (httpx.TransportError, OSError) as exc:
            outcome = "unavailable"
            raise NomadUnavailable(f"register_job: {exc!r}") from exc
        finally:
            report_request(
                self._on_request, "register_job", outcome, status, time.monotonic() - started
            )

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _log_retry(state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    log.info("retrying register_job after attempt %d: %s", state.attempt_number, exc)
