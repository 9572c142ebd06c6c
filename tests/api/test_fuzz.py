"""API fuzzing: schemathesis against the controller's own `/openapi.json`.

A real Controller runs against the in-process Nomad simulator behind the
ASGI app, with token authentication on and a small pool maximum (the fuzzer
creates environments with any pool size the schema allows). Schemathesis
generates valid and invalid requests for every operation from the document
the app serves; each answer must

- have a documented status and match the documented schema (status code,
  content type, body, headers);
- never be a 5xx other than the documented, expected ones: 500
  NOMAD_OVERLOAD on `POST /runners` (no idle runner ready) and 503
  PREWARMING_POOL_DEPLETING on `GET /health` (a pool refilling);
- be a 4xx with a message whenever the request is invalid; valid requests
  are never rejected as invalid;
- be given only with the token: after a 2xx on a protected operation,
  schemathesis sends it again without the token and with a wrong one and
  expects 401.

Examples are bounded and derandomized so CI stays fast and deterministic.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis import Case, CheckContext, Response
from schemathesis.checks import not_a_server_error
from starlette.types import Receive, Scope, Send

from controller.api import create_app
from controller.api.models import MAX_ID
from controller.clock import ManualClock
from controller.reconcile.loop import Controller
from nomadsim import SimConfig, SimServer
from tests.helpers import wait_until
from tests.support.api_client import (
    API,
    GATEWAY,
    TOKEN,
    Api,
    client_for,
    environment_body,
)
from tests.support.controller import start_controller
from tests.support.fake_nomad import FakeNomad
from tests.support.sim import FAST

APP_OPTIONS: dict[str, Any] = {"max_pool_size": 3, "api_token": TOKEN}
AUTH = {"Poseidon-Token": TOKEN}
# Environments that exist before fuzzing starts (small ids: the fuzzer tries them often).
SEEDED = (0, 1)
# 5xx answers the API documents for a state of the system, not for a fault:
# (method, path template) → {status: errorCode}.
EXPECTED_SERVER_ERRORS = {
    ("POST", f"{API}/runners"): {500: "NOMAD_OVERLOAD"},
    ("GET", f"{API}/health"): {503: "PREWARMING_POOL_DEPLETING"},
}

CONFIG = schemathesis.Config.from_dict(
    {
        "checks": {
            # `GET`/`DELETE /runners/{id}` answer 410 Gone for a runner id that is
            # not (or no longer) claimed, as Poseidon does: a valid request, not
            # rejected input. `GET /runners/{id}/websocket` is a WebSocket handshake:
            # a plain GET (all an HTTP fuzzer sends) is answered 426 Upgrade Required.
            "positive_data_acceptance": {"expected-statuses": ["2xx", "404", "410", "426", "5xx"]},
            # Invalid input is a client error, never a server error.
            "negative_data_rejection": {
                "expected-statuses": ["400", "401", "403", "404", "405", "410", "413"]
            },
        },
    }
)


def documented_server_errors_only(ctx: CheckContext, response: Response, case: Case[Any]) -> None:
    """Replaces `not_a_server_error`: only the 5xx answers listed above."""
    if response.status_code < 500:
        return
    expected = EXPECTED_SERVER_ERRORS.get((case.method.upper(), case.operation.path), {})
    code = expected.get(response.status_code)
    body = response.json()
    assert code is not None and body.get("errorCode") == code, (
        f"{case.method} {case.formatted_path} answered {response.status_code}: {body}"
    )


def errors_carry_a_message(ctx: CheckContext, response: Response, case: Case[Any]) -> None:
    """Every error is `{message, errorCode?}` with a message a person can act on."""
    if response.status_code < 400:
        return
    body: Any = response.json()
    assert isinstance(body, dict) and set(body) <= {"message", "errorCode"}, body
    assert isinstance(body.get("message"), str) and body["message"].strip(), body


class LiveApp:
    """The ASGI app under test, bound to a running controller by the `fuzzed`
    fixture. The schema is loaded when the module is imported (so pytest gets
    one test per operation), before any simulator runs."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def describing_app() -> FastAPI:
    """Serves the same description as the app under test (it does not depend
    on the controller); no Nomad behind it, nothing started."""
    clock = ManualClock()
    return create_app(Controller(FakeNomad(clock), clock=clock).pools, **APP_OPTIONS)


LIVE = LiveApp(describing_app())
schema = schemathesis.openapi.from_asgi("/openapi.json", LIVE, config=CONFIG)


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Api]:
    """Own simulator and controller: the fuzzer creates and deletes environments."""
    described = LIVE.app.openapi()
    config: dict[str, Any] = dict(FAST)
    sim = SimServer(SimConfig(**config))
    sim.start()
    controller = start_controller(sim.address, **GATEWAY)
    try:
        wait_until(controller.ready, timeout=10)
        app = create_app(controller.pools, **APP_OPTIONS)
        assert app.openapi() == described
        api = Api(sim, controller, app, client_for(app, **AUTH))
        for env_id in SEEDED:
            body = environment_body(env_id, prewarmingPoolSize=2)
            r = api.client.put(f"{API}/execution-environments/{env_id}", json=body)
            assert r.status_code == 201, r.text
        for env_id in SEEDED:
            api.wait_pool(env_id, 2)
        LIVE.app = app
        yield api
    finally:
        LIVE.app = describing_app()
        controller.stop()
        sim.stop()


def same_environment_id(case: Case[Any]) -> None:
    """A valid `PUT /execution-environments/{id}` names the same id in the path
    and the body (otherwise 400, by design); the schema cannot say so. Only
    valid ids are aligned, so an invalid one stays invalid."""
    if case.method.upper() != "PUT" or not isinstance(case.body, dict):
        return
    path_id = str((case.path_parameters or {}).get("executionEnvironmentId"))
    body_id = case.body.get("id")
    if not re.fullmatch("[0-9]{1,19}", path_id) or int(path_id) > MAX_ID:
        return
    # JSON Schema's integers include 5.0
    if isinstance(body_id, bool) or not isinstance(body_id, int | float):
        return
    if float(body_id).is_integer() and 0 <= body_id <= MAX_ID:
        case.body["id"] = int(path_id)


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=False,
)
def test_api_answers_as_documented(case: Case[Any], fuzzed: Api) -> None:
    same_environment_id(case)
    case.call_and_validate(
        headers=AUTH,
        excluded_checks=[not_a_server_error],
        additional_checks=[documented_server_errors_only, errors_carry_a_message],
    )
