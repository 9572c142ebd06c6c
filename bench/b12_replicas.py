"""12. Every replica serves: a rolling restart and a crash under load (issue 23).

Two controller replicas (`run`, leader election on) behind a plain
round-robin TCP balancer of our own (`tests.support.balancer`: health checks
on `/readyz`, a refused connection redispatched), the simulator in its own
process. The load, from threads of this process, each request on a new
connection through the balancer (so successive requests reach both
replicas):

- claims at `Shape.claim_rate` per second, open loop (latency counted from when
  each was due), each released at once;
- `Shape.executions` executions running at any time, each on a runner of its own,
  `TICKS` seconds long, its output checked (`tick 1` … `tick N`, then exit 0).

Rolling restart: each replica in turn is taken out of the balancer (Nomad's
`shutdown_delay`), SIGTERMed, and replaced by a new process that joins once
ready. Crash: the leader is SIGKILLed; a claim that fails is retried once, as
a client retries. Reported: failed claims (after the one retry), the longest
gap between successful claims, double claims, executions that did not end in
their own exit with their full output, and how long pool upkeep paused.
"""

from __future__ import annotations

import http.client
import itertools
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from websockets.sync.client import connect

from bench.common import Http, Result, idle_runners, replica_settings, start_sim, wait_for
from tests.support.balancer import Balancer
from tests.support.controller import start_controller_process
from tests.support.ports import free_port
from tests.support.processes import ChildProcess, child_processes

ENV_ID = 3
# Pool upkeep pauses for the lock's TTL plus Nomad's lock delay (10 s + 10 s
# here) after a leader dies: the pool holds that many seconds of claims.
TICKS = 5
COMMAND = f"for i in $(seq {TICKS}); do echo tick $i; sleep 1; done"
EXPECTED = "".join(f"tick {i}\r\n" for i in range(1, TICKS + 1))


@dataclass(frozen=True)
class Shape:
    """The load: claims per second, executions at once, the pool that holds
    the claims of an upkeep pause, and the calm before and after the act."""

    claim_rate: float = 10.0
    executions: int = 10
    pool: int = 400
    calm_s: float = 5.0


FULL = Shape()
QUICK = Shape(calm_s=2.0)


@dataclass
class Tally:
    """What the load saw, shared by its threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    claims_ok: list[float] = field(default_factory=list)  # completion times (monotonic)
    claim_latency_s: list[float] = field(default_factory=list)  # from when due
    claims_failed: list[str] = field(default_factory=list)  # status or error, after a retry
    claims_retried: int = 0
    runners: list[str] = field(default_factory=list)
    executions_ok: int = 0
    executions_bad: list[str] = field(default_factory=list)

    def note(self, attr: str, value: Any) -> None:
        with self.lock:
            getattr(self, attr).append(value)


def request(address: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request on a connection of its own (so the balancer picks again)."""
    parts = urlsplit(address)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def claim(address: str, tally: Tally) -> str | None:
    """A claim, retried once after a failure (as a client retries)."""
    body = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": 0}
    why = ""
    for attempt in range(2):
        try:
            status, answer = request(address, "POST", "/api/v1/runners", body)
        except OSError as exc:
            status, answer, why = 0, None, f"{type(exc).__name__}"
        if status == 200:
            runner = str(answer["runnerId"])
            tally.note("runners", runner)
            return runner
        why = why or f"{status} {answer}"
        if attempt == 0:
            with tally.lock:
                tally.claims_retried += 1
    tally.note("claims_failed", why)
    return None


def release(address: str, runner: str) -> None:
    for _ in range(2):
        try:
            if request(address, "DELETE", f"/api/v1/runners/{runner}")[0] in (204, 410):
                return
        except OSError:
            pass


