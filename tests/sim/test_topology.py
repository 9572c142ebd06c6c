"""The production topology: servers and a client agent per node, each on its
own listener; what each forwards, how a forwarded error comes back, and
Nomad's connection limits (HTTP per listener and client IP with the
hijack rule, RPC per server and agent IP for streaming connections)."""

from __future__ import annotations

import base64
import json
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import nomad
import pytest
import requests
from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import ClientConnection, connect

from nomadsim import SimConfig, SimServer
from nomadsim.connlimit import TOO_MANY_RESPONSE, RpcLimits, TokenBucket, check_rpc_limit
from nomadsim.errors import NomadError, Origin
from nomadsim.forwarding import Answer, answer
from nomadsim.topology import Agent, Hop, Kind, Role, cluster, hop
from tests.helpers import EventReader, Http, runner_job, wait_until
from tests.support.ports import free_port
from tests.support.processes import ChildProcess, python_module
from tests.support.sim import PRODUCTION

CONFLICT = "Enforcing job modify index 1: job exists with conflicting job modify index: 2"

# -- the rules, as tables --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "error", "hops", "expected"),
    [
        ("direct plain", NomadError(500, CONFLICT, origin=Origin.PLAIN), 0, Answer(500, CONFLICT)),
        (
            "forwarded once",
            NomadError(500, CONFLICT, origin=Origin.PLAIN),
            1,
            Answer(500, "rpc error: " + CONFLICT),
        ),
        (
            "agent to follower to leader",
            NomadError(500, CONFLICT, origin=Origin.PLAIN),
            2,
            Answer(500, "rpc error: rpc error: " + CONFLICT),
        ),
        (
            "plain with another status becomes 500",
            NomadError(404, "job not found", origin=Origin.PLAIN),
            1,
            Answer(500, "rpc error: job not found"),
        ),
        (
            "permission denied keeps 403 by its suffix",
            NomadError(403, "Permission denied", origin=Origin.PLAIN),
            2,
            Answer(403, "Permission denied"),
        ),
        (
            "token not found keeps 403",
            NomadError(500, "ACL token not found", origin=Origin.PLAIN),
            1,
            Answer(403, "ACL token not found"),
        ),
        (
            "registration disabled is 403",
            NomadError(
                500,
                "Job registration, dispatch, and scale are disabled by the scheduler configuration",
                origin=Origin.PLAIN,
            ),
            1,
            Answer(
                403,
                "Job registration, dispatch, and scale are disabled by the scheduler configuration",
            ),
        ),
        (
            "incompatible filtering is 400",
            NomadError(
                500,
                "Filter expression cannot be used with other filter parameters",
                origin=Origin.PLAIN,
            ),
            1,
            Answer(400, "Filter expression cannot be used with other filter parameters"),
        ),
        (
            "RPC-coded keeps code and text",
            NomadError(404, "alloc not found", origin=Origin.CODED),
            1,
            Answer(404, "alloc not found"),
        ),
        (
            "the HTTP handler's own error is never wrapped",
            NomadError(404, "job not found"),
            2,
            Answer(404, "job not found"),
        ),
    ],
)
def test_forwarded_errors_are_answered_as_nomad_does(
    name: str, error: NomadError, hops: int, expected: Answer
) -> None:
    assert answer(error, hops) == expected


LEADER, FOLLOWER = Agent("server-1", Role.LEADER, "ip"), Agent("server-2", Role.FOLLOWER, "ip")
CLIENT = Agent("agent-1", Role.CLIENT, "ip", node="agent-1", server="server-2")


