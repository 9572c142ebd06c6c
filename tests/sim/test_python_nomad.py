"""python-nomad 2.1.0, unchanged, drives the simulator over Nomad's HTTP API.

Every call below goes through the library's own request building and error
mapping, so these tests pin the wire details it depends on: paths, methods,
query parameters, JSON bodies, status codes (403/404/409/204) and the event
stream's newline-delimited frames with `{}` heartbeats. Each test runs twice:
on the tests' default entry and through a client agent of the production
topology, where every call is forwarded."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import nomad
import nomad.api.exceptions as nomad_exc
import pytest

from nomadsim import SimServer
from tests.helpers import runner_job, wait_until
from tests.support.sim import PRODUCTION


@pytest.fixture(params=["default", "client-agent"])
def make_sim(
    request: pytest.FixtureRequest, make_sim: Callable[..., SimServer]
) -> Callable[..., SimServer]:
    """conftest's `make_sim`, also in the production topology."""
    topology = PRODUCTION if request.param == "client-agent" else {}
    return lambda **overrides: make_sim(**{**topology, **overrides})


def client(sim: SimServer, token: str | None = None) -> Any:
    return nomad.Nomad(address=sim.address, timeout=5, token=token)


def running_allocs(n: Any, job_id: str) -> list[dict[str, Any]]:
    return [
        a
        for a in n.job.get_allocations(job_id)
        if a["DesiredStatus"] == "run" and a["ClientStatus"] == "running"
    ]


def wait_running(n: Any, job_id: str, count: int) -> list[dict[str, Any]]:
    """Wait until exactly `count` allocations of the job run; return them."""

    def check() -> list[dict[str, Any]]:
        running = running_allocs(n, job_id)
        return running if len(running) == count else []

    return wait_until(check)


def wait_for(fetch: Callable[[], dict[str, Any]], ok: Callable[[dict[str, Any]], bool]) -> Any:
    """Poll `fetch` until `ok` holds for its result; return that result."""

    def check() -> dict[str, Any] | None:
        value = fetch()
        return value if ok(value) else None

    return wait_until(check)


# -- jobs ---------------------------------------------------------------------------


def test_register_read_and_list_jobs(sim: SimServer) -> None:
    n = client(sim)

    via_job = n.job.register_job("pn-batch", {"Job": runner_job("pn-batch")})
    via_jobs = n.jobs.register_job({"Job": runner_job("pn-svc", job_type="service", count=2)})
    n.jobs.register_job({"Job": runner_job("other", job_type="service")})
    for resp in (via_job, via_jobs):
        assert resp["EvalID"]
        assert resp["EvalCreateIndex"] > 0
        assert resp["JobModifyIndex"] > 0

    job = n.job.get_job("pn-svc")
    assert job["ID"] == "pn-svc"
    assert job["Type"] == "service"
    assert [g["Name"] for g in job["TaskGroups"]] == ["default-group", "config"]
    assert job["TaskGroups"][0]["Count"] == 2
    assert job["TaskGroups"][1]["Meta"] == {"used": "false", "timeout": "0"}

    listed = n.jobs.get_jobs(prefix="pn-")
    assert sorted(j["ID"] for j in listed) == ["pn-batch", "pn-svc"]
    assert {j["ID"] for j in n.jobs.get_jobs()} == {"pn-batch", "pn-svc", "other"}
    stub = next(j for j in listed if j["ID"] == "pn-svc")
    assert stub["Type"] == "service"
    assert set(stub["JobSummary"]["Summary"]) == {"default-group", "config"}

    # Job's mapping protocol: `in` and [] go through get_job and its 404 mapping.
    assert "pn-batch" in n.job
    assert "missing" not in n.job
    assert n.job["pn-svc"]["ID"] == "pn-svc"
    with pytest.raises(KeyError):
        n.job["missing"]
    # Jobs' mapping protocol lists jobs.
    assert "pn-svc" in n.jobs
    assert n.jobs["pn-batch"]["ID"] == "pn-batch"
    assert len(n.jobs) == 3

    with pytest.raises(nomad_exc.URLNotFoundNomadException):
        n.job.get_job("missing")
    with pytest.raises(nomad_exc.URLNotFoundNomadException):
        n.job.get_summary("missing")
    with pytest.raises(nomad_exc.URLNotFoundNomadException):
        n.job.get_versions("missing")


