"""The API over real controllers against the in-process Nomad simulator.

Most tests share one simulator and one controller (package-scoped; each test
uses its own environment ids), so the suite stays fast. Tests that break
things (a stopped simulator, faults, a lock held elsewhere) get their own
through `make_api`.

Every response a test client receives is checked against the app's own
`/openapi.json`: its status must be documented for the operation and its body
must match the documented schema. No test may reach the catch-all (500
UNKNOWN) unless it says so.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.api import create_app
from controller.reconcile.loop import Controller
from nomadsim import SimConfig, SimServer
from tests.helpers import wait_until
from tests.support.api_client import GATEWAY, Api, MakeApi, client_for
from tests.support.controller import start_controller
from tests.support.sim import FAST

_env_ids = itertools.count(100)


@pytest.fixture
def env_id() -> int:
    """An environment id no other test uses (on the shared controller)."""
    return next(_env_ids)


@pytest.fixture(scope="package")
def shared() -> Iterator[tuple[SimServer, Controller]]:
    config: dict[str, Any] = {**FAST, "nodes": 3}
    sim = SimServer(SimConfig(**config))
    sim.start()
    controller = start_controller(sim.address, **GATEWAY)
    wait_until(controller.ready, timeout=10)
    yield sim, controller
    controller.stop()
    sim.stop()


@pytest.fixture(scope="package")
def shared_api(shared: tuple[SimServer, Controller]) -> Api:
    sim, controller = shared
    app = create_app(controller.pools)
    return Api(sim, controller, app, client_for(app))


@pytest.fixture
def api(shared_api: Api) -> Api:
    """The shared controller behind an app without authentication."""
    return shared_api


@pytest.fixture
def make_api(make_sim: Callable[..., SimServer]) -> Iterator[MakeApi]:
    """Own simulator and controller: `make_api(sim=..., app={create_app kwargs}, **settings)`."""
    controllers: list[Controller] = []

    def make(
        sim: SimServer | None = None,
        app: dict[str, Any] | None = None,
        wait_ready: bool = True,
        **settings: Any,
    ) -> Api:
        sim = sim or make_sim()
        controller = start_controller(sim.address, **{**GATEWAY, **settings})
        controllers.append(controller)
        if wait_ready:
            wait_until(lambda: controller.observer.observed_once, timeout=5)
        application = create_app(controller.pools, **(app or {}))
        return Api(sim, controller, application, client_for(application))

    yield make
    for controller in controllers:
        controller.stop()


@pytest.fixture(autouse=True)
def no_internal_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No request may reach the catch-all (tests of it clear the log)."""
    caplog.set_level(logging.INFO)
    yield
    unhandled = [
        r.getMessage()
        for r in caplog.records
        if r.name == "controller.api.errors" and r.levelno >= logging.ERROR
    ]
    assert not unhandled, unhandled
