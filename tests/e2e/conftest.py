"""Controllers running against the simulator over HTTP, as in production: the
python-nomad gateway, our event-stream reader, real threads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.reconcile.loop import Controller
from nomadsim import SimServer
from tests.support.controller import start_controller


@pytest.fixture
def make_controller() -> Iterator[Callable[..., Controller]]:
    """Start controllers against a simulator; all are stopped after the test."""
    started: list[Controller] = []

    def start(sim: SimServer, events: bool = True, **overrides: Any) -> Controller:
        controller = start_controller(sim.address, events=events, **overrides)
        started.append(controller)
        return controller

    yield start
    for controller in started:
        controller.stop()
