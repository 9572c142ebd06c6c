"""Executions end to end: a client claims a runner over HTTP, POSTs
`/execute`, connects to the WebSocket with the token header (as CodeOcean
does) and reads frames until the server closes — against the simulator, whose
exec runs the commands for real. Every frame the server sends is checked
against Poseidon's WebSocket schema."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from websockets.exceptions import InvalidStatus

from tests.helpers import Http, wait_until
from tests.support.api_server import TOKEN
from tests.support.world import AUTH, ENV, Run, World, read_all, world_with


@pytest.fixture
def world(make_sim: Any) -> Iterator[World]:
    with world_with(make_sim) as w:
        yield w


def test_echo(world: World) -> None:
    runner = world.claim()
    run = world.run(runner, "echo hi")
    assert run.frames == [
        {"type": "start"},
        {"type": "stdout", "data": "hi\r\n"},
        {"type": "exit", "data": 0},
    ]
    assert run.close_code == 1000


@pytest.mark.parametrize("code", [0, 1, 137, 255])
def test_exit_codes(world: World, code: int) -> None:
    run = world.run(world.claim(), f"exit {code}")
    assert run.last == {"type": "exit", "data": code}


def test_stdin_reaches_the_program_and_the_terminal_echoes_it(world: World) -> None:
    run = world.run(world.claim(), "head -n 1", stdin=("Hello World!\n",))
    assert run.stdout == "Hello World!\r\nHello World!\r\n"
    assert run.last == {"type": "exit", "data": 0}


def test_the_program_sees_a_terminal_and_stderr_arrives_apart(world: World) -> None:
    command = "test -t 0 && test -t 1 && echo tty; echo oops >&2; echo out"
    run = world.run(world.claim(), command)
    assert run.stdout == "tty\r\nout\r\n"
    assert run.stderr == "oops\n"
    assert run.last == {"type": "exit", "data": 0}


def test_the_program_may_reopen_its_stderr(world: World) -> None:
    """`> /dev/stderr` opens the FIFO again, as the unprivileged user: root's
    FIFO lets that user write to it."""
    run = world.run(world.claim(), "echo reopened > /dev/stderr; echo out")
    assert (run.stdout, run.stderr) == ("out\r\n", "reopened\n")
    assert run.last == {"type": "exit", "data": 0}


def test_stderr_merged_when_configured(make_sim: Any) -> None:
    with world_with(make_sim, NRC_EXEC_SEPARATE_STDERR="false") as w:
        run = w.run(w.claim(), "echo oops >&2; echo out")
        assert (run.stdout, run.stderr) == ("oops\r\nout\r\n", "")


def test_environment_values_with_spaces_and_quotes(world: World) -> None:
    value = 'it\'s "quoted" and  spaced $HOME `x`'
    run = world.run(world.claim(), 'printf "%s|%s" "$V" "$CODEOCEAN"', environment={"V": value})
    assert run.stdout == f"{value}|true"


def test_nomad_variables_are_hidden_and_unprivileged_runs_through_the_wrapper(world: World) -> None:
    run = world.run(world.claim(), 'echo "${NOMAD_ALLOC_ID-hidden}"')
    assert run.stdout == "hidden\r\n"


def test_time_limit_ends_the_whole_process_tree(world: World) -> None:
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    run = world.run(runner, "sleep 60 & (sleep 61 &); sleep 62", timeLimit=1)
    assert run.last == {"type": "timeout"}
    assert run.close_code == 1000
    assert 0.9 < run.seconds < 2.5, run.seconds
    wait_until(lambda: not world.processes(alloc), timeout=3.5, interval=0.05)
    assert world.runner_status(runner)[0] == 200, "the runner is still the client's"


def test_a_client_that_leaves_leaves_no_process(world: World) -> None:
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    ws_url = world.execute(runner, "sleep 60 & sleep 61")
    with world.connect(ws_url) as ws:
        assert json.loads(ws.recv(timeout=5)) == {"type": "start"}
        wait_until(lambda: len(world.processes(alloc)) >= 2, timeout=5)
    wait_until(lambda: not world.processes(alloc), timeout=3.5, interval=0.05)
    assert world.runner_status(runner)[0] == 200


def during_a_run(world: World, runner: str, fault: Callable[[], Any]) -> Run:
    """Start `echo started; sleep 60`, apply `fault` once it runs, read to the end."""
    ws_url = world.execute(runner, "echo started; sleep 60")
    with world.connect(ws_url) as ws:
        started = time.monotonic()
        assert json.loads(ws.recv(timeout=5)) == {"type": "start"}
        assert json.loads(ws.recv(timeout=5))["data"] == "started\r\n"
        fault()
        return read_all(ws, started, start_read=True)


def test_an_oom_kill_during_an_execution(world: World) -> None:
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    sim = Http(world.sim.address)
    run = during_a_run(world, runner, lambda: sim.request("POST", f"/_sim/allocation/{alloc}/oom"))
    assert run.last == {"type": "error", "data": "the allocation was OOM Killed"}
    status, message = world.runner_status(runner)
    assert status == 410 and "oom_killed" in message


def test_a_restart_during_an_execution_names_the_loss(world: World) -> None:
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    sim = Http(world.sim.address)
    run = during_a_run(
        world, runner, lambda: sim.request("POST", f"/_sim/allocation/{alloc}/crash")
    )
    assert run.last["type"] == "error" and "restarted" in run.last["data"]
    status, message = world.runner_status(runner)
    assert status == 410 and "restarted" in message


def test_a_drain_during_an_execution(world: World) -> None:
    runner = world.claim()
    node = world.alloc_of(runner)["NodeID"]
    sim = Http(world.sim.address)

    def drain() -> None:
        # a forced drain: batch allocations (runners) migrate at once
        body = {"DrainSpec": {"Deadline": -1}}
        sim.request("PUT", f"/v1/node/{node}/drain", json=body).raise_for_status()

    run = during_a_run(world, runner, drain)
    assert run.last["type"] == "error"
    assert "migrated" in run.last["data"]
    status, message = world.runner_status(runner)
    assert status == 410 and "migrated" in message


def test_an_agent_restart_cuts_an_execution_and_its_processes_end_once_the_agent_is_back(
    world: World,
) -> None:
    """The node's agent restarts (its port closed for 1 s, every connection
    reset) while a command runs: Docker keeps the command running, so the
    controller kills it once it can reach the runner again."""
    runner = world.claim()
    alloc = world.alloc_of(runner)
    leader = Http(world.sim.server_addresses["server-1"])

    def restart() -> None:
        path = f"/_sim/node/{alloc['NodeID']}/agent-restart?down=1"
        leader.request("POST", path).raise_for_status()

    run = during_a_run(world, runner, restart)
    assert run.last["type"] == "error" and "Nomad cut the connection" in run.last["data"]
    assert run.close_code == 1000
    wait_until(lambda: not world.processes(alloc["ID"]), timeout=10, interval=0.05)
    assert world.runner_status(runner)[0] == 200, "the runner is still the client's"


def test_a_docker_restart_tells_the_claimed_runner_and_keeps_the_idle_ones(make_sim: Any) -> None:
    """Docker restarts on a node: every task there exits 137 and restarts in
    place (the template's 15 s delay, scaled). The execution running on it
    ends with the loss, its claimed runner answers 410 `restarted`; the idle
    runners there are fresh again and stay in the pool: nothing is created
    anew."""
    with world_with(make_sim, {"time_scale": 0.01}) as world:
        docker_restart_during_a_run(world)


def docker_restart_during_a_run(world: World) -> None:
    runner = world.claim()
    alloc = world.alloc_of(runner)
    leader = Http(world.sim.server_addresses["server-1"])
    pools = world.api.controller.pools

    def idle_ready() -> int:
        return int(pools.pool_counts(ENV.id).idle_ready)

    wait_until(lambda: idle_ready() == ENV.prewarming_pool_size, timeout=10)
    created = leader.get("/_sim/stats")["JobsRegisteredTotal"]
    idle_on_node = [
        a["ID"]
        for a in leader.get("/v1/allocations")
        if a["NodeID"] == alloc["NodeID"] and a["ClientStatus"] == "running" and a != alloc
    ]

    elsewhere = [a["ID"] for a in leader.get("/v1/allocations") if a["NodeID"] != alloc["NodeID"]]
    assert idle_on_node and elsewhere, "the seeded placement puts runners on both nodes"

    def restart_docker() -> None:
        leader.request("POST", f"/_sim/node/{alloc['NodeID']}/docker-restart").raise_for_status()

    run = during_a_run(world, runner, restart_docker)
    assert run.last["type"] == "error" and "restarted" in run.last["data"]
    status, message = world.runner_status(runner)
    assert status == 410 and "restarted" in message

    def restarted_in_place() -> bool:
        idle = [leader.get(f"/v1/allocation/{a}") for a in idle_on_node]
        return all(
            a["ClientStatus"] == "running" and a["TaskStates"]["default-task"]["Restarts"] == 1
            for a in idle
        )

    wait_until(restarted_in_place, timeout=10)
    wait_until(lambda: idle_ready() == ENV.prewarming_pool_size, timeout=10)
    assert leader.get("/_sim/stats")["JobsRegisteredTotal"] == created, "a runner was recreated"
    for alloc_id in elsewhere:
        untouched = leader.get(f"/v1/allocation/{alloc_id}")
        assert untouched["ClientStatus"] == "running"
        assert untouched["TaskStates"]["default-task"]["Restarts"] == 0


def test_the_upgrade_needs_the_token(world: World) -> None:
    runner = world.claim()
    ws_url = world.execute(runner, "echo hi")
    for headers in ({}, {"Poseidon-Token": "wrong"}):
        with pytest.raises(InvalidStatus) as refused:
            world.connect(ws_url, headers=headers)
        assert refused.value.response.status_code == 401
    # the id was not used up by the refused attempts
    with world.connect(ws_url, headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        assert read_all(ws, time.monotonic()).last == {"type": "exit", "data": 0}


def test_unknown_used_and_foreign_execution_ids(world: World) -> None:
    runner, other = world.claim(), world.claim()
    ws_url = world.execute(runner, "true")
    with pytest.raises(InvalidStatus) as refused:
        world.connect(ws_url.replace(f"/runners/{runner}/", f"/runners/{other}/"))
    assert refused.value.response.status_code == 404
    with world.connect(ws_url) as ws:
        read_all(ws, time.monotonic())
    with pytest.raises(InvalidStatus) as refused:
        world.connect(ws_url)
    assert refused.value.response.status_code == 404
    body = json.loads(refused.value.response.body or b"{}")
    assert "execution id" in body["message"]
    with pytest.raises(InvalidStatus) as refused:
        world.connect(ws_url.split("?")[0] + "?executionID=nope")
    assert refused.value.response.status_code == 404


def test_released_and_unknown_runners_are_gone(world: World) -> None:
    runner = world.claim()
    ws_url = world.execute(runner, "true")
    assert requests.delete(world.url(f"/runners/{runner}"), headers=AUTH, timeout=10).ok
    with pytest.raises(InvalidStatus) as refused:
        world.connect(ws_url)
    assert refused.value.response.status_code == 410
    r = requests.post(
        world.url(f"/runners/{runner}/execute"), json={"command": "true"}, headers=AUTH, timeout=5
    )
    assert r.status_code == 410


@pytest.mark.parametrize(
    ("body", "field_name"),
    [
        ({}, "command"),
        ({"command": 5}, "command"),
        ({"command": "x", "timeLimit": -1}, "timeLimit"),
        ({"command": "x", "environment": {"1A": "x"}}, "environment"),
        ({"command": "a\u0000b"}, "command"),
        ({"command": "x", "privilegedExecution": "yes"}, "privilegedExecution"),
    ],
)
def test_bad_execute_bodies(world: World, body: dict[str, Any], field_name: str) -> None:
    runner = world.claim()
    r = requests.post(world.url(f"/runners/{runner}/execute"), json=body, headers=AUTH, timeout=5)
    assert r.status_code == 400
    assert field_name in r.json()["message"]


def test_several_executions_on_one_runner_at_once(world: World) -> None:
    runner = world.claim()
    urls = [world.execute(runner, f"sleep 0.3; echo {n}") for n in range(4)]
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(world.connect(u)) for u in urls]
        runs = [read_all(ws, time.monotonic()) for ws in sockets]
    assert [r.stdout for r in runs] == [f"{n}\r\n" for n in range(4)]
    assert max(r.seconds for r in runs) < 2.0


def test_a_long_execution_keeps_the_runner_from_expiring(world: World) -> None:
    runner = world.claim(timeout_s=1)
    run = world.run(runner, "sleep 2.5; echo done")
    assert run.stdout == "done\r\n"
    assert world.runner_status(runner)[0] == 200


def test_unused_execution_ids_expire(make_sim: Any) -> None:
    with world_with(make_sim, NRC_EXECUTION_ID_TTL="0.2") as w:
        ws_url = w.execute(w.claim(), "true")
        time.sleep(0.3)  # the expiry itself is what is tested
        with pytest.raises(InvalidStatus) as refused:
            w.connect(ws_url)
        assert refused.value.response.status_code == 404


def test_websocket_url_behind_a_trusted_proxy(make_sim: Any) -> None:
    with world_with(make_sim, NRC_API_TRUST_PROXY_HEADERS="true") as w:
        runner = w.claim()
        headers = {**AUTH, "X-Forwarded-Proto": "https", "X-Forwarded-Host": "ide.example"}
        r = requests.post(
            w.url(f"/runners/{runner}/execute"),
            json={"command": "true"},
            headers=headers,
            timeout=5,
        )
        assert r.json()["websocketUrl"].startswith(
            f"wss://ide.example/api/v1/runners/{runner}/websocket?executionID="
        )


def test_forwarded_headers_are_ignored_unless_trusted(world: World) -> None:
    runner = world.claim()
    headers = {**AUTH, "X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example"}
    r = requests.post(
        world.url(f"/runners/{runner}/execute"),
        json={"command": "true"},
        headers=headers,
        timeout=5,
    )
    assert r.json()["websocketUrl"].startswith(f"ws://127.0.0.1:{world.api.port}/api/v1/")
