"""Restarts of a node's client agent and of its Docker daemon in the
simulator (nomadsim/restarts.py), over real sockets: what each cuts, what
runs on, and what the cluster's state shows afterwards."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import requests
from websockets.exceptions import ConnectionClosed

from nomadsim import SimServer
from tests.helpers import SECOND, Http, wait_until
from tests.sim.test_exec import (
    TASK,
    Session,
    alive,
    processes,
    refused,
    run,
    start_job,
    wait_for_processes,
)
from tests.sim.test_topology import exec_url, node_names

MakeSim = Callable[..., SimServer]


def restart_agent(server: SimServer, node_id: str, down_s: float) -> requests.Response:
    leader = Http(server.server_addresses["server-1"])
    return leader.request("POST", f"/_sim/node/{node_id}/agent-restart?down={down_s}")


def answers(address: str) -> bool:
    try:
        return requests.get(f"{address}/v1/agent/self", timeout=2).ok
    except requests.ConnectionError:
        return False


def closed(session: Session) -> ConnectionClosed:
    """How the exec's connection ended, reading what is left (no exit frame)."""
    while True:
        try:
            frame = str(session.ws.recv(timeout=5))
        except ConnectionClosed as ended:
            return ended
        assert '"exited"' not in frame, "a cut exec sent an exit frame"


def placed(server: SimServer) -> tuple[str, str, str]:
    """A running allocation: its id, its node's id and its agent's address."""
    (alloc_id,) = start_job(server)
    node_id = Http(server.address).alloc(alloc_id)["NodeID"]
    return alloc_id, node_id, server.agent_addresses[node_names(server)[node_id]]


def test_an_agent_restart_cuts_its_connections_and_every_process_runs_on(
    make_sim: MakeSim,
) -> None:
    server = make_sim()
    alloc_id, node_id, agent = placed(server)
    follower = server.server_addresses["server-2"]
    before = Http(server.address).alloc(alloc_id)
    local = Session(exec_url(agent, alloc_id, ["sh", "-c", "echo up; exec sleep 60"]))
    remote = Session(exec_url(follower, alloc_id, ["sh", "-c", "echo up; exec sleep 60"]))
    local.read_until(b"up")
    remote.read_until(b"up")
    pids = wait_for_processes(server, alloc_id, 2)

    assert restart_agent(server, node_id, 1.0).ok

    # Served by the agent itself: reset with it, no close frame.
    assert closed(local).rcvd is None
    # Served through a server: a hop behind read EOF, a normal close.
    cut = closed(remote).rcvd
    assert cut is not None and (cut.code, cut.reason) == (1000, "")
    assert not answers(agent), "the restarting agent still accepts connections"
    assert refused(exec_url(follower, alloc_id, ["true"])) == (1008, "No path to node")
    assert all(alive(pid) for pid in pids)

    wait_until(lambda: answers(agent), timeout=5)
    node = Http(server.address).get(f"/v1/node/{node_id}")
    assert node["Status"] == "ready"
    after = Http(server.address).alloc(alloc_id)
    assert (after["ModifyIndex"], after["ClientStatus"]) == (before["ModifyIndex"], "running")
    assert after["TaskStates"][TASK]["Restarts"] == 0
    assert sorted(processes(server, alloc_id)) == sorted(pids)
    assert run(server, alloc_id, ["echo", "again"]).data("stdout") == b"again\n"


def test_the_node_re_registers_when_its_agent_is_back(make_sim: MakeSim) -> None:
    server = make_sim()
    _, node_id, agent = placed(server)
    index = Http(server.address).get(f"/v1/node/{node_id}")["ModifyIndex"]
    assert restart_agent(server, node_id, 0.2).ok
    wait_until(lambda: answers(agent), timeout=5)
    stream = requests.get(
        f"{server.address}/v1/event/stream",
        params={"topic": "Node", "index": index + 1},
        stream=True,
        timeout=5,
    )
    seen: list[tuple[str, str]] = []
    for line in stream.iter_lines():
        frame: dict[str, Any] = json.loads(line or b"{}")
        for event in frame.get("Events") or []:
            if event["Key"] == node_id:
                seen.append((event["Type"], event["Payload"]["Node"]["Status"]))
        if len(seen) >= 2:
            break
    stream.close()
    assert seen == [("NodeRegistration", "initializing"), ("NodeEvent", "ready")]


