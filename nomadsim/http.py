"""Nomad's HTTP API over the simulator (`/v1/...`), with Nomad's query
parameters, blocking queries, headers and plain-text errors.

Reads honour `index`/`wait` (blocking queries: return once the response's
index exceeds `index`, or after `wait` plus up to wait/16 jitter, capped at
300 s) and answer `X-Nomad-Index`, `X-Nomad-KnownLeader` and
`X-Nomad-LastContact`. List reads may lag behind writes when the
`stale_read_rate` fault is set, as a read served by a follower would.
Allocation exec, a WebSocket, is wired here and lives in `alloc_exec`.

Every request arrives at one of the cluster's agents (frontends.py): what
that agent forwards is forwarded, and an error that came back over RPC is
answered as Nomad's HTTP layer answers it (forwarding.py). A follower serves
a `stale` list read from its own, lagging view; an event stream through a
client agent holds a streaming RPC connection to the agent's server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute

from nomadsim import bexpr, encode, forwarding, jobspec
from nomadsim.alloc_exec import EXEC_ROUTE, exec_endpoint, not_upgraded_endpoint
from nomadsim.core import Simulator
from nomadsim.errors import NomadError, Origin
from nomadsim.events import Subscription, parse_topics
from nomadsim.state import ALLOCS, EVALS, JOB_SUMMARY, JOBS, NODES, VARIABLES
from nomadsim.topology import Hop, Kind
from nomadsim.variables import VariableError, parse_go_duration

MAX_WAIT_S = 300.0
Handler = Callable[[Request, Simulator], Awaitable[Response]]


def dumps(obj: Any) -> bytes:
    return encode.json_bytes(obj)


class RawJSON(bytes):
    """A response body that is JSON already (list entries encoded earlier)."""


def json_array(parts: Iterable[bytes]) -> RawJSON:
    """The JSON array of already encoded entries: what `dumps` of the list gives."""
    return RawJSON(b"[" + b",".join(parts) + b"]")


def text(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(message, status_code=status, media_type="text/plain", headers=headers)


def json_response(body: Any, index: int | None = None, status: int = 200) -> Response:
    headers = {}
    if index is not None:
        headers = {
            "X-Nomad-Index": str(index),
            "X-Nomad-KnownLeader": "true",
            "X-Nomad-LastContact": "0",
        }
    content = body if isinstance(body, RawJSON) else dumps(body)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


def hop_of(request: Request) -> Hop:
    """How the agent the request reached serves it (set by `_wrap`)."""
    found = getattr(request.state, "hop", None)
    return found if isinstance(found, Hop) else Hop()


def namespace_of(request: Request) -> str:
    return request.query_params.get("namespace") or "default"


def flag(request: Request, name: str, default: bool = False) -> bool:
    value = request.query_params.get(name)
    if value is None:
        return default
    if value.lower() in ("", "true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise NomadError(400, f"Failed to parse value of {name!r} ({value}) as a boolean")


async def read_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise NomadError(400, f"Request decode failed: {exc}") from None


def filter_of(request: Request) -> bexpr.Filter | None:
    """The `filter` expression of a list read, parsed (400 as Nomad when it does not parse)."""
    text = request.query_params.get("filter")
    if not text:
        return None
    try:
        return bexpr.parse(text)
    except bexpr.FilterSyntaxError as exc:
        raise NomadError(
            400, f"failed to create result paginator: failed to read filter expression: {exc}"
        ) from None


def keep(expression: bexpr.Filter, datum: Any) -> bool:
    try:
        return expression.matches(datum)
    except bexpr.FilterEvalError as exc:
        raise NomadError(400, f"failed to read result page: {exc}") from None


class Blocking:
    """One read: parses `index`/`wait` and decides whether it is a stale read."""

    def __init__(self, request: Request, sim: Simulator) -> None:
        self.sim = sim
        params = request.query_params
        try:
            self.min_index = int(params.get("index") or 0)
            if self.min_index < 0:
                raise ValueError
        except ValueError:
            raise NomadError(400, "Invalid index") from None
        wait = params.get("wait")
        try:
            wait_s = parse_go_duration(wait) / 1e9 if wait else 0.0
        except ValueError:
            raise NomadError(400, "Invalid wait time") from None
        if wait_s <= 0 or wait_s > MAX_WAIT_S:
            wait_s = MAX_WAIT_S
        self.wait_s = wait_s + sim.fault_rng.random() * wait_s / 16
        self.at_index: int | None = None
        self.follower_view = hop_of(request).follower_view

    def stale(self) -> None:
        """Maybe serve this list read from a lagging follower's view: always
        when a follower serves it (a `stale` read), else at the fault's rate."""
        sim = self.sim
        rate = sim.faults.stale_read_rate
        if self.follower_view or (rate and sim.fault_rng.random() < rate):
            lag = sim.fault_rng.random() * sim.config.stale_lag_ms / 1000
            self.at_index = sim.store.index_at(lag)

    def table(self, name: str) -> dict[Any, Any]:
        store = self.sim.store
        if self.at_index is None:
            return store.tables[name]
        return store.view(name, self.at_index)

    def index(self, *tables: str) -> int:
        idx = self.sim.store.max_index(*tables)
        return idx if self.at_index is None else min(idx, self.at_index)

    async def run(
        self, tables: tuple[str, ...], compute: Callable[[], tuple[int, Any]]
    ) -> Response:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while True:
            index, body = compute()
            remaining = deadline - loop.time()
            done = self.min_index == 0 or index > self.min_index or remaining <= 0
            # At shutdown a blocked query answers what it has, like a timeout.
            if done or self.sim.store.closed:
                return json_response(body, max(index, 1))
            # A follower catches up before answering a blocking query again.
            self.at_index = None
            await self.sim.store.wait_for_change(tables, remaining)


