"""A maintenance night's restarts against the whole service, as CodeOcean
meets them: one attempt per claim, never a retry (to CodeOcean every error
is a failed run)."""

from __future__ import annotations

import threading
import time
from typing import Any

import requests

from controller.model import Environment
from tests.helpers import wait_until
from tests.support.world import AUTH, World, world_with

POOL = Environment(id=22, image="python:3.12", prewarming_pool_size=10)


def claims_during(world: World, fault: Any, count: int, period_s: float) -> list[tuple[int, float]]:
    """`count` claims of POOL's environment, one every `period_s` (open loop,
    each from its due time), `fault` applied after the first; each claim's
    status and seconds."""
    body = {"executionEnvironmentId": POOL.id, "inactivityTimeout": 60}
    results: list[tuple[int, float]] = [(0, 0.0)] * count
    start = time.monotonic()

    def one(i: int) -> None:
        due = start + i * period_s
        r = requests.post(world.url("/runners"), json=body, headers=AUTH, timeout=30)
        results[i] = (r.status_code, time.monotonic() - due)

    threads = []
    for i in range(count):
        time.sleep(max(0.0, start + i * period_s - time.monotonic()))  # the load's pacing
        thread = threading.Thread(target=one, args=(i,))
        thread.start()
        threads.append(thread)
        if i == 0:
            fault()
    for thread in threads:
        thread.join(60)
    return results


def test_a_leader_restart_fails_no_claim(make_sim: Any) -> None:
    """The leader restarts (no handover): dial errors for the 1 s the
    followers take to notice, then `No cluster leader` after a short hold
    (0.2 s here: the part of an election that outlasts Nomad's 5 s hold)
    until a new leader is elected 3.5 s after the restart. With a pool that
    holds (ten ready runners for eight claims), no claim fails, where five
    quick attempts alone give up within about a second; each is answered
    within the claim's ride-through."""
    config = {"leader_notice_ms": 1000.0, "rpc_hold_ms": 200.0, "election_ms": 3500.0}
    with world_with(make_sim, config, NRC_RESYNC_INTERVAL="5") as world:
        pools = world.api.controller.pools
        pools.put_environment(POOL)
        wait_until(lambda: pools.pool_counts(POOL.id).idle_ready == POOL.prewarming_pool_size)
        follower = world.sim.server_addresses["server-2"]

        def restart_leader() -> None:
            requests.post(f"{follower}/_sim/server/server-1/restart?down=5", timeout=5)

        results = claims_during(world, restart_leader, count=8, period_s=0.25)
    assert [status for status, _ in results] == [200] * 8
    assert max(seconds for _, seconds in results) < 9.0
