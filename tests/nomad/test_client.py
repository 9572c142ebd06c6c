"""NomadClient against the simulator: jobs, EnforceIndex conflicts, retries,
errors, namespaces, blocking queries, allocations and variable locks."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import requests

from controller.nomad.aclient import AsyncJobWriter
from controller.nomad.client import NomadClient, go_duration
from controller.nomad.connection import NomadConnection
from controller.nomad.errors import Kind, unwrap
from controller.nomad.gateway import (
    IndexConflict,
    JobListing,
    Lock,
    LockHeld,
    NomadAPIError,
    NomadGateway,
    NomadUnavailable,
)
from controller.nomad.session import DirectSession
from nomadsim import SimConfig, SimServer
from tests.helpers import Http, runner_job, wait_until
from tests.support.http_stub import address_of, serve_in_thread
from tests.support.ports import free_port
from tests.support.sim import FAST


class Recorder:
    """The on_request hook: remembers (operation, outcome) and (operation, status)
    of every HTTP request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.statuses: list[tuple[str, str]] = []
        self.after: Callable[[str, str], None] | None = None

    def __call__(self, operation: str, outcome: str, status: str, seconds: float) -> None:
        self.statuses.append((operation, status))
        assert seconds >= 0
        self.calls.append((operation, outcome))
        if self.after is not None:
            self.after(operation, outcome)

    def outcomes(self, operation: str) -> list[str]:
        return [o for op, o in self.calls if op == operation]


# make_client's keywords that say where and how (NomadConnection's fields).
WHERE = ("token", "namespace", "region", "ca_cert", "client_cert", "client_key", "verify")


def make_client(address: str, **kwargs: Any) -> tuple[NomadClient, Recorder]:
    recorder = Recorder()
    kwargs.setdefault("retry_max_wait_s", 0.01)
    kwargs.setdefault("timeout_s", 5.0)
    wheres = {k: kwargs.pop(k) for k in WHERE if k in kwargs}
    connection = NomadConnection(address=address, **wheres)
    return NomadClient(connection, on_request=recorder, **kwargs), recorder


@pytest.fixture(scope="module")
def shared() -> Iterator[SimServer]:
    """One simulator for the tests that inject no faults and need no quiet
    cluster; each of them works in its own namespace (see `ns`)."""
    config: dict[str, Any] = dict(FAST)
    server = SimServer(SimConfig(**config))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def ns(request: pytest.FixtureRequest) -> str:
    """A namespace of the test's own on the shared simulator."""
    return "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[5:60].strip("-")


def set_faults(sim: SimServer, **faults: Any) -> None:
    response = Http(sim.address).request("PUT", "/_sim/faults", json=faults)
    assert response.status_code == 200, response.text


def test_is_a_gateway(shared: SimServer, ns: str) -> None:
    gateway: NomadGateway = make_client(shared.address, namespace=ns)[0]
    assert isinstance(gateway, NomadClient)


# -- jobs -------------------------------------------------------------------------


def test_register_get_list_deregister_roundtrip(shared: SimServer, ns: str) -> None:
    client, recorder = make_client(shared.address, namespace=ns)
    created = client.register_job(runner_job("1-a"), enforce_index=0)
    assert created.job_modify_index > 0
    assert created.index >= created.job_modify_index
    client.register_job(runner_job("2-b"))

    job = client.get_job("1-a")
    assert job is not None
    assert job["ID"] == "1-a"
    assert job["JobModifyIndex"] == created.job_modify_index
    assert job["TaskGroups"][1]["Meta"] == {"used": "false", "timeout": "0"}

    listing = client.list_jobs(prefix="1-")
    assert [s.id for s in listing.jobs] == ["1-a"]
    stub = listing.jobs[0]
    assert (stub.job_modify_index, stub.type, stub.stop) == (
        created.job_modify_index,
        "batch",
        False,
    )
    assert stub.create_index == created.job_modify_index
    assert stub.submit_time > 0
    assert listing.index >= created.index
    assert {s.id for s in client.list_jobs().jobs} == {"1-a", "2-b"}

    removed = client.deregister_job("1-a")
    assert removed.index > created.index
    assert removed.job_modify_index == 0
    assert client.get_job("1-a") is None
    assert [s.id for s in client.list_jobs().jobs] == ["2-b"]
    assert set(recorder.outcomes("get_job")) == {"ok"}  # a 404 is an answer, not an error