# -- jobs -------------------------------------------------------------------------


async def list_jobs(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    b.stale()
    ns = namespace_of(request)
    prefix = request.query_params.get("prefix", "")
    meta = flag(request, "meta")
    expression = filter_of(request)
    # `ID == "a" or ID == "b" ...` is answered from the table's key.
    ids = expression.equality_set("ID") if expression is not None else None

    def compute() -> tuple[int, Any]:
        table = b.table(JOBS)
        stale = b.at_index is not None
        if ids is not None and ns != "*":
            candidates = sorted((key, table[key]) for key in ((ns, i) for i in ids) if key in table)
        else:
            candidates = sorted(table.items())
        out = []
        for (job_ns, job_id), rec in candidates:
            if not ((ns == "*" or job_ns == ns) and job_id.startswith(prefix)):
                continue
            if expression is not None and ids is None and not keep(expression, rec.spec):
                continue
            if ids is not None and job_id not in ids:
                continue
            summary = sim.presenter.job_summary(rec, b.table(ALLOCS)) if stale else None
            out.append(sim.presenter.job_stub_json(rec, meta, summary))
        return b.index(JOBS, JOB_SUMMARY), json_array(out)

    return await b.run((JOBS, JOB_SUMMARY), compute)


async def register_job(request: Request, sim: Simulator, job_id: str | None = None) -> Response:
    body = await read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("Job"), dict):
        raise NomadError(400, "Job must be specified")
    job = body["Job"]
    if job_id is not None and job.get("ID") != job_id:
        raise NomadError(400, "Job ID does not match name")
    ns = request.query_params.get("namespace") or body.get("Namespace") or job.get("Namespace")
    enforce = body.get("EnforceIndex") is True
    try:
        index = int(body.get("JobModifyIndex") or 0)
    except (TypeError, ValueError):
        raise NomadError(400, "JobModifyIndex must be an integer") from None
    result = sim.job_endpoint.register(job, ns or "default", enforce, index)
    return json_response(result, result["Index"])


async def parse_job(request: Request, sim: Simulator) -> Response:
    """`POST /v1/jobs/parse`: HCL to the API's job JSON (nomadsim/jobspec.py)."""
    body = await read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("JobHCL"), str):
        raise NomadError(400, "Job HCL must be specified")
    job = jobspec.parse_job(body["JobHCL"])
    if body.get("Canonicalize") is True:
        try:
            job = encode.canonicalize_job(job, job.get("Namespace") or namespace_of(request))
        except encode.JobValidationError as exc:
            raise NomadError(400, str(exc)) from None
    return json_response(job)