def test_job_allocations_evaluations_summary(sim: SimServer) -> None:
    n = client(sim)
    reg = n.jobs.register_job({"Job": runner_job("pn-svc", job_type="service", count=2)})

    allocs = wait_running(n, "pn-svc", 2)
    assert {a["JobID"] for a in allocs} == {"pn-svc"}
    assert {a["TaskGroup"] for a in allocs} == {"default-group"}
    assert all(a["EvalID"] == reg["EvalID"] for a in allocs)

    evals = n.job.get_evaluations("pn-svc")
    assert [e["ID"] for e in evals] == [reg["EvalID"]]
    assert evals[0]["JobID"] == "pn-svc"
    assert evals[0]["TriggeredBy"] == "job-register"

    summary = wait_for(
        lambda: n.job.get_summary("pn-svc"),
        lambda s: s["Summary"]["default-group"]["Running"] == 2,
    )
    assert summary["JobID"] == "pn-svc"
    assert summary["Summary"]["config"]["Running"] == 0

    ev = n.job.evaluate_job("pn-svc")
    assert ev["EvalID"]
    assert ev["EvalID"] != reg["EvalID"]
    wait_until(lambda: n.evaluation.get_evaluation(ev["EvalID"])["Status"] == "complete")
    forced = n.evaluation.get_evaluation(ev["EvalID"])
    assert forced["JobID"] == "pn-svc"
    assert forced["TriggeredBy"] == "job-register"
    assert ev["EvalID"] in {e["ID"] for e in n.job.get_evaluations("pn-svc")}
    # A forced evaluation of an unchanged job places nothing new.
    assert {a["ID"] for a in running_allocs(n, "pn-svc")} == {a["ID"] for a in allocs}


def test_job_versions(sim: SimServer) -> None:
    n = client(sim)
    n.job.register_job("pn-svc", {"Job": runner_job("pn-svc", job_type="service")})
    n.job.register_job(
        "pn-svc", {"Job": runner_job("pn-svc", job_type="service", meta={"used": "true"})}
    )

    versions = n.job.get_versions("pn-svc")["Versions"]
    assert [v["Version"] for v in versions] == [1, 0]
    assert versions[0]["TaskGroups"][1]["Meta"] == {"used": "true"}
    assert versions[1]["TaskGroups"][1]["Meta"] == {"used": "false", "timeout": "0"}
    assert n.job.get_job("pn-svc")["Version"] == 1


def test_deregister_and_purge(sim: SimServer) -> None:
    n = client(sim)
    n.jobs.register_job({"Job": runner_job("pn-stop", job_type="service")})
    n.jobs.register_job({"Job": runner_job("pn-purge", job_type="service")})
    wait_until(lambda: running_allocs(n, "pn-stop") and running_allocs(n, "pn-purge"))

    stopped = n.job.deregister_job("pn-stop")
    assert stopped["EvalID"]
    # Stopped but not purged: still readable, marked Stop, and its allocations stop.
    assert "pn-stop" in n.job
    assert n.job.get_job("pn-stop")["Stop"] is True
    wait_until(
        lambda: all(a["ClientStatus"] == "complete" for a in n.job.get_allocations("pn-stop"))
    )
    wait_until(lambda: n.job.get_job("pn-stop")["Status"] == "dead")

    purged = n.job.deregister_job("pn-purge", purge=True)
    assert purged["EvalID"]
    assert "pn-purge" not in n.job
    with pytest.raises(nomad_exc.URLNotFoundNomadException):
        n.job.get_job("pn-purge")
    with pytest.raises(KeyError):
        n.job["pn-purge"]
    assert [j["ID"] for j in n.jobs.get_jobs(prefix="pn-")] == ["pn-stop"]