def test_deregister_without_purge_stops_the_job(shared: SimServer, ns: str) -> None:
    client, _ = make_client(shared.address, namespace=ns)
    client.register_job(runner_job("1-a"))
    client.deregister_job("1-a", purge=False)
    job = client.get_job("1-a")
    assert job is not None and job["Stop"] is True
    assert [s.stop for s in client.list_jobs().jobs] == [True]


def test_deregister_missing_job_is_fine(shared: SimServer, ns: str) -> None:
    client, recorder = make_client(shared.address, namespace=ns)
    result = client.deregister_job("never-existed")
    assert result.job_modify_index == 0
    assert recorder.outcomes("deregister_job") == ["ok"]


def test_enforce_index_conflicts_are_raised_at_once(shared: SimServer, ns: str) -> None:
    client, recorder = make_client(shared.address, namespace=ns)
    first = client.register_job(runner_job("1-a"), enforce_index=0)

    with pytest.raises(IndexConflict, match="job already exists"):
        client.register_job(runner_job("1-a"), enforce_index=0)
    claimed = runner_job("1-a", meta={"used": "true", "timeout": "60"})
    second = client.register_job(claimed, enforce_index=first.job_modify_index)
    assert second.job_modify_index > first.job_modify_index
    with pytest.raises(IndexConflict, match="conflicting job modify index"):
        client.register_job(runner_job("1-a"), enforce_index=first.job_modify_index)
    with pytest.raises(IndexConflict, match="job does not exist"):
        client.register_job(runner_job("9-z"), enforce_index=7)

    # Each conflict was one request, never retried.
    assert recorder.outcomes("register_job") == ["ok", "conflict", "ok", "conflict", "conflict"]
    statuses = [st for op, st in recorder.statuses if op == "register_job"]
    assert statuses == ["200", "500", "200", "500", "500"]
    job = client.get_job("1-a")
    assert job is not None and job["TaskGroups"][1]["Meta"]["used"] == "true"


def test_invalid_job_is_an_api_error(shared: SimServer, ns: str) -> None:
    client, recorder = make_client(shared.address, namespace=ns, retry_attempts=2)
    with pytest.raises(NomadAPIError) as info:
        client.register_job({"Type": "batch"})  # no ID
    assert info.value.status == 400
    assert recorder.outcomes("register_job") == ["error"]
    assert recorder.statuses == [("register_job", "400")]


# -- retries and failures -----------------------------------------------------------


def test_a_burst_of_no_leader_errors_is_retried(sim: SimServer) -> None:
    client, recorder = make_client(sim.address)
    client.register_job(runner_job("1-a"))
    set_faults(sim, http_error_rate=1.0)

    def end_burst_after_two(operation: str, outcome: str) -> None:
        if recorder.outcomes("list_jobs") == ["error", "error"]:
            set_faults(sim, http_error_rate=0)

    recorder.after = end_burst_after_two
    listing = client.list_jobs()
    assert [s.id for s in listing.jobs] == ["1-a"]
    assert recorder.outcomes("list_jobs") == ["error", "error", "ok"]


def test_persistent_5xx_gives_up_after_the_attempts(sim: SimServer) -> None:
    client, recorder = make_client(sim.address, retry_attempts=3)
    set_faults(sim, http_error_rate=1.0)
    with pytest.raises(NomadAPIError) as info:
        client.get_job("1-a")
    # Through a client agent Nomad's text comes wrapped: `rpc error: No cluster leader`.
    assert (info.value.status, unwrap(info.value.message)) == (500, "No cluster leader")
    assert info.value.kind is Kind.SERVER
    assert recorder.outcomes("get_job") == ["error"] * 3


def test_4xx_is_not_retried(make_sim: Callable[..., SimServer]) -> None:
    server = make_sim(acl_token="s3cret")
    client, recorder = make_client(server.address, token="wrong")
    with pytest.raises(NomadAPIError) as info:
        client.list_jobs()
    assert (info.value.status, info.value.message) == (403, "Permission denied")
    assert recorder.outcomes("list_jobs") == ["error"]

    authorised, _ = make_client(server.address, token="s3cret")
    authorised.register_job(runner_job("1-a"))
    assert [s.id for s in authorised.list_jobs().jobs] == ["1-a"]


def test_unreachable_nomad_is_unavailable_after_the_attempts() -> None:
    client, recorder = make_client(f"http://127.0.0.1:{free_port()}", retry_attempts=3)
    with pytest.raises(NomadUnavailable):
        client.list_allocations()
    assert recorder.outcomes("list_allocations") == ["unavailable"] * 3
    assert recorder.statuses == [("list_allocations", "none")] * 3


