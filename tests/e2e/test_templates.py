"""The site policy of runner templates against the simulator: a controller
started with other template settings rewrites the templates it wrote and
replaces idle runners only; the same settings, or a template Poseidon wrote,
replace nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from controller.model import Environment
from controller.nomad import jobs
from nomadsim import SimServer
from tests.e2e.test_controller import (
    MakeController,
    converged,
    one_more_pass,
    registered,
    runner_jobs,
)
from tests.helpers import Http, wait_until

ENV = Environment(
    id=31, image="python:3.12", cpu_limit=100, memory_limit=256, prewarming_pool_size=3
)
NEW_POLICY = jobs.TemplatePolicy(memory_reservation_mb=64)


def reservation(job: dict[str, Any]) -> int:
    group = next(g for g in job["TaskGroups"] if g["Name"] == jobs.RUNNER_GROUP)
    return int(group["Tasks"][0]["Resources"]["MemoryMB"])


def reservations(sim: SimServer) -> dict[str, int]:
    """Each runner's memory reservation (runners deleted meanwhile left out)."""
    http = Http(sim.address)
    out: dict[str, int] = {}
    for job in runner_jobs(sim):
        answer = http.request("GET", f"/v1/job/{job['ID']}")
        if answer.status_code == 200 and not answer.json().get("Stop"):
            out[job["ID"]] = reservation(answer.json())
    return out


def test_new_template_settings_roll_idle_runners_and_claimed_ones_finish(
    sim: SimServer, make_controller: MakeController
) -> None:
    first = make_controller(sim)
    first.pools.put_environment(ENV)
    wait_until(lambda: converged(first, sim, ENV), timeout=10)
    held = first.claims.claim(ENV.id, timeout_s=600).id
    wait_until(lambda: converged(first, sim, ENV, claimed=1), timeout=10)
    first.stop()

    second = make_controller(sim, template=NEW_POLICY)
    http = Http(sim.address)
    wait_until(lambda: reservation(http.get(f"/v1/job/{jobs.template_job_id(ENV.id)}")) == 64)

    def rolled() -> bool:
        now = reservations(sim)
        idle = {r: m for r, m in now.items() if r != held}
        return len(idle) == ENV.prewarming_pool_size and set(idle.values()) == {64}

    wait_until(rolled, timeout=15)
    assert reservations(sim)[held] == 50, "the claimed runner keeps running as it was built"
    view = second.claims.lookup(held)
    assert view is not None and view.claimed and view.job.claim is not None
    assert view.job.claim.lost_reason is None
    assert second.pools.environment(ENV.id) == ENV, "the environment itself is unchanged"


def test_a_restart_with_the_same_settings_replaces_nothing(
    sim: SimServer, make_controller: MakeController
) -> None:
    first = make_controller(sim, template=NEW_POLICY)
    first.pools.put_environment(ENV)
    wait_until(lambda: converged(first, sim, ENV), timeout=10)
    template = Http(sim.address).get(f"/v1/job/{jobs.template_job_id(ENV.id)}")
    before = registered(sim)
    first.stop()
    second = make_controller(sim, template=NEW_POLICY)
    wait_until(second.ready)
    for _ in range(3):
        one_more_pass(second, ENV.id)
    after = Http(sim.address).get(f"/v1/job/{jobs.template_job_id(ENV.id)}")
    assert after["JobModifyIndex"] == template["JobModifyIndex"], "template not rewritten"
    assert registered(sim) == before, "no runner replaced"


def test_a_template_without_a_policy_is_adopted_as_it_is(
    sim: SimServer, make_controller: MakeController
) -> None:
    # As Poseidon (or an older controller) left it: no nrc_template_policy.
    spec = jobs.template_job(ENV)
    config = next(g for g in spec["TaskGroups"] if g["Name"] == jobs.CONFIG_GROUP)
    del config["Meta"][jobs.META_TEMPLATE_POLICY]
    Http(sim.address).register(spec)
    c = make_controller(sim, template=NEW_POLICY)
    wait_until(lambda: converged(c, sim, ENV), timeout=10)
    before = registered(sim)
    for _ in range(3):
        one_more_pass(c, ENV.id)
    assert set(reservations(sim).values()) == {50}, "built from the template as it is"
    assert registered(sim) == before
    # The next PUT writes it under the current policy.
    c.pools.put_environment(ENV)
    wait_until(lambda: set(reservations(sim).values()) == {64}, timeout=15)


def test_nomads_warning_about_memory_max_is_logged_once_per_template(
    make_sim: Callable[..., SimServer],
    make_controller: MakeController,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Without memory oversubscription Nomad ignores MemoryMaxMB: every runner
    # would be held to its 50 MB reservation. The operator must hear of it.
    sim = make_sim(memory_oversubscription=False)
    c = make_controller(sim)
    with caplog.at_level(logging.WARNING, logger="controller.reconcile.writes"):
        c.pools.put_environment(ENV)
        wait_until(lambda: converged(c, sim, ENV), timeout=10)
    warnings = [r.getMessage() for r in caplog.records if r.name == "controller.reconcile.writes"]
    assert warnings == [
        "Nomad warns about template-31: Memory oversubscription is not enabled; Task "
        '"default-group.default-task" memory_max value will be ignored. Update the Scheduler '
        "Configuration to allow oversubscription."
    ]
