"""Health, readiness, version and metrics; leadership and Nomad outages."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from controller.api import create_app
from controller.api.app import PACKAGE_VERSION
from controller.nomad.client import NomadClient
from controller.reconcile.loop import Controller
from tests.helpers import Http, wait_until
from tests.support.api_client import API, Api, MakeApi, client_for, environment_body, error_of
from tests.support.controller import TEST_SETTINGS


def eligible(api: Api, yes: bool) -> None:
    http = Http(api.sim.address)
    for node in http.get("/v1/nodes"):
        r = http.request(
            "POST",
            f"/v1/node/{node['ID']}/eligibility",
            json={"Eligibility": "eligible" if yes else "ineligible"},
        )
        assert r.status_code == 200, r.text


def test_health_reports_depleting_pools(make_api: MakeApi) -> None:
    api = make_api()
    assert api.client.get(f"{API}/health").status_code == 204  # no environment yet
    eligible(api, False)  # nothing can be placed: the pool stays empty
    api.put_environment(1, prewarmingPoolSize=4)
    status, message, code = error_of(api.client.get(f"{API}/health"))
    assert (status, code) == (503, "PREWARMING_POOL_DEPLETING")
    assert "environment 1" in message and "0 of 4" in message
    eligible(api, True)
    api.wait_pool(1, 4)
    r = api.client.get(f"{API}/health")
    assert (r.status_code, r.content) == (204, b"")
    eligible(api, False)  # refills stay pending
    api.claim(1)
    api.claim(1)
    assert api.client.get(f"{API}/health").status_code == 204  # 2 of 4 is not below 0.5
    api.claim(1)
    assert error_of(api.client.get(f"{API}/health"))[2] == "PREWARMING_POOL_DEPLETING"
    assert api.client.get("/readyz").status_code == 200  # readiness ignores pools


def test_depletion_threshold_is_configurable(make_api: MakeApi) -> None:
    api = make_api(app={"pool_alert_threshold": 0.0})
    api.put_environment(1, prewarmingPoolSize=4)
    assert api.client.get(f"{API}/health").status_code == 204


def test_unobserved_nomad_is_unhealthy_and_not_ready() -> None:
    # nothing listens there, and the controller never observed Nomad
    controller = Controller(NomadClient(address="http://127.0.0.1:9", retry_attempts=1))
    client = client_for(create_app(controller.pools))
    for path in (f"{API}/health", "/readyz"):
        status, message, code = error_of(client.get(path))
        assert (status, code) == (503, "NOMAD_UNREACHABLE")
        assert "127.0.0.1" not in message
    assert client.get("/healthz").json() == {"status": "ok"}
    status, _, code = error_of(client.post(f"{API}/runners", json={"executionEnvironmentId": 1}))
    assert (status, code) == (503, "NOT_LEADER")  # it does not serve before observing Nomad


def test_probes_version_and_metrics(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    assert api.client.get("/readyz").json() == {"status": "ok", "role": "leader"}
    r = api.client.get(f"{API}/version")
    assert r.status_code == 200 and r.json() == PACKAGE_VERSION != "0.0.0"
    assert create_app(api.controller.pools, version="1.2.3").openapi()["info"]["version"] == "1.2.3"
    versioned = TestClient(create_app(api.controller.pools, version="1.2.3"))
    assert versioned.get(f"{API}/version").json() == "1.2.3"
    r = api.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(r.text)}
    expected = {m.name for m in api.controller.metrics.registry.collect()}
    assert expected and expected <= names


def hold_leader_lock(api: Api) -> None:
    lock_holder = NomadClient(address=api.sim.address)
    lock_holder.lock_acquire(TEST_SETTINGS.leader_lock_path, ttl_s=60.0, lock_delay_s=60.0)


def test_a_follower_serves_and_says_it_follows(make_api: MakeApi) -> None:
    """Every replica that has observed Nomad serves the API; only pool upkeep
    is the leader's (here nobody leads: the lock is held elsewhere)."""
    leader = make_api()
    leader.put_environment(1, prewarmingPoolSize=2)
    leader.wait_pool(1, 2)
    runner = leader.claim(1)["runnerId"]
    leader.controller.stop()
    hold_leader_lock(leader)
    api = make_api(sim=leader.sim, leader_election=True)
    wait_until(lambda: api.controller.pools.environment(1) is not None)
    assert not api.controller.is_leader()
    assert api.client.get("/readyz").json() == {"status": "ok", "role": "follower"}
    health = api.client.get(f"{API}/health")
    assert (health.status_code, health.headers["X-Nrc-Role"]) == (204, "follower")
    assert api.client.get(f"{API}/runners/{runner}").status_code == 200
    claimed = api.client.post(f"{API}/runners", json={"executionEnvironmentId": 1})
    assert claimed.status_code == 200, claimed.text
    assert claimed.json()["runnerId"] != runner
    assert api.client.delete(f"{API}/runners/{runner}").status_code == 204
    put = api.client.put(f"{API}/execution-environments/1", json=environment_body(1))
    assert put.status_code == 204, put.text
    stats = api.client.get(f"{API}/statistics/execution-environments").json()
    assert stats["1"]["usedRunners"] == 1
    # No upkeep on a follower: the claimed runner is not replaced.
    assert api.controller.passes == 0


def test_nomad_down_during_requests_is_500_nomad_unreachable(make_api: MakeApi) -> None:
    api = make_api()
    api.put_environment(1, prewarmingPoolSize=2)
    api.wait_pool(1, 2)
    runner = api.claim(1)["runnerId"]
    address = api.sim.address
    api.sim.stop()
    requests = [
        ("POST", f"{API}/runners", {"executionEnvironmentId": 1}),
        ("DELETE", f"{API}/runners/{runner}", None),
        ("PUT", f"{API}/execution-environments/2", environment_body(2)),
        ("DELETE", f"{API}/execution-environments/1", None),
        ("GET", f"{API}/execution-environments?fetch=true", None),
        ("GET", f"{API}/execution-environments/1?fetch=true", None),
    ]
    for method, path, json in requests:
        status, message, code = error_of(api.client.request(method, path, json=json))
        assert (status, code) == (500, "NOMAD_UNREACHABLE"), (method, path, message)
        assert address not in message and "127.0.0.1" not in message
    # the failed re-list is what Nomad's health is judged by
    for path in (f"{API}/health", "/readyz"):
        assert error_of(api.client.get(path))[::2] == (503, "NOMAD_UNREACHABLE")
    # the claimed runner is still claimed: the release did not happen
    assert api.controller.claims.lookup(runner) is not None


@pytest.mark.parametrize("faulty", ["claim", "put"])
def test_nomad_errors_are_500_nomad_internal_server_error(make_api: MakeApi, faulty: str) -> None:
    api = make_api()
    api.put_environment(1, prewarmingPoolSize=1)
    api.wait_pool(1, 1)
    Http(api.sim.address).request(
        "PUT", "/_sim/faults", json={"http_error_rate": 1.0}
    ).raise_for_status()
    if faulty == "claim":
        r = api.client.post(f"{API}/runners", json={"executionEnvironmentId": 1})
    else:
        r = api.client.put(f"{API}/execution-environments/2", json=environment_body(2))
    status, message, code = error_of(r)
    assert (status, code) == (500, "NOMAD_INTERNAL_SERVER_ERROR")
    assert "No cluster leader" not in message