def test_a_slow_answer_times_out(sim: SimServer) -> None:
    client, recorder = make_client(sim.address, timeout_s=0.05, retry_attempts=2)
    set_faults(sim, http_latency_ms=300)
    with pytest.raises(NomadUnavailable):
        client.get_job("1-a")
    assert recorder.outcomes("get_job") == ["unavailable"] * 2


# -- namespaces -----------------------------------------------------------------------


def test_every_call_stays_in_the_clients_namespace(shared: SimServer, ns: str) -> None:
    team, _ = make_client(shared.address, namespace=f"{ns}-team")
    other, _ = make_client(shared.address, namespace=ns)
    elsewhere = {**runner_job("1-a"), "Namespace": "somewhere-else"}
    team.register_job(elsewhere, enforce_index=0)

    http = Http(shared.address)
    assert http.get("/v1/job/1-a", namespace=f"{ns}-team")["Namespace"] == f"{ns}-team"
    assert (
        http.request("GET", "/v1/job/1-a", params={"namespace": "somewhere-else"}).status_code
        == 404
    )
    assert [s.id for s in team.list_jobs().jobs] == ["1-a"]
    assert other.list_jobs().jobs == ()
    assert other.get_job("1-a") is None
    wait_until(
        lambda: [a for a in team.list_allocations().allocations if a.client_status == "running"]
    )
    assert other.list_allocations().allocations == ()
    other.deregister_job("1-a")  # another namespace's job of the same ID is untouched
    assert team.get_job("1-a") is not None
    team.deregister_job("1-a")
    assert team.get_job("1-a") is None


# -- blocking queries -------------------------------------------------------------------


def jobs_list_requests(sim: SimServer) -> int:
    stats = Http(sim.address).get("/_sim/stats")
    return int(stats["Requests"].get("GET /v1/jobs", 0))


def test_blocking_list_jobs_returns_when_a_job_is_registered(sim: SimServer) -> None:
    client, _ = make_client(sim.address)
    before = client.list_jobs()
    seen = jobs_list_requests(sim)
    result: list[JobListing] = []
    waiter = threading.Thread(
        target=lambda: result.append(client.list_jobs(index=before.index, wait_s=10))
    )
    waiter.start()
    # The simulator answers on one event loop, so once it has counted the
    # request, that request is parked waiting for a change.
    wait_until(lambda: jobs_list_requests(sim) > seen)
    assert not result
    registered = client.register_job(runner_job("1-a"))
    waiter.join(5)
    assert result, "the blocking query did not return"
    assert [s.id for s in result[0].jobs] == ["1-a"]
    assert result[0].index >= registered.job_modify_index > before.index


def test_blocking_list_jobs_returns_after_the_wait(sim: SimServer) -> None:
    # The read timeout (0.05 s here) would cut a 0.3 s wait short if it did
    # not grow with the wait.
    client, recorder = make_client(sim.address, timeout_s=0.05)
    before = client.list_jobs()
    started = time.monotonic()
    after = client.list_jobs(index=before.index, wait_s=0.3)
    assert time.monotonic() - started >= 0.3
    assert after.index == before.index
    assert recorder.outcomes("list_jobs") == ["ok", "ok"]


def test_go_durations() -> None:
    assert [go_duration(s) for s in (15, 0.25, 1.5, 300, 0)] == [
        "15s",
        "250ms",
        "1500ms",
        "300s",
        "0s",
    ]


def test_tls_settings_are_read_once(tmp_path: Path) -> None:
    for name in ("ca.pem", "c.pem", "k.pem", "both.pem"):
        (tmp_path / name).write_text("")
    ca, c, k, both = (str(tmp_path / n) for n in ("ca.pem", "c.pem", "k.pem", "both.pem"))
    plain = NomadConnection(address="http://127.0.0.1:1")
    assert (plain.requests_verify, plain.requests_cert, plain.ssl_context) == (True, None, None)
    pair = NomadConnection(address="http://127.0.0.1:1", ca_cert=ca, client_cert=c, client_key=k)
    assert (pair.requests_verify, pair.requests_cert) == (ca, (c, k))
    one = NomadConnection(address="http://x:1", ca_cert=ca, client_cert=both, verify=False)
    assert (one.requests_verify, one.requests_cert) == (False, both)
    with pytest.raises(ValueError, match="client_key"):
        NomadConnection(
            address="http://127.0.0.1:1", client_cert=c, client_key=str(tmp_path / "no")
        )
    with pytest.raises(ValueError, match="cannot be loaded"):
        NomadConnection(address="https://127.0.0.1:1", client_cert=c, client_key=k)
    moved = pair.at("10.0.0.7:4646")
    assert (moved.address, moved.requests_cert, moved.token) == (
        "http://10.0.0.7:4646",
        (c, k),
        None,
    )


