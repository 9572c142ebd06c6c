"""A Controller with NRC_PREWARM_POLICY=adaptive over the in-memory Nomad:
a burst of claims raises the pool above prewarmingPoolSize, the history is
kept in a Nomad variable, and static pools stay exactly as they were."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.model import SECOND, Environment
from controller.prewarm.history import from_json
from controller.reconcile.claims import NoRunnerAvailable
from controller.reconcile.loop import Controller, ControllerSettings
from controller.reconcile.prewarming import HISTORY_ITEM, PrewarmSettings
from tests.support.fake_nomad import FakeNomad

ENV = Environment(id=9, image="python:3.12", prewarming_pool_size=5)


def make(adaptive: bool) -> tuple[Controller, FakeNomad, ManualClock]:
    clock = ManualClock()
    nomad = FakeNomad(clock)
    settings = ControllerSettings(
        workers=1,
        write_concurrency=1,
        write_rate_per_s=0,
        prewarm=PrewarmSettings(adaptive=adaptive),
    )
    return Controller(nomad, settings, clock=clock, metrics=Metrics()), nomad, clock


@pytest.fixture(params=[False, True], ids=["static", "adaptive"])
def setup(request: pytest.FixtureRequest) -> Iterator[tuple[Controller, FakeNomad, ManualClock]]:
    controller, nomad, clock = make(request.param)
    try:
        yield controller, nomad, clock
    finally:
        controller.actor.shutdown()


def reconcile(controller: Controller) -> float | None:
    controller.observer.refresh()
    result = controller.reconciler.reconcile(ENV.id)
    assert result.ok
    return result.requeue_after_s


def test_a_burst_of_claims_raises_an_adaptive_pool_only(
    setup: tuple[Controller, FakeNomad, ManualClock],
) -> None:
    controller, nomad, clock = setup
    adaptive = controller.prewarmer is not None
    controller.pools.put_environment(ENV)
    reconcile(controller)
    assert len(nomad.created()) == 5  # the floor, either way
    for job_id in nomad.created():
        placed = nomad.run(job_id)
        # Started 8 s after placement: one refill takes that long.
        nomad.put_alloc(replace(placed, create_time=placed.create_time - 8 * SECOND))
    clock.advance(2)
    reconcile(controller)
    for _ in range(5):
        controller.claims.claim(ENV.id, timeout_s=0)
        clock.advance(0.2)
    with pytest.raises(NoRunnerAvailable):
        controller.claims.claim(ENV.id, timeout_s=0)
    assert (
        controller.metrics.registry.get_sample_value(
            "nrc_prewarm_misses_total", {"environment": str(ENV.id)}
        )
        == 1
    )
    requeue = reconcile(controller)
    created = len(nomad.created()) - 5
    registry = controller.metrics.registry
    labels = {"environment": str(ENV.id)}
    # Counted per pass at what the pass saw: none before the runners were
    # placed, then 5 for the 1 s until the pass after the claims.
    idle_s = registry.get_sample_value("nrc_idle_runner_seconds_total", labels)
    assert idle_s == pytest.approx(5 * 1.0)
    target = registry.get_sample_value("nrc_prewarm_target_runners", labels)
    if not adaptive:
        assert created == 5  # the claimed ones replaced, nothing more
        assert nomad.variables == {}
        assert target is None  # static pools export no adaptive target
        return
    assert target == created
    decision = controller.prewarmer.decision(ENV.id) if controller.prewarmer else None
    assert decision is not None and decision.target > 5
    assert created == decision.target  # every idle runner was claimed
    assert requeue is not None and requeue > 0  # the hold ends, the target may fall
    clock.advance(61)
    reconcile(controller)
    saved = nomad.variables[f"nomad-runner-controller/prewarm/{ENV.id}"][HISTORY_ITEM]
    assert len(from_json(saved).claims.recent) == 5
    assert len(from_json(saved).startups.samples_ms) == 5
