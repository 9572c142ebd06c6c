"""Blocking queries, headers, errors, ACLs and HTTP faults."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from nomadsim import SimServer
from tests.helpers import Http, runner_job, wait_until


def test_reads_carry_nomad_headers(sim: SimServer) -> None:
    http = Http(sim.address)
    response = http.request("GET", "/v1/jobs")
    assert response.headers["X-Nomad-KnownLeader"] == "true"
    assert response.headers["X-Nomad-LastContact"] == "0"
    assert int(response.headers["X-Nomad-Index"]) >= 1


def test_blocking_query_returns_when_the_index_moves(sim: SimServer) -> None:
    http = Http(sim.address)
    index = int(http.request("GET", "/v1/jobs").headers["X-Nomad-Index"])
    result: dict[str, object] = {}

    def block() -> None:
        started = time.monotonic()
        response = http.request("GET", "/v1/jobs", params={"index": index, "wait": "30s"})
        result.update(
            took=time.monotonic() - started,
            index=int(response.headers["X-Nomad-Index"]),
            ids=[j["ID"] for j in response.json()],
        )

    thread = threading.Thread(target=block)
    thread.start()
    # The reader is parked until a write happens.
    wait_until(lambda: sim.sim.requests.get("GET /v1/jobs", 0) >= 2)
    assert not result
    http.register(runner_job("1-a"))
    thread.join(10)
    assert result["ids"] == ["1-a"]
    assert isinstance(result["index"], int) and result["index"] > index
    assert isinstance(result["took"], float) and result["took"] < 10


def test_blocking_query_times_out_with_the_same_index(sim: SimServer) -> None:
    http = Http(sim.address)
    index = int(http.request("GET", "/v1/nodes").headers["X-Nomad-Index"])
    started = time.monotonic()
    response = http.request("GET", "/v1/nodes", params={"index": index, "wait": "100ms"})
    took = time.monotonic() - started
    assert response.status_code == 200
    assert int(response.headers["X-Nomad-Index"]) == index
    # wait plus at most wait/16 jitter
    assert 0.1 <= took < 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"index": "abc"}, "Invalid index"),
        ({"index": "-1"}, "Invalid index"),
        ({"index": "5", "wait": "soon"}, "Invalid wait time"),
        ({"index": "5", "wait": "10"}, "Invalid wait time"),
    ],
)
def test_bad_blocking_parameters_are_400(
    sim: SimServer, params: dict[str, str], message: str
) -> None:
    response = Http(sim.address).request("GET", "/v1/allocations", params=params)
    assert response.status_code == 400
    assert response.text == message
    assert response.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v1/job/nope", "job not found"),
        ("/v1/allocation/nope", "alloc not found"),
        ("/v1/evaluation/nope", "eval not found"),
        ("/v1/node/nope", "node not found"),
        ("/v1/var/nope", "variable not found"),
    ],
)
def test_not_found_texts(sim: SimServer, path: str, message: str) -> None:
    response = Http(sim.address).request("GET", path)
    assert (response.status_code, response.text) == (404, message)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b'{"Job": null}', 400),
        (b'{"Job": {"Type": "batch"}}', 400),
        (b'{"Job": {"ID": "x", "TaskGroups": []}}', 500),
    ],
)
def test_bad_job_bodies(sim: SimServer, body: bytes, status: int) -> None:
    response = Http(sim.address).request("PUT", "/v1/jobs", data=body)
    assert response.status_code == status
    assert response.text


def test_job_id_in_path_must_match_body(sim: SimServer) -> None:
    response = Http(sim.address).request("PUT", "/v1/job/a", json={"Job": runner_job("b")})
    assert (response.status_code, response.text) == (400, "Job ID does not match name")


def test_namespace_is_honoured(sim: SimServer) -> None:
    http = Http(sim.address)
    response = http.request(
        "PUT", "/v1/jobs", params={"namespace": "runners"}, json={"Job": runner_job("1-a")}
    )
    assert response.status_code == 200
    assert http.get("/v1/jobs") == []
    (stub,) = http.get("/v1/jobs", namespace="runners")
    assert stub["Namespace"] == "runners"
    assert [j["ID"] for j in http.get("/v1/jobs", namespace="*")] == ["1-a"]
    assert http.request("GET", "/v1/job/1-a").status_code == 404
    assert http.get("/v1/job/1-a", namespace="runners")["Namespace"] == "runners"


def test_job_list_prefix_and_meta(sim: SimServer) -> None:
    http = Http(sim.address)
    job = runner_job("1-a")
    job["Meta"] = {"owner": "nrc"}
    http.register(job)
    http.register(runner_job("2-b"))
    assert [j["ID"] for j in http.get("/v1/jobs", prefix="1-")] == ["1-a"]
    assert "Meta" not in http.get("/v1/jobs", prefix="1-")[0]
    assert http.get("/v1/jobs", prefix="1-", meta="true")[0]["Meta"] == {"owner": "nrc"}


def test_acl_token_is_required(make_sim: Callable[..., SimServer]) -> None:
    server = make_sim(acl_token="s3cret")
    http = Http(server.address)
    denied = http.request("GET", "/v1/jobs")
    assert (denied.status_code, denied.text) == (403, "Permission denied")
    wrong = http.request("GET", "/v1/jobs", headers={"X-Nomad-Token": "nope"})
    assert wrong.status_code == 403
    ok = http.request("GET", "/v1/jobs", headers={"X-Nomad-Token": "s3cret"})
    assert ok.status_code == 200
    bearer = http.request("GET", "/v1/jobs", headers={"Authorization": "Bearer s3cret"})
    assert bearer.status_code == 200


def test_http_error_fault_answers_no_cluster_leader(sim: SimServer) -> None:
    http = Http(sim.address)
    assert http.request("PUT", "/_sim/faults", json={"http_error_rate": 1.0}).ok
    response = http.request("GET", "/v1/jobs")
    # Through a client agent (the suite's entry) the text comes wrapped once.
    text = response.text.removeprefix("rpc error: ")
    assert (response.status_code, text) == (500, "No cluster leader")
    assert http.get("/_sim/faults")["http_error_rate"] == 1.0
    assert http.request("PUT", "/_sim/faults", json={"http_error_rate": 0}).ok
    assert http.request("GET", "/v1/jobs").status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"nonsense": 1},
        {"http_error_rate": 2},
        {"heartbeat_loss": "yes"},
        {"migration_ordering": "x"},
        [],
    ],
)
def test_bad_fault_settings_are_400(sim: SimServer, body: object) -> None:
    response = Http(sim.address).request("PUT", "/_sim/faults", json=body)
    assert response.status_code == 400
    assert response.text


def test_stale_reads_lag_recent_writes(sim: SimServer) -> None:
    http = Http(sim.address)
    assert http.request("PUT", "/_sim/faults", json={"stale_read_rate": 1.0}).ok
    http.register(runner_job("1-a"))
    reads = [http.get("/v1/jobs") for _ in range(20)]
    assert any(r == [] for r in reads), "some list reads must miss the fresh job"
    # A follower catches up: once the lag window has passed, the job is always there.
    wait_until(lambda: all(http.get("/v1/jobs") for _ in range(5)), timeout=5)
    # Single-object reads are never stale.
    assert http.get("/v1/job/1-a")["ID"] == "1-a"


def test_sim_stats_count_requests_and_objects(sim: SimServer) -> None:
    http = Http(sim.address)
    http.register(runner_job("1-a"))
    http.running("1-a")
    stats = http.get("/_sim/stats")
    assert stats["JobsRegisteredTotal"] == 1
    assert stats["Allocations"] == {"running": 1}
    assert stats["Jobs"] == {"running": 1}
    assert stats["Requests"]["PUT /v1/jobs"] == 1
