"""The execution environment routes and the pool statistics."""

from __future__ import annotations

from typing import Any

import pytest

from controller.model import Environment
from controller.nomad import jobs
from controller.reconcile.prewarming import PrewarmSettings
from tests.helpers import Http, wait_until
from tests.support.api_client import API, Api, MakeApi, dumps, environment_body, error_of
from tests.support.one_runner import OneRunner
from tests.support.poseidon import POSEIDON_HCL, as_poseidon_registers


def url(env_id: int | str) -> str:
    return f"{API}/execution-environments/{env_id}"


def test_create_show_list_replace_delete(api: Api, env_id: int) -> None:
    body = environment_body(env_id, networkAccess=True, exposedPorts=[8080, 80])
    r = api.client.put(url(env_id), json=body)
    assert (r.status_code, r.content) == (201, b"")
    shown = api.client.get(url(env_id)).json()
    assert shown == {**body, "exposedPorts": [80, 8080]}
    listed = api.client.get(f"{API}/execution-environments").json()["executionEnvironments"]
    assert shown in listed
    assert api.controller.pools.environment(env_id) == Environment(
        id=env_id,
        image="python:3.12",
        cpu_limit=100,
        memory_limit=128,
        network_access=True,
        exposed_ports=(80, 8080),
        prewarming_pool_size=2,
    )
    r = api.client.put(url(env_id), json={**body, "prewarmingPoolSize": 3})
    assert (r.status_code, r.content) == (204, b"")
    assert api.client.get(url(env_id)).json()["prewarmingPoolSize"] == 3
    r = api.client.delete(url(env_id))
    assert (r.status_code, r.content) == (204, b"")
    assert error_of(api.client.get(url(env_id)))[0] == 404
    assert error_of(api.client.delete(url(env_id)))[0] == 404
    template = jobs.template_job_id(env_id)
    assert template not in {j["ID"] for j in Http(api.sim.address).get("/v1/jobs")}


def test_fetch_re_lists_nomad(make_api: MakeApi) -> None:
    # no event stream and no resync for a minute: only ?fetch=true looks again
    api = make_api(events=False, resync_interval_s=60.0)
    env = Environment(id=3, image="python:3.11", prewarming_pool_size=0)
    Http(api.sim.address).register(jobs.template_job(env))
    assert error_of(api.client.get(url(3)))[0] == 404
    assert api.client.get(f"{API}/execution-environments").json() == {"executionEnvironments": []}
    listed = api.client.get(f"{API}/execution-environments", params={"fetch": "true"}).json()
    assert [e["id"] for e in listed["executionEnvironments"]] == [3]
    Http(api.sim.address).register(jobs.template_job(Environment(id=4, image="python:3.10")))
    r = api.client.get(url(4), params={"fetch": "true"})
    assert r.status_code == 200 and r.json()["image"] == "python:3.10"
    assert api.client.get(url(4), params={"fetch": "false"}).status_code == 200


def test_fetch_reads_templates_no_event_named_yet() -> None:
    """With the event stream connected a refresh reads only what events named.
    `?fetch=true` must not wait for the event of a template another writer
    just registered (seen under load: 404 for an environment Nomad held)."""
    s = OneRunner()
    try:
        s.controller.observer.set_stream_connected(True)
        s.controller.observer.refresh()  # the first after a connect is full
        s.nomad.put(jobs.template_job(Environment(id=8, image="python:3.11")))  # no event yet
        assert error_of(s.api.get(url(8)))[0] == 404
        r = s.api.get(url(8), params={"fetch": "true"})
        assert r.status_code == 200 and r.json()["image"] == "python:3.11"
        s.nomad.put(jobs.template_job(Environment(id=9, image="python:3.12")))
        listed = s.api.get(f"{API}/execution-environments", params={"fetch": "true"}).json()
        assert [e["id"] for e in listed["executionEnvironments"]] == [8, 9]
        s.nomad.delete(jobs.template_job_id(8))  # gone, and no event heard of it either
        listed = s.api.get(f"{API}/execution-environments", params={"fetch": "true"}).json()
        assert [e["id"] for e in listed["executionEnvironments"]] == [9]
    finally:
        s.close()


def test_unknown_environment_is_404(api: Api) -> None:
    status, message, _ = error_of(api.client.get(url(4242424)))
    assert status == 404 and "4242424" in message
    assert error_of(api.client.get(url(4242424), params={"fetch": "1"}))[0] == 404
    assert error_of(api.client.delete(url(4242424)))[0] == 404


