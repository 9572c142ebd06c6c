"""A real Controller and API over the in-memory Nomad (`FakeNomad`) with a
`ManualClock` and one environment: passes run when the test calls
`reconcile`, so races are reproduced by calling back from inside a write."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controller.api import create_app
from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.model import Allocation, Environment
from controller.reconcile.loop import Controller, ControllerSettings
from tests.support.fake_nomad import FakeNomad

ENV = Environment(id=5, image="python:3.12", prewarming_pool_size=1)
SETTINGS = ControllerSettings(workers=1, write_concurrency=1, write_rate_per_s=0)


class OneRunner:
    """One environment with a pool of one; `claim` hands its runner to a client."""

    def __init__(self, nomad: FakeNomad | None = None) -> None:
        clock = nomad.clock if nomad is not None else ManualClock()
        assert isinstance(clock, ManualClock)
        self.clock: ManualClock = clock
        self.nomad = nomad or FakeNomad(clock)
        self.controller = Controller(self.nomad, SETTINGS, clock=self.clock, metrics=Metrics())
        self.api = TestClient(create_app(self.controller.pools))

    def close(self) -> None:
        self.controller.actor.shutdown()

    def reconcile(self) -> None:
        self.controller.observer.refresh()
        assert self.controller.reconciler.reconcile(ENV.id).ok, "a write failed"

    def claim(self, timeout_s: int = 0) -> str:
        """Fill the pool, place its runner on agent-1 and claim it over the API."""
        self.controller.pools.put_environment(ENV)
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
            json={"executionEnvironmentId": ENV.id, "inactivityTimeout": timeout_s},
        )
        assert answer.status_code == 200, answer.text
        runner_id = str(answer.json()["runnerId"])
        assert runner_id == job_id
        return runner_id
