"""The whole service when Nomad's agent refuses connections (its
`http_max_conns_per_client` 429) or the controller's own connection budget
is spent: executions end with an `error` frame that says so, file
operations answer 503 NOMAD_OVERLOAD with Retry-After — never an exception
in the ASGI app, never a WebSocket closed without a terminal frame."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.support.api_server import ApiServer, sim_settings
from tests.support.refusing_agent import RefusingAgent
from tests.support.world import ENV, World


@contextlib.contextmanager
def behind(make_sim: Any, **agent: Any) -> Iterator[tuple[World, RefusingAgent, dict[str, str]]]:
    """The service with NOMAD_ADDR on a RefusingAgent in front of the
    simulator (execs through it: not on the nodes' own agents)."""
    sim = make_sim(nodes=2)
    proxy = RefusingAgent(sim.address, refuse=0).start()
    extra: dict[str, str] = agent.pop("environ", {})
    settings = sim_settings(sim, NOMAD_ADDR=proxy.address, NRC_NOMAD_EXEC_ON_NODE="false", **extra)
    api = ApiServer(settings).start()
    try:
        api.controller.pools.put_environment(ENV)
        yield World(sim, api), proxy, extra
    finally:
        api.stop()
        proxy.stop()


class AsgiErrors(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "Exception in ASGI application" in record.getMessage():
            self.messages.append(record.getMessage())


@pytest.fixture
def asgi_errors() -> Iterator[AsgiErrors]:
    handler = AsgiErrors()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.mark.parametrize("cut", [False, True], ids=["429", "cut"])
def test_a_persistent_refusal_ends_the_execution_with_an_error_frame(
    make_sim: Any, asgi_errors: AsgiErrors, cut: bool
) -> None:
    with behind(make_sim) as (world, proxy, _):
        runner = world.claim()
        proxy.to_refuse, proxy.cut = None, cut
        run = world.run(runner, "echo hi")
        assert run.frames[0] == {"type": "start"}
        assert run.last["type"] == "error", run.frames
        assert ("overloaded" if not cut else "could not reach Nomad") in run.last["data"]
        assert run.close_code == 1000
        assert proxy.refused >= 5
        listing = world.list_files(runner)
        if not cut:
            assert listing.status_code == 503, listing.text
            assert listing.json()["errorCode"] == "NOMAD_OVERLOAD"
            assert listing.headers["Retry-After"] == "2"
        else:
            assert listing.status_code == 500, listing.text
        # Refusals over: the runner serves again.
        proxy.to_refuse = 0
        assert world.run(runner, "echo back").stdout == "back\r\n"
    assert asgi_errors.messages == []


def test_a_few_429s_are_retried_unseen(make_sim: Any) -> None:
    with behind(make_sim) as (world, proxy, _):
        runner = world.claim()
        proxy.refused, proxy.to_refuse = 0, 3
        run = world.run(runner, "echo hi")
        assert run.last == {"type": "exit", "data": 0}
        assert proxy.refused == 3


def test_a_full_queue_answers_503_with_retry_after(make_sim: Any) -> None:
    # Budget 3 on NOMAD_ADDR: one exec handshake at a time, no queue; the
    # agent takes 1 s over each handshake.
    environ = {"NRC_NOMAD_MAX_CONNS_PER_AGENT": "3", "NRC_NOMAD_CONN_QUEUE": "0"}
    with behind(make_sim, environ=environ) as (world, proxy, _):
        runners = [world.claim(), world.claim()]
        proxy.hold_s = 1.0
        answers: list[requests.Response] = []
        listings = [
            threading.Thread(target=lambda r=r: answers.append(world.list_files(r)))
            for r in runners
        ]
        for listing in listings:
            listing.start()
        for listing in listings:
            listing.join(10)
        # One took the slot for its 1 s handshake; the other found no slot
        # and no queue.
        assert sorted(a.status_code for a in answers) == [200, 503]
        (refused,) = (a for a in answers if a.status_code == 503)
        assert refused.json()["errorCode"] == "NOMAD_OVERLOAD"
        assert "NRC_NOMAD_MAX_CONNS_PER_AGENT" in refused.json()["message"]
        assert refused.headers["Retry-After"] == "1"
        # An execution needs two execs at once (stdout and the stderr
        # reader): with one slot and no queue it cannot start, and says why.
        proxy.hold_s = 0.0
        run = world.run(runners[0], "echo hi")
        assert run.last["type"] == "error"
        assert "NRC_NOMAD_CONN_QUEUE" in run.last["data"]
