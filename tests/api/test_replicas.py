"""The issuer's side of the hop between replicas (controller/api/replicas.py):
`POST /internal/v1/executions/{id}` answers a signed take once, refuses an
unsigned or stale one, is left out of the OpenAPI description and is served
while the replica drains. Two replicas end to end: tests/e2e/test_replica_executions.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from controller.api import create_app
from controller.api.drain import Drain
from controller.api.replicas import (
    SIGNATURE_HEADER,
    TIME_HEADER,
    IssuerClient,
    execution_from_json,
)
from controller.clock import SystemClock
from controller.execution.command import ExecutionRequest
from controller.execution.ids import Signer
from controller.execution.service import Executions, ExecutionSettings, executions
from controller.nomad.client import NomadClient
from controller.reconcile.loop import Controller

RUNNER = "1-0f0c1e2d-3b4a-4c5d-8e6f-7a8b9c0d1e2f"
SIGNER = Signer("http://127.0.0.1:7200", b"k" * 32)
REQUEST = ExecutionRequest("echo hi", 5, True, {"A": "b c"})


def issuer(drain: Drain | None = None) -> tuple[TestClient, Executions]:
    controller = Controller(NomadClient(address="http://127.0.0.1:9", retry_attempts=1))
    execution = executions(controller.pools, None, ExecutionSettings(ids=SIGNER))
    app = create_app(
        controller.pools,
        api_token="api-token-0123456789",
        execution=execution,
        issuers=IssuerClient(SIGNER, controller.pools.clock),
        drain=drain,
    )
    return TestClient(app), execution


def take(client: TestClient, execution_id: str, runner: str = RUNNER, at: int | None = None) -> Any:
    at = int(time.time()) if at is None else at
    return client.post(
        f"/internal/v1/executions/{execution_id}",
        params={"runnerId": runner},
        headers={
            TIME_HEADER: str(at),
            SIGNATURE_HEADER: SIGNER.take_signature(execution_id, runner, at),
        },
    )


def test_a_signed_take_answers_the_execution_once() -> None:
    client, execution = issuer()
    stored = execution.store.add(RUNNER, REQUEST)
    assert SIGNER.is_mine(stored.id)
    r = take(client, stored.id)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "runnerId": RUNNER,
        "command": "echo hi",
        "timeLimit": 5,
        "privilegedExecution": True,
        "environment": {"A": "b c"},
    }
    assert len(execution.store) == 0
    assert take(client, stored.id).status_code == 404


def test_another_runners_take_is_404_and_spends_nothing() -> None:
    client, execution = issuer()
    stored = execution.store.add(RUNNER, REQUEST)
    assert take(client, stored.id, runner="1-other").status_code == 404
    assert take(client, stored.id).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {TIME_HEADER: "1"},
        {SIGNATURE_HEADER: "0" * 64},
        {TIME_HEADER: "{now}", SIGNATURE_HEADER: "0" * 64},
    ],
)
def test_an_unsigned_take_is_403_and_spends_nothing(headers: dict[str, str]) -> None:
    client, execution = issuer()
    stored = execution.store.add(RUNNER, REQUEST)
    sent = {k: v.format(now=int(time.time())) for k, v in headers.items()}
    r = client.post(
        f"/internal/v1/executions/{stored.id}", params={"runnerId": RUNNER}, headers=sent
    )
    assert r.status_code == 403
    assert len(execution.store) == 1


def test_a_stale_take_is_403() -> None:
    client, execution = issuer()
    stored = execution.store.add(RUNNER, REQUEST)
    assert take(client, stored.id, at=int(time.time()) - 120).status_code == 403
    assert len(execution.store) == 1


def test_a_draining_replica_still_answers_takes() -> None:
    drain = Drain()
    drain.begin()
    client, execution = issuer(drain)
    stored = execution.store.add(RUNNER, REQUEST)
    assert client.post(f"/api/v1/runners/{RUNNER}/execute", json={}).status_code == 503
    assert take(client, stored.id).status_code == 200


def test_the_internal_route_is_not_in_the_openapi_description() -> None:
    client, _ = issuer()
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/internal")]


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"runnerId": "1-other", "command": "x", "timeLimit": 0},
        {"runnerId": RUNNER, "command": 1},
        {"runnerId": RUNNER, "command": "x", "timeLimit": True},
        {"runnerId": RUNNER, "command": "x", "timeLimit": -1},
        {
            "runnerId": RUNNER,
            "command": "x",
            "timeLimit": 0,
            "privilegedExecution": False,
            "environment": {"A": 1},
        },
    ],
)
def test_a_malformed_answer_is_no_execution(body: Any) -> None:
    assert execution_from_json(body, "id", RUNNER, SystemClock()) is None


def test_an_answer_becomes_the_execution_to_run_here() -> None:
    body = {
        "runnerId": RUNNER,
        "command": "x",
        "timeLimit": 3,
        "privilegedExecution": False,
        "environment": {"A": "1"},
    }
    execution = execution_from_json(body, "the-id", RUNNER, SystemClock())
    assert execution is not None
    assert (execution.id, execution.runner_id) == ("the-id", RUNNER)
    assert execution.request == ExecutionRequest("x", 3, False, {"A": "1"})


def _connect_while_draining(time_limit_s: int, grace_left_s: float) -> tuple[int, str]:
    """A WebSocket for an execution of this time limit, on a replica whose
    drain has `grace_left_s` of its grace left: the denial's status and code."""
    drain = Drain()
    client, execution = issuer(drain)
    drain.begin(deadline=None)
    stored = execution.store.add(RUNNER, ExecutionRequest("sleep 1", time_limit_s, False, {}))
    with client:
        assert client.portal is not None
        loop_time = client.portal.call(_loop_time)  # the app's event loop clock
        drain.deadline = loop_time + grace_left_s
        url = f"/api/v1/runners/{RUNNER}/websocket?executionID={stored.id}"
        headers = {"Authorization": "Bearer api-token-0123456789"}
        with (
            pytest.raises(WebSocketDenialResponse) as denied,
            client.websocket_connect(url, headers=headers),
        ):
            pass
    body = denied.value.json()
    return denied.value.status_code, str(body.get("errorCode"))


async def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def test_a_draining_replica_takes_only_websockets_it_can_finish() -> None:
    """Issue 47: a WebSocket whose execution would outlast the grace is 503
    SHUTTING_DOWN before the upgrade (a balancer retries it on a replica that
    takes the id from here); one that ends within the grace goes on to its
    runner, as without a drain (this replica has not observed Nomad: NOT_LEADER)."""
    assert _connect_while_draining(30, grace_left_s=10) == (503, "SHUTTING_DOWN")
    assert _connect_while_draining(0, grace_left_s=10) == (503, "SHUTTING_DOWN")  # no limit
    assert _connect_while_draining(5, grace_left_s=10) == (503, "NOT_LEADER")
