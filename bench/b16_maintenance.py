"""16. A maintenance night (issue 46): Nomad's restarts under a student load.

The simulator runs as a production cluster of 10 nodes (three servers, a
client agent per node) with short, production-shaped timings (`--maintenance`
in bench.simproc); the controller runs in its own process. Student sessions
run at a steady rate from client threads of this process, each as CodeOcean
runs one: claim a runner, copy a file, run a program with output (stdout and
stderr, 2 s long, exiting 7), list the files, download the file, release.

The night has four phases, each a series of restarts through the
simulator's `/_sim/` routes while the load goes on:

- **servers**: each server restarted in turn, the leader last (one election);
- **agents**: each node's client agent restarted in turn;
- **docker**: Docker restarted on one node;
- **host**: one host rebooted, down past the heartbeat TTL.

After each phase the load pauses: once the sessions in flight have ended, the
benchmark waits until every pool is full again (the seconds it took are a
figure) and counts the executions' processes still alive a bound after the
last execution ended (the simulator's marker scan, `/_bench/processes`).

Per phase: sessions started and failed, by cause (the first step that failed
and how); executions that did not end with their program's exit, by how they
ended; processes left behind; runners lost (`nrc_runner_losses_total`) and
runners created beyond the releases' replacements (a restart that made the
controller recreate a runner shows here); claims failed; seconds until every
pool is full again. Targets: 0 failed sessions in the server phase; in the
other phases only sessions whose execution ran on the restarted node at that
moment fail, each told with an `error` frame; 0 processes left; 0 runners
recreated.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from bench.common import (
    Http,
    Result,
    environment_body,
    idle_runners,
    metric_sum,
    start_ctlproc,
    start_sim,
    wait_for,
)
from tests.support.processes import child_processes

ENV_ID = 1
NODES = 10
POOL = 20
CLIENTS = 6
# Each client starts a session every this many seconds (open loop: a session
# that runs late starts the next at once).
SESSION_PERIOD_S = 3.0
EXIT_CODE = 7
# How long an ended execution's processes may live on (the controller's kill
# of a cut execution retries until the runner answers again).
PROCESS_BOUND_S = 10.0
POOL_FULL_TIMEOUT_S = 180.0


@dataclass
class Session:
    phase: str
    started: float = 0.0
    ended: float = 0.0
    node: str = ""
    failed: str = ""  # the cause, empty when the session passed
    execution: str = ""  # how its execution ended: exit N, timeout, error: ..., hung


@dataclass
class Load:
    """Student sessions from client threads, each tagged with the phase it
    started in."""

    api: Http
    cluster: Cluster
    phase: str = ""
    sessions: list[Session] = field(default_factory=list)
    claims_failed: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    in_flight: int = 0

    def client(self) -> None:
        api = Http(self.api.address, timeout=60)
        next_due = time.perf_counter()
        while not self.stop.is_set():
            if not self.running.wait(0.1):
                next_due = time.perf_counter()
                continue
            wait = next_due - time.perf_counter()
            if wait > 0 and self.stop.wait(wait):
                return
            next_due += SESSION_PERIOD_S
            with self.lock:
                self.in_flight += 1
                session = Session(self.phase, started=time.perf_counter())
                self.sessions.append(session)
            try:
                self.session(api, session)
            except Exception as exc:  # a figure of what the student saw, whatever it is
                session.failed = session.failed or f"exception {type(exc).__name__}"
            finally:
                session.ended = time.perf_counter()
                with self.lock:
                    self.in_flight -= 1

    def session(self, api: Http, s: Session) -> None:
        body = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": 60}
        status, data = api.request("POST", "/api/v1/runners", body)
        if status != 200:
            s.failed = f"claim {_answer(status, data)}"
            with self.lock:
                self.claims_failed[_answer(status, data)] += 1
            return
        runner = str(json.loads(data)["runnerId"])
        s.node = _node_of(self.cluster, runner)
        token = uuid.uuid4().hex[:12]
        try:
            self._use(api, s, runner, token)
        finally:
            status, data = api.request("DELETE", f"/api/v1/runners/{runner}")
            if status not in (204, 410) and not s.failed:
                s.failed = f"release {_answer(status, data)}"

    def _use(self, api: Http, s: Session, runner: str, token: str) -> None:
        files = f"/api/v1/runners/{runner}/files"
        content = f"print('{token}')\n".encode()
        copy = {"copy": [{"path": "main.py", "content": _b64(content)}], "delete": []}
        status, data = api.request("PATCH", files, copy)
        if status != 204:
            s.failed = f"copy {_answer(status, data)}"
            return
        command = f"echo out-{token}; echo err-{token} >&2; sleep 2; cat main.py; exit {EXIT_CODE}"
        status, data = api.request(
            "POST", f"/api/v1/runners/{runner}/execute", {"command": command, "timeLimit": 30}
        )
        if status != 200:
            s.failed = f"execute {_answer(status, data)}"
            return
        s.execution = _run(json.loads(data)["websocketUrl"], token)
        if s.execution != f"exit {EXIT_CODE}":
            s.failed = f"execution {s.execution}"
            return
        status, data = api.request("GET", f"{files}?path=./")
        if status != 200 or b"main.py" not in data:
            s.failed = f"list {_answer(status, data)}"
            return
        status, data = api.request("GET", f"{files}/raw?path=main.py")
        if status != 200 or data != content:
            s.failed = f"download {_answer(status, data)}"


def _b64(content: bytes) -> str:
    return base64.b64encode(content).decode()


def _answer(status: int, data: bytes) -> str:
    """A failed answer as a cause: its status and error code."""
    try:
        code = json.loads(data).get("errorCode", "")
    except (ValueError, AttributeError):
        code = ""
    return f"{status} {code}".strip()


def _run(url: str, token: str) -> str:
    """How the execution ended, as its client saw it; `exit N` only when the
    program's own output arrived before its exit frame."""
    stdout = stderr = ""
    terminal: list[dict[str, Any]] = []
    try:
        with connect(url, compression=None, open_timeout=30) as ws:
            deadline = time.monotonic() + 60
            while True:
                try:
                    raw = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    return "hung"
                except ConnectionClosed:
                    break
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "stdout":
                    stdout += str(frame.get("data", ""))
                elif kind == "stderr":
                    stderr += str(frame.get("data", ""))
                elif kind in ("exit", "timeout", "error"):
                    terminal.append(frame)
    except Exception as exc:  # what the client saw
        return f"connect {type(exc).__name__}"
    if len(terminal) != 1:
        return f"{len(terminal)} terminal frames"
    frame = terminal[0]
    if frame["type"] == "exit":
        whole = f"out-{token}" in stdout and f"err-{token}" in stderr and token in stdout
        return f"exit {frame['data']}" if whole else f"exit {frame['data']} without output"
    if frame["type"] == "error":
        return f"error: {str(frame.get('data', ''))[:80]}"
    return str(frame["type"])


