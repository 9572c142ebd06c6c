"""The `run`, `dev` and `config` commands, as an operator starts them: real
subprocesses, real HTTP."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import requests
from websockets.sync.client import connect

from nomadsim import SimServer
from tests.helpers import wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any setting of ours, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NRC_", "NOMAD_"))}
    return {**env, **extra}


def command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


class Process:
    """A command whose output lines are collected on a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controller", *args],
            env=clean_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            while True:
                try:
                    self.seen.append(self.lines.get_nowait())
                except queue.Empty:
                    break
            for line in self.seen:
                match = re.search(pattern, line)
                if match:
                    return match
            return None

        match = wait_until(found, timeout=timeout)
        assert match is not None
        return match

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait(10)


def test_dev_serves_a_demo_pool_and_stops_cleanly(processes: list[Process]) -> None:
    port = free_port()
    dev = Process(["dev"], {"NRC_API_PORT": str(port), "NRC_LOG_FORMAT": "text"})
    processes.append(dev)
    api = dev.wait_for(r"API\s+(http://\S+)/api/v1").group(1)
    assert api == f"http://127.0.0.1:{port}"
    dev.wait_for(r"^curl -s -X PUT .*/api/v1/execution-environments/2")
    dev.wait_for(r"^RUNNER_ID=\$\(curl -s -X POST")
    dev.wait_for(r"^curl -s -X DELETE .*/api/v1/runners/")
    dev.wait_for(r"simulator\s+http://127\.0\.0\.1:\d+")
    dev.wait_for(r"metrics\s+http://127\.0\.0\.1:\d+/metrics")

    def claim() -> str | None:
        r = requests.post(
            f"{api}/api/v1/runners",
            json={"executionEnvironmentId": 1, "inactivityTimeout": 60},
            timeout=5,
        )
        return str(r.json()["runnerId"]) if r.status_code == 200 else None

    runner = wait_until(claim, timeout=20, interval=0.1)
    # an execution runs for real (the simulator's setuser stands in for /sbin/setuser)
    dev.wait_for(r"^curl -s -X POST .*/execute")
    r = requests.post(
        f"{api}/api/v1/runners/{runner}/execute", json={"command": "echo hello"}, timeout=5
    )
    with connect(r.json()["websocketUrl"]) as ws:
        frames = [json.loads(raw) for raw in ws]
    assert frames[1:] == [{"type": "stdout", "data": "hello\r\n"}, {"type": "exit", "data": 0}]
    assert requests.delete(f"{api}/api/v1/runners/{runner}", timeout=5).status_code == 204
    assert "nrc_claims_total" in requests.get(f"{api}/metrics", timeout=5).text
    assert dev.stop(signal.SIGINT) == 0


def test_run_against_a_nomad_and_stop_on_sigterm(sim: SimServer, processes: list[Process]) -> None:
    port = free_port()
    run = Process(
        ["run"],
        {
            "NOMAD_ADDR": sim.address,
            "NRC_API_PORT": str(port),
            "NRC_LOG_FORMAT": "json",
            "NRC_API_TOKEN": "s3cret-token",
        },
    )
    processes.append(run)
    api = f"http://127.0.0.1:{port}"
    wait_until(lambda: _status(f"{api}/readyz") == 200, timeout=20, interval=0.05)
    auth = {"Authorization": "Bearer s3cret-token"}
    body = {
        "id": 3,
        "image": "python:3.12",
        "prewarmingPoolSize": 1,
        "cpuLimit": 100,
        "memoryLimit": 128,
        "networkAccess": False,
        "exposedPorts": [],
    }
    r = requests.put(f"{api}/api/v1/execution-environments/3", json=body, headers=auth, timeout=5)
    assert r.status_code == 201, r.text
    assert requests.get(f"{api}/api/v1/execution-environments", timeout=5).status_code == 401
    assert run.stop(signal.SIGTERM) == 0
    output = "\n".join(run.seen + list(run.lines.queue))
    assert "s3cret-token" not in output
    assert "Traceback" not in output


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return 0


def test_config_prints_every_setting_without_secrets() -> None:
    env = clean_env(NOMAD_TOKEN="very-secret", NRC_API_PORT="8080")
    out = command("config", env=env).stdout
    assert "very-secret" not in out
    assert re.search(r"NRC_API_PORT\s+8080\s+environment", out)
    assert re.search(r"NOMAD_TOKEN\s+\(set\)", out)
    markdown = command("config", "--markdown", env=env).stdout
    assert markdown.startswith("| variable | default | description |")
    assert "very-secret" not in markdown


@pytest.mark.parametrize("name", ["run", "dev", "config"])
def test_bad_configuration_exits_2_with_one_line_per_problem(name: str) -> None:
    result = command(name, env=clean_env(NRC_API_PORT="abc", NRC_API_PROT="1"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert 'NRC_API_PORT: must be an integer between 1 and 65535 (got "abc")' in result.stderr
    assert "NRC_API_PROT: unknown variable" in result.stderr
