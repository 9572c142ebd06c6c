"""Token authentication: both header forms, wrong tokens, open routes."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from controller.api import create_app
from controller.api.auth import require_token
from tests.support.api_client import API, TOKEN, client_for, environment_body, error_of


@pytest.fixture(scope="module")
def secured(shared: Any) -> TestClient:
    _, controller = shared
    return client_for(create_app(controller.pools, api_token=TOKEN))


PROTECTED = [
    ("POST", f"{API}/runners", {"executionEnvironmentId": 1}),
    ("GET", f"{API}/runners/1-x", None),
    ("DELETE", f"{API}/runners/1-x", None),
    ("GET", f"{API}/execution-environments", None),
    ("GET", f"{API}/execution-environments/1", None),
    ("PUT", f"{API}/execution-environments/1", environment_body(1)),
    ("DELETE", f"{API}/execution-environments/1", None),
    ("GET", f"{API}/statistics/execution-environments", None),
]
OPEN = [f"{API}/health", f"{API}/version", "/healthz", "/readyz", "/metrics", "/openapi.json"]
WRONG: list[dict[str, str]] = [
    {},
    {"Poseidon-Token": "wrong"},
    {"Poseidon-Token": TOKEN + "x"},
    {"Poseidon-Token": ""},
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": TOKEN},
    {"Authorization": "Bearer"},
    {"X-Nomad-Token": TOKEN},
]


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
def test_protected_routes_need_the_token(
    secured: TestClient, method: str, path: str, body: Any
) -> None:
    for headers in WRONG:
        r = secured.request(method, path, json=body, headers=headers)
        status, message, code = error_of(r)
        assert (status, code) == (401, None), headers
        assert TOKEN not in message
        assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "headers",
    [{"Poseidon-Token": TOKEN}, {"Authorization": f"Bearer {TOKEN}"}],
    ids=["poseidon-token", "bearer"],
)
def test_either_header_form_is_accepted(secured: TestClient, headers: dict[str, str]) -> None:
    r = secured.get(f"{API}/execution-environments", headers=headers)
    assert r.status_code == 200
    # a wrong token in the other header does not matter
    both = {"Poseidon-Token": "wrong", "Authorization": "Bearer wrong", **headers}
    assert secured.get(f"{API}/statistics/execution-environments", headers=both).status_code == 200
    # authenticated requests reach validation and the routes
    r = secured.post(f"{API}/runners", content=b"{", headers=headers)
    assert error_of(r)[0] == 400
    r = secured.get(f"{API}/execution-environments/987654", headers=headers)
    assert error_of(r)[0] == 404


def test_authentication_comes_before_validation(secured: TestClient) -> None:
    assert error_of(secured.post(f"{API}/runners", content=b"{"))[0] == 401
    assert error_of(secured.get(f"{API}/execution-environments/abc"))[0] == 401
    big = b" " * (2 << 20)
    assert error_of(secured.post(f"{API}/runners", content=big))[0] == 413  # before reading


def test_probes_metrics_and_description_are_open(secured: TestClient) -> None:
    for path in OPEN:
        assert secured.get(path).status_code in (200, 204, 503), path
    assert error_of(secured.get("/nope"))[0] == 404  # unknown routes are not hidden


def test_without_a_token_nothing_is_required(shared: Any) -> None:
    _, controller = shared
    client = client_for(create_app(controller.pools))
    assert client.get(f"{API}/execution-environments").status_code == 200
    r = client.get(f"{API}/statistics/execution-environments", headers={"Poseidon-Token": "x"})
    assert r.status_code == 200


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        require_token("")


def test_the_token_is_never_logged(secured: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    secured.put(
        f"{API}/execution-environments/31337",
        json=environment_body(31337, prewarmingPoolSize=0),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    secured.get(f"{API}/runners/x", headers={"Poseidon-Token": TOKEN})
    secured.get(f"{API}/runners/x", headers={"Poseidon-Token": TOKEN + "-wrong"})
    assert any(r.name.startswith("controller.api") for r in caplog.records)
    assert TOKEN not in caplog.text
    secured.delete(
        f"{API}/execution-environments/31337", headers={"Authorization": f"Bearer {TOKEN}"}
    )


def test_security_is_declared_in_the_description(secured: TestClient) -> None:
    doc = secured.get("/openapi.json").json()
    schemes = doc["components"]["securitySchemes"]
    assert schemes["poseidonAuthToken"] == {
        "type": "apiKey",
        "in": "header",
        "name": "Poseidon-Token",
        "description": schemes["poseidonAuthToken"]["description"],
    }
    assert schemes["bearerAuth"]["type"] == "http" and schemes["bearerAuth"]["scheme"] == "bearer"
    for method, path, _ in PROTECTED:
        template = path.replace("1-x", "{runnerId}").replace("/1", "/{executionEnvironmentId}")
        operation = doc["paths"][template][method.lower()]
        assert {"poseidonAuthToken": []} in operation["security"], (method, template)
        assert {"bearerAuth": []} in operation["security"], (method, template)
        assert "401" in operation["responses"]
    for path in OPEN[:-1]:
        operation = doc["paths"][path]["get"]
        assert "security" not in operation and "401" not in operation["responses"], path