# -- allocations and evaluations ------------------------------------------------------


def test_allocations_and_stop(sim: SimServer) -> None:
    n = client(sim)
    n.jobs.register_job({"Job": runner_job("pn-svc", job_type="service", count=2)})
    first = wait_running(n, "pn-svc", 2)

    listed = n.allocations.get_allocations()
    assert {a["ID"] for a in listed} == {a["ID"] for a in first}
    prefix = first[0]["ID"][:8]
    assert [a["ID"] for a in n.allocations.get_allocations(prefix=prefix)] == [first[0]["ID"]]
    assert len(n.allocations) == 2

    victim = first[0]["ID"]
    alloc = n.allocation.get_allocation(victim)
    assert alloc["ID"] == victim
    assert alloc["JobID"] == "pn-svc"
    assert alloc["Job"]["ID"] == "pn-svc"
    assert alloc["ClientStatus"] == "running"
    assert "default-task" in alloc["TaskStates"]

    stop = n.allocation.stop_allocation(victim)
    assert stop["EvalID"]
    assert stop["Index"] > 0
    wait_until(lambda: n.allocation.get_allocation(victim)["ClientStatus"] == "complete")
    assert n.allocation.get_allocation(victim)["DesiredStatus"] == "stop"
    # The service job is topped back up with a replacement.
    replaced = wait_until(
        lambda: len(r := running_allocs(n, "pn-svc")) == 2 and victim not in {a["ID"] for a in r}
    )
    assert replaced
    assert n.evaluation.get_evaluation(stop["EvalID"])["JobID"] == "pn-svc"

    with pytest.raises(nomad_exc.URLNotFoundNomadException):
        n.allocation.get_allocation("00000000-0000-0000-0000-000000000000")


def test_evaluations(sim: SimServer) -> None:
    n = client(sim)
    a = n.jobs.register_job({"Job": runner_job("pn-a")})
    b = n.jobs.register_job({"Job": runner_job("pn-b")})

    ids = {e["ID"] for e in n.evaluations.get_evaluations()}
    assert {a["EvalID"], b["EvalID"]} <= ids
    prefixed = n.evaluations.get_evaluations(prefix=a["EvalID"][:8])
    assert [e["ID"] for e in prefixed] == [a["EvalID"]]
    assert a["EvalID"] in n.evaluations

    ev = wait_for(
        lambda: n.evaluation.get_evaluation(a["EvalID"]), lambda e: e["Status"] == "complete"
    )
    assert ev["ID"] == a["EvalID"]
    assert ev["JobID"] == "pn-a"
    assert ev["Type"] == "batch"
    assert ev["TriggeredBy"] == "job-register"
    allocs = n.evaluation.get_allocations(a["EvalID"])
    assert [x["JobID"] for x in allocs] == ["pn-a"]

    with pytest.raises(nomad_exc.URLNotFoundNomadException):
        n.evaluation.get_evaluation("00000000-0000-0000-0000-000000000000")


# -- nodes ----------------------------------------------------------------------------


def test_nodes_read(sim: SimServer) -> None:
    n = client(sim)
    nodes = n.nodes.get_nodes()
    assert len(nodes) == 3
    assert all(x["Status"] == "ready" and x["SchedulingEligibility"] == "eligible" for x in nodes)
    assert all(x["Drain"] is False for x in nodes)
    assert n.nodes.get_nodes(prefix=nodes[0]["ID"][:8])[0]["ID"] == nodes[0]["ID"]

    node = n.node.get_node(nodes[0]["ID"])
    assert node["ID"] == nodes[0]["ID"]
    assert node["Name"] == nodes[0]["Name"]
    assert node["DrainStrategy"] is None
    assert "docker" in node["Drivers"]
    assert nodes[0]["ID"] in n.node

    n.jobs.register_job({"Job": runner_job("pn-svc", job_type="service", count=3)})
    allocs = wait_running(n, "pn-svc", 3)
    by_node: dict[str, set[str]] = {}
    for a in allocs:
        by_node.setdefault(a["NodeID"], set()).add(a["ID"])
    for node_id, alloc_ids in by_node.items():
        on_node = n.node.get_allocations(node_id)
        assert {a["ID"] for a in on_node} == alloc_ids
        assert all(a["NodeID"] == node_id for a in on_node)

    with pytest.raises(nomad_exc.URLNotFoundNomadException):
        n.node.get_node("00000000-0000-0000-0000-000000000000")


