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
from controller.api.guard import (
    allowed_hosts,
    default_hosts,
    from_a_page,
    host_allowed,
    origin_allowed,
)
from tests.support.api_client import API, environment_body


@pytest.mark.parametrize(
    ("method", "origin", "fetch_site", "refused"),
    [
        ("POST", None, None, False),  # a platform's server: no browser headers
        ("PUT", None, None, False),
        ("POST", "https://evil.example", "cross-site", True),  # a page's form or fetch
        ("POST", "https://evil.example", None, True),  # an older browser: Origin only
        ("POST", "null", "cross-site", True),  # a sandboxed page
        ("PATCH", "https://lms.example", "cross-site", False),  # the listed origin
        ("DELETE", None, "cross-site", True),  # a write marked another site's, no Origin
        ("POST", None, "same-site", True),
        ("POST", None, "same-origin", False),
        ("POST", None, "none", False),  # typed by the user: not a page's request
        ("GET", "https://evil.example", "cross-site", True),  # a page's CORS fetch
        ("GET", None, "cross-site", False),  # an image: the page cannot read the answer
    ],
)
def test_requests_from_web_pages(
    method: str, origin: str | None, fetch_site: str | None, refused: bool
) -> None:
    assert from_a_page(method, origin, fetch_site, ["https://lms.example"]) is refused


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
    """What a page sends cross-site without a preflight (a form, a `text/plain`
    fetch) carries its Origin: refused before the body is read. The same
    body without browser headers, whatever its Content-Type, is Poseidon's
    clients' and is taken."""
    client = TestClient(open_app, base_url="http://127.0.0.1:7200")
    body = json.dumps(environment_body(env_id)).encode()
    page = {"Content-Type": "text/plain", "Origin": "https://evil.example"}
    for headers in (page, {**page, "Sec-Fetch-Site": "cross-site"}):
        r = client.put(f"{API}/execution-environments/{env_id}", content=body, headers=headers)
        assert r.status_code == 403, r.text
        assert "Origin https://evil.example" in r.json()["message"]
    for path, method in ((f"{API}/runners", "POST"), (f"{API}/runners/1-x/files", "PATCH")):
        r = client.request(method, path, content=b"{}", headers=page)
        assert r.status_code == 403, (path, r.text)
    assert client.get(f"{API}/execution-environments/{env_id}").status_code == 404
    r = client.put(
        f"{API}/execution-environments/{env_id}",
        content=body,
        headers={"Content-Type": "text/plain", "Origin": "https://lms.example"},
    )
    assert r.status_code == 201, r.text  # the listed origin
    for headers in ({"Content-Type": "text/plain"}, {}):
        r = client.put(f"{API}/execution-environments/{env_id}", content=body, headers=headers)
        assert r.status_code == 204, r.text  # no browser headers: read as JSON


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