async def job_route(request: Request, sim: Simulator) -> Response:
    job_id = request.path_params["job_id"]
    if request.method in ("PUT", "POST"):
        return await register_job(request, sim, job_id)
    ns = namespace_of(request)
    if request.method == "DELETE":
        purge = flag(request, "purge")
        result = sim.job_endpoint.deregister(ns, job_id, purge)
        return json_response(result, result["Index"])
    b = Blocking(request, sim)

    def compute() -> tuple[int, Any]:
        rec = sim.store.job(ns, job_id)
        if rec is None:
            raise NomadError(404, "job not found")
        return rec.spec["ModifyIndex"], rec.spec

    return await b.run((JOBS,), compute)


def _job_or_404(sim: Simulator, ns: str, job_id: str) -> Any:
    rec = sim.store.job(ns, job_id)
    if rec is None:
        raise NomadError(404, "job not found")
    return rec


async def job_allocations(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    b.stale()
    ns = namespace_of(request)
    job_id = request.path_params["job_id"]
    include_all = flag(request, "all")

    def compute() -> tuple[int, Any]:
        rec = sim.store.job(ns, job_id)
        allocs_tbl = b.table(ALLOCS)
        ids = sim.store.allocs_by_job.get((ns, job_id), set())
        out = []
        for a in sorted(
            (allocs_tbl[i] for i in ids if i in allocs_tbl), key=lambda a: a.create_index
        ):
            if (
                rec is not None
                and not include_all
                and a.job.get("CreateIndex") != rec.spec["CreateIndex"]
            ):
                continue
            out.append(sim.presenter.alloc_stub(a, False, True))
        return b.index(ALLOCS), out

    return await b.run((ALLOCS,), compute)


async def job_evaluations(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    ns = namespace_of(request)
    job_id = request.path_params["job_id"]

    def compute() -> tuple[int, Any]:
        evals = sim.store.job_evals(ns, job_id)
        return b.index(EVALS), [encode.evaluation(e) for e in evals]

    return await b.run((EVALS,), compute)


async def job_summary(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    ns = namespace_of(request)
    job_id = request.path_params["job_id"]

    def compute() -> tuple[int, Any]:
        rec = _job_or_404(sim, ns, job_id)
        summary = sim.presenter.job_summary(rec, b.table(ALLOCS))
        return summary["ModifyIndex"], summary

    return await b.run((JOBS, JOB_SUMMARY), compute)


async def job_versions(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    ns = namespace_of(request)
    job_id = request.path_params["job_id"]

    def compute() -> tuple[int, Any]:
        rec = sim.store.job(ns, job_id)
        if rec is None:
            raise NomadError(404, "job versions not found")
        versions = list(reversed(rec.versions))
        versions[0] = rec.spec
        return rec.spec["ModifyIndex"], {"Versions": versions, "Diffs": None}

    return await b.run((JOBS,), compute)


async def job_evaluate(request: Request, sim: Simulator) -> Response:
    result = sim.job_endpoint.evaluate(namespace_of(request), request.path_params["job_id"])
    return json_response(result, result["Index"])


# -- allocations --------------------------------------------------------------------


async def list_allocations(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    b.stale()
    ns = namespace_of(request)
    prefix = request.query_params.get("prefix", "")
    resources = flag(request, "resources")
    task_states = flag(request, "task_states", default=True)
    expression = filter_of(request)
    # `JobID == "a" or JobID == "b" ...` is answered from the by-job index.
    job_ids = expression.equality_set("JobID") if expression is not None else None

    def compute() -> tuple[int, Any]:
        table = b.table(ALLOCS)
        store = sim.store
        if job_ids is not None and ns != "*" and b.at_index is None:
            found = [table[i] for j in job_ids for i in store.allocs_by_job.get((ns, j), ())]
            found.sort(key=lambda a: (a.create_index, store.alloc_seq[a.id]))
            allocs = [a for a in found if a.id.startswith(prefix)]
        else:
            allocs = [
                a
                for a in table.values()
                if (ns == "*" or a.namespace == ns) and a.id.startswith(prefix)
            ]
            if job_ids is not None:
                allocs = [a for a in allocs if a.job_id in job_ids]
            elif expression is not None:
                allocs = [a for a in allocs if keep(expression, sim.presenter.alloc_datum(a))]
            allocs.sort(key=lambda a: a.create_index)
        body = json_array(sim.presenter.alloc_stub_json(a, resources, task_states) for a in allocs)
        return b.index(ALLOCS), body

    return await b.run((ALLOCS,), compute)


async def get_allocation(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    alloc_id = request.path_params["alloc_id"]

    def compute() -> tuple[int, Any]:
        alloc = sim.store.allocs.get(alloc_id)
        if alloc is None:
            raise NomadError(404, "alloc not found")
        return alloc.modify_index, sim.presenter.alloc(alloc)

    return await b.run((ALLOCS,), compute)


async def stop_allocation(request: Request, sim: Simulator) -> Response:
    result = sim.alloc_endpoint.stop(request.path_params["alloc_id"])
    return json_response(result, result["Index"])


# -- evaluations --------------------------------------------------------------------


async def list_evaluations(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    ns = namespace_of(request)
    prefix = request.query_params.get("prefix", "")
    job_filter = request.query_params.get("job")
    status_filter = request.query_params.get("status")

    def compute() -> tuple[int, Any]:
        out = [
            encode.evaluation(e)
            for e in sorted(b.table(EVALS).values(), key=lambda e: e.create_index)
            if (ns == "*" or e.namespace == ns)
            and e.id.startswith(prefix)
            and (job_filter is None or e.job_id == job_filter)
            and (status_filter is None or e.status == status_filter)
        ]
        return b.index(EVALS), out

    return await b.run((EVALS,), compute)


async def get_evaluation(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    eval_id = request.path_params["eval_id"]

    def compute() -> tuple[int, Any]:
        ev = sim.store.evals.get(eval_id)
        if ev is None:
            raise NomadError(404, "eval not found")
        return ev.modify_index, encode.evaluation(ev)

    return await b.run((EVALS,), compute)


async def evaluation_allocations(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    eval_id = request.path_params["eval_id"]

    def compute() -> tuple[int, Any]:
        allocs = sorted(
            (a for a in sim.store.allocs.values() if a.eval_id == eval_id),
            key=lambda a: a.create_index,
        )
        return b.index(ALLOCS), [sim.presenter.alloc_stub(a, False, True) for a in allocs]

    return await b.run((ALLOCS,), compute)


# -- nodes --------------------------------------------------------------------------


async def list_nodes(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    b.stale()
    prefix = request.query_params.get("prefix", "")
    resources = flag(request, "resources")

    def compute() -> tuple[int, Any]:
        nodes = sorted(b.table(NODES).values(), key=lambda n: n.create_index)
        body = [encode.node_stub(n, resources) for n in nodes if n.id.startswith(prefix)]
        return b.index(NODES), body

    return await b.run((NODES,), compute)


async def get_node(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    node_id = request.path_params["node_id"]

    def compute() -> tuple[int, Any]:
        node = sim.node_endpoint.get(node_id)
        return node.modify_index, encode.node_full(node)

    return await b.run((NODES,), compute)


async def node_allocations(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    node_id = request.path_params["node_id"]

    def compute() -> tuple[int, Any]:
        sim.node_endpoint.get(node_id)
        allocs = sim.store.node_allocs(node_id)
        return b.index(ALLOCS), [sim.presenter.alloc(a) for a in allocs]

    return await b.run((ALLOCS,), compute)


async def drain_node(request: Request, sim: Simulator) -> Response:
    body = await read_body(request) or {}
    if not isinstance(body, dict):
        raise NomadError(400, "Request decode failed: body must be an object")
    result = sim.node_endpoint.drain(
        request.path_params["node_id"], body.get("DrainSpec"), bool(body.get("MarkEligible"))
    )
    return json_response(result, result["Index"])


async def node_eligibility(request: Request, sim: Simulator) -> Response:
    body = await read_body(request) or {}
    if not isinstance(body, dict):
        raise NomadError(400, "Request decode failed: body must be an object")
    result = sim.node_endpoint.set_eligibility(
        request.path_params["node_id"], body.get("Eligibility")
    )
    return json_response(result, result["Index"])


# -- variables ------------------------------------------------------------------------


def _cas(request: Request) -> int | None:
    raw = request.query_params.get("cas")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise NomadError(
            400, f'can not parse cas: strconv.ParseUint: parsing "{raw}": invalid syntax'
        ) from None


async def variable_route(request: Request, sim: Simulator) -> Response:
    path = request.path_params["path"]
    ns = namespace_of(request)
    params = request.query_params
    lock_ops = [op for op in ("lock-acquire", "lock-renew", "lock-release") if op in params]
    try:
        if request.method == "GET":
            b = Blocking(request, sim)

            def compute() -> tuple[int, Any]:
                var = sim.variables.get(ns, path)
                if var is None:
                    raise NomadError(404, "variable not found")
                return var.modify_index, encode.variable(var, lock_id=True)

            return await b.run((VARIABLES,), compute)
        if request.method == "DELETE":
            sim.variables.delete(ns, path, _cas(request))
            return Response(status_code=204, headers={"X-Nomad-Index": str(sim.store.index)})
        if request.method != "PUT":
            raise NomadError(400, "Invalid method")
        if len(lock_ops) > 1:
            raise NomadError(400, "multiple lock operations")
        if lock_ops and "cas" in params:
            raise NomadError(400, "CAS can't be used with lock operations")
        body = await read_body(request)
        if not isinstance(body, dict):
            raise NomadError(400, "Request decode failed: body must be an object")
        lock = body.get("Lock") or {}
        if not isinstance(lock, dict):
            raise NomadError(400, "Request decode failed: Lock must be an object")
        items = body.get("Items")
        if items is not None and (
            not isinstance(items, dict) or not all(isinstance(v, str) for v in items.values())
        ):
            raise NomadError(400, "Request decode failed: Items must map strings to strings")
        if not lock_ops:
            if lock.get("TTL") or lock.get("LockDelay"):
                raise NomadError(400, "variable should not contain lock definition")
            var = sim.variables.put(ns, path, items or {}, _cas(request), lock.get("ID"))
            return json_response(encode.variable(var, lock_id=True), var.modify_index)
        op = lock_ops[0]
        if op == "lock-acquire":
            var = sim.variables.acquire(ns, path, items, lock.get("TTL"), lock.get("LockDelay"))
            return json_response(encode.variable(var, lock_id=True), var.modify_index)
        if items:
            raise NomadError(
                400, f"lock {op.removeprefix('lock-')} operation doesn't take variable items"
            )
        if not lock.get("ID"):
            raise NomadError(400, "missing lock information")
        if op == "lock-renew":
            var = sim.variables.renew(ns, path, lock["ID"])
            return json_response(encode.variable(var, with_items=False, lock_id=True))
        var = sim.variables.release(ns, path, lock["ID"])
        return json_response(encode.variable(var, with_items=False), var.modify_index)
    except VariableError as exc:
        if exc.body is not None:
            return json_response(exc.body, exc.body.get("ModifyIndex") or None, status=exc.status)
        if exc.status == 500:
            # The endpoint's own uncoded error: wrapped when forwarded.
            raise NomadError(500, exc.message, origin=Origin.PLAIN) from None
        return text(exc.status, exc.message)


async def list_variables(request: Request, sim: Simulator) -> Response:
    b = Blocking(request, sim)
    ns = namespace_of(request)
    prefix = request.query_params.get("prefix", "")

    def compute() -> tuple[int, Any]:
        out = [
            encode.variable(v, with_items=False, lock_id=True)
            for (var_ns, path), v in sorted(b.table(VARIABLES).items())
            if (ns == "*" or var_ns == ns) and path.startswith(prefix)
        ]
        return b.index(VARIABLES), out

    return await b.run((VARIABLES,), compute)


# -- event stream ---------------------------------------------------------------------


async def event_stream(request: Request, sim: Simulator) -> Response:
    raw_index = request.query_params.get("index") or "0"
    try:
        from_index = int(raw_index)
    except ValueError:
        raise NomadError(
            400, f'Unable to parse index: strconv.Atoi: parsing "{raw_index}": invalid syntax'
        ) from None
    try:
        topics = parse_topics(request.query_params.getlist("topic"))
    except ValueError as exc:
        raise NomadError(400, f"Invalid topic query: error parsing topics: {exc}") from None
    stream_to = hop_of(request).stream_to
    agent = sim.frontends.agent_of(request.scope)
    if stream_to is not None and not sim.frontends.rpc.open_stream(stream_to, agent.ip):
        # The server closed the streaming RPC connection unanswered: the
        # agent read EOF (command/agent/event_endpoint.go, CodedError 500).
        raise NomadError(500, "EOF")
    sub = sim.broker.subscribe(Subscription(topics, namespace_of(request)), from_index)
    sim.restarts.track_stream(sub, stream_to)

    async def stalled() -> None:
        """Hold everything while the stream is stalled: not a byte, no FIN."""
        # Faults are plain settings (PUT /_sim/faults), with nothing to wait
        # on: a stall is looked at again every 50 ms.
        while sim.faults.event_stream_stall and not sim.stopped:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def frames() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        interval = sim.config.heartbeat_interval_ms / 1000
        sent = 0
        try:
            if not sim.faults.heartbeat_loss:
                yield b"{}\n"
            next_beat = loop.time() + interval
            while True:
                try:
                    frame = await asyncio.wait_for(
                        sub.queue.get(), max(0.0, next_beat - loop.time())
                    )
                except TimeoutError:
                    await stalled()
                    if not sim.faults.heartbeat_loss:
                        yield b"{}\n"
                    next_beat = loop.time() + interval
                    continue
                if frame is None:
                    return
                await stalled()
                line = dumps(frame) + b"\n"
                yield line
                if (
                    sim.faults.event_duplicate_rate
                    and sim.fault_rng.random() < sim.faults.event_duplicate_rate
                ):
                    yield line
                sent += 1
                cut = sim.faults.event_stream_cut_every
                if cut and sent >= cut:
                    return
        finally:
            sim.broker.unsubscribe(sub)
            sim.restarts.forget_stream(sub)
            if stream_to is not None:
                sim.frontends.rpc.close_stream(stream_to, agent.ip)

    return StreamingResponse(
        frames(), media_type="application/json", headers={"Cache-Control": "no-cache"}
    )


# -- status and agent -------------------------------------------------------------------


async def status_leader(request: Request, sim: Simulator) -> Response:
    # The leader's RPC address; "" while none leads (nomad/status_endpoint.go).
    leader = sim.frontends.leader
    return json_response(f"{sim.frontends.by_name[leader].ip}:4647" if leader else "")


async def regions(request: Request, sim: Simulator) -> Response:
    return json_response(["global"])


async def agent_self(request: Request, sim: Simulator) -> Response:
    agent = sim.frontends.agent_of(request.scope)
    server = "false" if agent.node is not None else "true"
    leader = "true" if agent.name == sim.frontends.leader else "false"
    return json_response(
        {
            "config": {
                "Region": "global",
                "Datacenter": "dc1",
                "NodeName": agent.name,
                "Version": {"Version": "1.11.1", "VersionPrerelease": "", "Revision": "sim"},
                "ACL": {"Enabled": sim.acl.enabled},
            },
            "member": {
                "Name": f"{agent.name}.global",
                "Addr": "127.0.0.1",
                "Port": 4648,
                "Tags": {"region": "global", "dc": "dc1", "role": "nomad", "build": "1.11.1"},
                "Status": "alive",
            },
            "stats": {"nomad": {"leader": leader, "server": server, "known_regions": "1"}},
        }
    )


# -- simulator controls (/_sim) ---------------------------------------------------------


async def sim_faults(request: Request, sim: Simulator) -> Response:
    if request.method == "PUT":
        body = await read_body(request)
        try:
            sim.faults.update(body)
        except ValueError as exc:
            raise NomadError(400, str(exc)) from None
    return json_response(sim.faults.as_dict())


async def sim_stats(request: Request, sim: Simulator) -> Response:
    return json_response(sim.stats())


async def sim_connections(request: Request, sim: Simulator) -> Response:
    return json_response(sim.frontends.connections())


async def sim_alloc_oom(request: Request, sim: Simulator) -> Response:
    sim.task_exit(request.path_params["alloc_id"], oom=True)
    return json_response({"Index": sim.store.index})


async def sim_alloc_crash(request: Request, sim: Simulator) -> Response:
    sim.task_exit(request.path_params["alloc_id"], oom=False)
    return json_response({"Index": sim.store.index})


async def sim_node_down(request: Request, sim: Simulator) -> Response:
    sim.node_endpoint.set_status(request.path_params["node_id"], "down")
    return json_response({"Index": sim.store.index})


async def sim_node_up(request: Request, sim: Simulator) -> Response:
    sim.node_endpoint.set_status(request.path_params["node_id"], "ready")
    return json_response({"Index": sim.store.index})


def _seconds(request: Request, name: str, default: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise NomadError(400, f"{name} must be a number of seconds; found: {raw!r}") from None
    if not 0 <= value <= 3600:
        raise NomadError(400, f"{name} must be between 0 and 3600 seconds; found: {raw}")
    return value


def _agent_down(request: Request, sim: Simulator, default_s: float, reboot: bool) -> Response:
    down_s = _seconds(request, "down", default_s)
    node = sim.restarts.agent(request.path_params["node_id"], down_s, reboot=reboot)
    return json_response({"Node": node.id, "Name": node.name, "DownSeconds": down_s})


async def sim_agent_restart(request: Request, sim: Simulator) -> Response:
    return _agent_down(request, sim, 2.0, reboot=False)


def _down_and_election(request: Request, sim: Simulator) -> tuple[float, float]:
    return (
        _seconds(request, "down", 2.0),
        _seconds(request, "election", sim.config.election_ms / 1000),
    )


async def sim_server_restart(request: Request, sim: Simulator) -> Response:
    sim.restarts.server(request.path_params["name"], *_down_and_election(request, sim))
    return json_response(sim.restarts.servers_view())


async def sim_servers_restart(request: Request, sim: Simulator) -> Response:
    sim.restarts.all_servers(*_down_and_election(request, sim))
    return json_response(sim.restarts.servers_view())


async def sim_servers(request: Request, sim: Simulator) -> Response:
    return json_response(sim.restarts.servers_view())


async def sim_reboot(request: Request, sim: Simulator) -> Response:
    return _agent_down(request, sim, 20.0, reboot=True)


async def sim_docker_restart(request: Request, sim: Simulator) -> Response:
    killed = sim.restarts.docker(request.path_params["node_id"])
    return json_response({"Index": sim.store.index, "Killed": killed})


# -- wiring ---------------------------------------------------------------------------


def kind_of(template: str, method: str) -> Kind:
    """What a request is, for forwarding."""
    if not template.startswith("/v1/") or template in (
        "/v1/agent/self",
        "/v1/regions",
        "/v1/status/leader",
    ):
        return Kind.LOCAL
    if template == "/v1/event/stream":
        return Kind.STREAM
    return Kind.READ if method == "GET" else Kind.WRITE


def _wrap(
    sim: Simulator, template: str, handler: Handler
) -> Callable[[Request], Awaitable[Response]]:
    nomad_api = template.startswith("/v1/")

    async def endpoint(request: Request) -> Response:
        response = await serve(request)
        if sim.stopped:
            # Shutting down: no keep-alive, so a connection uvicorn accepted
            # in its last moments closes after this answer instead of idling
            # until the graceful-shutdown timeout.
            response.headers["Connection"] = "close"
        return response

    async def serve(request: Request) -> Response:
        key = f"{request.method} {template}"
        sim.requests[key] = sim.requests.get(key, 0) + 1
        agent = sim.frontends.agent_of(request.scope)
        stale = "stale" in request.query_params
        kind = kind_of(template, request.method)
        hop = sim.frontends.hop(agent, kind, stale)
        request.state.hop = hop
        try:
            if nomad_api and sim.acl.enabled:
                token = request.headers.get("X-Nomad-Token")
                auth = request.headers.get("Authorization", "")
                if auth.startswith("Bearer "):
                    token = token or auth[7:]
                if not sim.acl.known(token):
                    # The servers resolve tokens: an uncoded RPC error.
                    raise NomadError(403, "Permission denied", origin=Origin.PLAIN)
            if nomad_api:
                if kind in (Kind.READ, Kind.WRITE):
                    # A forwarded write or consistent read needs the leader.
                    await sim.restarts.leader_for(
                        agent, hop, needs_leader=hop.pool_hops > 0 and not hop.follower_view
                    )
                faults = sim.faults
                if faults.http_latency_ms:
                    await asyncio.sleep(faults.http_latency_ms / 1000)
                if faults.http_error_rate and sim.fault_rng.random() < faults.http_error_rate:
                    raise NomadError(500, "No cluster leader", origin=Origin.PLAIN)
                if (
                    faults.write_eof_rate
                    and hop.pool_hops
                    and kind is Kind.WRITE
                    and sim.fault_rng.random() < faults.write_eof_rate
                ):
                    # The leader's connection ended before its answer: the
                    # pool reads EOF, whether or not the write was committed.
                    if sim.fault_rng.random() < faults.write_eof_applied_rate:
                        await handler(request, sim)
                    raise NomadError(500, "EOF", origin=Origin.PLAIN)
            return await handler(request, sim)
        except NomadError as exc:
            answer = forwarding.answer(exc, hop.pool_hops if exc.hops is None else exc.hops)
            if exc.body is not None and answer.status == exc.status:
                return json_response(exc.body, status=exc.status)
            return text(answer.status, answer.text)

    return endpoint


def routes(sim: Simulator) -> list[BaseRoute]:
    table: list[tuple[str, Handler, list[str]]] = [
        ("/v1/jobs", list_jobs, ["GET"]),
        ("/v1/jobs", register_job, ["PUT", "POST"]),
        ("/v1/jobs/parse", parse_job, ["PUT", "POST"]),
        ("/v1/job/{job_id}", job_route, ["GET", "PUT", "POST", "DELETE"]),
        ("/v1/job/{job_id}/allocations", job_allocations, ["GET"]),
        ("/v1/job/{job_id}/evaluations", job_evaluations, ["GET"]),
        ("/v1/job/{job_id}/summary", job_summary, ["GET"]),
        ("/v1/job/{job_id}/versions", job_versions, ["GET"]),
        ("/v1/job/{job_id}/evaluate", job_evaluate, ["PUT", "POST"]),
        ("/v1/allocations", list_allocations, ["GET"]),
        ("/v1/allocation/{alloc_id}", get_allocation, ["GET"]),
        ("/v1/allocation/{alloc_id}/stop", stop_allocation, ["PUT", "POST"]),
        ("/v1/evaluations", list_evaluations, ["GET"]),
        ("/v1/evaluation/{eval_id}", get_evaluation, ["GET"]),
        ("/v1/evaluation/{eval_id}/allocations", evaluation_allocations, ["GET"]),
        ("/v1/nodes", list_nodes, ["GET"]),
        ("/v1/node/{node_id}", get_node, ["GET"]),
        ("/v1/node/{node_id}/allocations", node_allocations, ["GET"]),
        ("/v1/node/{node_id}/drain", drain_node, ["PUT", "POST"]),
        ("/v1/node/{node_id}/eligibility", node_eligibility, ["PUT", "POST"]),
        ("/v1/vars", list_variables, ["GET"]),
        ("/v1/var/{path:path}", variable_route, ["GET", "PUT", "DELETE", "POST"]),
        ("/v1/event/stream", event_stream, ["GET"]),
        ("/v1/status/leader", status_leader, ["GET"]),
        ("/v1/regions", regions, ["GET"]),
        ("/v1/agent/self", agent_self, ["GET"]),
        ("/_sim/faults", sim_faults, ["GET", "PUT"]),
        ("/_sim/stats", sim_stats, ["GET"]),
        ("/_sim/connections", sim_connections, ["GET"]),
        ("/_sim/allocation/{alloc_id}/oom", sim_alloc_oom, ["POST"]),
        ("/_sim/allocation/{alloc_id}/crash", sim_alloc_crash, ["POST"]),
        ("/_sim/node/{node_id}/down", sim_node_down, ["POST"]),
        ("/_sim/node/{node_id}/up", sim_node_up, ["POST"]),
        ("/_sim/node/{node_id}/agent-restart", sim_agent_restart, ["POST"]),
        ("/_sim/node/{node_id}/docker-restart", sim_docker_restart, ["POST"]),
        ("/_sim/node/{node_id}/reboot", sim_reboot, ["POST"]),
        ("/_sim/servers", sim_servers, ["GET"]),
        ("/_sim/servers/restart", sim_servers_restart, ["POST"]),
        ("/_sim/server/{name}/restart", sim_server_restart, ["POST"]),
    ]
    wrapped: list[BaseRoute] = [
        Route(path, _wrap(sim, path, handler), methods=methods) for path, handler, methods in table
    ]
    # Allocation exec is a WebSocket (alloc_exec.py); asked without an
    # upgrade it is refused as gorilla/websocket refuses it.
    return [
        *wrapped,
        WebSocketRoute(EXEC_ROUTE, exec_endpoint(sim)),
        Route(EXEC_ROUTE, not_upgraded_endpoint(sim), methods=["GET"]),
    ]