def test_drain_and_eligibility(sim: SimServer) -> None:
    n = client(sim)
    n.jobs.register_job({"Job": runner_job("pn-svc", job_type="service", count=2)})
    allocs = wait_running(n, "pn-svc", 2)
    node_id = allocs[0]["NodeID"]
    drained_allocs = {a["ID"] for a in allocs if a["NodeID"] == node_id}

    resp = n.node.drain_node_with_spec(node_id, {"Deadline": -1, "IgnoreSystemJobs": False})
    assert resp["NodeModifyIndex"] > 0
    node = n.node.get_node(node_id)
    assert node["SchedulingEligibility"] == "ineligible"
    if node["DrainStrategy"] is not None:  # a forced drain may already be done
        assert node["DrainStrategy"]["Deadline"] == -1
        assert node["DrainStrategy"]["IgnoreSystemJobs"] is False

    # The drained allocations are replaced elsewhere and the drain completes.
    def migrated() -> bool:
        running = running_allocs(n, "pn-svc")
        return len(running) == 2 and all(a["NodeID"] != node_id for a in running)

    wait_until(migrated)
    wait_until(
        lambda: all(
            n.allocation.get_allocation(i)["ClientStatus"] == "complete" for i in drained_allocs
        )
    )
    done = wait_for(lambda: n.node.get_node(node_id), lambda x: x["DrainStrategy"] is None)
    assert done["SchedulingEligibility"] == "ineligible"
    assert done["LastDrain"]["Status"] == "complete"

    # Disabling the drain with MarkEligible makes the node eligible again.
    n.node.drain_node_with_spec(node_id, None, mark_eligible=True)
    node = n.node.get_node(node_id)
    assert node["DrainStrategy"] is None
    assert node["SchedulingEligibility"] == "eligible"

    n.node.eligible_node(node_id, ineligible=True)
    assert n.node.get_node(node_id)["SchedulingEligibility"] == "ineligible"
    stub = next(x for x in n.nodes.get_nodes() if x["ID"] == node_id)
    assert stub["SchedulingEligibility"] == "ineligible"
    n.node.eligible_node(node_id, eligible=True)
    assert n.node.get_node(node_id)["SchedulingEligibility"] == "eligible"


def test_disable_drain_in_progress(sim: SimServer) -> None:
    """A drain with a long deadline can be turned off before it finishes."""
    n = client(sim)
    node_id = n.nodes.get_nodes()[0]["ID"]
    hour = 3600 * 1_000_000_000
    n.node.drain_node_with_spec(node_id, {"Deadline": hour, "IgnoreSystemJobs": True})
    node = n.node.get_node(node_id)
    # An empty node finishes its drain at once; otherwise the strategy is visible.
    if node["DrainStrategy"] is not None:
        assert node["DrainStrategy"]["Deadline"] == hour
        assert node["DrainStrategy"]["IgnoreSystemJobs"] is True
    assert node["SchedulingEligibility"] == "ineligible"

    n.node.drain_node_with_spec(node_id, None, mark_eligible=True)
    node = n.node.get_node(node_id)
    assert node["DrainStrategy"] is None
    assert node["SchedulingEligibility"] == "eligible"


# -- variables ------------------------------------------------------------------------


