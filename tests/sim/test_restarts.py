"""Restarts of a node's client agent and of its Docker daemon in the
simulator (nomadsim/restarts.py), over real sockets: what each cuts, what
runs on, and what the cluster's state shows afterwards."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

import requests
from websockets.exceptions import ConnectionClosed

from nomadsim import SimServer
from tests.helpers import SECOND, Http, runner_job, wait_until
from tests.sim.test_exec import (
    TASK,
    Session,
    alive,
    processes,
    refused,
    run,
    start_job,
    task_dir,
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


RESTART = {"Attempts": 2, "Interval": 3600 * SECOND, "Delay": 0, "Mode": "fail"}


def placed(server: SimServer) -> tuple[str, str, str]:
    """A running allocation (restarted in place twice at most, at once): its
    id, its node's id and its agent's address."""
    (alloc_id,) = start_job(server, restart=RESTART)
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
    allocs = start_job(server, count=2, restart=RESTART)
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


# -- servers ----------------------------------------------------------------------------


def servers(server: SimServer) -> dict[str, Any]:
    answer: dict[str, Any] = Http(server.address).get("/_sim/servers")
    return answer


def register(address: str, job_id: str) -> requests.Response:
    return requests.put(f"{address}/v1/jobs", json={"Job": runner_job(job_id)}, timeout=10)


def test_a_follower_restart_moves_its_agents_and_elects_nobody(make_sim: MakeSim) -> None:
    server = make_sim()
    follower = server.server_addresses["server-2"]
    agent = server.agent_addresses["agent-2"]  # sends its RPCs to server-2
    stream = requests.get(f"{agent}/v1/event/stream", stream=True, timeout=5)
    lines = stream.iter_lines()
    assert next(lines) == b"{}"
    leader = Http(server.server_addresses["server-1"])
    assert leader.request("POST", "/_sim/server/server-2/restart?down=0.5").ok

    assert servers(server)["Leader"] == "server-1"
    assert servers(server)["Servers"]["server-2"]["Status"] == "down"
    assert not answers(follower)
    # The agent's streaming RPC read EOF: its stream ends, cleanly (after
    # the buffered frames it replays; a stream still open would time out).
    assert all(line.startswith(b'{"Index"') for line in lines)
    first = register(agent, "1-f")
    assert (first.status_code, first.text) == (
        500,
        "rpc error: failed to get conn: dial tcp 127.0.2.2:4647: connect: connection refused",
    )
    assert register(agent, "1-f").ok, "the agent did not move to another server"
    wait_until(lambda: answers(follower), timeout=5)
    assert servers(server)["Servers"]["server-2"]["Status"] == "up"


def test_a_leader_restart_answers_as_followers_do_until_one_is_elected(make_sim: MakeSim) -> None:
    """Dial errors while the followers still believe in the dead leader, then
    each request held for `rpc_hold_ms` and answered `No cluster leader`,
    then a new leader; stale reads are served throughout."""
    server = make_sim(leader_notice_ms=300.0, rpc_hold_ms=100.0)
    follower = server.server_addresses["server-2"]
    agent = server.agent_addresses["agent-2"]
    before = register(agent, "1-g")
    assert before.ok
    index = before.json()["Index"]
    assert requests.post(f"{follower}/_sim/server/server-1/restart?down=5&election=1.5").ok

    dialled = register(agent, "1-g")
    assert (dialled.status_code, dialled.text) == (
        500,
        "rpc error: rpc error: failed to get conn: dial tcp 127.0.2.1:4647: "
        "connect: connection refused",
    )
    wait_until(lambda: register(follower, "1-g").text == "No cluster leader", timeout=5)
    held = register(agent, "1-g")
    assert (held.status_code, held.text) == (500, "rpc error: No cluster leader")
    assert servers(server)["Leader"] is None
    assert requests.get(f"{agent}/v1/jobs?stale", timeout=5).ok
    assert requests.get(f"{agent}/v1/status/leader", timeout=5).json() == ""

    wait_until(lambda: servers(server)["Leader"] is not None, timeout=5)
    assert servers(server)["Leader"] in ("server-2", "server-3")
    after = register(agent, "1-g")
    assert after.ok and after.json()["Index"] > index  # indexes continue


def test_a_request_held_through_a_short_election_is_answered(make_sim: MakeSim) -> None:
    server = make_sim(leader_notice_ms=0.0, rpc_hold_ms=5000.0)
    follower = server.server_addresses["server-3"]
    assert requests.post(f"{follower}/_sim/server/server-1/restart?down=5&election=0.5").ok
    started = time.monotonic()
    assert register(follower, "1-h").ok
    assert 0.3 < time.monotonic() - started < 3.0


def test_updates_kept_without_a_leader_arrive_after_the_election(make_sim: MakeSim) -> None:
    """A task that crashes while no server leads: the servers learn of it
    once a leader is elected, not before."""
    server = make_sim(leader_notice_ms=0.0, rpc_hold_ms=50.0)
    alloc_id, _, _ = placed(server)
    follower = Http(server.server_addresses["server-2"])
    assert follower.request("POST", "/_sim/server/server-1/restart?down=5&election=1").ok
    assert follower.request("POST", f"/_sim/allocation/{alloc_id}/crash").ok
    # What the servers hold (a stale read would lag behind even that, and
    # could show the allocation from before it ran).
    held = server.call(lambda: server.sim.store.allocs[alloc_id])
    assert (held.client_status, held.task_state(TASK).restarts) == ("running", 0)
    wait_until(lambda: servers(server)["Leader"] is not None, timeout=5)
    wait_until(lambda: follower.alloc(alloc_id)["TaskStates"][TASK]["Restarts"] == 1)


def test_all_servers_down_need_a_quorum_back_before_a_leader(make_sim: MakeSim) -> None:
    server = make_sim(rpc_hold_ms=50.0)
    agent = server.agent_addresses["agent-3"]
    assert requests.post(f"{agent}/_sim/servers/restart?down=0.5&election=0.2", timeout=5).ok
    assert all(s["Status"] == "down" for s in servers_via(agent)["Servers"].values())
    assert register(agent, "1-i").status_code == 500
    wait_until(lambda: servers_via(agent)["Leader"] is not None, timeout=5)
    wait_until(lambda: register(agent, "1-i").ok, timeout=5)


def servers_via(address: str) -> dict[str, Any]:
    answer: dict[str, Any] = requests.get(f"{address}/_sim/servers", timeout=5).json()
    return answer


# -- hosts ------------------------------------------------------------------------------


def reboot(server: SimServer, node_id: str, down_s: float) -> requests.Response:
    leader = Http(server.server_addresses["server-1"])
    return leader.request("POST", f"/_sim/node/{node_id}/reboot?down={down_s}")


def test_a_short_reboot_restarts_every_task_in_place_on_return(make_sim: MakeSim) -> None:
    server = make_sim()
    http = Http(server.server_addresses["server-1"])
    alloc_id, node_id, agent = placed(server)
    run(server, alloc_id, ["touch", "left-behind"])
    session = Session(exec_url(http.address, alloc_id, ["sh", "-c", "echo up; exec sleep 60"]))
    session.read_until(b"up")
    pids = wait_for_processes(server, alloc_id, 1)

    assert reboot(server, node_id, 1.0).ok

    # The containers went with the host, at once.
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=5)
    assert http.alloc(alloc_id)["ClientStatus"] == "running"  # the servers do not know yet
    wait_until(lambda: answers(agent), timeout=5)
    wait_until(
        lambda: (
            (a := http.alloc(alloc_id))["ClientStatus"] == "running"
            and a["TaskStates"][TASK]["Restarts"] == 1
        ),
        timeout=5,
    )
    assert run(server, alloc_id, ["ls", "-A"]).data("stdout") == b""


def test_a_reboot_past_the_heartbeat_ttl_loses_the_node_and_nothing_comes_back(
    make_sim: MakeSim,
) -> None:
    server = make_sim(heartbeat_ttl_ms=300.0)
    http = Http(server.server_addresses["server-1"])
    alloc_id, node_id, agent = placed(server)

    assert reboot(server, node_id, 1.5).ok

    wait_until(lambda: http.alloc(alloc_id)["ClientStatus"] == "lost", timeout=5)
    wait_until(lambda: [a for a in http.allocs("exec") if a["ClientStatus"] == "running"])
    wait_until(lambda: answers(agent), timeout=5)
    assert http.get(f"/v1/node/{node_id}")["Status"] == "ready"
    assert http.alloc(alloc_id)["ClientStatus"] == "lost"
    assert task_dir(server, alloc_id) is None