# -- allocations ------------------------------------------------------------------------


def test_list_allocations_decodes_ports_and_task_states(shared: SimServer, ns: str) -> None:
    client, _ = make_client(shared.address, namespace=ns)
    client.register_job(runner_job("1-a"))

    def running() -> Any:
        listing = client.list_allocations()
        return listing if [a.client_status for a in listing.allocations] == ["running"] else None

    listing = wait_until(running)
    (alloc,) = listing.allocations
    raw = Http(shared.address).get(f"/v1/allocation/{alloc.id}")
    assert listing.index >= alloc.modify_index
    assert (alloc.id, alloc.job_id, alloc.node_id, alloc.client_status, alloc.desired_status) == (
        raw["ID"],
        "1-a",
        raw["NodeID"],
        "running",
        "run",
    )
    assert alloc.node_name.startswith("agent-")
    assert alloc.started_at is not None and alloc.started_at >= alloc.create_time
    assert (alloc.restarts, alloc.last_exit_oom, alloc.migrate) == (0, False, False)
    (port,) = alloc.ports
    assert port.exposed_port == 8080
    assert port.host_address.endswith(":20000")


def test_blocking_list_allocations_sees_an_oom_kill(sim: SimServer) -> None:
    client, _ = make_client(sim.address)
    client.register_job(runner_job("1-a"))
    alloc_id = Http(sim.address).running("1-a")[0]["ID"]
    before = client.list_allocations()
    result: list[Any] = []
    waiter = threading.Thread(
        target=lambda: result.append(client.list_allocations(index=before.index, wait_s=10))
    )
    waiter.start()
    assert Http(sim.address).request("POST", f"/_sim/allocation/{alloc_id}/oom").ok
    waiter.join(5)
    assert result and result[0].index > before.index
    assert result[0].allocations[0].last_exit_oom is True


# -- variable locks ---------------------------------------------------------------------


def test_lock_acquire_renew_release(shared: SimServer, ns: str) -> None:
    leader, recorder = make_client(shared.address, namespace=ns)
    rival, _ = make_client(shared.address, namespace=ns)
    lock = leader.lock_acquire("nrc/leader", ttl_s=15, lock_delay_s=15)
    assert lock.path == "nrc/leader" and lock.lock_id
    held = Http(shared.address).get("/v1/var/nrc/leader", namespace=ns)["Lock"]
    assert held == {"ID": lock.lock_id, "TTL": "15s", "LockDelay": "15s"}

    with pytest.raises(LockHeld):
        rival.lock_acquire("nrc/leader", ttl_s=15, lock_delay_s=15)
    leader.lock_renew(lock)
    with pytest.raises(LockHeld):
        rival.lock_renew(Lock(path=lock.path, lock_id="not-ours"))
    rival.lock_release(Lock(path=lock.path, lock_id="not-ours"))  # not ours: silently fine
    leader.lock_release(lock)
    leader.lock_release(lock)  # already released: silently fine
    with pytest.raises(LockHeld):
        leader.lock_renew(lock)

    taken = rival.lock_acquire("nrc/leader", ttl_s=10, lock_delay_s=0.5)
    assert taken.lock_id != lock.lock_id
    assert recorder.outcomes("lock_acquire") == ["ok"]
    assert recorder.outcomes("lock_release") == ["ok", "conflict"]


def test_lock_on_a_missing_variable(shared: SimServer, ns: str) -> None:
    client, _ = make_client(shared.address, namespace=ns)
    lock = client.lock_acquire("nrc/l", ttl_s=15, lock_delay_s=15)
    ghost = Lock(path="nrc/nothing-here", lock_id=lock.lock_id)
    with pytest.raises(LockHeld):
        client.lock_renew(ghost)
    client.lock_release(ghost)


