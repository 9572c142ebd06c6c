"""POST /runners, GET and DELETE /runners/{id} over a real controller."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime

import pytest

from controller.api.runners import claimed_at
from controller.dataplane.answers import lost_message
from controller.model import SECOND, LossReason
from tests.helpers import Http, runner_job, wait_until
from tests.support.api_client import API, Api, MakeApi, dumps, error_of


def test_claim_hands_out_a_ready_runner_with_its_ports(api: Api, env_id: int) -> None:
    api.put_environment(env_id, networkAccess=True, exposedPorts=[8080, 443])
    api.wait_pool(env_id, 2)
    body = api.claim(env_id, timeout_s=60)
    view = api.controller.claims.lookup(body["runnerId"])
    assert view is not None and view.job.claim is not None and view.alloc is not None
    assert view.job.claim.timeout == 60
    ports = {p["exposedPort"]: p["hostAddress"] for p in body["mappedPorts"]}
    assert set(ports) == {443, 8080}
    assert ports == {p.exposed_port: p.host_address for p in view.alloc.ports}
    for address in ports.values():
        host, _, port = address.rpartition(":")
        assert host and port.isdigit()


def test_claim_without_network_has_no_ports_and_defaults_the_timeout(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=1)
    api.wait_pool(env_id, 1)
    r = api.client.post(f"{API}/runners", json={"executionEnvironmentId": env_id})
    assert r.status_code == 200, r.text
    assert r.json()["mappedPorts"] == []
    status = api.client.get(f"{API}/runners/{r.json()['runnerId']}").json()
    assert status["inactivityTimeout"] == 0


def test_claim_of_an_unknown_environment_is_404(api: Api) -> None:
    r = api.client.post(f"{API}/runners", json={"executionEnvironmentId": 987654})
    assert error_of(r)[:1] == (404,)
    assert "987654" in error_of(r)[1]


def test_empty_pool_is_500_nomad_overload(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=0)
    r = api.client.post(f"{API}/runners", json={"executionEnvironmentId": env_id})
    status, message, code = error_of(r)
    assert (status, code) == (500, "NOMAD_OVERLOAD")
    assert str(env_id) in message


@pytest.mark.parametrize(("wait_s", "served"), [(0.0, False), (10.0, True)])
def test_a_claim_on_a_new_environment_waits_for_its_first_runner(
    make_api: MakeApi, wait_s: float, served: bool
) -> None:
    """NRC_CLAIM_WAIT: right after the environment is created no runner is
    ready yet; a claim that may wait gets the first one to start, one that
    may not is answered at once, as Poseidon answers. Either is a miss."""
    api = make_api(claim_wait_s=wait_s)
    api.put_environment(41, prewarmingPoolSize=2)
    began = time.monotonic()
    r = api.client.post(f"{API}/runners", json={"executionEnvironmentId": 41})
    waited = time.monotonic() - began
    if served:
        assert r.status_code == 200, r.text
    else:
        assert error_of(r)[2] == "NOMAD_OVERLOAD"
        assert waited < 1.0
    # The miss says no runner was ready when the claim came, whether it then
    # waited for one or not (how long the wait took is the simulator's pace).
    registry = api.controller.metrics.registry
    assert registry.get_sample_value("nrc_prewarm_misses_total", {"environment": "41"}) == 1


def test_integral_numbers_are_integers(api: Api, env_id: int) -> None:
    # JSON Schema counts 5.0 as an integer; the request gets past validation.
    api.put_environment(env_id, prewarmingPoolSize=0)
    r = api.client.post(f"{API}/runners", content=dumps({"executionEnvironmentId": float(env_id)}))
    assert error_of(r)[2] == "NOMAD_OVERLOAD"


def test_runner_status(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=1)
    api.wait_pool(env_id, 1)
    before = datetime.now(UTC)
    runner = api.claim(env_id, timeout_s=30)["runnerId"]
    r = api.client.get(f"{API}/runners/{runner}")
    assert r.status_code == 200
    body = r.json()
    view = api.controller.claims.lookup(runner)
    assert view is not None and view.alloc is not None
    assert body == {
        "runnerId": runner,
        "executionEnvironmentId": env_id,
        "status": "ready",
        "allocationId": view.alloc.id,
        "nodeName": view.alloc.node_name,
        "claimedAt": body["claimedAt"],
        "inactivityTimeout": 30,
    }
    assert body["claimedAt"].endswith("Z")
    stamp = datetime.fromisoformat(body["claimedAt"])
    assert stamp.tzinfo is not None and stamp.utcoffset() == UTC.utcoffset(None)
    # the simulator's clock is the wall clock: the claim is from this test
    assert abs((stamp - before).total_seconds()) < 60


def test_every_request_on_a_runner_restarts_its_inactivity_timer(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=1)
    api.wait_pool(env_id, 1)
    runner = api.claim(env_id, timeout_s=600)["runnerId"]
    claims = api.controller.claims

    def activity() -> int:
        view = claims.lookup(runner)
        assert view is not None
        return claims.last_activity([view])[runner]

    first = activity()
    wait_until(lambda: api.controller.clock.now_ns() > first)
    assert api.client.get(f"{API}/runners/{runner}").status_code == 200
    assert activity() > first


def test_unknown_idle_and_released_runners_are_gone(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=2)
    api.wait_pool(env_id, 2)
    unknown = f"{env_id}-{uuid.uuid4()}"
    idle = next(v.id for v in api.controller.observer.snapshot.views(env_id) if not v.claimed)
    for runner in (unknown, idle, "not-a-runner-id"):
        for method in ("GET", "DELETE"):
            status, message, code = error_of(api.client.request(method, f"{API}/runners/{runner}"))
            assert (status, code) == (410, None)
            assert runner in message
    assert api.controller.claims.lookup(idle) is not None  # an idle runner is not released

    runner = api.claim(env_id)["runnerId"]
    assert api.client.delete(f"{API}/runners/{runner}").status_code == 204
    assert api.controller.claims.lookup(runner) is None
    assert runner not in {j["ID"] for j in Http(api.sim.address).get("/v1/jobs")}
    assert error_of(api.client.delete(f"{API}/runners/{runner}"))[0] == 410
    assert error_of(api.client.get(f"{API}/runners/{runner}"))[0] == 410


def test_a_lost_runner_says_why_until_deleted(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=1)
    api.wait_pool(env_id, 1)
    runner = api.claim(env_id)["runnerId"]
    view = api.controller.claims.lookup(runner)
    assert view is not None and view.alloc is not None
    r = Http(api.sim.address).request("POST", f"/_sim/allocation/{view.alloc.id}/oom")
    assert r.status_code == 200, r.text

    def lost() -> bool:
        v = api.controller.claims.lookup(runner)
        return bool(v and v.job.claim and v.job.claim.lost_reason)

    wait_until(lost, timeout=10)
    status, message, code = error_of(api.client.get(f"{API}/runners/{runner}"))
    assert (status, code) == (410, None)
    assert message == lost_message(runner, LossReason.OOM_KILLED)
    assert message.startswith(f"runner {runner} was lost: oom_killed (")
    # deleting acknowledges the loss
    assert api.client.delete(f"{API}/runners/{runner}").status_code == 204
    assert error_of(api.client.get(f"{API}/runners/{runner}"))[1].endswith("was released")


def test_loss_messages_name_every_reason() -> None:
    assert all(reason.description for reason in LossReason)
    assert lost_message("7-x", LossReason.MIGRATED) == (
        "runner 7-x was lost: migrated (its allocation was migrated to another node; "
        "its file system was reset)"
    )


def test_claim_time_in_utc() -> None:
    assert claimed_at(0) is None
    stamp = claimed_at(1_700_000_000 * SECOND + 123_456_789)
    assert stamp == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)


def test_an_adopted_poseidon_claim_has_no_claim_time(api: Api, env_id: int) -> None:
    api.put_environment(env_id, prewarmingPoolSize=0)
    runner = f"{env_id}-{uuid.uuid4()}"
    Http(api.sim.address).register(runner_job(runner, meta={"used": "true", "timeout": "0"}))
    wait_until(lambda: api.controller.claims.lookup(runner) is not None, timeout=5)
    r = api.client.get(f"{API}/runners/{runner}")
    assert r.status_code == 200, r.text
    assert r.json()["claimedAt"] is None
    assert api.client.delete(f"{API}/runners/{runner}").status_code == 204


def test_claims_and_releases_are_logged_with_ids(
    api: Api, env_id: int, caplog: pytest.LogCaptureFixture
) -> None:
    api.put_environment(env_id, prewarmingPoolSize=1)
    api.wait_pool(env_id, 1)
    runner = api.claim(env_id)["runnerId"]
    api.client.delete(f"{API}/runners/{runner}")
    records = [
        r
        for r in caplog.records
        if r.name == "controller.api.runners" and getattr(r, "runner_id", None) == runner
    ]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert [r.getMessage().split()[0] for r in records] == ["claimed", "released"]
    assert all(getattr(r, "environment_id", None) == env_id for r in records)


BAD_RUNNER_BODIES: list[tuple[str, bytes, str]] = [
    ("malformed", b'{"executionEnvironmentId": ', "invalid JSON"),
    ("empty", b"", "body is required"),
    ("whitespace", b"  \n", "body is required"),
    ("array", b"[1]", "JSON object"),
    ("string", b'"x"', "JSON object"),
    ("null", b"null", "JSON object"),
    ("number", b"5", "JSON object"),
    ("not utf-8", b'{"executionEnvironmentId": "\xff"}', "invalid JSON"),
    ("missing id", b'{"inactivityTimeout": 5}', "executionEnvironmentId: Field required"),
    ("unknown field", b'{"executionEnvironmentId": 1, "image": "x"}', "image: Extra inputs"),
    ("id as string", b'{"executionEnvironmentId": "1"}', "executionEnvironmentId: Input should"),
    ("id as bool", b'{"executionEnvironmentId": true}', "executionEnvironmentId: Input should"),
    ("id fraction", b'{"executionEnvironmentId": 1.5}', "executionEnvironmentId: Input should"),
    ("id null", b'{"executionEnvironmentId": null}', "executionEnvironmentId: Input should"),
    ("id negative", b'{"executionEnvironmentId": -1}', "executionEnvironmentId: Input should"),
    ("id too large", b'{"executionEnvironmentId": 9223372036854775808}', "executionEnvironmentId"),
    ("id NaN", b'{"executionEnvironmentId": NaN}', "NaN is not valid JSON"),
    ("id Infinity", b'{"executionEnvironmentId": Infinity}', "Infinity is not valid JSON"),
    ("id 1e400", b'{"executionEnvironmentId": 1e400}', "executionEnvironmentId"),
    ("timeout negative", b'{"executionEnvironmentId": 1, "inactivityTimeout": -5}', "inactivity"),
    ("timeout string", b'{"executionEnvironmentId": 1, "inactivityTimeout": "5"}', "inactivity"),
    ("timeout huge", b'{"executionEnvironmentId": 1, "inactivityTimeout": 1e300}', "inactivity"),
    (
        "duplicate key",
        b'{"executionEnvironmentId": 1, "executionEnvironmentId": 2}',
        "duplicate key",
    ),
    (
        "deep nesting",
        b'{"executionEnvironmentId": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested too deeply",
    ),
    ("5000 digits", b'{"executionEnvironmentId": ' + b"9" * 5000 + b"}", "invalid JSON"),
]


@pytest.mark.parametrize(
    ("body", "expected"),
    [pytest.param(body, expected, id=name) for name, body, expected in BAD_RUNNER_BODIES],
)
def test_invalid_claim_requests_are_400(api: Api, body: bytes, expected: str) -> None:
    r = api.client.post(
        f"{API}/runners", content=body, headers={"Content-Type": "application/json"}
    )
    status, message, code = error_of(r)
    assert (status, code) == (400, None), message
    assert expected in message


def test_a_body_is_json_whatever_its_content_type(api: Api, env_id: int) -> None:
    """As Poseidon reads it: its e2e helpers send no Content-Type, `curl -d`
    sends a form's (the browser defence is the Origin: test_browser.py)."""
    api.put_environment(env_id, prewarmingPoolSize=0)
    body = dumps({"executionEnvironmentId": env_id})
    for content_type in (
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "text/html",
        "application/json; charset=utf-8",
    ):
        headers: dict[str, str] = {} if content_type is None else {"Content-Type": content_type}
        r = api.client.post(f"{API}/runners", content=body, headers=headers)
        assert error_of(r)[2] == "NOMAD_OVERLOAD", (content_type, r.text)
    for content_type in (None, "text/html"):
        headers = {} if content_type is None else {"Content-Type": content_type}
        for bad in (b"", b"<html></html>"):
            r = api.client.post(f"{API}/runners", content=bad, headers=headers)
            assert error_of(r)[0] == 400, (content_type, bad, r.text)


def test_any_id_that_is_not_a_claimed_runner_is_gone(api: Api) -> None:
    # ids are not parsed: anything that is not a claimed runner is simply gone
    for runner in (str(uuid.uuid4()), "a b", "%00", "x" * 2000):
        assert error_of(api.client.get(f"{API}/runners/{runner}"))[0] == 410
