"""Regression (chaos seed 145): a runner its client had just touched was deleted
for `inactivity_timeout`.

What happened: a restarted controller planned the release of an expired claim
and re-checked the expiry, then its deregistration went through retries in a
burst of Nomad 500s. Meanwhile the client's `GET /runners/{id}` was answered
200 (its timer started again), and 0.26 s later the retried deregistration
landed: a runner deleted while its client held it and had been told it was
alive.

The timing is reproduced exactly: the deregistration of the in-memory Nomad
calls back while it is "in flight", and the client's request is made there.
A release that is decided is final: the request is answered 410 naming the
inactivity timeout, never 200.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from controller.api import create_app
from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.model import Allocation, Environment
from controller.nomad.gateway import NomadUnavailable
from controller.reconcile.loop import Controller, ControllerSettings
from tests.reconcile.fake_nomad import FakeNomad

ENV = Environment(id=5, image="python:3.12", prewarming_pool_size=1)
TIMEOUT_S = 1


class Scene:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.nomad = FakeNomad(self.clock)
        self.controller = Controller(
            self.nomad,
            ControllerSettings(workers=1, write_concurrency=1, write_rate_per_s=0),
            clock=self.clock,
            metrics=Metrics(),
        )
        self.api = TestClient(create_app(self.controller))

    def reconcile(self) -> None:
        self.controller.observer.refresh()
        assert self.controller.reconcile(ENV.id), "a write failed"

    def claimed_runner(self) -> str:
        self.controller.put_environment(ENV)
        self.reconcile()
        (job_id,) = self.nomad.created()
        now = self.clock.now_ns()
        self.nomad.put_alloc(
            Allocation(
                id="alloc-1",
                job_id=job_id,
                node_id="agent-1",
                node_name="agent-1",
                client_status="running",
                create_index=self.nomad.index + 1,
                create_time=now,
                started_at=now,
            )
        )
        self.reconcile()
        answer = self.api.post(
            "/api/v1/runners",
            json={"executionEnvironmentId": ENV.id, "inactivityTimeout": TIMEOUT_S},
        )
        assert answer.status_code == 200, answer.text
        runner_id = str(answer.json()["runnerId"])
        assert runner_id == job_id
        return runner_id


@pytest.fixture
def scene() -> Iterator[Scene]:
    s = Scene()
    try:
        yield s
    finally:
        s.controller.actor.shutdown()


def test_a_touch_while_the_release_is_in_flight_is_told_the_runner_expired(
    scene: Scene,
) -> None:
    runner_id = scene.claimed_runner()
    scene.clock.advance(TIMEOUT_S + 0.5)  # nobody touched it: expired
    answers: list[tuple[int, str]] = []

    def client_touches_meanwhile(job_id: str) -> None:
        if job_id == runner_id:
            got = scene.api.get(f"/api/v1/runners/{runner_id}")
            answers.append((got.status_code, str(got.json().get("message", ""))))

    scene.nomad.before_deregister = client_touches_meanwhile
    scene.reconcile()

    assert scene.nomad.deregistered() == [runner_id]
    assert len(answers) == 1
    status, message = answers[0]
    assert status == 410, "the client was told its runner is alive while it was being deleted"
    assert "inactivity timeout" in message
    # and after the deletion, it is simply gone
    assert scene.api.get(f"/api/v1/runners/{runner_id}").status_code == 410


def test_a_touch_before_the_release_is_decided_keeps_the_runner(scene: Scene) -> None:
    runner_id = scene.claimed_runner()
    scene.clock.advance(TIMEOUT_S - 0.2)
    assert scene.api.get(f"/api/v1/runners/{runner_id}").status_code == 200
    scene.clock.advance(0.5)  # past the claim's first expiry, not past the touch's
    scene.reconcile()
    assert runner_id not in scene.nomad.deregistered()
    assert scene.api.get(f"/api/v1/runners/{runner_id}").status_code == 200


def test_a_failed_release_stays_decided(scene: Scene) -> None:
    """A release that failed is retried by the next pass; the claim stays
    expired in between (a 410 is never followed by a 200)."""
    runner_id = scene.claimed_runner()
    scene.clock.advance(TIMEOUT_S + 0.5)

    def unavailable(job_id: str) -> None:
        raise NomadUnavailable("No cluster leader")

    scene.nomad.before_deregister = unavailable
    scene.controller.observer.refresh()
    assert not scene.controller.reconcile(ENV.id)  # the write failed
    assert scene.api.get(f"/api/v1/runners/{runner_id}").status_code == 410
    scene.nomad.before_deregister = None
    scene.reconcile()
    assert scene.nomad.deregistered() == [runner_id]
