"""A controller in `dev` mode (simulator, controller and demo pool in one
process), started once for the deploy tests that need a real one to talk to."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.support.ports import free_port
from tests.support.processes import ChildProcess, python_module


@pytest.fixture(scope="session")
def dev_controller() -> Iterator[str]:
    """The base URL of `python -m controller dev` on a free loopback port."""
    port = free_port()
    settings = {"NRC_API_PORT": str(port), "NRC_LOG_FORMAT": "text"}
    dev = ChildProcess(python_module("controller", "dev"), settings)
    try:
        # The banner is printed once the API listens.
        dev.wait_for(rf"metrics\s+http://127\.0\.0\.1:{port}/metrics")
        yield f"http://127.0.0.1:{port}"
    finally:
        dev.stop(signal.SIGINT, timeout=10)