@pytest.mark.parametrize(
    ("name", "agent", "kind", "stale", "server_role", "alloc_node", "expected"),
    [
        ("leader write", LEADER, Kind.WRITE, False, None, None, Hop()),
        ("leader exec", LEADER, Kind.EXEC, False, None, "agent-2", Hop()),
        ("follower write", FOLLOWER, Kind.WRITE, False, None, None, Hop(pool_hops=1)),
        ("follower read", FOLLOWER, Kind.READ, False, None, None, Hop(pool_hops=1)),
        ("follower stale read", FOLLOWER, Kind.READ, True, None, None, Hop(follower_view=True)),
        ("follower event stream is its own", FOLLOWER, Kind.STREAM, False, None, None, Hop()),
        ("agent/self is local", CLIENT, Kind.LOCAL, False, Role.FOLLOWER, None, Hop()),
        ("client write to leader", CLIENT, Kind.WRITE, False, Role.LEADER, None, Hop(1)),
        ("client write to follower", CLIENT, Kind.WRITE, False, Role.FOLLOWER, None, Hop(2)),
        ("client read to follower", CLIENT, Kind.READ, False, Role.FOLLOWER, None, Hop(2)),
        (
            "client stale read to follower",
            CLIENT,
            Kind.READ,
            True,
            Role.FOLLOWER,
            None,
            Hop(pool_hops=1, follower_view=True),
        ),
        ("client stale read to leader", CLIENT, Kind.READ, True, Role.LEADER, None, Hop(1)),
        (
            "client event stream",
            CLIENT,
            Kind.STREAM,
            False,
            Role.FOLLOWER,
            None,
            Hop(stream_to="server-2"),
        ),
        ("client exec, own node", CLIENT, Kind.EXEC, False, Role.LEADER, "agent-1", Hop()),
        (
            "client exec, other node",
            CLIENT,
            Kind.EXEC,
            False,
            Role.LEADER,
            "agent-2",
            Hop(stream_to="server-2"),
        ),
        (
            "client exec, unknown allocation",
            CLIENT,
            Kind.EXEC,
            False,
            Role.LEADER,
            None,
            Hop(stream_to="server-2"),
        ),
    ],
)
def test_what_each_agent_forwards(
    name: str,
    agent: Agent,
    kind: Kind,
    stale: bool,
    server_role: Role | None,
    alloc_node: str | None,
    expected: Hop,
) -> None:
    assert hop(agent, kind, stale, server_role, alloc_node) == expected


def test_the_cluster_has_a_leader_followers_and_an_agent_per_node() -> None:
    agents = cluster(3, 4)
    assert [(a.name, a.role, a.server) for a in agents] == [
        ("server-1", Role.LEADER, None),
        ("server-2", Role.FOLLOWER, None),
        ("server-3", Role.FOLLOWER, None),
        ("agent-1", Role.CLIENT, "server-1"),
        ("agent-2", Role.CLIENT, "server-2"),
        ("agent-3", Role.CLIENT, "server-3"),
        ("agent-4", Role.CLIENT, "server-1"),
    ]
    assert len({a.ip for a in agents}) == len(agents)


@pytest.mark.parametrize(
    ("limit", "ok"), [(0, True), (26, True), (100, True), (25, False), (1, False), (-1, False)]
)
def test_rpc_limit_is_checked_as_nomad_checks_it(limit: int, ok: bool) -> None:
    if ok:
        check_rpc_limit(limit)
    else:
        with pytest.raises(ValueError, match=f"must be > 25; found: {limit}"):
            check_rpc_limit(limit)


def test_streams_are_held_to_the_limit_less_twenty_per_agent_ip() -> None:
    limits = RpcLimits(100, {"server-1": ["a"]})
    assert [limits.open_stream("server-1", "a") for _ in range(81)] == [True] * 80 + [False]
    assert limits.open_stream("server-1", "b")  # another agent's IP counts apart
    limits.close_stream("server-1", "a")
    assert limits.open_stream("server-1", "a")
    stats = limits.as_dict()["server-1"]
    # The agent's multiplexed connection plus its 80 streams.
    assert stats["Connections"]["ByClientIP"] == {"a": 81, "b": 1}
    assert stats["Streams"]["Peak"] == 81 and stats["Streams"]["Refused"] == 1


def test_the_429_answers_are_rate_limited_as_nomad_limits_them() -> None:
    now = [0.0]
    bucket = TokenBucket(10, 100, lambda: now[0])
    assert sum(bucket.allow() for _ in range(150)) == 100
    now[0] = 1.0
    assert sum(bucket.allow() for _ in range(150)) == 10


