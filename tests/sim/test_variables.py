"""Variables: check-and-set, paths, and locks with TTL expiry and lock delay."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import requests

from nomadsim import SimServer
from tests.helpers import Http, wait_until


def test_cas_create_update_and_conflict(sim: SimServer) -> None:
    http = Http(sim.address)
    created = http.request("PUT", "/v1/var/nrc/a", params={"cas": 0}, json={"Items": {"k": "v"}})
    assert created.status_code == 200
    index = created.json()["ModifyIndex"]
    again = http.request("PUT", "/v1/var/nrc/a", params={"cas": 0}, json={"Items": {"k": "w"}})
    assert again.status_code == 409
    assert again.json()["Items"] == {"k": "v"}  # the current variable comes back
    ok = http.request("PUT", "/v1/var/nrc/a", params={"cas": index}, json={"Items": {"k": "w"}})
    assert ok.status_code == 200
    stale = http.request("PUT", "/v1/var/nrc/a", params={"cas": index}, json={"Items": {"k": "x"}})
    assert stale.status_code == 409
    missing = http.request("PUT", "/v1/var/nrc/b", params={"cas": 5}, json={"Items": {"k": "v"}})
    assert missing.status_code == 409
    assert missing.json()["ModifyIndex"] == 0
    assert http.get("/v1/var/nrc/a")["Items"] == {"k": "w"}
    assert [v["Path"] for v in http.get("/v1/vars", prefix="nrc/")] == ["nrc/a"]
    assert "Items" not in http.get("/v1/vars")[0]
    deleted = http.request("DELETE", "/v1/var/nrc/a")
    assert (deleted.status_code, deleted.text) == (204, "")
    assert http.request("GET", "/v1/var/nrc/a").status_code == 404


@pytest.mark.parametrize("path", ["has space", "a" * 129, "semi;colon"])
def test_invalid_paths_are_400(sim: SimServer, path: str) -> None:
    response = Http(sim.address).request("PUT", f"/v1/var/{path}", json={"Items": {"k": "v"}})
    assert response.status_code == 400
    assert response.text == f'invalid path "{path}"'


def lock_op(http: Http, path: str, op: str, **lock: str) -> requests.Response:
    """PUT /v1/var/<path>?lock-<op> with {"Lock": lock}."""
    return http.request("PUT", f"/v1/var/{path}", params={f"lock-{op}": ""}, json={"Lock": lock})


def test_lock_acquire_renew_release(sim: SimServer) -> None:
    http = Http(sim.address)
    first = lock_op(http, "nrc/leader", "acquire", TTL="15s", LockDelay="15s")
    assert first.status_code == 200
    held = first.json()
    lock_id = held["Lock"]["ID"]
    assert held["Lock"]["TTL"] == "15s" and lock_id
    assert lock_op(http, "nrc/leader", "acquire", TTL="15s").status_code == 409
    renew = lock_op(http, "nrc/leader", "renew", ID=lock_id)
    assert renew.status_code == 200
    assert renew.json()["ModifyIndex"] == held["ModifyIndex"]
    assert lock_op(http, "nrc/leader", "renew", ID="x").status_code == 409
    released = lock_op(http, "nrc/leader", "release", ID=lock_id)
    assert released.status_code == 200
    assert "Lock" not in released.json()
    assert released.json()["ModifyIndex"] > held["ModifyIndex"]
    assert lock_op(http, "nrc/leader", "acquire", TTL="15s").status_code == 200


@pytest.mark.parametrize("ttl", ["5s", "25h"])
def test_lock_ttl_bounds(sim: SimServer, ttl: str) -> None:
    response = lock_op(Http(sim.address), "nrc/l", "acquire", TTL=ttl)
    assert response.status_code == 400
    assert "TTL must be between 10 seconds and 24 hours" in response.text


def test_lock_expires_after_twice_the_ttl_then_waits_out_the_delay(
    make_sim: Callable[..., SimServer],
) -> None:
    # At time_scale 0.05 a 10 s TTL expires 2×10 s×0.05 = 1.0 s after the last
    # renew, and the 10 s lock delay holds the dead lock for another 0.5 s.
    server = make_sim(time_scale=0.05)
    http = Http(server.address)
    lock = {"TTL": "10s", "LockDelay": "10s"}
    lock_id = lock_op(http, "nrc/l", "acquire", **lock).json()["Lock"]["ID"]
    # The server renews somewhere between these two instants: each bound below
    # is measured from the one that makes it hold however long the answer took.
    sent_at = time.monotonic()
    assert lock_op(http, "nrc/l", "renew", ID=lock_id).status_code == 200
    renewed_at = time.monotonic()
    wait_until(lambda: time.monotonic() - renewed_at > 1.1, timeout=5)
    # Dead but still stored: the holder cannot renew and nobody can acquire.
    assert lock_op(http, "nrc/l", "renew", ID=lock_id).status_code == 409
    assert lock_op(http, "nrc/l", "acquire", **lock).status_code == 409
    assert "Lock" in http.get("/v1/var/nrc/l")
    # Then the server removes the lock and it can be taken again.
    wait_until(lambda: "Lock" not in http.get("/v1/var/nrc/l"), timeout=5)
    assert time.monotonic() - sent_at >= 1.5
    assert lock_op(http, "nrc/l", "acquire", **lock).status_code == 200


def test_locked_variable_cannot_be_written_without_the_lock(sim: SimServer) -> None:
    http = Http(sim.address)
    held = http.request(
        "PUT",
        "/v1/var/nrc/l",
        params={"lock-acquire": ""},
        json={"Lock": {"TTL": "15s"}, "Items": {"a": "1"}},
    ).json()
    blocked = http.request("PUT", "/v1/var/nrc/l", json={"Items": {"a": "2"}})
    assert blocked.status_code == 409
    allowed = http.request(
        "PUT", "/v1/var/nrc/l", json={"Items": {"a": "2"}, "Lock": {"ID": held["Lock"]["ID"]}}
    )
    assert allowed.status_code == 200
    assert http.request("DELETE", "/v1/var/nrc/l").status_code == 409
