"""Error shapes everywhere: unknown routes, wrong methods, oversized bodies,
the catch-all, and arbitrary request bodies that must never reach it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.api import create_app
from controller.api.body import MAX_BODY_BYTES
from controller.reconcile.facade import Pools
from controller.reconcile.loop import Controller
from tests.support.api_client import API, Api, client_for, dumps, environment_body, error_of


def test_unknown_routes_are_404_and_wrong_methods_405(api: Api) -> None:
    paths = ("/", "/api/v1", "/api/v1/nope", "/api/v2/runners", "/api/v1/runners/a/b", "/healthz/")
    for path in paths:
        assert error_of(api.client.get(path)) == (404, "no such route", None), path
    r = api.client.patch(f"{API}/runners/x")
    assert error_of(r)[0] == 405
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "DELETE"}
    assert error_of(api.client.get(f"{API}/runners"))[0] == 405
    assert error_of(api.client.post(f"{API}/execution-environments/1"))[0] == 405
    assert error_of(api.client.delete("/healthz"))[0] == 405
    assert error_of(api.client.post(f"{API}/runners/", json={}))[0] == 404  # no redirect


def chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    while total > 0:
        yield b" " * min(size, total)
        total -= size


def test_bodies_over_1_mib_are_413(api: Api, env_id: int) -> None:
    too_large = f"request body larger than {MAX_BODY_BYTES} bytes"
    padded = b" " * MAX_BODY_BYTES + b"{}"
    for method, path in (("POST", f"{API}/runners"), ("PUT", f"{API}/execution-environments/1")):
        r = api.client.request(method, path, content=padded)  # with Content-Length
        assert error_of(r) == (413, too_large, None)
        r = api.client.request(method, path, content=chunks(MAX_BODY_BYTES + 1))  # chunked
        assert "content-length" not in r.request.headers
        assert error_of(r) == (413, too_large, None)
    # any route: the limit is checked before routing
    assert error_of(api.client.request("GET", f"{API}/version", content=padded))[0] == 413
    # exactly the limit is read (and then judged on its content)
    body = dumps({"executionEnvironmentId": 999_999})
    exact = body + b" " * (MAX_BODY_BYTES - len(body))
    assert error_of(api.client.post(f"{API}/runners", content=exact))[0] == 404
    chunked = iter([body, *chunks(MAX_BODY_BYTES - len(body))])
    assert error_of(api.client.post(f"{API}/runners", content=chunked))[0] == 404


def asgi_request(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> int:
    """Send a request straight to the ASGI app (to set headers no client would)."""
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
        "headers": headers,
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert set(json.loads(body)) == {"message"}
    return int(start["status"])


def test_content_length_is_checked(api: Api) -> None:
    path = f"{API}/runners"
    assert asgi_request(api.app, "POST", path, [(b"content-length", b"abc")]) == 400
    assert asgi_request(api.app, "POST", path, [(b"content-length", b"-1")]) == 400
    huge = b"9" * 30
    assert asgi_request(api.app, "POST", path, [(b"content-length", huge)]) == 413
    json = (b"content-type", b"application/json")
    assert asgi_request(api.app, "POST", path, [(b"content-length", b"2"), json]) == 400  # no id


def test_unexpected_errors_are_500_unknown_without_details(
    api: Api, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Controller) -> list[Any]:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(Pools, "environments", broken)
    r = api.client.get(f"{API}/execution-environments")
    assert r.json() == {"message": "internal error", "errorCode": "UNKNOWN"}
    assert r.status_code == 500 and "secret" not in r.text
    records = [r for r in caplog.records if r.name == "controller.api.errors"]
    assert [r.levelno for r in records] == [logging.ERROR]
    assert records[0].exc_info is not None  # the traceback goes to the log, not the client
    caplog.clear()  # this test reaches the catch-all on purpose


# -- arbitrary bodies ---------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


def near(valid: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid body with some fields replaced, removed, or added."""
    return st.fixed_dictionaries(
        {},
        optional={key: json_values | st.just(value) for key, value in valid.items()}
        | {"extra": json_values},
    )


@pytest.fixture(scope="module")
def fuzz_client(shared: Any) -> TestClient:
    _, controller = shared
    return client_for(create_app(controller.pools, max_pool_size=0))


ALLOWED_RUNNER = {200, 400, 404, 500}
ALLOWED_ENV = {201, 204, 400}


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=json_values | near({"executionEnvironmentId": 1, "inactivityTimeout": 0}),
    env=json_values | near(environment_body(777_777, prewarmingPoolSize=0)),
    raw=st.binary(max_size=64),
)
def test_no_body_reaches_the_catch_all(
    fuzz_client: TestClient, body: Any, env: Any, raw: bytes
) -> None:
    client = fuzz_client
    r = client.post(f"{API}/runners", content=dumps(body))
    assert r.status_code in ALLOWED_RUNNER, r.text
    if r.status_code == 500:
        assert r.json()["errorCode"] == "NOMAD_OVERLOAD"
    r = client.put(f"{API}/execution-environments/777777", content=dumps(env))
    assert r.status_code in ALLOWED_ENV, r.text
    for path in (f"{API}/runners", f"{API}/execution-environments/777777"):
        method = "POST" if path.endswith("runners") else "PUT"
        r = client.request(method, path, content=raw)
        assert r.status_code in ALLOWED_RUNNER | ALLOWED_ENV, r.text
        assert r.status_code < 500 or r.json().get("errorCode") == "NOMAD_OVERLOAD"