# -- the cluster, over real sockets ------------------------------------------------------


def production(make_sim: Callable[..., SimServer], **overrides: Any) -> SimServer:
    return make_sim(**{**PRODUCTION, **overrides})


def node_names(server: SimServer) -> dict[str, str]:
    """Node ID to node name."""
    return {n["ID"]: n["Name"] for n in Http(server.address).get("/v1/nodes")}


def exec_url(address: str, alloc_id: str, command: list[str]) -> str:
    params = {"task": "default-task", "command": json.dumps(command), "tty": "false"}
    host = address.removeprefix("http://")
    return f"ws://{host}/v1/client/allocation/{alloc_id}/exec?{urlencode(params)}"


def connections(server: SimServer) -> dict[str, Any]:
    # Asked of the leader, so that the entry's own counts are not disturbed.
    result: dict[str, Any] = Http(server.server_addresses["server-1"]).get("/_sim/connections")
    return result


@pytest.fixture
def topology(make_sim: Callable[..., SimServer]) -> SimServer:
    return production(make_sim)


def test_each_node_publishes_its_own_agent_as_http_addr(topology: SimServer) -> None:
    server = topology
    http = Http(server.address)
    agents = server.agent_addresses
    assert sorted(agents) == ["agent-1", "agent-2", "agent-3"]
    assert len(set(server.addresses.values())) == 6
    for stub in http.get("/v1/nodes"):
        node = http.get(f"/v1/node/{stub['ID']}")
        assert "http://" + node["HTTPAddr"] == agents[node["Name"]]
        assert stub["Address"] == node["HTTPAddr"].rsplit(":", 1)[0]
        # The node's own agent answers there, as a client, not a server.
        me = Http(agents[node["Name"]]).get("/v1/agent/self")
        assert me["config"]["NodeName"] == node["Name"]
        assert me["stats"]["nomad"]["server"] == "false"
    assert server.address == agents["agent-1"]  # the default entry is a client agent
    leader = Http(server.server_addresses["server-1"]).get("/v1/agent/self")
    assert leader["stats"]["nomad"] == {"leader": "true", "server": "true", "known_regions": "1"}


@pytest.mark.parametrize(
    ("entry", "agent"), [("client", "agent-1"), ("leader", "server-1"), ("follower", "server-2")]
)
def test_the_entry_is_chosen_by_role(
    make_sim: Callable[..., SimServer], entry: str, agent: str
) -> None:
    server = production(make_sim, entry=entry)
    assert server.address == server.addresses[agent]
    assert connections(server)["Entry"] == agent


def test_a_follower_entry_needs_a_second_server() -> None:
    with pytest.raises(ValueError, match="needs at least two servers"):
        SimServer(SimConfig(servers=1, entry="follower"))


def test_an_rpc_limit_nomad_refuses_is_refused() -> None:
    with pytest.raises(ValueError, match="must be > 25; found: 10"):
        SimServer(SimConfig(rpc_max_conns_per_client=10))
    with pytest.raises(ValueError, match="must not be negative; found: -1"):
        SimServer(SimConfig(http_max_conns_per_client=-1))


def test_an_enforce_index_conflict_is_wrapped_per_pool_hop(topology: SimServer) -> None:
    """agent-1 talks to the leader, agent-2 to a follower (two hops)."""
    server = topology
    Http(server.address).register(runner_job("j"))
    index = Http(server.address).get("/v1/job/j")["JobModifyIndex"]
    body = {"Job": runner_job("j"), "EnforceIndex": True, "JobModifyIndex": index + 7}
    conflict = (
        f"Enforcing job modify index {index + 7}: job exists with conflicting job modify "
        f"index: {index}"
    )
    expected = {
        "server-1": conflict,
        "server-2": "rpc error: " + conflict,
        "server-3": "rpc error: " + conflict,
        "agent-1": "rpc error: " + conflict,
        "agent-2": "rpc error: rpc error: " + conflict,
        "agent-3": "rpc error: rpc error: " + conflict,
    }
    for name, address in server.addresses.items():
        response = requests.put(f"{address}/v1/jobs", json=body, timeout=10)
        assert (name, response.status_code, response.text) == (name, 500, expected[name])
    # The job was not touched by any of them.
    assert Http(server.address).get("/v1/job/j")["JobModifyIndex"] == index