class Cluster:
    """The simulated cluster's agents, each reachable at its own address: a
    call goes through one that is not being restarted (a request to an agent
    whose listener a restart resets loses its answer)."""

    def __init__(self, entry: Http) -> None:
        listeners = entry.json("GET", "/_sim/connections")["HTTP"]
        self.agents = {name: Http(v["Address"], timeout=30) for name, v in listeners.items()}
        self.down: set[str] = set()

    def via(self, avoid: str = "", server: bool = False) -> Http:
        """An agent that is up and not `avoid` (a server with `server`)."""
        for name, http in self.agents.items():
            if name in self.down or name == avoid:
                continue
            if server == name.startswith("server-"):
                return http
        raise RuntimeError("no agent is up")

    def call(self, path: str, avoid: str) -> Any:
        """A `/_sim` call, through an agent other than the one it restarts
        (which counts as down until `back`)."""
        self.down.add(avoid)
        return self.via(avoid).json("POST", path)

    def back(self, name: str) -> None:
        self.down.discard(name)


def _node_of(cluster: Cluster, runner: str) -> str:
    """The node the runner's allocation runs on (the runner id is its job's)."""
    for name in ("agent-2", "agent-3"):
        try:
            allocs = cluster.agents[name].json("GET", f"/v1/job/{runner}/allocations?stale")
        except (RuntimeError, OSError):
            continue
        running = [a for a in allocs if a["ClientStatus"] == "running"]
        return str(running[0]["NodeName"]) if running else ""
    return ""


def _explained(s: Session, restarts: list[tuple[str, float, float]]) -> bool:
    """Whether the session's runner was on a node restarted while it ran."""
    return any(
        node == s.node and start <= s.ended and s.started <= end for node, start, end in restarts
    )


def _metrics(api: Http) -> str:
    return api.request("GET", "/metrics")[1].decode()


def _counts(api: Http) -> dict[str, float]:
    text = _metrics(api)
    return {
        "lost": metric_sum(text, "nrc_runner_losses_total"),
        "created": metric_sum(text, "nrc_jobs_created_total"),
    }


def _node_names(cluster: Cluster) -> dict[str, str]:
    """Node ID by name (the agent's name is the node's)."""
    return {n["Name"]: n["ID"] for n in cluster.via().json("GET", "/v1/nodes?stale")}


def _servers(cluster: Cluster) -> dict[str, Any]:
    answer: dict[str, Any] = cluster.via().json("GET", "/_sim/servers")
    return answer


def _settle(cluster: Cluster, restarted: str) -> None:
    """Wait until what was restarted is back, the cluster has a leader and
    every node is ready again."""
    wait_for(lambda: _servers(cluster)["Leader"] is not None, 60, what="a leader")
    if restarted in cluster.agents:
        wait_for(
            lambda: cluster.agents[restarted].status("GET", "/v1/agent/self") == 200,
            120,
            what=f"{restarted} back",
        )
    cluster.back(restarted)
    wait_for(
        lambda: all(n["Status"] == "ready" for n in cluster.via().json("GET", "/v1/nodes")),
        120,
        what="every node ready",
    )


