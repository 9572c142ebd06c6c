"""Inactivity across replicas over the simulator, in real time: two started
controllers with leader election, the activity published and read over
Nomad's HTTP API (docs/inactivity.md). A runner its client touches through
the follower outlives its timeout several times over, and the leader
releases it once the client stops; a stopped replica deletes its
variables."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from controller.model import Environment
from controller.reconcile.activity import activity_prefix
from controller.reconcile.claims import NoRunnerAvailable
from controller.reconcile.loop import Controller
from nomadsim import SimServer
from tests.helpers import Http, wait_until

ENV = Environment(id=12, image="python:3.12", prewarming_pool_size=1)
TIMEOUT_S = 2
INTERVAL_S = 0.2  # touches every 0.5 s are far inside TIMEOUT_S − 2 × INTERVAL_S

MakeController = Callable[..., Controller]


def job_exists(sim: SimServer, job_id: str) -> bool:
    return Http(sim.address).request("GET", f"/v1/job/{job_id}").status_code == 200


def activity_variables(sim: SimServer, lock_path: str) -> list[str]:
    listed = Http(sim.address).get("/v1/vars", prefix=activity_prefix(lock_path) + "/")
    return [str(v["Path"]) for v in listed]


def test_a_runner_touched_through_the_follower_is_kept_and_released_once_left(
    sim: SimServer, make_controller: MakeController
) -> None:
    a = make_controller(sim, leader_election=True, activity_publish_interval_s=INTERVAL_S)
    b = make_controller(sim, leader_election=True, activity_publish_interval_s=INTERVAL_S)
    wait_until(lambda: a.is_leader() != b.is_leader(), timeout=10)
    leader, follower = (a, b) if a.is_leader() else (b, a)
    leader.pools.put_environment(ENV)
    wait_until(leader.ready, timeout=10)
    claimed = wait_until(lambda: _claim(leader), timeout=10)
    assert claimed is not None
    runner = claimed
    follower.observer.refresh()
    assert follower.pools.lookup(runner) is not None

    path = follower.settings.leader_lock_path
    assert follower.pools.touch(runner)
    wait_until(lambda: len(activity_variables(sim, path)) == 2, timeout=5)  # both published
    kept_until = time.monotonic() + 3 * TIMEOUT_S
    pace = threading.Event()  # never set: the client's pace between touches
    while time.monotonic() < kept_until:
        assert follower.pools.touch(runner), "the follower says the runner expired"
        assert job_exists(sim, runner), "released while its client touched it"
        pace.wait(0.5)
    assert follower.pools.touch(runner)
    left = time.monotonic()
    wait_until(lambda: not job_exists(sim, runner), timeout=TIMEOUT_S + 5, interval=0.05)
    # Not before its timeout (less the scheduling of this test's own last touch).
    assert time.monotonic() - left >= TIMEOUT_S - 0.1

    a.stop()
    b.stop()
    assert activity_variables(sim, path) == []  # each replica deleted its own


def _claim(c: Controller) -> str | None:
    try:
        return c.pools.claim(ENV.id, TIMEOUT_S).id
    except NoRunnerAvailable:
        return None  # the pool is not ready yet
