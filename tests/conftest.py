"""Shared fixtures: an in-process Nomad simulator with millisecond timings, and
a check that the whole session leaves no process of an execution behind."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from nomadsim import SimConfig, SimServer
from tests.support.sim import FAST


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


# Every process the simulator's exec starts carries the first; every process of
# one of our executions the second — but a root shell of ours that has not
# exec'd yet only in its script (`command._started`).
MARKERS = ("NOMADSIM_ALLOC_ID", "NRC_EXECUTION_ID")
STARTED = "export NRC_EXECUTION_ID="


# Set for this session: processes inherit it through the simulator's
# environment, so those of another session running at the same time (started
# before or during this one) are told apart.
SESSION = "NRC_TEST_SESSION"


def marked_processes(session: str) -> set[int]:
    found = set()
    for process in psutil.process_iter():
        try:
            environ = process.environ()
            script = process.cmdline()[2:3]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        ours = environ.get(SESSION) == session
        marked = any(m in environ for m in MARKERS) or any(a.startswith(STARTED) for a in script)
        if ours and marked and process.status() != "zombie":
            found.add(process.pid)
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Fails the session if a process started by an execution outlives it."""
    session = os.environ.setdefault(SESSION, uuid.uuid4().hex)
    yield
    left = marked_processes(session)
    if left:
        names = [" ".join(psutil.Process(pid).cmdline()) for pid in sorted(left)]
        pytest.fail(f"processes of executions left behind: {names}")