def test_permission_errors_stay_403_and_handler_errors_keep_their_status(
    make_sim: Callable[..., SimServer],
) -> None:
    server = production(make_sim, acl_token="root")
    for address in server.addresses.values():
        denied = requests.get(f"{address}/v1/jobs", timeout=10)
        assert (denied.status_code, denied.text) == (403, "Permission denied")
        missing = requests.get(
            f"{address}/v1/job/nope", headers={"X-Nomad-Token": "root"}, timeout=10
        )
        assert (missing.status_code, missing.text) == (404, "job not found")


def test_reads_and_blocking_queries_through_an_agent(topology: SimServer) -> None:
    server = topology
    agent = Http(server.agent_addresses["agent-2"])
    first = agent.request("GET", "/v1/jobs")
    index = int(first.headers["X-Nomad-Index"])
    # A blocking query on one agent wakes on a write through another.
    result: dict[str, Any] = {}

    def block() -> None:
        result["r"] = agent.request("GET", "/v1/jobs", params={"index": index, "wait": "5s"})

    thread = threading.Thread(target=block)
    thread.start()
    Http(server.agent_addresses["agent-3"]).register(runner_job("woke"))
    thread.join(10)
    blocked = result["r"]
    assert int(blocked.headers["X-Nomad-Index"]) > index
    assert [j["ID"] for j in blocked.json()] == ["woke"]


def test_a_stale_read_on_a_follower_may_lag_the_leader(make_sim: Callable[..., SimServer]) -> None:
    server = production(make_sim, stale_lag_ms=60_000.0)
    follower = server.server_addresses["server-2"]
    Http(server.address).register(runner_job("lagging"))
    leader_index = int(Http(server.address).request("GET", "/v1/jobs").headers["X-Nomad-Index"])
    consistent = requests.get(f"{follower}/v1/jobs", timeout=10)
    assert int(consistent.headers["X-Nomad-Index"]) == leader_index
    stale = requests.get(f"{follower}/v1/jobs", params={"stale": ""}, timeout=10)
    assert int(stale.headers["X-Nomad-Index"]) < leader_index


def test_variable_locks_through_an_agent(topology: SimServer) -> None:
    agent = Http(topology.address)
    lock = {"Lock": {"TTL": "15s", "LockDelay": "15s"}}
    acquired = agent.request("PUT", "/v1/var/nrc/leader", params={"lock-acquire": ""}, json=lock)
    assert acquired.status_code == 200, acquired.text
    lock_id = acquired.json()["Lock"]["ID"]
    held = agent.request("PUT", "/v1/var/nrc/leader", params={"lock-acquire": ""}, json=lock)
    assert held.status_code == 409
    body = {"Lock": {"ID": lock_id}}
    renewed = agent.request("PUT", "/v1/var/nrc/leader", params={"lock-renew": ""}, json=body)
    assert renewed.status_code == 200
    released = agent.request("PUT", "/v1/var/nrc/leader", params={"lock-release": ""}, json=body)
    assert released.status_code == 200
    again = agent.request("PUT", "/v1/var/nrc/leader", params={"lock-release": ""}, json=body)
    assert (again.status_code, again.text) == (500, "rpc error: variable doesn't hold a lock")


def test_python_nomad_works_against_the_agent_entry(topology: SimServer) -> None:
    host, port = topology.address.removeprefix("http://").split(":")
    client = nomad.Nomad(host=host, port=int(port), timeout=10)
    client.jobs.register_job({"Job": runner_job("pn")})
    assert client.job.get_job("pn")["ID"] == "pn"
    with pytest.raises(nomad.api.exceptions.BaseNomadException) as failed:
        client.jobs.register_job(
            {"Job": runner_job("pn"), "EnforceIndex": True, "JobModifyIndex": 999_999}
        )
    assert "rpc error: Enforcing job modify index 999999" in failed.value.nomad_resp.text