def claims_loop(address: str, tally: Tally, stop: threading.Event, rate: float) -> None:
    """Claims at `rate` per second, open loop: each is due at its time, whatever the
    others do; each is released at once."""
    start = time.monotonic()

    def one(due: float) -> None:
        runner = claim(address, tally)
        if runner is None:
            return
        done = time.monotonic()
        tally.note("claims_ok", done)
        tally.note("claim_latency_s", done - due)
        release(address, runner)

    with ThreadPoolExecutor(max_workers=32) as pool:
        n = 0
        while not stop.is_set():
            due = start + n / rate
            delay = due - time.monotonic()
            if delay > 0:
                stop.wait(delay)
                continue
            pool.submit(one, due)
            n += 1


def execution_loop(address: str, tally: Tally, stop: threading.Event) -> None:
    """Executions one after another, each on a runner of its own."""
    while not stop.is_set():
        runner = claim(address, tally)
        if runner is None:
            stop.wait(0.2)
            continue
        try:
            outcome = run_execution(address, runner)
            if outcome == "ok":
                with tally.lock:
                    tally.executions_ok += 1
            else:
                tally.note("executions_bad", outcome)
        finally:
            release(address, runner)


def run_execution(address: str, runner: str) -> str:
    """ "ok", or what went wrong."""
    body = {"command": COMMAND, "privilegedExecution": True}
    try:
        status, answer = request(address, "POST", f"/api/v1/runners/{runner}/execute", body)
    except OSError as exc:
        return f"execute: {type(exc).__name__}"
    if status != 200:
        return f"execute: {status} {answer}"
    frames: list[dict[str, Any]] = []
    try:
        with connect(answer["websocketUrl"], open_timeout=10, compression=None) as ws:
            for raw in ws:
                frames.append(json.loads(raw))
    except Exception as exc:
        return f"websocket: {type(exc).__name__} {exc} after {frames[-1:]}"
    stdout = "".join(f["data"] for f in frames if f["type"] == "stdout")
    if frames[-1:] != [{"type": "exit", "data": 0}] or stdout != EXPECTED:
        return f"frames: {frames[-2:]} stdout {stdout!r}"
    return "ok"


@contextmanager
def load(address: str, shape: Shape) -> Iterator[Tally]:
    tally = Tally()
    stop = threading.Event()
    threads = [threading.Thread(target=claims_loop, args=(address, tally, stop, shape.claim_rate))]
    threads += [
        threading.Thread(target=execution_loop, args=(address, tally, stop))
        for _ in range(shape.executions)
    ]
    for t in threads:
        t.start()
    try:
        yield tally
    finally:
        stop.set()
        for t in threads:
            t.join(60)


def replica(procs: list[ChildProcess], nomad: str) -> ChildProcess:
    port = free_port()
    settings = {
        **replica_settings(port),
        "NRC_LEADER_TTL": "10s",
        "NRC_SHUTDOWN_GRACE": "20s",
        "NRC_LOG_LEVEL": "WARNING",
        "NRC_LOG_FORMAT": "text",
    }
    return start_controller_process(procs, nomad, settings, port=port, timeout=60)


def leader_of(replicas: list[ChildProcess]) -> ChildProcess | None:
    for r in replicas:
        try:
            status, answer = request(r.address, "GET", "/readyz")
        except OSError:
            continue
        if status == 200 and answer.get("role") == "leader":
            return r
    return None


def contains(balancer: Balancer, backend: str) -> bool:
    return backend in balancer.healthy()


def gaps(times: list[float]) -> float:
    ordered = sorted(times)
    return max((b - a for a, b in itertools.pairwise(ordered)), default=0.0)