def _phase_actions(cluster: Cluster, phase: str) -> list[tuple[str, str]]:
    """The `/_sim/` calls of a phase, in order: (path, what restarted)."""
    nodes = _node_names(cluster)
    names = sorted(nodes, key=lambda n: int(n.rsplit("-", 1)[-1]))
    if phase == "servers":
        servers = _servers(cluster)
        leader = servers["Leader"]
        order = [s for s in sorted(servers["Servers"]) if s != leader] + [leader]
        return [(f"/_sim/server/{s}/restart?down=3", s) for s in order]
    if phase == "agents":
        return [(f"/_sim/node/{nodes[n]}/agent-restart?down=3", n) for n in names]
    if phase == "docker":
        return [(f"/_sim/node/{nodes[names[1]]}/docker-restart", names[1])]
    return [(f"/_sim/node/{nodes[names[2]]}/reboot?down=20", names[2])]


def _phase(cluster: Cluster, api: Http, load: Load, phase: str) -> dict[str, Any]:
    before = _counts(api)
    with load.lock:
        load.phase = phase
        first = len(load.sessions)
    load.running.set()
    time.sleep(SESSION_PERIOD_S)  # the load in its stride before the first restart
    restarted = []
    windows: list[tuple[str, float, float]] = []
    for path, what in _phase_actions(cluster, phase):
        began = time.perf_counter()
        cluster.call(path, avoid=what)
        restarted.append(what)
        _settle(cluster, what)
        windows.append((what, began, time.perf_counter()))
        time.sleep(SESSION_PERIOD_S)  # the load runs on between restarts (a pacing)
    last_action = time.perf_counter()
    load.running.clear()
    wait_for(lambda: load.in_flight == 0, 120, what="sessions in flight ended")
    wait_for(lambda: idle_runners(api, ENV_ID) >= POOL, POOL_FULL_TIMEOUT_S, what="pool full")
    full_after = time.perf_counter() - last_action
    time.sleep(PROCESS_BOUND_S)  # the bound the processes are allowed
    left = len(cluster.via().json("GET", "/_bench/processes")["pids"])
    after = _counts(api)
    with load.lock:
        sessions = load.sessions[first:]
    failed = Counter(s.failed for s in sessions if s.failed)
    elsewhere = [s for s in sessions if s.failed and not _explained(s, windows)]
    ended = Counter(s.execution for s in sessions if s.execution != f"exit {EXIT_CODE}")
    claims_failed = Counter(s.failed for s in sessions if s.failed.startswith("claim"))
    released = sum(1 for s in sessions if not s.failed.startswith("claim"))
    return {
        "restarted": restarted,
        "sessions": len(sessions),
        "failed": sum(failed.values()),
        "failed_by_cause": dict(failed),
        "failed_not_on_restarted_node": len(elsewhere),
        "failed_not_on_restarted_node_causes": dict(Counter(s.failed for s in elsewhere)),
        "executions_not_exiting": dict(ended),
        "processes_left": left,
        "runners_lost": after["lost"] - before["lost"],
        "runners_recreated": max(0.0, after["created"] - before["created"] - released),
        "claims_failed": sum(claims_failed.values()),
        "pool_full_after_s": round(full_after, 2),
    }


def run(quick: bool = False) -> Result:
    result = Result("maintenance", "A maintenance night: Nomad's restarts under a student load")
    phases = ["servers", "agents", "docker", "host"]
    result.details = {"nodes": NODES, "pool": POOL, "clients": CLIENTS, "phases": {}}
    with child_processes() as procs:
        _, sim = start_sim(
            procs,
            nodes=NODES,
            startup_delay_s=0.05,
            stop_delay_s=0.05,
            topology="production",
            maintenance=True,
        )
        setuser = sim.json("GET", "/_bench/status")["setuser"]
        _, api = start_ctlproc(
            procs, sim.address, {"NRC_EXEC_UNPRIVILEGED_WRAPPER": f"{setuser} user"}
        )
        api.json("PUT", f"/api/v1/execution-environments/{ENV_ID}", environment_body(ENV_ID, POOL))
        wait_for(lambda: idle_runners(api, ENV_ID) >= POOL, 180, what="pool full")
        cluster = Cluster(sim)
        load = Load(api, cluster)
        threads = [threading.Thread(target=load.client, daemon=True) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        try:
            for phase in phases[:2] if quick else phases:
                result.details["phases"][phase] = _phase(cluster, api, load, phase)
        finally:
            load.stop.set()
            for t in threads:
                t.join(timeout=90)
    for phase, figures in result.details["phases"].items():
        target = "== 0" if phase == "servers" else ""
        result.add(f"{phase}: student sessions failed", figures["failed"], "sessions", target)
        result.add(
            f"{phase}: sessions failed off the restarted node or moment",
            figures["failed_not_on_restarted_node"],
            "sessions",
            "== 0",
        )
        result.add(f"{phase}: processes left", figures["processes_left"], "procs", "== 0")
        result.add(f"{phase}: runners recreated", figures["runners_recreated"], "runners", "== 0")
        result.add(f"{phase}: seconds until the pool is full", figures["pool_full_after_s"], "s")
    return result