def test_variables(sim: SimServer) -> None:
    n = client(sim)
    created = n.variable.create_variable("pn/app/config", {"Items": {"user": "alice"}})
    assert created["Path"] == "pn/app/config"
    assert created["Items"] == {"user": "alice"}
    n.variable.create_variable("pn/other", {"Items": {"k": "v"}})
    n.variable.create_variable("elsewhere", {"Items": {"k": "v"}})

    got = n.variable.get_variable("pn/app/config")
    assert got["Items"] == {"user": "alice"}
    assert got["Namespace"] == "default"
    assert got["ModifyIndex"] == created["ModifyIndex"]
    assert "pn/app/config" in n.variable
    assert "pn/missing" not in n.variable
    with pytest.raises(nomad_exc.URLNotFoundNomadException):
        n.variable.get_variable("pn/missing")

    # Check-and-set: the current ModifyIndex wins, a stale one conflicts with 409.
    updated = n.variable.create_variable(
        "pn/app/config", {"Items": {"user": "bob"}}, cas=got["ModifyIndex"]
    )
    assert updated["Items"] == {"user": "bob"}
    assert updated["ModifyIndex"] > got["ModifyIndex"]
    with pytest.raises(nomad_exc.VariableConflict) as conflict:
        n.variable.create_variable(
            "pn/app/config", {"Items": {"user": "mallory"}}, cas=got["ModifyIndex"]
        )
    assert conflict.value.nomad_resp.status_code == 409
    assert conflict.value.nomad_resp.json()["ModifyIndex"] == updated["ModifyIndex"]
    assert n.variable.get_variable("pn/app/config")["Items"] == {"user": "bob"}
    # cas=0 means "only if it does not exist yet".
    with pytest.raises(nomad_exc.VariableConflict):
        n.variable.create_variable("pn/app/config", {"Items": {"x": "y"}}, cas=0)
    fresh = n.variable.create_variable("pn/new", {"Items": {"x": "y"}}, cas=0)
    assert fresh["Items"] == {"x": "y"}

    listed = n.variables.get_variables(prefix="pn/")
    assert [v["Path"] for v in listed] == ["pn/app/config", "pn/new", "pn/other"]
    assert all("Items" not in v for v in listed)
    assert {v["Path"] for v in n.variables.get_variables()} == {
        "pn/app/config",
        "pn/new",
        "pn/other",
        "elsewhere",
    }
    assert "pn/other" in n.variables

    deleted = n.variable.delete_variable("pn/other")
    assert deleted.status_code == 204
    assert "pn/other" not in n.variable
    with pytest.raises(nomad_exc.VariableConflict):
        n.variable.delete_variable("pn/new", cas=fresh["ModifyIndex"] - 1)
    assert n.variable.delete_variable("pn/new", cas=fresh["ModifyIndex"]).status_code == 204
    assert [v["Path"] for v in n.variables.get_variables(prefix="pn/")] == ["pn/app/config"]


# -- event stream -----------------------------------------------------------------------