def test_poseidons_shapes_of_an_environment_are_taken(api: Api, env_id: int) -> None:
    """What Poseidon's own e2e helpers send: no `id` (its request type has
    none; the path has it), no Content-Type, `exposedPorts` null or left out."""
    body = environment_body(env_id, prewarmingPoolSize=0)
    del body["id"]
    r = api.client.put(url(env_id), content=dumps(body), headers={"Content-Type": ""})
    assert r.status_code == 201, r.text
    assert api.client.get(url(env_id)).json()["id"] == env_id
    for ports in (None, "absent"):
        sent = {**body, "networkAccess": True, "exposedPorts": ports}
        if ports == "absent":
            del sent["exposedPorts"]
        r = api.client.put(url(env_id), content=dumps(sent))
        assert r.status_code == 204, r.text
        assert api.client.get(url(env_id)).json()["exposedPorts"] == []


def test_fractional_cpu_rounds_up_and_ports_need_network(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=0, cpuLimit=99.2, exposedPorts=[80])
    shown = api.client.get(url(env_id)).json()
    assert shown["cpuLimit"] == 100
    assert shown["exposedPorts"] == []  # without networkAccess nothing is published


def test_replacing_keeps_claimed_runners_and_rolls_idle_ones(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=2)
    api.wait_pool(env_id, 2)
    runner = api.claim(env_id)["runnerId"]
    api.wait_pool(env_id, 2)
    old_idle = {v.id for v in api.controller.observer.snapshot.views(env_id) if not v.claimed}
    r = api.client.put(url(env_id), json=environment_body(env_id, image="python:3.13"))
    assert r.status_code == 204
    api.wait_pool(env_id, 2)  # idle runners of the new template only
    views = api.controller.observer.snapshot.views(env_id)
    assert not old_idle & {v.id for v in views if not v.claimed}
    assert api.client.get(f"{API}/runners/{runner}").status_code == 200
    view = api.controller.claims.lookup(runner)
    assert view is not None and view.job.claim is not None and view.job.claim.lost_reason is None


def test_deleting_removes_idle_runners_and_keeps_claimed_ones(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=2)
    api.wait_pool(env_id, 2)
    runner = api.claim(env_id)["runnerId"]
    assert api.client.delete(url(env_id)).status_code == 204
    wait_until(
        lambda: [v.id for v in api.controller.observer.snapshot.views(env_id)] == [runner],
        timeout=10,
    )
    assert api.client.get(f"{API}/runners/{runner}").status_code == 200
    assert api.client.delete(f"{API}/runners/{runner}").status_code == 204


def test_statistics(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=3)
    api.wait_pool(env_id, 3)
    api.claim(env_id)
    stats = api.client.get(f"{API}/statistics/execution-environments").json()
    assert stats[str(env_id)] == {
        "id": env_id,
        "prewarmingPoolSize": 3,
        "idleRunners": 2,  # the claim shows at once, before the pool refills
        "usedRunners": 1,
    }
    api.wait_pool(env_id, 3)
    stats = api.client.get(f"{API}/statistics/execution-environments").json()
    assert stats[str(env_id)]["idleRunners"] == 3
    assert all(key == str(value["id"]) for key, value in stats.items())


def test_pool_size_limit_is_configurable(make_api: MakeApi) -> None:
    api = make_api(events=False, app={"max_pool_size": 3})
    r = api.client.put(url(1), json=environment_body(1, prewarmingPoolSize=4))
    status, message, _ = error_of(r)
    assert status == 400 and "prewarmingPoolSize" in message and "3" in message
    assert api.client.put(url(1), json=environment_body(1, prewarmingPoolSize=3)).status_code == 201
    doc = api.app.openapi()
    pool = doc["components"]["schemas"]["EnvironmentRequest"]["properties"]["prewarmingPoolSize"]
    assert pool["maximum"] == 3


def without(key: str) -> dict[str, Any]:
    body = environment_body(1)
    del body[key]
    return body


