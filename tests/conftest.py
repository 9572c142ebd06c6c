"""Shared fixtures: an in-process Nomad simulator with millisecond timings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.sim import SimConfig, SimServer

# Short, fixed timings keep the suite fast and deterministic in order.
FAST = {
    "startup_delay_ms": 30.0,
    "stop_delay_ms": 20.0,
    "migration_stop_lag_ms": 30.0,
    "heartbeat_interval_ms": 200.0,
    "stale_lag_ms": 300.0,
}


@pytest.fixture
def make_sim() -> Iterator[Callable[..., SimServer]]:
    """Start simulators with FAST timings overridden by keyword; all are stopped after the test."""
    servers: list[SimServer] = []

    def start(**overrides: Any) -> SimServer:
        server = SimServer(SimConfig(**{**FAST, **overrides}))
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def sim(make_sim: Callable[..., SimServer]) -> SimServer:
    return make_sim()
