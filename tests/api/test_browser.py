"""Browser defences (issue 24, finding 4): a web page cannot drive the API
with a simple cross-site request, through a re-pointed name, or over the
execution WebSocket — whether or not a token is set."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from controller.api import create_app
from controller.api.guard import allowed_hosts, default_hosts, host_allowed, is_json, origin_allowed
from tests.support.api_client import API, environment_body


@pytest.mark.parametrize(
    ("value", "json_"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("Application/JSON", True),
        ("application/problem+json", True),
        ("text/plain", False),  # what a cross-site form or fetch sends without a preflight
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("text/json", False),
        ("application/jsonx", False),
        ("", False),
        (None, False),
    ],
)
def test_json_content_types(value: str | None, json_: bool) -> None:
    assert is_json(value) is json_


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:7200", True),
        ("localhost", True),
        ("LOCALHOST:80", True),
        ("[::1]:7200", True),
        ("evil.example", False),  # DNS rebinding: the page's own name
        ("evil.example:7200", False),
        ("127.0.0.1.evil.example", False),
        (None, False),
    ],
)
def test_trusted_hosts_by_default_on_loopback(host: str | None, allowed: bool) -> None:
    assert host_allowed(host, default_hosts("127.0.0.1")) is allowed


def test_host_settings() -> None:
    assert default_hosts("0.0.0.0") is None and default_hosts("::") is None  # any
    assert allowed_hosts([""], "10.0.0.5") == frozenset(
        {"10.0.0.5", "localhost", "127.0.0.1", "::1"}
    )
    assert allowed_hosts(["api.example", "10.0.0.5"], "0.0.0.0") == frozenset(
        {"api.example", "10.0.0.5"}
    )
    assert allowed_hosts(["*"], "127.0.0.1") is None


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),  # not a browser: a platform's server
        ("https://lms.example", True),
        ("https://LMS.example/", True),
        ("http://lms.example", False),
        ("https://lms.example:8443", False),
        ("https://evil.example", False),
        ("null", False),
    ],
)
def test_websocket_origins(origin: str | None, allowed: bool) -> None:
    assert origin_allowed(origin, ["https://lms.example"]) is allowed


@pytest.fixture(scope="module")
def open_app(shared: Any) -> Any:
    """No token, as `dev` used to run and `run` still may on loopback."""
    _, controller = shared
    return create_app(
        controller.pools,
        allowed_hosts=default_hosts("127.0.0.1"),
        allowed_origins=("https://lms.example",),
    )


def test_a_cross_site_text_plain_post_is_refused(open_app: Any, env_id: int) -> None:
    client = TestClient(open_app, base_url="http://127.0.0.1:7200")
    body = json.dumps(environment_body(env_id)).encode()
    for headers in ({"Content-Type": "text/plain"}, {}):
        r = client.put(f"{API}/execution-environments/{env_id}", content=body, headers=headers)
        assert r.status_code == 415, r.text
        assert "application/json" in r.json()["message"]
    assert client.get(f"{API}/execution-environments/{env_id}").status_code == 404
    r = client.post(
        f"{API}/runners",
        content=b'{"executionEnvironmentId": 1}',
        headers={"Content-Type": "text/plain"},
    )
    assert r.status_code == 415
    r = client.patch(
        f"{API}/runners/1-x/files", content=b"{}", headers={"Content-Type": "text/plain"}
    )
    assert r.status_code == 410  # the runner first, as Poseidon answers
    ok = {"Content-Type": "application/json"}
    r = client.put(f"{API}/execution-environments/{env_id}", content=body, headers=ok)
    assert r.status_code == 201


def test_an_untrusted_host_is_refused(open_app: Any) -> None:
    assert TestClient(open_app, base_url="http://127.0.0.1:7200").get("/healthz").status_code == 200
    rebound = TestClient(open_app, base_url="http://evil.example:7200")
    r = rebound.get(f"{API}/execution-environments")
    assert r.status_code == 400
    assert "Host" in r.json()["message"]
    url = f"ws://evil.example:7200{API}/runners/1-x/websocket?executionID=x"
    with pytest.raises(WebSocketDenialResponse) as denied, rebound.websocket_connect(url):
        pass
    assert denied.value.status_code == 400


def test_the_websocket_refuses_a_browser_origin(open_app: Any) -> None:
    client = TestClient(open_app, base_url="http://127.0.0.1:7200")
    url = f"ws://127.0.0.1:7200{API}/runners/1-x/websocket?executionID=x"
    browser = {"Origin": "https://evil.example"}
    with (
        pytest.raises(WebSocketDenialResponse) as denied,
        client.websocket_connect(url, headers=browser),
    ):
        pass
    assert denied.value.status_code == 403
    assert "Origin" in denied.value.json()["message"]
    # no Origin, or a listed one: on to the runner (unknown here: 410)
    for headers in ({}, {"Origin": "https://lms.example"}):
        with (
            pytest.raises(WebSocketDenialResponse) as denied,
            client.websocket_connect(url, headers=headers),
        ):
            pass
        assert denied.value.status_code == 410
