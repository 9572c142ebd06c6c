"""`NomadClient`: the `NomadGateway` over Nomad's HTTP API, on python-nomad.

Every call goes through python-nomad's `Requester.request()` (its per-endpoint
classes `Jobs`, `Job`, `Allocations`, `Variable`), which builds the URL, adds
`namespace`/`region`, the `X-Nomad-Token` header and the TLS options, and maps
error statuses to its exception classes. Its convenience methods are not used
because each falls short here: they return only the decoded body (dropping
`X-Nomad-Index`, which blocking queries need), take no `index`/`wait`, no
per-call timeout and no lock operation, and the variable ones do not apply the
client's namespace. The requesters are built directly rather than through
`nomad.Nomad`, which silently falls back to NOMAD_TOKEN, NOMAD_ADDR,
NOMAD_NAMESPACE, NOMAD_REGION and NOMAD_CLIENT_CERT/KEY from the environment
and defaults to `verify=False`: every setting here is explicit. The session
python-nomad sends through is a `DirectSession` (`session`): a plain request
goes from it straight to requests' adapter, without the session layer that
cost more of the controller's CPU than the request itself. The lists of jobs
and allocations are decoded into only the fields the controller reads
(`wire`); every other answer whole, by the json module.

Error answers are read by `controller.nomad.errors.classify`, direct and
forwarded (`rpc error: …`) alike, and retried by its one policy: transient
failures (connection errors, timeouts, 429 and 5xx) with capped, fully
jittered exponential backoff; other 4xx, an EnforceIndex conflict and a lost
lock are final: retrying cannot change the answer.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias
from urllib.parse import quote

import msgspec
import nomad.api
import nomad.api.exceptions as nomad_exc
import requests
import tenacity

from controller.model import Allocation
from controller.nomad import jobs, wire
from controller.nomad.connection import NomadConnection, RequestHook, report_request
from controller.nomad.decode import decode_allocation, decode_allocations, decode_job_stubs
from controller.nomad.errors import (
    TRANSIENT,
    IndexConflict,
    Kind,
    LockHeld,
    NomadAPIError,
    NomadUnavailable,
    classify,
    retry_kwargs,
)
from controller.nomad.gateway import (
    AllocListing,
    JobListing,
    JsonDict,
    Lock,
    VariableStub,
    WriteResult,
)
from controller.nomad.session import DirectSession

log = logging.getLogger(__name__)

Outcome: TypeAlias = Literal["ok", "conflict", "error", "unavailable"]
# (operation, outcome, HTTP status or "none", seconds) after every HTTP request,
# retries included.
# Decides whether an error answer is one the operation handles itself
# (returning the outcome to report) instead of an error to raise or retry.
Final: TypeAlias = Callable[[int, str], Outcome | None]

# Nomad caps a blocking query's wait at 300 s (and uses 300 s when none is
# given), then adds up to wait/16 of jitter before answering.
MAX_BLOCKING_WAIT_S = 300.0
CONNECTIONS = 64  # kept-alive connections to Nomad


def go_duration(seconds: float) -> str:
    """A Go duration string Nomad parses (`15s`, `1500ms`)."""
    ms = max(0, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(frozen=True)
class _Reply:
    status: int
    body: Any  # decoded JSON of a 2xx answer, else None
    # The answer as text when it has no decoded body (what Nomad said when it
    # refused); "" beside a body, which a full list makes megabytes long.
    text: str
    index: int  # X-Nomad-Index, 0 when absent

    def excerpt(self, limit: int = 200) -> str:
        """The start of the answer, for an error message."""
        said = self.text if self.body is None else json.dumps(self.body, ensure_ascii=False)
        return said[:limit]


def _header_index(response: requests.Response) -> int:
    try:
        return int(response.headers.get("X-Nomad-Index", "0"))
    except ValueError:
        return 0


class NomadClient:
    """Reads and writes in one namespace of one Nomad region (see the module docstring)."""

    def __init__(
        self,
        connection: NomadConnection | None = None,
        *,
        address: str | None = None,
        timeout_s: float = 10.0,
        retry_attempts: int = 5,
        retry_max_wait_s: float = 2.0,
        on_request: RequestHook | None = None,
        connections: int = CONNECTIONS,
        enforced_ride_through_s: float = 0.0,
    ) -> None:
        """`connection` says where and how; `address` alone is short for
        `NomadConnection(address=address)`. `connections` bounds the kept-alive
        pool, and blocks a caller beyond it until one is free (the connection
        budget's share of the HTTP pool)."""
        if connection is None:
            connection = NomadConnection(address=address or "http://127.0.0.1:4646")
        self.connection = connection
        self.address = connection.address
        self.namespace = connection.namespace
        self._timeout_s = timeout_s
        self._on_request = on_request
        self._session = DirectSession()
        # Explicit settings only (see the module docstring): no proxies, CA
        # bundle or .netrc from the environment, which requests would also look
        # up with file-system calls on every request.
        self._session.trust_env = False
        # One kept-alive connection per concurrent caller (API threads, writers,
        # fetchers): requests' default pool of 10 would close and reopen
        # connections under load.
        # pool_block: a caller beyond the pool waits for a connection instead
        # of opening one more that is closed after use, so the controller never
        # holds more than `connections` HTTP connections to the agent.
        for scheme in ("http://", "https://"):
            self._session.mount(
                scheme,
                requests.adapters.HTTPAdapter(pool_maxsize=max(1, connections), pool_block=True),
            )
        settings: dict[str, Any] = {
            "address": self.address,
            "namespace": connection.namespace,
            "token": connection.token or None,
            "timeout": timeout_s,
            "verify": connection.requests_verify,
            "cert": connection.requests_cert or (),
            "region": connection.region or None,
            "session": self._session,
        }
        self._jobs = nomad.api.Jobs(**settings)
        self._job = nomad.api.Job(**settings)
        self._allocations = nomad.api.Allocations(**settings)
        self._variable = nomad.api.Variable(**settings)
        self._variables = nomad.api.Variables(**settings)
        self._allocation = nomad.api.Allocation(**settings)
        self._node = nomad.api.Node(**settings)
        self._retrying = tenacity.Retrying(
            **retry_kwargs(retry_attempts, retry_max_wait_s, before_sleep=self._log_retry)
        )
        # EnforceIndex registers (a claim, its end, a loss recorded: who holds
        # a runner) ride through a leader election when asked to, as the
        # claims' own writer does (errors.CLAIM_RIDE_THROUGH_S).
        self._enforced_retrying = tenacity.Retrying(
            **retry_kwargs(
                retry_attempts,
                retry_max_wait_s,
                before_sleep=self._log_retry,
                ride_through_s=enforced_ride_through_s,
            )
        )

    def close(self) -> None:
        self._session.close()

    # -- reads ---------------------------------------------------------------------

    def list_jobs(self, prefix: str = "", index: int = 0, wait_s: float = 0) -> JobListing:
        params: dict[str, Any] = {"prefix": prefix or None, **self._blocking(index, wait_s)}
        return self._job_listing(params, self._read_timeout(index, wait_s))

    def get_job(self, job_id: str) -> JsonDict | None:
        reply = self._job_reply(job_id)
        if reply.status == 404 or not isinstance(reply.body, dict):
            return None
        return reply.body

    def _job_reply(self, job_id: str) -> _Reply:
        """`GET /v1/job/:id`, a 404 (no such job) answered, not raised."""
        return self._call(
            "get_job",
            lambda: self._job.request(_segment(job_id), method="get"),
            final=lambda status, _: "ok" if status == 404 else None,
        )

    def get_allocation(self, alloc_id: str) -> Allocation | None:
        """One allocation as Nomad's leader holds it now (a default read, which
        a follower forwards; never `stale`); None when Nomad does not know it."""
        reply = self._call(
            "get_allocation",
            lambda: self._allocation.request(_segment(alloc_id), method="get"),
            final=lambda status, _: "ok" if status == 404 else None,
        )
        if reply.status == 404 or not isinstance(reply.body, dict):
            return None
        return decode_allocation(reply.body)

    def allocation_node(self, alloc_id: str) -> str | None:
        """The id of the node an allocation was placed on; None when Nomad
        does not know the allocation."""
        alloc = self.get_allocation(alloc_id)
        return alloc.node_id if alloc is not None and alloc.node_id else None

    def node_http_address(self, node_id: str) -> str | None:
        """A node's `HTTPAddr` (host:port of its client agent); None when
        Nomad does not know the node or publishes no address for it."""
        reply = self._call(
            "get_node",
            lambda: self._node.request(_segment(node_id), method="get"),
            final=lambda status, _: "ok" if status == 404 else None,
        )
        address = reply.body.get("HTTPAddr") if isinstance(reply.body, dict) else None
        return address if isinstance(address, str) and address else None

    def list_allocations(self, index: int = 0, wait_s: float = 0) -> AllocListing:
        params: dict[str, Any] = {
            "resources": "true",
            "task_states": "true",
            **self._blocking(index, wait_s),
        }
        return self._alloc_listing(params, self._read_timeout(index, wait_s))

    def list_jobs_by_id(self, job_ids: Collection[str]) -> JobListing:
        """Stubs of those of the jobs that exist (a `filter` expression per
        batch of ids; the index is the oldest of the batches')."""
        listings = [
            self._list_jobs_filtered(_any_equal("ID", batch)) for batch in _batches(job_ids)
        ]
        return JobListing(
            jobs=tuple(s for listing in listings for s in listing.jobs),
            index=min((listing.index for listing in listings), default=0),
        )

    def list_allocations_of_jobs(self, job_ids: Collection[str]) -> AllocListing:
        """Every allocation of the jobs, with task states and ports, as
        `list_allocations` (batched like `list_jobs_by_id`)."""
        listings = [
            self._list_allocations_filtered(_any_equal("JobID", batch))
            for batch in _batches(job_ids)
        ]
        return AllocListing(
            allocations=tuple(a for listing in listings for a in listing.allocations),
            index=min((listing.index for listing in listings), default=0),
        )

    def list_allocation_versions(self) -> AllocListing:
        """Every allocation of the namespace without task states or resources:
        a quarter of the bytes, enough to tell which allocations changed."""
        return self._alloc_listing({"task_states": "false"})

    def _list_jobs_filtered(self, expression: str) -> JobListing:
        return self._job_listing({"filter": expression})

    def _list_allocations_filtered(self, expression: str) -> AllocListing:
        params = {"resources": "true", "task_states": "true", "filter": expression}
        return self._alloc_listing(params)

    def _job_listing(
        self, params: dict[str, Any], timeout: tuple[float, float] | None = None
    ) -> JobListing:
        timeout = timeout or self._read_timeout(0, 0)
        reply = self._call(
            "list_jobs",
            lambda: self._jobs.request(method="get", params=dict(params), timeout=timeout),
            typed=wire.JOB_LIST,
        )
        return JobListing(jobs=decode_job_stubs(reply.body), index=reply.index)

    def _alloc_listing(
        self, params: dict[str, Any], timeout: tuple[float, float] | None = None
    ) -> AllocListing:
        timeout = timeout or self._read_timeout(0, 0)
        reply = self._call(
            "list_allocations",
            lambda: self._allocations.request(method="get", params=dict(params), timeout=timeout),
            typed=wire.ALLOC_LIST,
        )
        return AllocListing(allocations=decode_allocations(reply.body), index=reply.index)

    # -- writes --------------------------------------------------------------------

    def register_job(self, job: JsonDict, enforce_index: int | None = None) -> WriteResult:
        body = register_body(job, self.namespace, enforce_index)
        sent = [0]

        def send() -> requests.Response:
            sent[0] += 1
            response: requests.Response = self._jobs.request(method="put", json=body)
            return response

        retrying = self._enforced_retrying if enforce_index is not None else None
        try:
            reply = self._call("register_job", send, retrying=retrying)
        except IndexConflict:
            # A retried EnforceIndex register conflicts with itself when an
            # earlier try, whose answer was lost, was committed: read it back.
            if enforce_index is None or sent[0] < 2:
                raise
            result = self._landed(job)
            if result is None:
                raise
            return result
        return write_result(reply.body, reply.index)

    def _landed(self, job: JsonDict) -> WriteResult | None:
        """The write of `job` as Nomad holds it, if it is `job` (`jobs.landed`)."""
        try:
            current = self.get_job(str(job.get("ID")))
        except (NomadUnavailable, NomadAPIError):
            return None
        if current is None or not jobs.landed(job, current):
            return None
        log.info("register of job %s had landed before its retry conflicted", job.get("ID"))
        return landed_result(current)

    def parse_job_hcl(self, hcl: str) -> JsonDict:
        """A job in HCL as Nomad's API JSON, parsed by Nomad (`POST
        /v1/jobs/parse`), so that we need no HCL parser of our own. Raises
        NomadAPIError with Nomad's text when Nomad cannot parse it."""
        body = {"JobHCL": hcl, "Canonicalize": False}
        reply = self._call(
            "parse_job", lambda: self._jobs.request("parse", method="post", json=body)
        )
        if not isinstance(reply.body, dict):
            raise NomadAPIError(reply.status, f"parse answered {reply.excerpt()!r}")
        return reply.body

    def deregister_job(
        self, job_id: str, purge: bool = True, ride_through: bool = False
    ) -> WriteResult:
        """Deregister (and purge) a job; with `ride_through`, retried as the
        EnforceIndex registers are (deregistering is idempotent). A purge
        whose last answer was an error of unknown outcome (`rpc error: EOF`:
        the leader died with the write in flight, perhaps committed) is read
        back: a job Nomad no longer has was deregistered."""
        params = {"purge": "true"} if purge else {}
        try:
            reply = self._call(
                "deregister_job",
                lambda: self._job.request(_segment(job_id), method="delete", params=dict(params)),
                retrying=self._enforced_retrying if ride_through else None,
            )
        except (NomadUnavailable, NomadAPIError) as exc:
            if not purge or (isinstance(exc, NomadAPIError) and exc.kind not in TRANSIENT):
                raise
            gone_at = self._gone_at(job_id)
            if gone_at is None:
                raise
            log.info("deregistration of job %s had landed before its answer failed", job_id)
            return WriteResult(index=gone_at, job_modify_index=0)
        answer = reply.body if isinstance(reply.body, dict) else {}
        return WriteResult(index=int(answer.get("Index") or reply.index), job_modify_index=0)

    def _gone_at(self, job_id: str) -> int | None:
        """The index at which Nomad answers that it has no job `job_id`, or
        None while it has it (or cannot say)."""
        try:
            reply = self._job_reply(job_id)
        except (NomadUnavailable, NomadAPIError):
            return None
        return reply.index if reply.status == 404 else None

    # -- variable locks ------------------------------------------------------------

    def lock_acquire(self, path: str, ttl_s: float, lock_delay_s: float) -> Lock:
        body = self._lock_body(
            path, {"TTL": go_duration(ttl_s), "LockDelay": go_duration(lock_delay_s)}
        )
        reply = self._lock_call(
            "lock_acquire",
            "lock-acquire",
            path,
            body,
            lambda s, t: "conflict" if classify(s, t) is Kind.LOCK_GONE else None,
        )
        if reply.status == 409:
            raise LockHeld(f"lock {path!r} is held by somebody else")
        lock = reply.body.get("Lock") if isinstance(reply.body, dict) else None
        lock_id = lock.get("ID") if isinstance(lock, dict) else None
        if not isinstance(lock_id, str) or not lock_id:
            raise NomadAPIError(
                reply.status, f"lock-acquire answer without Lock.ID: {reply.excerpt()}"
            )
        return Lock(path=path, lock_id=lock_id)

    def lock_renew(self, lock: Lock) -> None:
        body = self._lock_body(lock.path, {"ID": lock.lock_id})
        reply = self._lock_call("lock_renew", "lock-renew", lock.path, body, _lock_gone)
        if reply.status >= 300:
            raise LockHeld(f"lock {lock.path!r} is no longer ours: {reply.text.strip()}")

    def lock_release(self, lock: Lock) -> None:
        body = self._lock_body(lock.path, {"ID": lock.lock_id})
        reply = self._lock_call("lock_release", "lock-release", lock.path, body, _lock_gone)
        if reply.status >= 300:
            log.info("lock %r was no longer ours at release: %s", lock.path, reply.text.strip())

    def lock_held(self, path: str) -> bool:
        reply = self._call(
            "lock_held",
            lambda: self._variable.request(
                quote(path, safe="/"), method="get", params={"namespace": self.namespace}
            ),
            final=lambda s, _: "ok" if s == 404 else None,
        )
        if reply.status == 404:
            return False
        # Nomad writes `Lock` only while one is held (omitempty), a dead one
        # waiting out its LockDelay included.
        return isinstance(reply.body, dict) and bool(reply.body.get("Lock"))

    # -- variables -----------------------------------------------------------------

    def get_variable(self, path: str) -> dict[str, str] | None:
        reply = self._call(
            "get_variable",
            lambda: self._variable.request(
                quote(path, safe="/"), method="get", params={"namespace": self.namespace}
            ),
            final=lambda s, _: "ok" if s == 404 else None,
        )
        if reply.status == 404:
            return None
        items = reply.body.get("Items") if isinstance(reply.body, dict) else None
        if not isinstance(items, dict):
            raise NomadAPIError(reply.status, f"variable answer without Items: {reply.excerpt()}")
        return {str(k): str(v) for k, v in items.items()}

    def put_variable(self, path: str, items: dict[str, str]) -> None:
        body = {"Path": path, "Namespace": self.namespace, "Items": items}
        self._call(
            "put_variable",
            lambda: self._variable.request(
                quote(path, safe="/"),
                method="put",
                params={"namespace": self.namespace},
                json=body,
            ),
        )

    def list_variables(self, prefix: str) -> tuple[VariableStub, ...]:
        reply = self._call(
            "list_variables",
            lambda: self._variables.request(
                method="get", params={"prefix": prefix, "namespace": self.namespace}
            ),
        )
        if not isinstance(reply.body, list):
            raise NomadAPIError(reply.status, f"variable list not a list: {reply.excerpt()}")
        out: list[VariableStub] = []
        for entry in reply.body:
            path = entry.get("Path") if isinstance(entry, dict) else None
            if not isinstance(path, str):
                raise NomadAPIError(reply.status, f"variable stub without Path: {entry!r}"[:200])
            out.append(VariableStub(path=path, modify_index=int(entry.get("ModifyIndex") or 0)))
        return tuple(out)

    def delete_variable(self, path: str, modify_index: int | None = None) -> bool:
        params: dict[str, Any] = {"namespace": self.namespace}
        if modify_index is not None:
            params["cas"] = modify_index
        # A check-and-set that lost answers 409 with the variable as it is now.
        reply = self._call(
            "delete_variable",
            lambda: self._variable.request(
                quote(path, safe="/"), method="delete", params=dict(params)
            ),
            final=lambda s, _: "conflict" if s == 409 and modify_index is not None else None,
        )
        return reply.status != 409

    def _lock_body(self, path: str, lock: JsonDict) -> JsonDict:
        return {"Path": path, "Namespace": self.namespace, "Lock": lock}

    def _lock_call(
        self, operation: str, op: str, path: str, body: JsonDict, final: Final
    ) -> _Reply:
        # python-nomad leaves the namespace off /v1/var/ paths: pass it ourselves.
        params = {op: "", "namespace": self.namespace}
        return self._call(
            operation,
            lambda: self._variable.request(
                quote(path, safe="/"), method="put", params=dict(params), json=body
            ),
            final=final,
        )

    # -- plumbing ------------------------------------------------------------------

    @staticmethod
    def _blocking(index: int, wait_s: float) -> dict[str, Any]:
        if index <= 0:
            return {}
        params: dict[str, Any] = {"index": index}
        if wait_s > 0:
            params["wait"] = go_duration(min(wait_s, MAX_BLOCKING_WAIT_S))
        return params

    def _read_timeout(self, index: int, wait_s: float) -> tuple[float, float]:
        """(connect, read) timeouts; a blocking query may legitimately stay
        silent for its wait plus Nomad's jitter, so its read timeout is longer."""
        if index <= 0:
            return (self._timeout_s, self._timeout_s)
        wait = min(wait_s, MAX_BLOCKING_WAIT_S) if wait_s > 0 else MAX_BLOCKING_WAIT_S
        return (self._timeout_s, wait + wait / 16 + self._timeout_s)

    def _call(
        self,
        operation: str,
        send: Callable[[], requests.Response],
        final: Final | None = None,
        typed: msgspec.json.Decoder[Any] | None = None,
        retrying: tenacity.Retrying | None = None,
    ) -> _Reply:
        """`send` with retries (`retrying`, the client's policy by default);
        `typed` decodes an answer of its shape (`wire`)."""
        # A copy per call keeps tenacity's per-run state apart across threads.
        policy = (retrying or self._retrying).copy()
        reply: _Reply = policy(self._attempt, operation, send, final, typed)
        return reply

    def _attempt(
        self,
        operation: str,
        send: Callable[[], requests.Response],
        final: Final | None,
        typed: msgspec.json.Decoder[Any] | None,
    ) -> _Reply:
        started = time.monotonic()
        outcome: Outcome = "error"
        status = "none"  # the HTTP status, or "none" when no answer came
        try:
            response = send()
            status = str(response.status_code)
            try:
                # A list through its `wire` type; any other answer (a spec, an
                # allocation) through the json module, not orjson as elsewhere:
                # on the answers of 10,000 idle runners orjson left the
                # controller 10 MB larger (docs/performance.md). From the bytes,
                # which both decoders take as UTF-8 (as Nomad writes).
                body = wire.loads(response.content, typed) if response.content else None
            except ValueError:
                raise NomadAPIError(
                    response.status_code, f"undecodable answer: {response.text[:200]!r}"
                ) from None
            outcome = "ok"
            # The text only when there is no body: requests guesses a charset
            # for it (Nomad names none), about 40 µs on a 1 KB answer, and a
            # full list's megabytes would be held twice while decoded.
            text = response.text if body is None else ""
            return _Reply(response.status_code, body, text, _header_index(response))
        except nomad_exc.BaseNomadException as exc:
            cause = exc.nomad_resp
            if not isinstance(cause, requests.Response):
                # python-nomad wraps transport failures (connection refused,
                # timeouts, TLS errors) in the same exception class as statuses.
                outcome = "unavailable"
                raise NomadUnavailable(f"{operation}: {cause}") from exc
            code, text = cause.status_code, cause.text
            status = str(code)
            handled = final(code, text) if final is not None else None
            if handled is not None:
                outcome = handled
                return _Reply(code, None, text, _header_index(cause))
            if classify(code, text) is Kind.INDEX_CONFLICT:
                outcome = "conflict"
                raise IndexConflict(text) from None
            raise NomadAPIError(code, text) from None
        except (requests.RequestException, OSError) as exc:
            # python-nomad lets OSError through: requests raises it when a TLS
            # file it was given has gone missing since the client was built.
            outcome = "unavailable"
            raise NomadUnavailable(f"{operation}: {exc}") from exc
        finally:
            self._report(operation, outcome, status, time.monotonic() - started)

    def _report(self, operation: str, outcome: Outcome, status: str, seconds: float) -> None:
        report_request(self._on_request, operation, outcome, status, seconds)

    @staticmethod
    def _log_retry(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        fn_args = state.args
        operation = fn_args[0] if fn_args else "?"
        log.info("retrying %s after attempt %d: %s", operation, state.attempt_number, exc)


# Ids per filtered list: keeps the query string near 4 KB (proxies commonly
# allow 8 KB), and the server's work per request small.
FILTER_BATCH = 64


def _batches(ids: Collection[str]) -> list[list[str]]:
    ordered = sorted(set(ids))
    return [ordered[i : i + FILTER_BATCH] for i in range(0, len(ordered), FILTER_BATCH)]


def _any_equal(selector: str, values: list[str]) -> str:
    """A go-bexpr expression true for objects whose `selector` is one of `values`
    (JSON string literals are valid Go string literals)."""
    return " or ".join(f"{selector} == {json.dumps(v, ensure_ascii=False)}" for v in values)


def _segment(value: str) -> str:
    """One URL path segment: python-nomad joins segments without escaping."""
    return quote(value, safe="")


def _lock_gone(status: int, text: str) -> Outcome | None:
    """For a renew or release, a missing lock or variable means "no longer
    ours", not a fault."""
    if classify(status, text) in (Kind.LOCK_GONE, Kind.NOT_FOUND):
        return "conflict"
    return None


def register_body(job: JsonDict, namespace: str, enforce_index: int | None) -> JsonDict:
    """The body of Nomad's register (`PUT /v1/jobs`); with `enforce_index`,
    only over that version of the job (0: only if it does not exist)."""
    # Nomad takes the job's own Namespace over the query parameter, so a job
    # read from elsewhere must not carry another namespace into this write.
    body: JsonDict = {"Job": {**job, "Namespace": namespace}}
    if enforce_index is not None:
        body["EnforceIndex"] = True
        body["JobModifyIndex"] = enforce_index
    return body


def landed_result(current: JsonDict) -> WriteResult:
    """The result of a register found committed on reading the job back."""
    return WriteResult(
        index=int(current.get("ModifyIndex") or 0),
        job_modify_index=int(current.get("JobModifyIndex") or 0),
    )


def write_result(answer: Any, header_index: int | str) -> WriteResult:
    """What a register answered (its JSON body and X-Nomad-Index)."""
    body = answer if isinstance(answer, dict) else {}
    try:
        index = int(body.get("Index") or header_index)
    except ValueError:
        index = 0
    return WriteResult(
        index=index,
        job_modify_index=int(body.get("JobModifyIndex") or 0),
        warnings=_warnings(str(body.get("Warnings") or "")),
    )


def _warnings(text: str) -> tuple[str, ...]:
    """Nomad's register warnings (`N warning(s):` then `* ...` items, each
    possibly wrapped over lines) as one line each."""
    items = [" ".join(item.split()) for item in text.split("\n* ")[1:]]
    if not items and text.strip():
        items = [" ".join(text.split())]
    return tuple(i for i in items if i)
