"""Controllers running against the simulator over HTTP, as in production: the
python-nomad gateway, our event-stream reader, real threads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.model import SECOND
from controller.nomad.client import NomadClient
from controller.nomad.stream import EventStream
from controller.reconcile.loop import EVENT_TOPICS, Controller, ControllerSettings, EventSource
from controller.reconcile.plan import PlanSettings
from nomadsim import SimServer

# Short timings so every test converges in well under a second or two.
TEST_SETTINGS = ControllerSettings(
    resync_interval_s=1.0,
    workers=4,
    write_concurrency=8,
    write_rate_per_s=0,
    max_backoff_s=0.5,
    expectation_timeout_s=10.0,
    leader_ttl_s=1.0,
    plan=PlanSettings(
        orphan_grace_ns=1 * SECOND,
        startup_timeout_ns=10 * SECOND,
        lost_retention_ns=3600 * SECOND,
        backoff_base_ns=SECOND // 10,
        backoff_cap_ns=SECOND,
    ),
)


def stream_factory(address: str) -> Callable[..., EventSource]:
    def make(on_events: Any, on_state: Any, start_index: int) -> EventSource:
        return EventStream(
            address=address,
            topics=EVENT_TOPICS,
            on_events=on_events,
            on_state=on_state,
            start_index=start_index,
            read_timeout_s=5.0,
            backoff_base_s=0.05,
            backoff_cap_s=0.5,
        )

    return make


@pytest.fixture
def make_controller() -> Iterator[Callable[..., Controller]]:
    """Start controllers against a simulator; all are stopped after the test."""
    started: list[Controller] = []

    def start(sim: SimServer, events: bool = True, **overrides: Any) -> Controller:
        settings = ControllerSettings(**{**TEST_SETTINGS.__dict__, **overrides})
        gateway = NomadClient(address=sim.address, timeout_s=5.0, retry_max_wait_s=0.2)
        controller = Controller(
            gateway, settings, stream_factory=stream_factory(sim.address) if events else None
        )
        controller.start()
        started.append(controller)
        return controller

    yield start
    for controller in started:
        controller.stop()