def test_lock_is_in_the_clients_namespace(shared: SimServer, ns: str) -> None:
    team, _ = make_client(shared.address, namespace=f"{ns}-team")
    default, _ = make_client(shared.address, namespace=ns)
    lock = team.lock_acquire("nrc/leader", ttl_s=15, lock_delay_s=15)
    http = Http(shared.address)
    assert http.get("/v1/var/nrc/leader", namespace=f"{ns}-team")["Lock"]["ID"] == lock.lock_id
    missing = http.request("GET", "/v1/var/nrc/leader", params={"namespace": ns})
    assert missing.status_code == 404
    other = default.lock_acquire("nrc/leader", ttl_s=15, lock_delay_s=15)  # a different lock
    assert other.lock_id != lock.lock_id


def test_an_expired_lock_is_lost(make_sim: Callable[..., SimServer]) -> None:
    # At time_scale 0.01 a 10 s TTL dies after 0.2 s and its 10 s delay ends 0.1 s later.
    server = make_sim(time_scale=0.01)
    leader, _ = make_client(server.address)
    rival, _ = make_client(server.address)
    lock = leader.lock_acquire("nrc/leader", ttl_s=10, lock_delay_s=10)
    http = Http(server.address)
    wait_until(lambda: "Lock" not in http.get("/v1/var/nrc/leader"))
    with pytest.raises(LockHeld):
        leader.lock_renew(lock)
    assert rival.lock_acquire("nrc/leader", ttl_s=10, lock_delay_s=10).lock_id != lock.lock_id


def test_token_region_and_tls_settings_reach_the_wire(
    shared: SimServer, ns: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "cli.pem", "cli-key.pem"))
    for path in (ca, cert, key):
        path.write_text("not used over plain HTTP")
    sent: list[dict[str, Any]] = []
    real_request = DirectSession.request

    def spy(self: DirectSession, method: str, url: str, **kwargs: Any) -> Any:
        sent.append({"method": method, "url": url, **kwargs})
        return real_request(self, method, url, **kwargs)

    monkeypatch.setattr(DirectSession, "request", spy)
    monkeypatch.setenv("NOMAD_TOKEN", "from-the-environment")  # python-nomad's fallback: unused
    client, _ = make_client(
        shared.address,
        namespace=ns,
        region="global",
        ca_cert=str(ca),
        client_cert=str(cert),
        client_key=str(key),
    )
    client.lock_acquire("nrc/l", ttl_s=15, lock_delay_s=15)
    client.list_jobs()
    var_put, jobs_get = sent
    assert jobs_get["method"] == "GET" and jobs_get["url"].endswith("/v1/jobs")
    for request in sent:
        assert request["params"]["region"] == "global"
        assert request["params"]["namespace"] == ns
        assert "X-Nomad-Token" not in (request["headers"] or {})
        assert request["verify"] == str(ca)
        assert request["cert"] == (str(cert), str(key))
        assert request["timeout"] in (5.0, (5.0, 5.0))
    assert var_put["method"] == "PUT" and var_put["url"].endswith("/v1/var/nrc/l")
    assert "lock-acquire" in var_put["params"]
    assert var_put["json"]["Namespace"] == ns

    sent.clear()
    tokened, _ = make_client(shared.address, namespace=ns, token="t0ken", verify=False)
    tokened.get_job("nothing")
    assert sent[0]["headers"]["X-Nomad-Token"] == "t0ken"
    assert sent[0]["verify"] is False
    assert sent[0]["url"].endswith("/v1/job/nothing")


def test_variable_put_get_overwrite_and_missing(shared: SimServer, ns: str) -> None:
    client, recorder = make_client(shared.address, namespace=ns)
    assert client.get_variable("nomad-runner-controller/prewarm/7") is None
    assert recorder.outcomes("get_variable") == ["ok"]  # a missing variable is an answer
    client.put_variable("nomad-runner-controller/prewarm/7", {"history": "{}"})
    assert client.get_variable("nomad-runner-controller/prewarm/7") == {"history": "{}"}
    client.put_variable("nomad-runner-controller/prewarm/7", {"history": '{"v":1}'})
    assert client.get_variable("nomad-runner-controller/prewarm/7") == {"history": '{"v":1}'}
    other, _ = make_client(shared.address, namespace=ns + "-other")
    assert other.get_variable("nomad-runner-controller/prewarm/7") is None


def test_a_variable_beside_a_held_lock_is_writable(shared: SimServer, ns: str) -> None:
    client, _ = make_client(shared.address, namespace=ns)
    client.lock_acquire("nrc/leader", ttl_s=15, lock_delay_s=15)
    client.put_variable("nrc/prewarm/1", {"history": "x"})
    assert client.get_variable("nrc/prewarm/1") == {"history": "x"}


