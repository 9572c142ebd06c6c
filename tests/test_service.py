"""The `run`, `dev` and `config` commands, as an operator starts them: real
subprocesses, real HTTP."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from websockets.sync.client import connect

from controller import service as service_module
from controller.config import load_settings
from nomadsim import SimServer
from tests.helpers import wait_until
from tests.support.api_client import environment_body
from tests.support.controller import start_controller_process
from tests.support.ports import free_port
from tests.support.processes import ChildProcess, child_processes, clean_environ, python_module


def command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        python_module("controller", *args),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def processes() -> Iterator[list[ChildProcess]]:
    with child_processes(signal.SIGKILL) as started:
        yield started


def test_dev_serves_a_demo_pool_and_stops_cleanly(processes: list[ChildProcess]) -> None:
    port = free_port()
    dev = ChildProcess(
        python_module("controller", "dev"), {"NRC_API_PORT": str(port), "NRC_LOG_FORMAT": "text"}
    )
    processes.append(dev)
    api = dev.wait_for(r"API\s+(http://\S+)/api/v1").group(1)
    assert api == f"http://127.0.0.1:{port}"
    dev.wait_for(r"^curl -s -X PUT .*/api/v1/execution-environments/2")
    dev.wait_for(r"^RUNNER_ID=\$\(curl -s -X POST")
    dev.wait_for(r"^curl -s -X DELETE .*/api/v1/runners/")
    dev.wait_for(r"simulator\s+http://127\.0\.0\.1:\d+")
    dev.wait_for(r"metrics\s+http://127\.0\.0\.1:\d+/metrics")
    # without NRC_API_TOKEN, dev makes one up and prints it: never open
    token = dev.wait_for(r"API token\s+(\S{16,})\s").group(1)
    auth = {"Authorization": f"Bearer {token}"}
    assert requests.get(f"{api}/api/v1/execution-environments", timeout=5).status_code == 401

    def claim() -> str | None:
        r = requests.post(
            f"{api}/api/v1/runners",
            json={"executionEnvironmentId": 1, "inactivityTimeout": 60},
            headers=auth,
            timeout=5,
        )
        return str(r.json()["runnerId"]) if r.status_code == 200 else None

    runner = wait_until(claim, timeout=20, interval=0.1)
    # an execution runs for real (the simulator's setuser stands in for /sbin/setuser)
    dev.wait_for(r"^curl -s -X POST .*/execute")
    r = requests.post(
        f"{api}/api/v1/runners/{runner}/execute",
        json={"command": "echo hello"},
        headers=auth,
        timeout=5,
    )
    with connect(r.json()["websocketUrl"], additional_headers=auth) as ws:
        frames = [json.loads(raw) for raw in ws]
    assert frames[1:] == [{"type": "stdout", "data": "hello\r\n"}, {"type": "exit", "data": 0}]
    assert (
        requests.delete(f"{api}/api/v1/runners/{runner}", headers=auth, timeout=5).status_code
        == 204
    )
    assert "nrc_claims_total" in requests.get(f"{api}/metrics", timeout=5).text
    assert dev.stop(signal.SIGINT) == 0


def test_run_against_a_nomad_and_stop_on_sigterm(
    sim: SimServer, processes: list[ChildProcess]
) -> None:
    settings = {"NRC_LOG_FORMAT": "json", "NRC_API_TOKEN": "s3cret-token-16ch"}
    run = start_controller_process(processes, sim.address, settings, timeout=20)
    api = run.address
    auth = {"Authorization": "Bearer s3cret-token-16ch"}
    body = environment_body(3, prewarmingPoolSize=1)
    r = requests.put(f"{api}/api/v1/execution-environments/3", json=body, headers=auth, timeout=5)
    assert r.status_code == 201, r.text
    assert requests.get(f"{api}/api/v1/execution-environments", timeout=5).status_code == 401
    assert run.stop(signal.SIGTERM) == 0
    output = run.output()
    assert "s3cret-token-16ch" not in output
    assert "Traceback" not in output


def test_no_token_or_command_in_any_log_line_of_a_full_run_at_debug(
    make_sim: Any, processes: list[ChildProcess]
) -> None:
    """Issue 24, finding 5: at DEBUG the websockets and uvicorn loggers printed
    Poseidon-Token and X-Nomad-Token, and the exec URL with every command."""
    nomad_token, api_token = "nomad-acl-secret-4f1d2a", "api-secret-token-9c3e7b"
    sim = make_sim(acl_token=nomad_token)
    settings = {
        "NRC_LOG_FORMAT": "text",
        "NRC_LOG_LEVEL": "DEBUG",
        "NOMAD_TOKEN": nomad_token,
        "NRC_API_TOKEN": api_token,
    }
    run = start_controller_process(processes, sim.address, settings, timeout=30)
    api = f"{run.address}/api/v1"
    auth = {"Poseidon-Token": api_token}
    body = environment_body(4, prewarmingPoolSize=1)
    assert requests.put(f"{api}/execution-environments/4", json=body, headers=auth).ok

    def claim() -> str | None:
        r = requests.post(
            f"{api}/runners",
            json={"executionEnvironmentId": 4, "inactivityTimeout": 60},
            headers=auth,
            timeout=5,
        )
        return str(r.json()["runnerId"]) if r.status_code == 200 else None

    runner = wait_until(claim, timeout=20, interval=0.1)
    command = {
        "command": "echo command-marker-71",
        "environment": {"ENV_MARKER": "env-value-58"},
        "privilegedExecution": True,  # no /sbin/setuser on this host
    }
    r = requests.post(f"{api}/runners/{runner}/execute", json=command, headers=auth, timeout=5)
    with connect(r.json()["websocketUrl"], additional_headers=auth) as ws:
        frames = [json.loads(raw) for raw in ws]
    assert {"type": "exit", "data": 0} in frames
    files = requests.get(
        f"{api}/runners/{runner}/files?privilegedExecution=true", headers=auth, timeout=5
    )
    assert files.status_code == 200
    assert requests.delete(f"{api}/runners/{runner}", headers=auth, timeout=5).status_code == 204
    assert run.stop(signal.SIGTERM) == 0
    output = run.output()
    assert " DEBUG " in output and "websockets" in output  # the chatty loggers did speak
    for secret in (nomad_token, api_token, "command-marker-71", "env-value-58"):
        leaks = [line for line in output.splitlines() if secret in line]
        assert not leaks, leaks[:3]


def test_a_request_head_that_never_ends_is_closed(
    sim: SimServer, processes: list[ChildProcess]
) -> None:
    """Issue 24, finding 6 (slowloris): a connection that never finished its
    headers was held for ever, before any token could be checked."""
    settings = {"NRC_API_TOKEN": "s3cret-token-16ch", "NRC_API_REQUEST_HEAD_TIMEOUT": "1s"}
    run = start_controller_process(processes, sim.address, settings, timeout=20)
    port = int(run.address.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(b"GET /api/v1/execution-environments HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        assert slow.recv(1024) == b""  # closed, without an answer
        assert 0.5 < time.monotonic() - started < 5
    # a connection that idles between complete requests is uvicorn's keep-alive;
    # requests and responses that take longer than the deadline are not cut
    with requests.Session() as session:
        for _ in range(2):
            assert session.get(f"{run.address}/healthz", timeout=5).status_code == 200
            time.sleep(1.5)  # longer than the head deadline, shorter than keep-alive's 5 s
    # and a WebSocket outlives the deadline: it is no longer waiting for a head
    api, auth = f"{run.address}/api/v1", {"Poseidon-Token": "s3cret-token-16ch"}
    body = environment_body(5, prewarmingPoolSize=1)
    assert requests.put(f"{api}/execution-environments/5", json=body, headers=auth).ok

    def claim() -> str | None:
        r = requests.post(
            f"{api}/runners", json={"executionEnvironmentId": 5}, headers=auth, timeout=5
        )
        return str(r.json()["runnerId"]) if r.status_code == 200 else None

    runner = wait_until(claim, timeout=20, interval=0.1)
    command = {"command": "sleep 2; echo done", "privilegedExecution": True}
    r = requests.post(f"{api}/runners/{runner}/execute", json=command, headers=auth, timeout=5)
    with connect(r.json()["websocketUrl"], additional_headers=auth) as ws:
        frames = [json.loads(raw) for raw in ws]
    assert frames[-2:] == [{"type": "stdout", "data": "done\r\n"}, {"type": "exit", "data": 0}]
    assert run.stop(signal.SIGTERM) == 0


def test_config_prints_every_setting_without_secrets() -> None:
    env = clean_environ(NOMAD_TOKEN="very-secret", NRC_API_PORT="8080")
    out = command("config", env=env).stdout
    assert "very-secret" not in out
    assert re.search(r"NRC_API_PORT\s+8080\s+environment", out)
    assert re.search(r"NOMAD_TOKEN\s+\(set\)", out)
    markdown = command("config", "--markdown", env=env).stdout
    assert markdown.startswith("| variable | default | description |")
    assert "very-secret" not in markdown


@pytest.mark.parametrize("name", ["run", "dev", "config"])
def test_bad_configuration_exits_2_with_one_line_per_problem(name: str) -> None:
    result = command(name, env=clean_environ(NRC_API_PORT="abc", NRC_API_PROT="1"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert 'NRC_API_PORT: must be an integer between 1 and 65535 (got "abc")' in result.stderr
    assert "NRC_API_PROT: unknown variable" in result.stderr


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"NRC_API_HOST": "0.0.0.0"}, True),
        ({"NRC_API_HOST": "controller.example"}, True),
        ({"NRC_API_HOST": "0.0.0.0", "NRC_API_TOKEN": ""}, True),  # empty is unset
        ({"NRC_API_HOST": "0.0.0.0", "NRC_API_ALLOW_UNAUTHENTICATED": "true"}, False),
        ({"NRC_API_HOST": "127.0.0.1"}, False),
    ],
)
def test_run_without_a_token_refuses_to_face_the_network(
    env: dict[str, str], refused: bool
) -> None:
    """Issue 24, finding 3: no token meant no authentication, on any address."""
    # Nomad nobody listens on and a port taken: a run that starts stops by itself.
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        environ = clean_environ(NOMAD_ADDR="http://127.0.0.1:9", NRC_API_PORT=port, **env)
        result = command("run", env=environ)
    line = (
        "nomad-runner-controller: NRC_API_TOKEN is not set and the API would listen on "
        f"{env['NRC_API_HOST']}, open to anyone who reaches it"
    )
    if refused:
        assert result.returncode == 2
        assert result.stderr.startswith(line), result.stderr
    else:
        assert line not in result.stderr
        assert "NRC_API_TOKEN is not set: the API on" in result.stderr  # the warning


def test_a_short_token_is_refused() -> None:
    result = command("run", env=clean_environ(NRC_API_TOKEN="fifteen-chars-x"))
    assert result.returncode == 2
    assert "NRC_API_TOKEN: must be a token of 16 or more characters" in result.stderr
    assert "fifteen-chars-x" not in result.stderr


def test_a_template_file_that_cannot_carry_runners_stops_run_with_exit_2(tmp_path: Path) -> None:
    template = tmp_path / "runner.json"
    job = {"TaskGroups": [{"Name": "default-group", "Tasks": [{"Name": "x", "Driver": "docker"}]}]}
    template.write_text(json.dumps({"Job": job}))
    # A Nomad nobody listens on: a JSON template needs none to be checked.
    env = clean_environ(NRC_TEMPLATE_JOB_FILE=str(template), NOMAD_ADDR="http://127.0.0.1:9")
    result = command("run", env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "NRC_TEMPLATE_JOB_FILE" in line]
    assert lines == [
        f"nomad-runner-controller: NRC_TEMPLATE_JOB_FILE: {template}: "
        "no task 'default-task' in group 'default-group'"
    ]


POSEIDON_HCL = Path(__file__).parent / "reference" / "poseidon-production-template.hcl"


def test_run_with_poseidons_hcl_template_file_builds_runners_from_it(
    sim: SimServer, processes: list[ChildProcess]
) -> None:
    # The HCL is parsed by Nomad (here the simulator's /v1/jobs/parse).
    settings = {"NRC_TEMPLATE_JOB_FILE": str(POSEIDON_HCL), "NRC_API_TOKEN": "s3cret-token-16ch"}
    run = start_controller_process(processes, sim.address, settings, timeout=20)
    body = environment_body(4, prewarmingPoolSize=1, cpuLimit=20, memoryLimit=256)
    auth = {"Authorization": "Bearer s3cret-token-16ch"}
    url = f"{run.address}/api/v1/execution-environments/4"
    assert requests.put(url, json=body, headers=auth, timeout=5).status_code == 201
    template = requests.get(f"{sim.address}/v1/job/template-4", timeout=5).json()
    assert template["Datacenters"] == ["dc1"], "the file's datacenters, not the setting's"
    task = template["TaskGroups"][0]["Tasks"][0]
    assert task["Resources"]["CPU"] == 20 and task["Resources"]["MemoryMaxMB"] == 256
    assert task["Resources"]["MemoryMB"] == 50
    got = requests.get(url, headers=auth, timeout=5).json()
    assert {k: got[k] for k in body} == body
    assert run.stop(signal.SIGTERM) == 0


def test_an_unparsable_hcl_template_stops_run_with_exit_2(sim: SimServer, tmp_path: Path) -> None:
    template = tmp_path / "runner.hcl"
    template.write_text('job "template-0" {\n  group "default-group" {\n    count = \n')
    result = command(
        "run", env=clean_environ(NRC_TEMPLATE_JOB_FILE=str(template), NOMAD_ADDR=sim.address)
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "NRC_TEMPLATE_JOB_FILE" in line]
    assert len(lines) == 1
    assert lines[0].startswith(f"nomad-runner-controller: NRC_TEMPLATE_JOB_FILE: {template}: ")
    assert "Nomad cannot parse it" in lines[0]


def test_serve_sets_the_interpreters_switch_interval(
    sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings({"NOMAD_ADDR": sim.address, "NRC_GIL_SWITCH_INTERVAL": "2ms"})
    built = service_module.build(settings)
    seen: list[float] = []

    def run(self: Any, sockets: Any = None) -> None:
        seen.append(sys.getswitchinterval())
        self.started = True

    monkeypatch.setattr(service_module._Server, "run", run)
    before = sys.getswitchinterval()
    try:
        assert service_module.serve(built) == 0
    finally:
        sys.setswitchinterval(before)
    assert seen == [pytest.approx(0.002)]