def _next_event(q: queue.Queue[Any], match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Read frames until an event matches; each get waits at most 5 s."""
    while True:
        frame = q.get(timeout=5)
        for event in frame["Events"]:
            if match(event):
                return dict(event)


@contextlib.contextmanager
def event_stream(
    sim: SimServer, n: Any, **kwargs: Any
) -> Iterator[tuple[threading.Thread, threading.Event, queue.Queue[Any]]]:
    """python-nomad's stream helper, started, and always stopped afterwards.

    Its thread is not a daemon and only checks `exit_event` after reading a
    line, so it is stopped by setting the event and then closing the stream
    (stopping the simulator); heartbeats alone would also wake it."""
    thread, exit_event, q = n.event.stream.get_stream(**kwargs)
    assert thread.daemon is False
    thread.start()
    try:
        yield thread, exit_event, q
    finally:
        exit_event.set()
        sim.stop()
        thread.join(timeout=5)
    assert not thread.is_alive(), "python-nomad's event stream thread did not stop"


@pytest.mark.parametrize(
    "topic",
    [
        pytest.param(["Job:pn-watched"], id="topic-key"),
        # python-nomad documents a dict; requests sends only its key (`topic=Job`).
        pytest.param({"Job": "pn-watched"}, id="topic-dict"),
    ],
)
def test_event_stream_helper(make_sim: Callable[..., SimServer], topic: Any) -> None:
    sim = make_sim()
    n = client(sim)
    with event_stream(sim, n, index=0, topic=topic, timeout=10) as (thread, exit_event, q):
        # The subscription is made on the helper's thread; let it reach the broker so
        # this test does not depend on index=0 replaying the buffer (tested below).
        wait_until(lambda: sim.sim.broker.subscribers == 1)
        n.jobs.register_job({"Job": runner_job("pn-unwatched")})
        reg = n.jobs.register_job({"Job": runner_job("pn-watched")})

        event = _next_event(q, lambda e: e["Type"] == "JobRegistered")
        assert event["Topic"] == "Job"
        if isinstance(topic, list):
            # Keyed subscription: the other job's earlier event never arrives.
            assert event["Key"] == "pn-watched"
        elif event["Key"] != "pn-watched":
            assert event["Key"] == "pn-unwatched"
            event = _next_event(
                q, lambda e: e["Type"] == "JobRegistered" and e["Key"] == "pn-watched"
            )
        assert event["Key"] == "pn-watched"
        assert event["Namespace"] == "default"
        assert event["Payload"]["Job"]["ID"] == "pn-watched"
        assert event["Index"] >= reg["JobModifyIndex"]
        assert all(e["Topic"] == "Job" for f in list(q.queue) for e in f["Events"]), (
            "only Job events were subscribed to"
        )

        # The loop checks exit_event after every line, heartbeats included, so it
        # ends on the next heartbeat even while the stream stays open.
        exit_event.set()
        thread.join(timeout=5)
        assert not thread.is_alive(), "event stream thread did not stop after exit_event"


def test_event_stream_index_zero_replays_buffer(make_sim: Callable[..., SimServer]) -> None:
    """index=0 starts at the oldest buffered event, as Nomad's broker does
    (`Subscribe`: `req.Index == 0` -> `eventBuf.Head()`), so events committed
    before the helper's thread connects are not lost."""
    sim = make_sim()
    n = client(sim)
    reg = n.jobs.register_job({"Job": runner_job("pn-before")})
    with event_stream(sim, n, index=0, topic=["Job:pn-before"], timeout=10) as (_, _, q):
        try:
            event = _next_event(q, lambda e: e["Type"] == "JobRegistered")
        except queue.Empty:
            pytest.fail("index=0 did not replay the buffered JobRegistered event")
        assert event["Key"] == "pn-before"
        assert event["Index"] == reg["JobModifyIndex"]


# -- ACL ------------------------------------------------------------------------------------


def test_acl_token(make_sim: Callable[..., SimServer]) -> None:
    sim = make_sim(acl_token="secret")
    authed = client(sim, token="secret")
    anonymous = client(sim)
    wrong = client(sim, token="not-the-secret")

    reg = authed.jobs.register_job({"Job": runner_job("pn-acl")})
    assert reg["EvalID"]
    assert [j["ID"] for j in authed.jobs.get_jobs()] == ["pn-acl"]
    assert authed.job.get_job("pn-acl")["ID"] == "pn-acl"
    assert len(authed.nodes.get_nodes()) == 3
    authed.variable.create_variable("pn/secret", {"Items": {"k": "v"}})
    assert authed.variable.get_variable("pn/secret")["Items"] == {"k": "v"}

    for c in (anonymous, wrong):
        with pytest.raises(nomad_exc.URLNotAuthorizedNomadException) as denied:
            c.jobs.get_jobs()
        assert denied.value.nomad_resp.status_code == 403
        with pytest.raises(nomad_exc.URLNotAuthorizedNomadException):
            c.job.get_job("pn-acl")
        with pytest.raises(nomad_exc.URLNotAuthorizedNomadException):
            c.jobs.register_job({"Job": runner_job("pn-denied")})
        with pytest.raises(nomad_exc.URLNotAuthorizedNomadException):
            c.nodes.get_nodes()
        with pytest.raises(nomad_exc.URLNotAuthorizedNomadException):
            c.variable.get_variable("pn/secret")
    assert [j["ID"] for j in authed.jobs.get_jobs()] == ["pn-acl"]