def test_an_agent_down_past_the_heartbeat_ttl_loses_its_node_and_ends_the_old_processes_on_return(
    make_sim: MakeSim,
) -> None:
    server = make_sim(heartbeat_ttl_ms=300.0)
    leader = server.server_addresses["server-1"]
    http = Http(leader)
    alloc_id, node_id, agent = placed(server)
    session = Session(exec_url(leader, alloc_id, ["sh", "-c", "echo up; exec sleep 60"]))
    session.read_until(b"up")
    pids = wait_for_processes(server, alloc_id, 1)

    assert restart_agent(server, node_id, 2.0).ok

    wait_until(lambda: http.alloc(alloc_id)["ClientStatus"] == "lost", timeout=5)
    assert http.get(f"/v1/node/{node_id}")["Status"] == "down"
    wait_until(lambda: [a for a in http.allocs("exec") if a["ClientStatus"] == "running"])
    # The host still runs the container until its agent learns of the loss.
    assert not answers(agent) and all(alive(pid) for pid in pids)

    wait_until(lambda: answers(agent), timeout=5)
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=5)
    assert processes(server, alloc_id) == []
    assert http.get(f"/v1/node/{node_id}")["Status"] == "ready"


def test_a_docker_restart_restarts_every_task_of_its_node_in_place(make_sim: MakeSim) -> None:
    server = make_sim(nodes=1)
    http = Http(server.address)
    restart = {"Attempts": 2, "Interval": 3600 * SECOND, "Delay": 0, "Mode": "fail"}
    allocs = start_job(server, count=2, restart=restart)
    for alloc_id in allocs:
        run(server, alloc_id, ["touch", "left-behind"])
    sessions = [Session(exec_url(server.address, a, ["sleep", "60"])) for a in allocs]
    for alloc_id in allocs:
        wait_for_processes(server, alloc_id, 1)
    node_id = http.alloc(allocs[0])["NodeID"]

    answer = http.request("POST", f"/_sim/node/{node_id}/docker-restart")

    assert answer.ok and sorted(answer.json()["Killed"]) == sorted(allocs)
    for session in sessions:
        assert session.finish().exit_code == 137

    def restarted(alloc_id: str) -> bool:
        got = http.alloc(alloc_id)
        return bool(got["ClientStatus"] == "running" and got["TaskStates"][TASK]["Restarts"] == 1)

    for alloc_id in allocs:
        wait_until(functools.partial(restarted, alloc_id))
        assert run(server, alloc_id, ["ls", "-A"]).data("stdout") == b""  # a fresh file system
        assert processes(server, alloc_id) == []


def test_restart_routes_refuse_what_cannot_be_restarted(make_sim: MakeSim) -> None:
    server = make_sim()
    _, node_id, _ = placed(server)
    leader = Http(server.server_addresses["server-1"])
    bad = leader.request("POST", f"/_sim/node/{node_id}/agent-restart?down=soon")
    assert (bad.status_code, bad.text) == (400, "down must be a number of seconds; found: 'soon'")
    unknown = leader.request("POST", "/_sim/node/no-such-node/docker-restart")
    assert (unknown.status_code, unknown.text) == (404, "node not found")
    assert restart_agent(server, node_id, 1.0).ok
    again = restart_agent(server, node_id, 1.0)
    assert again.status_code == 409 and "already down" in again.text
    docker = leader.request("POST", f"/_sim/node/{node_id}/docker-restart")
    assert docker.status_code == 409 and "is down" in docker.text
