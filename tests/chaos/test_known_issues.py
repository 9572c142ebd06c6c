"""Bugs the chaos suite found, each as a minimal deterministic reproduction.

Open ones are marked xfail(strict=True): the day a fix lands, the test
passes, the strict xfail fails the suite, and whoever fixed it removes the
mark here. The three controller bugs are fixed and these are now their
regression tests; the chaos runs treat each of them as a violation again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controller.api.app import create_app
from controller.model import Environment, LossReason
from controller.nomad.client import NomadClient
from controller.reconcile.loop import Controller, ControllerSettings
from controller.reconcile.plan import Plan, PlanInput, plan
from controller.sim import SimServer
from tests.helpers import Http, runner_job, wait_until

MakeSim = Callable[..., SimServer]


@contextlib.contextmanager
def filled_controller(sim: SimServer, env: Environment) -> Iterator[Controller]:
    """A controller (no threads of its own: passes run when the test calls
    `reconcile`) whose pool of `env` is full of ready runners."""
    gateway = NomadClient(address=sim.address, timeout_s=5.0, retry_max_wait_s=0.2)
    c = Controller(gateway, ControllerSettings(write_rate_per_s=0))
    try:
        c.observer.refresh()
        c.put_environment(env)

        def pool_ready() -> bool:
            c.observer.refresh()
            c.reconcile(env.id)
            return c.pool_counts(env.id).idle_ready == env.prewarming_pool_size

        wait_until(pool_ready, timeout=10, interval=0.05)
        yield c
    finally:
        c.stop()


def test_a_claim_during_a_pass_is_not_an_invariant_violation(
    make_sim: MakeSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_sim()
    env = Environment(id=3, image="python:3.12", prewarming_pool_size=2)
    with filled_controller(sim, env) as c:
        handed: list[str] = []

        def plan_while_a_client_claims(inp: PlanInput) -> Plan:
            result = plan(inp)
            if not handed:
                # A client's claim lands while the pass is planning (an API thread).
                handed.append(c.claims.claim(env.id, timeout_s=0).id)
            return result

        monkeypatch.setattr("controller.reconcile.loop.plan", plan_while_a_client_claims)
        c.reconcile(env.id)
        assert handed
        violations = c.metrics.invariant_violations
        assert violations.labels("claimed_in_pool")._value.get() == 0


def test_a_runner_known_to_be_reset_is_not_served_from_its_replacement(
    make_sim: MakeSim,
) -> None:
    sim = make_sim(nodes=2)
    env = Environment(id=4, image="python:3.12", prewarming_pool_size=1)
    with filled_controller(sim, env) as c:
        runner = c.claims.claim(env.id, timeout_s=0)
        assert runner.alloc is not None
        claimed_on = runner.alloc.id
        r = Http(sim.address).request("POST", f"/v1/allocation/{claimed_on}/stop")
        assert r.status_code == 200, r.text

        def reset_observed() -> bool:
            # The controller lists Nomad; no pass has run yet to end the claim.
            c.observer.refresh()
            view = c.claims.lookup(runner.id)
            return view is not None and view.reset is LossReason.MIGRATED

        wait_until(reset_observed, timeout=5, interval=0.02)
        answer = TestClient(create_app(c)).get(f"/api/v1/runners/{runner.id}")
        assert answer.status_code == 410 or answer.json()["allocationId"] == claimed_on, (
            answer.status_code,
            answer.json(),
        )


def test_deleting_an_environment_before_the_first_observation_is_not_404(
    make_sim: MakeSim,
) -> None:
    sim = make_sim()
    env = Environment(id=5, image="python:3.12", prewarming_pool_size=0)
    gateway = NomadClient(address=sim.address, timeout_s=5.0, retry_max_wait_s=0.2)
    first = Controller(gateway, ControllerSettings(write_rate_per_s=0))
    first.put_environment(env)  # environment 5 exists in Nomad
    first.stop()
    # A controller that has just started (and not yet listed Nomad) is asked to delete it.
    fresh = Controller(gateway, ControllerSettings(write_rate_per_s=0))
    try:
        answer = TestClient(create_app(fresh)).delete("/api/v1/execution-environments/5")
        assert answer.status_code in (204, 503), (answer.status_code, answer.json())
    finally:
        fresh.stop()


@pytest.mark.xfail(
    strict=True,
    reason=(
        "simulator: with the production migration ordering the old allocation completes "
        "only after its replacement runs; when the replacement is stopped before it runs "
        "(the job is stopped), the old one stays running/stop with its Killing event for "
        "ever (chaos seed 2: lost runners whose migrated allocation never completes); "
        "tolerated in tests/chaos/run.py::serving"
    ),
)
def test_migrated_allocation_completes_when_its_job_stops_first(make_sim: MakeSim) -> None:
    sim = make_sim(nodes=2, startup_delay_ms=300.0, migration_ordering="production")
    http = Http(sim.address)
    job_id = "7-00000000-0000-4000-8000-000000000001"
    http.register(runner_job(job_id))
    (old,) = http.running(job_id)
    r = http.request(
        "POST",
        f"/v1/node/{old['NodeID']}/drain",
        json={"DrainSpec": {"Deadline": -1, "IgnoreSystemJobs": False}},
    )
    assert r.status_code == 200, r.text

    def migrating() -> bool:
        alloc: dict[str, Any] = http.alloc(old["ID"])
        return bool(alloc["DesiredStatus"] == "stop" and alloc.get("NextAllocation"))

    wait_until(migrating, timeout=5)
    # Stop the job while the replacement is still starting (startup takes 300 ms).
    assert http.request("DELETE", f"/v1/job/{job_id}").status_code == 200
    wait_until(lambda: http.alloc(old["ID"])["ClientStatus"] == "complete", timeout=3)
