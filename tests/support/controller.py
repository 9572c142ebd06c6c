"""Starting controllers against a Nomad (the simulator): in this process as
the tests drive it (`start_controller`: python-nomad gateway, our event-stream
reader, real threads, short timings), or as a child process the way an
operator runs it (`start_controller_process`, for the benchmarks)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from controller.model import SECOND
from controller.nomad.client import NomadClient
from controller.nomad.stream import EventStream
from controller.reconcile.loop import EVENT_TOPICS, Controller, ControllerSettings, EventSource
from controller.reconcile.plan import PlanSettings
from tests.helpers import wait_until
from tests.support.ports import free_port
from tests.support.processes import ChildProcess, python_module

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
    """Our event-stream reader of the Nomad at `address`, with short backoffs."""

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


def start_controller(
    nomad_address: str,
    *,
    events: bool = True,
    timeout_s: float = 5.0,
    retries: int = 5,
    retry_max_wait_s: float = 0.2,
    **overrides: Any,
) -> Controller:
    """A started Controller over HTTP to `nomad_address` with TEST_SETTINGS
    (`overrides` replace fields of it), fed by the event stream unless
    `events` is false. The caller stops it."""
    settings = ControllerSettings(**{**TEST_SETTINGS.__dict__, **overrides})
    gateway = NomadClient(
        address=nomad_address,
        timeout_s=timeout_s,
        retry_attempts=retries,
        retry_max_wait_s=retry_max_wait_s,
    )
    controller = Controller(
        gateway, settings, stream_factory=stream_factory(nomad_address) if events else None
    )
    controller.start()
    return controller


def controller_environ(nomad_address: str, port: int, **settings: str) -> dict[str, str]:
    """The settings of a controller process (its environment, besides
    `ChildProcess`'s): Nomad's address, the API port, `settings`."""
    return {"NOMAD_ADDR": nomad_address, "NRC_API_PORT": str(port), **settings}


def start_controller_process(
    started: list[ChildProcess],
    nomad_address: str,
    settings: Mapping[str, str] | None = None,
    *,
    argv: Sequence[str] | None = None,
    timeout: float = 120.0,
    port: int | None = None,
    cwd: Path | None = None,
) -> ChildProcess:
    """The controller service as a child process (`argv`: `run` by default),
    appended to `started` (whoever owns that list stops it); returns once its
    API answers /readyz (it has observed Nomad), with `address` its API's
    (on `port`, a free one by default); `cwd`: its working directory (this
    repository by default)."""
    port = port if port is not None else free_port()
    command = argv if argv is not None else python_module("controller", "run")
    environ = controller_environ(nomad_address, port, **dict(settings or {}))
    child = (
        ChildProcess(command, environ) if cwd is None else ChildProcess(command, environ, cwd=cwd)
    )
    started.append(child)
    child.address = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if not child.alive():
            raise AssertionError("exited")  # ends the wait at once
        return _answers(f"{child.address}/readyz")

    try:
        wait_until(ready, timeout=timeout, interval=0.05)
    except AssertionError:
        why = f"exited with {child.returncode}" if not child.alive() else "is not ready"
        raise AssertionError(f"{child} {why} after {timeout} s at most:\n{child.tail()}") from None
    return child


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False
