"""`AsyncJobWriter`: a runner job's register on the API's event loop.

A claim is one register with EnforceIndex. Through `NomadClient` it needs a
thread of its own (python-nomad and requests block), and under load the
hand-off to that thread and back, and forty threads passing the GIL to each
other, cost more CPU than the claim itself (docs/performance.md). This writer
sends the same request through aiohttp's client on the event loop: kept-alive
connections (the claims' share of the connection budget), the same URL,
token, namespace, region and TLS (`NomadConnection`), the same errors
(`errors.classify`), retries (`errors.retry_kwargs`) and request metrics as
`NomadClient.register_job`. Measured (`python -m bench clients`), a register
costs the controller about a third of the CPU it costs through requests on
a thread, and a seventh of what httpx's asynchronous client costs.

The session belongs to the event loop it was made on: `aclose` it on that
loop when done (the service does at shutdown).
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
import tenacity

from controller.nomad import jobs
from controller.nomad.client import (
    CONNECTIONS,
    Outcome,
    landed_result,
    register_body,
    write_result,
)
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
        ride_through_s: float = 0.0,
        on_request: RequestHook | None = None,
        connections: int = CONNECTIONS,
    ) -> None:
        self.connection = connection
        self._url = f"{connection.address}/v1/jobs"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._on_request = on_request
        self._connections = max(1, connections)
        self._retry = retry_kwargs(
            retry_attempts, retry_max_wait_s, before_sleep=_log_retry, ride_through_s=ride_through_s
        )
        self._params = {"namespace": connection.namespace}
        if connection.region:
            self._params["region"] = connection.region
        self._headers = {"Content-Type": "application/json", **connection.headers}
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            context = self.connection.ssl_context
            connector = aiohttp.TCPConnector(
                limit=self._connections, ssl=context if context is not None else False
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, trust_env=False
            )
        return self._session

    async def register_job(self, job: JsonDict, enforce_index: int | None = None) -> WriteResult:
        """As `NomadClient.register_job`, a retry's conflict with an earlier
        try that was committed included."""
        body = orjson.dumps(register_body(job, self.connection.namespace, enforce_index))
        tries = 0
        try:
            async for attempt in tenacity.AsyncRetrying(**self._retry):
                with attempt:
                    tries += 1
                    return await self._attempt(body)
        except IndexConflict:
            if enforce_index is None or tries < 2:
                raise
            result = await self._landed(job)
            if result is None:
                raise
            return result
        raise AssertionError("tenacity re-raises the last error")

    async def _landed(self, job: JsonDict) -> WriteResult | None:
        """The write of `job` as Nomad holds it, if it is `job` (`jobs.landed`)."""
        job_id = str(job.get("ID"))
        url = f"{self.connection.address}/v1/job/{quote(job_id, safe='')}"
        try:
            async with self._http().get(url, params=self._params, headers=self._headers) as got:
                if got.status != 200:
                    return None
                current = orjson.loads(await got.read())
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None
        if not isinstance(current, dict) or not jobs.landed(job, current):
            return None
        log.info("register of job %s had landed before its retry conflicted", job_id)
        return landed_result(current)

    async def _attempt(self, body: bytes) -> WriteResult:
        started = time.monotonic()
        outcome: Outcome = "error"
        status = "none"
        try:
            async with self._http().put(
                self._url, params=self._params, data=body, headers=self._headers
            ) as response:
                status = str(response.status)
                text = await response.text()
            if response.status >= 400:
                if classify(response.status, text) is Kind.INDEX_CONFLICT:
                    outcome = "conflict"
                    raise IndexConflict(text)
                raise NomadAPIError(response.status, text)
            try:
                answer = orjson.loads(text) if text else None
            except ValueError:
                raise NomadAPIError(
                    response.status, f"undecodable answer: {text[:200]!r}"
                ) from None
            outcome = "ok"
            return write_result(answer, response.headers.get("X-Nomad-Index", "0"))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            outcome = "unavailable"
            raise NomadUnavailable(f"register_job: {exc!r}") from exc
        finally:
            report_request(
                self._on_request, "register_job", outcome, status, time.monotonic() - started
            )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _log_retry(state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    log.info("retrying register_job after attempt %d: %s", state.attempt_number, exc)