# -- connection limits ------------------------------------------------------------------


def test_http_connections_beyond_the_limit_get_nomads_429_and_close(
    make_sim: Callable[..., SimServer],
) -> None:
    server = production(make_sim, http_max_conns_per_client=3)
    port = server.port
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        wait_until(lambda: connections(server)["HTTP"]["agent-1"]["Current"] >= 3)
        refused = socket.create_connection(("127.0.0.1", port), timeout=5)
        received = b""
        while chunk := refused.recv(4096):
            received += chunk
        refused.close()
        assert received == TOO_MANY_RESPONSE
        assert received.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
        # Another listener counts apart.
        Http(server.server_addresses["server-1"]).get("/v1/jobs")
    finally:
        for sock in held:
            sock.close()
    # Closed connections no longer count.
    wait_until(lambda: Http(server.address).request("GET", "/v1/jobs").status_code == 200)
    stats = connections(server)["HTTP"]["agent-1"]
    assert stats["Refused"] >= 1 and stats["Peak"] >= 3


class Exec:
    """A running `cat` exec: its stdin ends it."""

    def __init__(self, url: str) -> None:
        self.ws: ClientConnection = connect(url, open_timeout=5).__enter__()

    def finish(self) -> list[dict[str, Any]]:
        self.ws.send(json.dumps({"stdin": {"data": base64.b64encode(b"hi").decode()}}))
        self.ws.send(json.dumps({"stdin": {"close": True}}))
        frames: list[dict[str, Any]] = []
        while not frames or "exited" not in frames[-1]:
            frames.append(json.loads(self.ws.recv(timeout=5)))
        self.ws.close()
        return frames


@pytest.fixture
def placed(make_sim: Callable[..., SimServer]) -> tuple[SimServer, str, str, str]:
    """A cluster with one running allocation: the server, the allocation,
    its node's agent address and another node's agent address."""
    server = production(make_sim, http_max_conns_per_client=2, rpc_max_conns_per_client=26)
    http = Http(server.address)
    http.register(runner_job("x"))
    (alloc,) = http.running("x")
    node = node_names(server)[alloc["NodeID"]]
    other = next(name for name in server.agent_addresses if name != node)
    return server, alloc["ID"], server.agent_addresses[node], server.agent_addresses[other]


def test_an_upgraded_exec_no_longer_counts_toward_the_http_limit(
    placed: tuple[SimServer, str, str, str],
) -> None:
    server, alloc_id, own, _ = placed
    execs = [Exec(exec_url(own, alloc_id, ["cat"])) for _ in range(4)]  # twice the limit
    name = next(n for n, a in server.addresses.items() if a == own)
    assert wait_until(lambda: connections(server)["HTTP"][name]["Current"] == 0)
    assert requests.get(f"{own}/v1/jobs", timeout=10).status_code == 200
    for e in execs:
        assert e.finish()[-1] == {"exited": True, "result": {}}


def test_execs_on_other_nodes_hold_streaming_rpc_connections_up_to_the_limit(
    placed: tuple[SimServer, str, str, str],
) -> None:
    """rpc_max_conns_per_client 26 leaves 6 streams per agent IP and server."""
    server, alloc_id, own, other = placed
    other_name = next(n for n, a in server.addresses.items() if a == other)
    its_server = server.sim.frontends.by_name[other_name].server
    assert its_server is not None
    remote = [Exec(exec_url(other, alloc_id, ["cat"])) for _ in range(6)]
    streams = connections(server)["RPC"][its_server]["Streams"]
    assert streams["Current"] == 6
    # The seventh is dropped without a close frame, as Nomad's handler leaves it.
    with (
        connect(exec_url(other, alloc_id, ["cat"]), open_timeout=5) as ws,
        pytest.raises(ConnectionClosedError) as dropped,
    ):
        ws.recv(timeout=5)
    assert dropped.value.rcvd is None
    # On the allocation's own node the exec is local: no RPC connection.
    local = Exec(exec_url(own, alloc_id, ["cat"]))
    assert local.finish()[-1] == {"exited": True, "result": {}}
    for e in remote:
        assert e.finish()[-1] == {"exited": True, "result": {}}
    stats = wait_until(
        lambda: (s := connections(server)["RPC"][its_server])["Streams"]["Current"] == 0 and s
    )
    assert stats["Streams"]["Peak"] == 6 and stats["Streams"]["Refused"] == 1
    assert stats["Connections"]["Current"] >= 1  # the agent's own multiplexed connection