def test_variables_listed_by_prefix_and_deleted_with_check_and_set(
    shared: SimServer, ns: str
) -> None:
    client, recorder = make_client(shared.address, namespace=ns)
    client.lock_acquire("nrc/leader", ttl_s=15, lock_delay_s=15)
    client.put_variable("nrc/leader/activity/a/0", {"r1": "1"})
    client.put_variable("nrc/leader/activity/b/0", {"r2": "2"})
    client.put_variable("nrc/prewarm/1", {"history": "x"})
    listed = client.list_variables("nrc/leader/activity/")
    assert [v.path for v in listed] == ["nrc/leader/activity/a/0", "nrc/leader/activity/b/0"]
    a_index = listed[0].modify_index
    assert a_index > 0
    other, _ = make_client(shared.address, namespace=ns + "-other")
    assert other.list_variables("nrc/") == ()  # the client's namespace only

    client.put_variable("nrc/leader/activity/a/0", {"r1": "3"})  # written since the list
    assert client.delete_variable("nrc/leader/activity/a/0", a_index) is False
    assert recorder.outcomes("delete_variable") == ["conflict"]
    assert client.get_variable("nrc/leader/activity/a/0") == {"r1": "3"}
    (now,) = [v for v in client.list_variables("nrc/leader/activity/a/")]
    assert client.delete_variable(now.path, now.modify_index) is True
    assert client.delete_variable("nrc/leader/activity/b/0") is True
    assert client.delete_variable("nrc/leader/activity/b/0") is True  # already gone
    assert client.list_variables("nrc/leader/activity/") == ()


class OneAnswer:
    """A server in front of Nomad's address that answers every request 200
    with the same body (a proxy's login page, or JSON of another shape)."""

    def __init__(self, body: bytes, content_type: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = _answer

        self.server = serve_in_thread(Handler)
        self.address = address_of(self.server)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def html_proxy() -> Iterator[OneAnswer]:
    proxy = OneAnswer(b"<html>proxy login</html>", "text/html")
    yield proxy
    proxy.close()


@pytest.fixture
def other_json() -> Iterator[OneAnswer]:
    server = OneAnswer(b'{"Unexpected": 1}', "application/json")
    yield server
    server.close()


def test_an_answer_that_is_not_json_is_an_api_error_with_its_text(html_proxy: OneAnswer) -> None:
    client, recorder = make_client(html_proxy.address)
    with pytest.raises(NomadAPIError, match="undecodable answer: '<html>proxy login</html>'"):
        client.list_jobs()
    with pytest.raises(NomadAPIError, match="undecodable answer"):
        client.register_job(runner_job("1-a"), enforce_index=0)
    assert recorder.outcomes("list_jobs") == ["error"]

    async def claim_write() -> None:
        writer = AsyncJobWriter(NomadConnection(address=html_proxy.address))
        try:
            await writer.register_job(runner_job("1-a"), enforce_index=0)
        finally:
            await writer.aclose()

    with pytest.raises(NomadAPIError, match="undecodable answer: '<html>proxy login</html>'"):
        asyncio.run(claim_write())


def test_json_of_another_shape_is_an_api_error_saying_what_came(other_json: OneAnswer) -> None:
    client, _ = make_client(other_json.address)
    came = re.escape('{"Unexpected": 1}')
    with pytest.raises(NomadAPIError, match=f"variable answer without Items: {came}"):
        client.get_variable("nrc/x")
    with pytest.raises(NomadAPIError, match=f"variable list not a list: {came}"):
        client.list_variables("nrc/")
    with pytest.raises(NomadAPIError, match=f"without Lock.ID: {came}"):
        client.lock_acquire("nrc/lock", ttl_s=15.0, lock_delay_s=0.0)


def test_a_json_answer_is_not_also_decoded_as_text(
    shared: SimServer, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests guesses the charset of a text it is asked for (Nomad names
    none): 30 µs on a small answer, and on a full list a second copy of its
    megabytes held while the list is decoded. Only error messages need it."""
    client, _ = make_client(shared.address, namespace=ns)
    client.register_job(runner_job("1-text"))

    def refused(response: requests.Response) -> str:
        raise AssertionError("a JSON answer was decoded as text")

    monkeypatch.setattr(requests.Response, "text", property(refused))
    assert [j.id for j in client.list_jobs().jobs] == ["1-text"]
    assert client.list_allocations().allocations is not None
