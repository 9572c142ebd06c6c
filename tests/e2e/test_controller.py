"""End to end over HTTP against the simulator: pools, claims, losses, restarts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client import generate_latest

from controller.model import Environment, LossReason, Phase, RunnerView
from controller.nomad import jobs
from controller.reconcile.claims import NoRunnerAvailable
from controller.reconcile.loop import Controller
from nomadsim import SimServer
from tests.helpers import Http, wait_until

ENV = Environment(
    id=11, image="python:3.12", cpu_limit=100, memory_limit=128, prewarming_pool_size=5
)

MakeController = Callable[..., Controller]
MakeSim = Callable[..., SimServer]


def idle_ready(c: Controller, env_id: int = ENV.id) -> list[RunnerView]:
    return [
        v for v in c.observer.snapshot.views(env_id) if not v.claimed and v.phase is Phase.READY
    ]


def runner_jobs(sim: SimServer) -> list[dict[str, Any]]:
    http = Http(sim.address)
    return [j for j in http.get("/v1/jobs") if jobs.runner_env_id(j["ID"]) is not None]


def registered(sim: SimServer) -> int:
    """Jobs ever created in the simulator (updates of a job not counted)."""
    return int(Http(sim.address).get("/_sim/stats")["JobsRegisteredTotal"])


def lost_reason(c: Controller, runner_id: str) -> LossReason | None:
    """Why a claimed runner was lost, once the controller has ended its claim."""
    view = c.claims.lookup(runner_id)
    return view.job.claim.lost_reason if view and view.job.claim else None


def one_more_pass(c: Controller, env_id: int) -> None:
    passes = c.passes
    c.enqueue(env_id)
    wait_until(lambda: c.passes > passes, timeout=10)


def converged(c: Controller, sim: SimServer, env: Environment = ENV, claimed: int = 0) -> bool:
    """The pool is full of ready idle runners and Nomad holds nothing else."""
    return (
        len(idle_ready(c, env.id)) == env.prewarming_pool_size
        and len(runner_jobs(sim)) == env.prewarming_pool_size + claimed
    )


def test_pool_fills_exactly(sim: SimServer, make_controller: MakeController) -> None:
    c = make_controller(sim)
    assert c.pools.put_environment(ENV) is True
    wait_until(lambda: converged(c, sim), timeout=10)
    assert registered(sim) == 1 + ENV.prewarming_pool_size  # template + runners
    assert c.pools.environment(ENV.id) == ENV
    assert c.pools.put_environment(ENV) is False  # replacing an existing one


def test_stale_reads_never_over_create(make_sim: MakeSim, make_controller: MakeController) -> None:
    sim = make_sim(seed=5)
    Http(sim.address).request(
        "PUT", "/_sim/faults", json={"stale_read_rate": 0.5}
    ).raise_for_status()
    c = make_controller(sim)
    env = Environment(id=12, image="python:3.12", prewarming_pool_size=50)
    c.pools.put_environment(env)
    wait_until(lambda: converged(c, sim, env), timeout=20)
    # a few more passes over lagging lists must not create anything either
    for _ in range(5):
        one_more_pass(c, env.id)
    assert registered(sim) == 1 + 50
    guards = c.metrics.guard_hits
    assert guards.labels("stale_list")._value.get() + guards.labels("expectation")._value.get() > 0
    for invariant in ("claimed_twice", "claimed_in_pool"):
        assert c.metrics.invariant_violations.labels(invariant)._value.get() == 0


def test_claim_and_release(sim: SimServer, make_controller: MakeController) -> None:
    c = make_controller(sim)
    c.pools.put_environment(ENV)
    wait_until(lambda: converged(c, sim), timeout=10)
    runner = c.claims.claim(ENV.id, timeout_s=60)
    assert runner.claimed and runner.job.claim is not None
    assert runner.job.claim.alloc_id == (runner.alloc.id if runner.alloc else None)
    meta = Http(sim.address).get(f"/v1/job/{runner.id}")["TaskGroups"][1]["Meta"]
    assert meta["used"] == "true" and meta["timeout"] == "60"
    # the pool refills around the claim
    wait_until(lambda: converged(c, sim, claimed=1), timeout=10)
    assert c.claims.release(runner.id) is True
    assert c.claims.release(runner.id) is False
    wait_until(lambda: runner.id not in {j["ID"] for j in runner_jobs(sim)}, timeout=5)
    wait_until(lambda: converged(c, sim), timeout=10)


def test_fifty_concurrent_claims_on_a_pool_of_twenty(
    sim: SimServer, make_controller: MakeController
) -> None:
    c = make_controller(sim)
    env = Environment(id=13, image="python:3.12", prewarming_pool_size=20)
    c.pools.put_environment(env)
    wait_until(lambda: converged(c, sim, env), timeout=10)
    # No node takes new work: refills stay pending, so exactly the 20 ready
    # runners can be handed out.
    http = Http(sim.address)
    for node in http.get("/v1/nodes"):
        r = http.request(
            "POST", f"/v1/node/{node['ID']}/eligibility", json={"Eligibility": "ineligible"}
        )
        assert r.status_code == 200, r.text
    barrier = threading.Barrier(50)

    def claim(_: int) -> str | None:
        barrier.wait()
        try:
            return c.claims.claim(env.id, timeout_s=0).id
        except NoRunnerAvailable:
            return None

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(claim, range(50)))
    won = [r for r in results if r is not None]
    assert len(won) == 20 and len(set(won)) == 20
    assert results.count(None) == 30
    # Nomad agrees: each of the 20 is claimed once, with one claim.
    for runner_id in won:
        assert http.get(f"/v1/job/{runner_id}")["TaskGroups"][1]["Meta"]["used"] == "true"
    assert c.metrics.claims.labels("claimed")._value.get() == 20
    assert c.metrics.claims.labels("empty")._value.get() == 30
    one_more_pass(c, env.id)  # it checks the invariants over the claims
    assert c.metrics.invariant_violations.labels("claimed_twice")._value.get() == 0
    assert c.metrics.invariant_violations.labels("claimed_in_pool")._value.get() == 0


def test_claims_from_two_replicas_never_share_a_runner(
    sim: SimServer, make_controller: MakeController
) -> None:
    """Only EnforceIndex stands between two processes claiming from one pool."""
    a = make_controller(sim)
    env = Environment(id=16, image="python:3.12", prewarming_pool_size=20)
    a.pools.put_environment(env)
    wait_until(lambda: converged(a, sim, env), timeout=10)
    b = make_controller(sim, workers=0)  # a second process that only claims
    wait_until(lambda: len(idle_ready(b, env.id)) == 20, timeout=10)
    http = Http(sim.address)
    for node in http.get("/v1/nodes"):
        http.request(
            "POST", f"/v1/node/{node['ID']}/eligibility", json={"Eligibility": "ineligible"}
        ).raise_for_status()
    barrier = threading.Barrier(40)

    def claim(n: int) -> str | None:
        replica = a if n % 2 else b
        barrier.wait()
        try:
            return replica.claims.claim(env.id, timeout_s=0).id
        except NoRunnerAvailable:
            return None

    with ThreadPoolExecutor(40) as pool:
        won = [r for r in pool.map(claim, range(40)) if r is not None]
    assert len(won) == len(set(won)) == 20
    conflicts = sum(c.metrics.claims.labels("conflict")._value.get() for c in (a, b))
    assert conflicts > 0, "both replicas raced for the same runners"


def test_unknown_environment_and_not_leader(
    sim: SimServer, make_controller: MakeController
) -> None:
    from controller.reconcile.claims import UnknownEnvironment

    c = make_controller(sim)
    wait_until(lambda: c.ready())
    with pytest.raises(UnknownEnvironment):
        c.claims.claim(999, timeout_s=0)
    assert c.pools.delete_environment(999) is False


def drain(sim: SimServer, node_id: str) -> None:
    r = Http(sim.address).request(
        "POST",
        f"/v1/node/{node_id}/drain",
        json={"DrainSpec": {"Deadline": -1, "IgnoreSystemJobs": False}, "Meta": None},
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("ordering", ["production", "client"])
def test_drain_loses_claimed_runner_and_migrates_idle_ones(
    make_sim: MakeSim, make_controller: MakeController, ordering: str
) -> None:
    sim = make_sim(nodes=2, migration_ordering=ordering)
    c = make_controller(sim)
    env = Environment(id=14, image="python:3.12", prewarming_pool_size=6)
    c.pools.put_environment(env)
    wait_until(lambda: converged(c, sim, env), timeout=10)
    runner = c.claims.claim(env.id, timeout_s=0)
    assert runner.alloc is not None
    node = runner.alloc.node_id
    wait_until(lambda: converged(c, sim, env, claimed=1), timeout=10)
    before = registered(sim)
    idle_on_node = {v.id for v in idle_ready(c, env.id) if v.alloc and v.alloc.node_id == node}
    assert idle_on_node, "spread placement puts idle runners on both nodes"
    drain(sim, node)

    assert wait_until(lambda: lost_reason(c, runner.id), timeout=10) is LossReason.MIGRATED
    # idle runners on the drained node keep their jobs and serve from new allocations
    wait_until(lambda: {v.id for v in idle_ready(c, env.id)} >= idle_on_node, timeout=10)
    for v in idle_ready(c, env.id):
        assert v.alloc is not None and v.alloc.node_id != node
    # The claimed runner was replaced in the pool when it was claimed; the
    # drain recreates nothing: idle runners moved with their jobs.
    wait_until(lambda: len(idle_ready(c, env.id)) == 6, timeout=10)
    assert registered(sim) == before
    assert c.metrics.runner_losses.labels("migrated")._value.get() == 1


def test_oom_kill_ends_the_claim(sim: SimServer, make_controller: MakeController) -> None:
    c = make_controller(sim)
    c.pools.put_environment(ENV)
    wait_until(lambda: converged(c, sim), timeout=10)
    runner = c.claims.claim(ENV.id, timeout_s=0)
    assert runner.alloc is not None
    r = Http(sim.address).request("POST", f"/_sim/allocation/{runner.alloc.id}/oom")
    assert r.status_code == 200, r.text

    assert wait_until(lambda: lost_reason(c, runner.id), timeout=10) is LossReason.OOM_KILLED


def test_crash_restarted_in_place_ends_the_claim(
    sim: SimServer, make_controller: MakeController
) -> None:
    c = make_controller(sim)
    c.pools.put_environment(ENV)
    wait_until(lambda: converged(c, sim), timeout=10)
    runner = c.claims.claim(ENV.id, timeout_s=0)
    idle = [v.id for v in idle_ready(c) if v.id != runner.id]
    assert runner.alloc is not None
    r = Http(sim.address).request("POST", f"/_sim/allocation/{runner.alloc.id}/crash")
    assert r.status_code == 200, r.text

    assert wait_until(lambda: lost_reason(c, runner.id), timeout=10) is LossReason.RESTARTED
    assert c.metrics.runner_losses.labels("restarted")._value.get() == 1
    assert set(idle) <= {v.id for v in idle_ready(c)}  # nobody else was touched


def test_inactivity_timeout_releases(sim: SimServer, make_controller: MakeController) -> None:
    c = make_controller(sim)
    c.pools.put_environment(ENV)
    wait_until(lambda: converged(c, sim), timeout=10)
    runner = c.claims.claim(ENV.id, timeout_s=1)
    kept = c.claims.claim(ENV.id, timeout_s=0)
    wait_until(lambda: c.claims.lookup(runner.id) is None, timeout=5)
    assert runner.id not in {j["ID"] for j in runner_jobs(sim)}
    assert c.claims.lookup(kept.id) is not None


def test_a_new_controller_keeps_every_claim(
    sim: SimServer, make_controller: MakeController
) -> None:
    first = make_controller(sim)
    first.pools.put_environment(ENV)
    wait_until(lambda: converged(first, sim), timeout=10)
    held = {first.claims.claim(ENV.id, timeout_s=600).id for _ in range(3)}
    wait_until(lambda: converged(first, sim, claimed=3), timeout=10)
    before = registered(sim)
    first.stop()
    second = make_controller(sim)
    wait_until(lambda: second.ready())
    wait_until(lambda: converged(second, sim, claimed=3), timeout=10)
    claimed = {v.id for v in second.observer.snapshot.views(ENV.id) if v.claimed}
    assert claimed == held
    assert registered(sim) == before  # nothing recreated
    for runner_id in held:
        view = second.claims.lookup(runner_id)
        assert view is not None and view.job.claim is not None
        assert view.job.claim.timeout == 600 and view.job.claim.lost_reason is None


def test_orphans_are_removed_after_the_grace_period(
    sim: SimServer, make_controller: MakeController
) -> None:
    c = make_controller(sim)
    c.pools.put_environment(ENV)
    wait_until(lambda: converged(c, sim), timeout=10)
    held = c.claims.claim(ENV.id, timeout_s=0)
    # the template disappears behind our back (another tool, an operator)
    r = Http(sim.address).request("DELETE", f"/v1/job/{jobs.template_job_id(ENV.id)}?purge=true")
    assert r.status_code == 200
    wait_until(lambda: [j["ID"] for j in runner_jobs(sim)] == [held.id], timeout=10)


def test_two_controllers_with_leader_election_exactly_one_acts(
    sim: SimServer, make_controller: MakeController
) -> None:
    a = make_controller(sim, leader_election=True)
    b = make_controller(sim, leader_election=True)
    wait_until(lambda: a.is_leader() != b.is_leader(), timeout=10)
    leader, follower = (a, b) if a.is_leader() else (b, a)
    leader.pools.put_environment(ENV)
    wait_until(lambda: converged(leader, sim), timeout=10)
    assert registered(sim) == 1 + ENV.prewarming_pool_size
    # The follower serves claims (every replica does) but keeps no pool up.
    wait_until(follower.ready, timeout=10)
    wait_until(lambda: follower.pools.environment(ENV.id) is not None, timeout=10)
    served = wait_until(lambda: _claimed(follower), timeout=10)
    wait_until(lambda: converged(leader, sim), timeout=10)  # the leader refills
    assert follower.passes == 0
    assert served is not None and served.claimed
    assert 'nrc_runners{environment="11"' not in generate_latest(follower.metrics.registry).decode()
    assert 'nrc_runners{environment="11"' in generate_latest(leader.metrics.registry).decode()
    leader.stop()
    wait_until(follower.is_leader, timeout=10)
    wait_until(follower.ready, timeout=5)
    runner = follower.claims.claim(ENV.id, timeout_s=0)
    assert runner.claimed


def _claimed(controller: Controller) -> RunnerView | None:
    """A claim through `controller`; None while it has no ready runner."""
    try:
        return controller.claims.claim(ENV.id, timeout_s=0)
    except NoRunnerAvailable:
        return None


def test_node_down_loses_the_claimed_runner(
    make_sim: MakeSim, make_controller: MakeController
) -> None:
    sim = make_sim(nodes=2)
    c = make_controller(sim)
    c.pools.put_environment(ENV)
    wait_until(lambda: converged(c, sim), timeout=10)
    runner = c.claims.claim(ENV.id, timeout_s=0)
    assert runner.alloc is not None
    r = Http(sim.address).request("POST", f"/_sim/node/{runner.alloc.node_id}/down")
    assert r.status_code == 200, r.text

    assert wait_until(lambda: lost_reason(c, runner.id), timeout=10) is LossReason.LOST
    wait_until(lambda: len(idle_ready(c)) == ENV.prewarming_pool_size, timeout=10)


def test_no_capacity_backs_off_and_degrades_then_recovers(
    sim: SimServer, make_controller: MakeController
) -> None:
    from controller.model import SECOND
    from controller.reconcile.plan import PlanSettings

    c = make_controller(
        sim,
        plan=PlanSettings(
            startup_timeout_ns=SECOND // 5,
            backoff_base_ns=SECOND // 10,
            backoff_cap_ns=SECOND,
            degraded_after=3,
        ),
    )
    # more CPU than any node has: every allocation stays unplaced (memory
    # would not do: only its 50 MB reservation counts for placement)
    huge = Environment(id=15, image="python:3.12", cpu_limit=10**7, prewarming_pool_size=2)
    c.pools.put_environment(huge)
    wait_until(lambda: c.pools.degraded(huge.id), timeout=10)
    assert c.metrics.environment_degraded.labels("15")._value.get() == 1
    # churn is bounded: never more runner jobs than the pool at once
    assert len(runner_jobs(sim)) <= 2
    created = registered(sim) - 1
    assert created <= 2 * 4  # ≤ 4 rounds of 2 within the backoff so far
    fixed = Environment(id=15, image="python:3.12", cpu_limit=100, prewarming_pool_size=2)
    c.pools.put_environment(fixed)
    wait_until(lambda: converged(c, sim, fixed), timeout=10)
    wait_until(lambda: not c.pools.degraded(huge.id), timeout=10)


def test_pools_converge_through_no_leader_bursts(
    make_sim: MakeSim, make_controller: MakeController
) -> None:
    sim = make_sim(seed=9)
    c = make_controller(sim)
    wait_until(c.ready)
    http = Http(sim.address)
    http.request("PUT", "/_sim/faults", json={"http_error_rate": 0.3}).raise_for_status()
    c.pools.put_environment(ENV)
    wait_until(lambda: len(idle_ready(c)) == ENV.prewarming_pool_size, timeout=15)
    http.request("PUT", "/_sim/faults", json={"http_error_rate": 0.0}).raise_for_status()
    wait_until(lambda: converged(c, sim), timeout=10)
    assert registered(sim) == 1 + ENV.prewarming_pool_size