def scenario(
    shape: Shape, act: Callable[[list[ChildProcess], Balancer, list[ChildProcess], str], float]
) -> dict[str, Any]:
    """The load around `act(replicas, balancer, procs, nomad)`, which returns
    how long pool upkeep paused (s)."""
    with child_processes(signal.SIGKILL) as procs:
        _, sim = start_sim(procs, nodes=25, startup_delay_s=0.2, stop_delay_s=0.1)
        replicas = [replica(procs, sim.address), replica(procs, sim.address)]
        with Balancer([r.address for r in replicas]) as balancer:
            api = Http(balancer.address)
            env = {
                "id": ENV_ID,
                "image": "python:3.12-slim",
                "prewarmingPoolSize": shape.pool,
                "cpuLimit": 100,
                "memoryLimit": 256,
                "networkAccess": False,
                "exposedPorts": [],
            }
            wait_for(
                lambda: (
                    api.status("PUT", f"/api/v1/execution-environments/{ENV_ID}", env) in (201, 204)
                ),
                timeout=30,
                what="environment written",
            )
            wait_for(
                lambda: idle_runners(api, ENV_ID) >= shape.pool, timeout=120, what="pool filled"
            )
            with load(balancer.address, shape) as tally:
                time.sleep(shape.calm_s)
                began = time.monotonic()
                paused_s = act(replicas, balancer, procs, sim.address)
                acted_s = time.monotonic() - began
                time.sleep(shape.calm_s)
            api.close()
    duplicates = len(tally.runners) - len(set(tally.runners))
    latencies = sorted(tally.claim_latency_s)
    return {
        "claims_ok": len(tally.claims_ok),
        "claims_failed": len(tally.claims_failed),
        "claim_failures": tally.claims_failed[:10],
        "claims_retried": tally.claims_retried,
        "longest_gap_s": round(gaps(tally.claims_ok), 3),
        "claim_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 1)
        if latencies
        else None,
        "double_claims": duplicates,
        "executions_ok": tally.executions_ok,
        "executions_bad": len(tally.executions_bad),
        "execution_failures": tally.executions_bad[:10],
        "upkeep_paused_s": round(paused_s, 2),
        "act_s": round(acted_s, 2),
    }


def rolling_restart(
    replicas: list[ChildProcess], balancer: Balancer, procs: list[ChildProcess], nomad: str
) -> float:
    """Each replica in turn out of the balancer, SIGTERMed, replaced."""
    paused = 0.0
    for old in list(replicas):
        balancer.remove(old.address)
        time.sleep(0.5)  # the job's shutdown_delay: the balancer has stopped routing to it
        was_leader = leader_of([old]) is not None
        stopped = time.monotonic()
        code = old.stop(signal.SIGTERM, timeout=40)
        if code != 0:
            raise RuntimeError(f"{old} exited {code}:\n{old.tail()}")
        replicas.remove(old)
        if was_leader:
            wait_for(lambda: leader_of(replicas), timeout=40, what="a new leader")
            paused = max(paused, time.monotonic() - stopped)
        new = replica(procs, nomad)
        replicas.append(new)
        balancer.add(new.address)
        wait_for(partial(contains, balancer, new.address), timeout=10, what="new replica")
    return paused


def crash(
    replicas: list[ChildProcess], balancer: Balancer, procs: list[ChildProcess], nomad: str
) -> float:
    """SIGKILL the leader; the survivor takes the lock after its TTL and delay."""
    leader = wait_for(lambda: leader_of(replicas), timeout=30, what="a leader")
    assert leader is not None
    killed = time.monotonic()
    leader.kill()
    replicas.remove(leader)
    wait_for(lambda: leader_of(replicas), timeout=60, what="a new leader")
    return time.monotonic() - killed


def run(quick: bool) -> Result:
    result = Result("replicas", "Every replica serves: a rolling restart and a leader crash")
    for name, act in (("restart", rolling_restart), ("crash", crash)):
        facts = scenario(QUICK if quick else FULL, act)
        result.details[name] = facts
        result.add(f"{name}: failed claims", facts["claims_failed"], "", "== 0")
        result.add(f"{name}: double claims", facts["double_claims"], "", "== 0")
        result.add(f"{name}: longest gap between claims", facts["longest_gap_s"], "s")
        result.add(f"{name}: claim p99 (from due)", facts["claim_p99_ms"], "ms")
        result.add(
            f"{name}: executions not ended by their exit",
            facts["executions_bad"],
            "",
            "== 0" if name == "restart" else "",
        )
        result.add(f"{name}: pool upkeep paused", facts["upkeep_paused_s"], "s")
    result.details["load"] = {
        "claims_per_s": FULL.claim_rate,
        "executions_at_once": FULL.executions,
        "execution_s": TICKS,
        "pool": FULL.pool,
    }
    return result
