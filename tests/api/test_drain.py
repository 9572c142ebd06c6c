"""The drain's gate (controller/api/drain.py), route by route, on an app
whose replica drains: which requests it refuses with 503 SHUTTING_DOWN and
Retry-After, which it still serves, and what `run_drain` waits for. The
whole drain of a real process is in tests/e2e/test_graceful_drain.py."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from controller.api import create_app
from controller.api.drain import Drain, describe_uses, run_drain
from controller.nomad.client import NomadClient
from controller.reconcile.loop import Controller
from controller.reconcile.uses import InFlight
from tests.support.api_client import API, client_for

RUNNER = "1-0f0c1e2d-3b4a-4c5d-8e6f-7a8b9c0d1e2f"


@pytest.fixture
def draining() -> TestClient:
    controller = Controller(NomadClient(address="http://127.0.0.1:9", retry_attempts=1))
    drain = Drain()
    drain.begin()
    return client_for(create_app(controller.pools, drain=drain))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", f"{API}/runners"),
        ("POST", f"{API}/runners/{RUNNER}/execute"),
        ("GET", f"{API}/runners/{RUNNER}/files"),
        ("PATCH", f"{API}/runners/{RUNNER}/files"),
        ("GET", f"{API}/runners/{RUNNER}/files/raw"),
        ("GET", "/readyz"),
    ],
)
def test_new_work_is_refused_while_draining(draining: TestClient, method: str, path: str) -> None:
    r = draining.request(method, path, json={})
    assert r.status_code == 503, r.text
    assert r.json()["errorCode"] == "SHUTTING_DOWN"
    if path != "/readyz":
        assert r.headers["Retry-After"] == "1"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"{API}/runners/{RUNNER}"),
        ("DELETE", f"{API}/runners/{RUNNER}"),
        ("GET", f"{API}/execution-environments"),
        # CodeOcean's /ping reads it: a deploy must not look like an outage
        ("GET", f"{API}/health"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
    ],
)
def test_everything_else_is_still_answered(draining: TestClient, method: str, path: str) -> None:
    r = draining.request(method, path)
    assert not (r.status_code == 503 and r.json().get("errorCode") == "SHUTTING_DOWN"), r.text


def test_run_drain_waits_for_work_in_flight_then_ends_what_outlives_the_grace() -> None:
    async def scenario() -> list[str]:
        drain = Drain()
        steps: list[str] = []
        drain.enter()  # one execution running, ended only by end_executions

        async def step_down() -> None:
            steps.append("step_down")

        def end_executions() -> None:
            steps.append("end_executions")
            drain.leave()

        async def executions_ended() -> None:
            steps.append("executions_ended")

        ended = await run_drain(
            drain,
            step_down=step_down,
            end_executions=end_executions,
            executions_ended=executions_ended,
            grace_s=0.05,
        )
        assert drain.draining and not ended and drain.in_flight == 0
        return steps

    assert asyncio.run(scenario()) == ["step_down", "end_executions", "executions_ended"]


def test_run_drain_ends_nothing_when_the_work_ends_within_the_grace() -> None:
    async def scenario() -> bool:
        drain = Drain()
        drain.enter()
        asyncio.get_running_loop().call_later(0.02, drain.leave)
        ended: list[str] = []

        async def nothing() -> None:
            return None

        done = await run_drain(
            drain,
            step_down=nothing,
            end_executions=lambda: ended.append("x"),
            executions_ended=nothing,
            grace_s=5.0,
        )
        return done and not ended

    assert asyncio.run(scenario())


def test_the_drain_says_which_uses_are_in_flight() -> None:
    in_flight = [
        InFlight("7-a", "execution"),
        InFlight("7-b", "download"),
        InFlight("7-a", "execution"),
    ]
    assert describe_uses(in_flight) == "1 download, 2 execution"
    assert describe_uses([]) == "nothing"


def test_run_drain_waits_for_ids_still_to_be_taken_within_the_grace() -> None:
    """With ids other replicas take, an idle replica stays up until its ids
    were taken (or expired), not longer than the grace."""

    async def scenario(taken_after_s: float | None, grace_s: float) -> tuple[bool, list[str]]:
        drain = Drain()
        waiting = [2]
        loop = asyncio.get_running_loop()
        if taken_after_s is not None:
            loop.call_later(taken_after_s / 2, lambda: waiting.__setitem__(0, 1))
            loop.call_later(taken_after_s, lambda: waiting.__setitem__(0, 0))
        steps: list[str] = []

        async def step_down() -> None:
            steps.append("step_down")

        async def executions_ended() -> None:
            steps.append(f"ended with {waiting[0]} waiting")

        ended = await run_drain(
            drain,
            step_down=step_down,
            end_executions=lambda: steps.append("end_executions"),
            executions_ended=executions_ended,
            grace_s=grace_s,
            ids_waiting=lambda: waiting[0],
            poll_s=0.01,
        )
        return ended, steps

    assert asyncio.run(scenario(0.05, 5.0)) == (True, ["step_down", "ended with 0 waiting"])
    # Never taken: the grace bounds the wait (nothing runs, so nothing is ended).
    assert asyncio.run(scenario(None, 0.05)) == (True, ["step_down", "ended with 2 waiting"])