def test_event_streams_through_an_agent_hold_streaming_rpc_connections(
    make_sim: Callable[..., SimServer],
) -> None:
    server = production(make_sim, rpc_max_conns_per_client=26)
    readers = [EventReader(server.address) for _ in range(6)]
    try:
        refused = requests.get(f"{server.address}/v1/event/stream", timeout=10)
        assert (refused.status_code, refused.text) == (500, "EOF")
        # A server serves its own stream: no agent connection.
        leader = EventReader(server.server_addresses["server-1"])
        leader.close()
    finally:
        for reader in readers:
            reader.close()
    wait_until(lambda: connections(server)["RPC"]["server-1"]["Streams"]["Current"] == 0)
    assert connections(server)["RPC"]["server-1"]["Streams"]["Peak"] == 6


# -- the `sim` command's banner ---------------------------------------------------------


@pytest.mark.parametrize(("entry", "server"), [("client", "false"), ("leader", "true")])
def test_sim_prints_every_setting_run_needs_ready_to_paste(entry: str, server: str) -> None:
    port = free_port()
    sim = ChildProcess(
        python_module("controller", "sim", "--port", str(port), "--nodes", "2", "--entry", entry)
    )
    try:
        wrapper = sim.wait_for(r"^export NRC_EXEC_UNPRIVILEGED_WRAPPER=(.+)$").group(1)
        nomad_addr = sim.wait_for(r"^export NOMAD_ADDR=(\S+)$").group(1)
        assert nomad_addr == f"http://127.0.0.1:{port}"
        me = requests.get(f"{nomad_addr}/v1/agent/self", timeout=5).json()
        assert me["stats"]["nomad"]["server"] == server
        # Pasted into a shell, the wrapper runs a command as the stand-in does.
        (value,) = shlex.split(wrapper)
        *setuser, user = shlex.split(value)
        assert user == "user" and setuser[0].endswith("/bin/setuser")
        ran = subprocess.run(
            [*setuser, user, "echo", "as-user"], capture_output=True, text=True, timeout=10
        )
        assert ran.stdout == "as-user\n", ran.stderr
        # Every agent is listed with its role and address.
        banner = sim.output()
        for role in ("leader", "follower", "client"):
            assert f" {role} " in banner
        assert banner.count("http://127.0.0.1:") == 2 + 3 + 1  # agents, servers, NOMAD_ADDR
        assert sim.stop(signal.SIGTERM, timeout=15) == 0
    finally:
        sim.kill()
    assert "Traceback" not in sim.output()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rpc-max-conns-per-client", "25"], "must be 0 or more than 25"),
        (["--http-max-conns-per-client", "-1"], "must not be negative"),
        (["--entry", "nowhere"], "invalid choice"),
        (["--servers", "0"], "must be at least 1"),
        (["--servers", "1", "--entry", "follower"], "needs at least two servers"),
    ],
)
def test_bad_topology_arguments_exit_2_with_a_message(args: list[str], needle: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controller", "sim", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stdout
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_dev_takes_the_same_topology_flags() -> None:
    from controller.cli import _topology, build_parser

    args = build_parser().parse_args(
        ["dev", "--servers", "2", "--entry", "follower", "--http-max-conns-per-client", "0"]
    )
    assert _topology(args) == {
        "servers": 2,
        "entry": "follower",
        "http_max_conns_per_client": 0,
        "rpc_max_conns_per_client": 100,
    }
    assert _topology(build_parser().parse_args(["dev"])) == PRODUCTION
