"""The production migration of docs/architecture.md, in all 24 orders (plus duplicated
and missing reports), through derive and plan.

Each report is what one event said about one allocation. The controller acts
on lists, not on reports, and a list shows each allocation at its newest
ModifyIndex; so the observed state of an allocation is the newest report that
has arrived for it, whatever the arrival order. After every report the pass
runs, and any EndClaim it plans is applied to the job, as the controller's
write would be.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from controller.model import SECOND, Allocation, Claim, Environment, LossReason, Phase, RunnerJob
from controller.reconcile.derive import derive_runner
from controller.reconcile.plan import CreateRunners, DeleteRunner, EndClaim, PlanInput, plan

T0 = 1_700_000_000 * SECOND
MIGRATING = "alloc is being migrated"
ENV = Environment(id=7, image="python:3.12", prewarming_pool_size=1)

A1_RUNNING = Allocation(
    id="a1",
    job_id="J",
    node_name="agent-3",
    client_status="running",
    create_index=11,
    create_time=T0,
    modify_time=T0 + SECOND,
    started_at=T0 + SECOND,
)
# The four reports of docs/architecture.md; PreviousAllocation is on none of them.
EVENTS = (
    replace(
        A1_RUNNING,
        desired_status="stop",
        desired_description=MIGRATING,
        modify_index=40,
        modify_time=T0 + 10 * SECOND,
    ),
    Allocation(
        id="a2",
        job_id="J",
        node_name="agent-4",
        client_status="pending",
        create_index=41,
        create_time=T0 + 10 * SECOND,
        modify_index=41,
    ),
    Allocation(
        id="a2",
        job_id="J",
        node_name="agent-4",
        client_status="running",
        create_index=41,
        create_time=T0 + 10 * SECOND,
        started_at=T0 + 10 * SECOND + 700_000_000,
        modify_index=42,
    ),
    replace(
        A1_RUNNING,
        client_status="complete",
        desired_status="stop",
        desired_description=MIGRATING,
        modify_index=43,
    ),
)


def orders() -> list[tuple[str, tuple[int, ...]]]:
    out = [(f"order {''.join(str(i + 1) for i in p)}", p) for p in itertools.permutations(range(4))]
    out += [
        (f"each twice {''.join(str(i + 1) for i in p)}", p + p)
        for p in [(0, 1, 2, 3), (3, 2, 1, 0)]
    ]
    out += [(f"event {m + 1} missing", tuple(i for i in range(4) if i != m)) for m in range(4)]
    return out


def replay(claim: Claim | None, sequence: tuple[int, ...]):
    job = RunnerJob(
        id="J",
        env_id=7,
        job_modify_index=10,
        status="running",
        claim=claim,
        template_hash=ENV.template_hash,
    )
    state = {"a1": A1_RUNNING}
    ended: list[LossReason] = []
    views = []
    for step, i in enumerate(sequence):
        event = EVENTS[i]
        if event.id not in state or state[event.id].modify_index < event.modify_index:
            state[event.id] = event
        view = derive_runner(job, list(state.values()))
        views.append(view)
        result = plan(PlanInput(env_id=7, env=ENV, runners=(view,), now=T0 + (20 + step) * SECOND))
        for action in result.actions:
            if isinstance(action, EndClaim):
                ended.append(action.reason)
                assert job.claim is not None
                job = replace(
                    job, stop=True, claim=replace(job.claim, lost_reason=action.reason, lost_at=T0)
                )
            if isinstance(action, DeleteRunner):
                assert action.runner_id != "J", f"runner deleted: {action}"
        if claim is not None:
            # never pooled while claimed: the pool is refilled instead
            assert result.counts.idle_ready == result.counts.idle_starting == 0
            assert sum(a.count for a in result.actions if isinstance(a, CreateRunners)) == 1
        else:
            assert result.counts.idle_ready + result.counts.idle_starting == 1
            assert not any(isinstance(a, CreateRunners) for a in result.actions)
    return views, ended


@pytest.mark.parametrize(("name", "sequence"), orders())
def test_claimed_runner_is_reported_migrated_exactly_once(name, sequence):
    _, ended = replay(Claim(timeout=60, alloc_id="a1", claimed_at=T0), sequence)
    # Events 1 and 4 are the ones that say the claimed allocation is leaving;
    # with both missing nothing could tell, but with one missing the other does.
    assert ended == [LossReason.MIGRATED], name


@pytest.mark.parametrize(("name", "sequence"), orders())
def test_idle_runner_keeps_serving_from_its_new_allocation(name, sequence):
    views, ended = replay(None, sequence)
    assert not ended
    assert all(v.reset is None and not v.claimed for v in views)
    final = views[-1]
    if 2 in sequence:  # a2 running was reported
        assert (final.phase, final.alloc and final.alloc.id) == (Phase.READY, "a2"), name
    for v in views:
        if v.phase is Phase.READY:
            # ready only from an allocation that should run: never from a1 once it is leaving
            assert v.alloc is not None and v.alloc.desired_status == "run"