BAD_ENVIRONMENTS: list[tuple[str, Any, str]] = [
    ("id mismatch", environment_body(2), "id: 2 differs from the id in the path (1)"),
    ("pool over max", environment_body(1, prewarmingPoolSize=10_001), "prewarmingPoolSize"),
    ("pool negative", environment_body(1, prewarmingPoolSize=-1), "prewarmingPoolSize"),
    ("pool string", environment_body(1, prewarmingPoolSize="2"), "prewarmingPoolSize"),
    ("cpu zero", environment_body(1, cpuLimit=0), "cpuLimit"),
    ("cpu negative", environment_body(1, cpuLimit=-0.5), "cpuLimit"),
    ("cpu too large", environment_body(1, cpuLimit=1e12), "cpuLimit"),
    ("cpu bool", environment_body(1, cpuLimit=True), "cpuLimit"),
    ("memory zero", environment_body(1, memoryLimit=0), "memoryLimit"),
    ("memory negative", environment_body(1, memoryLimit=-128), "memoryLimit"),
    ("memory fraction", environment_body(1, memoryLimit=128.5), "memoryLimit"),
    ("port zero", environment_body(1, exposedPorts=[0]), "exposedPorts.0"),
    ("port too large", environment_body(1, exposedPorts=[80, 65536]), "exposedPorts.1"),
    ("port negative", environment_body(1, exposedPorts=[-80]), "exposedPorts.0"),
    ("duplicate ports", environment_body(1, exposedPorts=[80, 443, 80]), "exposedPorts"),
    ("ports not a list", environment_body(1, exposedPorts=80), "exposedPorts"),
    ("port string", environment_body(1, exposedPorts=["80"]), "exposedPorts.0"),
    ("network string", environment_body(1, networkAccess="yes"), "networkAccess"),
    ("network number", environment_body(1, networkAccess=1), "networkAccess"),
    ("image empty", environment_body(1, image=""), "image"),
    ("image number", environment_body(1, image=5), "image"),
    ("id negative", environment_body(-1), "id"),
    ("unknown field", {**environment_body(1), "cpu": 5}, "cpu: Extra inputs"),
    ("missing image", without("image"), "image: Field required"),
    ("not an object", [environment_body(1)], "JSON object"),
]


@pytest.mark.parametrize(
    ("body", "expected"),
    [pytest.param(body, expected, id=name) for name, body, expected in BAD_ENVIRONMENTS],
)
def test_invalid_environments_are_400(api: Api, body: Any, expected: str) -> None:
    status, message, code = error_of(api.client.put(url(1), content=dumps(body)))
    assert (status, code) == (400, None), message
    assert expected in message
    assert api.controller.pools.environment(1) is None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", url("abc")),
        ("GET", url(-1)),
        ("GET", url("1.5")),
        ("DELETE", url("x")),
        ("DELETE", url(-3)),
        ("PUT", url(-1)),
        ("GET", url(9223372036854775808)),
        ("GET", f"{API}/execution-environments?fetch=maybe"),
        ("GET", url(1) + "?fetch=2"),
    ],
)
def test_invalid_ids_and_parameters_are_400(api: Api, method: str, path: str) -> None:
    body = dumps(environment_body(1)) if method == "PUT" else None
    status, message, _ = error_of(api.client.request(method, path, content=body))
    assert status == 400
    assert "executionEnvironmentId" in message or "fetch" in message


def test_prewarming_of_a_static_pool_is_its_size(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=2)
    r = api.client.get(f"{url(env_id)}/prewarming")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "id": env_id,
        "policy": "static",
        "prewarmingPoolSize": 2,
        "ceiling": 2,
        "target": 2,
        "reason": "static",
        "forecast": None,
    }
    assert error_of(api.client.get(f"{url(987654)}/prewarming"))[0] == 404


def test_prewarming_of_an_adaptive_pool_shows_its_forecast(make_api: MakeApi) -> None:
    api = make_api(events=False, prewarm=PrewarmSettings(adaptive=True, ceiling_multiple=3))
    api.put_environment(4, prewarmingPoolSize=2)
    api.wait_pool(4, 2)

    def decided() -> dict[str, Any]:
        body: dict[str, Any] = api.client.get(f"{url(4)}/prewarming").json()
        return body if body["forecast"] is not None else {}

    body = wait_until(decided, timeout=10)
    assert (body["policy"], body["prewarmingPoolSize"], body["ceiling"]) == ("adaptive", 2, 6)
    assert body["target"] == 2 and body["reason"] == "floor"  # no claims yet
    assert body["forecast"]["claimsPerSecond"] == 0
    assert body["forecast"]["leadTimeSeconds"] > 0
    stats = api.client.get(f"{API}/statistics/execution-environments").json()
    assert stats["4"]["prewarmingPoolSize"] == 2  # unchanged: the floor


def test_an_adopted_poseidon_template_shows_its_environment(api: Api, env_id: int) -> None:
    # Registered as Poseidon registers it: its own HCL (parsed by Nomad) with
    # memoryLimit as MemoryMaxMB over a 50 MB reservation.
    http = Http(api.sim.address)
    parsed = http.request("POST", "/v1/jobs/parse", json={"JobHCL": POSEIDON_HCL.read_text()})
    env = Environment(
        id=env_id,
        image="openhpi/co_execenv_java:17",
        cpu_limit=40,
        memory_limit=512,
        network_access=True,
        exposed_ports=(8080,),
        prewarming_pool_size=0,
    )
    http.register(as_poseidon_registers(parsed.json(), env))
    shown = api.client.get(url(env_id), params={"fetch": "true"}).json()
    assert shown == {
        "id": env_id,
        "image": "openhpi/co_execenv_java:17",
        "cpuLimit": 40,
        "memoryLimit": 512,
        "networkAccess": True,
        "exposedPorts": [8080],
        "prewarmingPoolSize": 0,
    }
