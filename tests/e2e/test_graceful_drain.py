"""A controller stopped with SIGTERM drains (controller/api/drain.py): no
client is cut off without a terminal frame, new work is refused with 503
SHUTTING_DOWN and Retry-After, a follower takes the lead at once, and a
second signal ends at once. Controllers are real subprocesses (`run`)
against the simulator, as an operator's deploy stops them."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import requests
from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import ClientConnection, connect

from nomadsim import SimServer
from tests.helpers import wait_until
from tests.support.api_client import environment_body
from tests.support.controller import start_controller_process
from tests.support.processes import ChildProcess, child_processes

TOKEN = "drain-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
POOL = 4
ENV = environment_body(7, prewarmingPoolSize=POOL)


@pytest.fixture
def processes() -> Iterator[list[ChildProcess]]:
    with child_processes(signal.SIGKILL) as started:
        yield started


def start(
    processes: list[ChildProcess], sim: SimServer, **settings: str
) -> tuple[ChildProcess, str]:
    env = {"NRC_API_TOKEN": TOKEN, "NRC_LOG_FORMAT": "text", **settings}
    run = start_controller_process(processes, sim.address, env, timeout=30)
    return run, run.address


def pool_ready(api: str, size: int) -> bool:
    r = requests.get(f"{api}/api/v1/statistics/execution-environments", headers=AUTH, timeout=5)
    return (
        r.status_code == 200 and (r.json().get(str(ENV["id"])) or {}).get("idleRunners", 0) >= size
    )


def claim(api: str) -> requests.Response:
    body = {"executionEnvironmentId": ENV["id"], "inactivityTimeout": 0}
    return requests.post(f"{api}/api/v1/runners", json=body, headers=AUTH, timeout=10)


def open_execution(api: str, runner: str, command: str) -> ClientConnection:
    r = requests.post(
        f"{api}/api/v1/runners/{runner}/execute",
        json={"command": command, "privilegedExecution": True},
        headers=AUTH,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    ws = connect(r.json()["websocketUrl"], additional_headers=AUTH)  # closed by `frames`
    assert json.loads(ws.recv(timeout=10)) == {"type": "start"}
    return ws


def frames(ws: ClientConnection, out: list[dict[str, Any]]) -> None:
    """Every frame until the close (on a thread of its own). A service that
    ends at once closes with 1012 or not at all, which the iterator raises;
    the tests judge the frames received, not how the connection ended."""
    with ws:
        try:
            for raw in ws:
                out.append(json.loads(raw))
        except ConnectionClosedError:
            pass


def follow(ws: ClientConnection) -> tuple[threading.Thread, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    thread = threading.Thread(target=frames, args=(ws, got), daemon=True)
    thread.start()
    return thread, got


def set_up(api: str, claims: int) -> list[str]:
    url = f"{api}/api/v1/execution-environments/{ENV['id']}"
    assert requests.put(url, json=ENV, headers=AUTH, timeout=10).status_code in (201, 204)
    wait_until(lambda: pool_ready(api, POOL), timeout=30, interval=0.1)
    runners = []
    for _ in range(claims):
        r = claim(api)
        assert r.status_code == 200, r.text
        runners.append(str(r.json()["runnerId"]))
    return runners


def test_running_executions_end_by_themselves_new_work_is_refused_and_the_exit_is_0(
    sim: SimServer, processes: list[ChildProcess]
) -> None:
    run, api = start(processes, sim, NRC_SHUTDOWN_GRACE="30s")
    runners = set_up(api, 3)
    followed = [follow(open_execution(api, r, "sleep 2; echo done")) for r in runners]
    run.popen.send_signal(signal.SIGTERM)
    wait_until(lambda: requests.get(f"{api}/readyz", timeout=5).status_code == 503, timeout=5)
    assert requests.get(f"{api}/readyz", timeout=5).json()["errorCode"] == "SHUTTING_DOWN"
    refused = claim(api)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert refused.json()["errorCode"] == "SHUTTING_DOWN"
    files = requests.get(f"{api}/api/v1/runners/{runners[0]}/files", headers=AUTH, timeout=5)
    assert files.status_code == 503
    execute = requests.post(
        f"{api}/api/v1/runners/{runners[0]}/execute",
        json={"command": "true"},
        headers=AUTH,
        timeout=5,
    )
    assert execute.status_code == 503
    # Reads and releases are still served while it drains.
    assert requests.get(f"{api}/api/v1/runners/{runners[0]}", headers=AUTH, timeout=5).ok
    for thread, got in followed:
        thread.join(20)
        assert got[-1] == {"type": "exit", "data": 0}, got
        assert any(f == {"type": "stdout", "data": "done\r\n"} for f in got), got
    assert run.popen.wait(20) == 0
    assert "draining: SIGTERM received" in run.output()


def test_an_execution_outliving_the_grace_ends_with_an_error_frame(
    sim: SimServer, processes: list[ChildProcess]
) -> None:
    run, api = start(processes, sim, NRC_SHUTDOWN_GRACE="1s")
    (runner,) = set_up(api, 1)
    thread, got = follow(open_execution(api, runner, "sleep 60"))
    began = time.monotonic()
    run.popen.send_signal(signal.SIGTERM)
    thread.join(20)
    assert got[-1]["type"] == "error" and "shutting down" in got[-1]["data"], got
    assert run.popen.wait(20) == 0
    assert time.monotonic() - began < 10
    # Its command was stopped as on a timeout: nothing of it runs on.
    allocs = [a["ID"] for a in requests.get(f"{sim.address}/v1/allocations", timeout=5).json()]

    def left() -> list[int]:
        return [p for a in allocs for p in sim.call(partial(sim.sim.exec_processes, a))]

    wait_until(lambda: not left(), timeout=10)


def test_a_second_signal_ends_at_once(sim: SimServer, processes: list[ChildProcess]) -> None:
    run, api = start(processes, sim, NRC_SHUTDOWN_GRACE="60s")
    (runner,) = set_up(api, 1)
    thread, _ = follow(open_execution(api, runner, "sleep 60"))
    run.popen.send_signal(signal.SIGTERM)
    wait_until(lambda: requests.get(f"{api}/readyz", timeout=5).status_code == 503, timeout=5)
    began = time.monotonic()
    run.popen.send_signal(signal.SIGINT)
    assert run.popen.wait(15) == 0
    assert time.monotonic() - began < 8
    thread.join(10)


def test_the_leader_hands_the_lock_over_at_the_start_of_its_drain(
    sim: SimServer, processes: list[ChildProcess]
) -> None:
    election = {"NRC_LEADER_ELECTION": "true", "NRC_SHUTDOWN_GRACE": "30s"}
    first, api = start(processes, sim, **election)
    runners = set_up(api, 1)
    _, follower = start(processes, sim, **election)  # it serves, and says it follows
    assert _role(follower) == "follower"
    # An execution keeps the leader draining; the follower must lead meanwhile.
    thread, got = follow(open_execution(api, runners[0], "sleep 5; echo done"))
    first.popen.send_signal(signal.SIGTERM)
    began = time.monotonic()
    wait_until(lambda: _role(follower) == "leader", timeout=10, interval=0.05)
    took_over = time.monotonic() - began
    assert took_over < 3.0, f"the follower led only after {took_over:.1f} s"
    assert first.alive(), "the old leader still drains"
    thread.join(20)
    assert got[-1] == {"type": "exit", "data": 0}
    assert first.popen.wait(20) == 0


def _role(api: str) -> str | None:
    try:
        answer = requests.get(f"{api}/readyz", timeout=2)
    except requests.RequestException:
        return None
    return str(answer.json().get("role")) if answer.status_code == 200 else None


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return 0
