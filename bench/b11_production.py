"""11. The controller on a production cluster (issue 20, the figures).

The simulator runs as a production cluster (three servers, a client agent per
node serving on the node's `HTTPAddr`, the controller's `NOMAD_ADDR` one of
those agents, Nomad's default limits: 100 HTTP connections per client IP on
every agent, 100 RPC connections per agent IP on every server, streams for
execs on other nodes among them). The controller and the simulator run in
processes of their own; the clients are threads of this process.

- **200 executions at once.** 200 claimed runners spread over the nodes, one
  `sleep 5; echo done` on each, all started together. Each must end with
  `done` and `exit 0`: no 429 and no refused stream may reach a client.
  Reported: how many did, and the peak connections the simulator counted
  per agent listener (HTTP, from the controller's IP) and per server (RPC).
- **Claims under a second writer.** Claims at 100/s offered (open loop, each
  counted from its due time) while a second writer re-registers 10 % of the
  idle runners in one burst a third into the run (their JobModifyIndex moves
  under the controller, as an operator's `nomad job run` or another
  controller would).
  Every claim must answer 200 or 500 `NOMAD_OVERLOAD`; conflicts (a lost
  EnforceIndex race, retried on the next runner) are counted from the
  controller's `nrc_claims_total{result="conflict"}`.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from bench.common import (
    Http,
    Result,
    idle_runners,
    metric_sum,
    start_ctlproc,
    start_sim,
    summary_ms,
    wait_for,
)
from tests.support.processes import child_processes

ENV_ID = 1
NODES = 10
EXECUTIONS = 200
EXEC_COMMAND = "sleep 5; echo done"
# A client gives up on an execution that sent no terminal frame by then.
EXEC_DEADLINE_S = 60.0
CLAIM_RATE = 100.0
CLAIM_SECONDS = 10.0
CLAIM_CLIENTS = 50
CLAIM_POOL = 1500
TOUCH_SHARE = 0.10


def _claim(api: Http) -> str:
    body = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": 0}
    return str(api.json("POST", "/api/v1/runners", body)["runnerId"])


def _execute(api: Http, runner: str, start: threading.Barrier) -> dict[str, Any]:
    """One execution; what the client saw."""
    start.wait()
    status, body = api.request(
        "POST", f"/api/v1/runners/{runner}/execute", {"command": EXEC_COMMAND}
    )
    if status != 200:
        return {"ok": False, "post": status, "body": body[:200].decode(errors="replace")}
    url = json.loads(body)["websocketUrl"]
    stdout = ""
    frames: list[dict[str, Any]] = []
    try:
        with connect(url, compression=None, open_timeout=60) as ws:
            deadline = time.monotonic() + EXEC_DEADLINE_S
            while True:
                try:
                    raw = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    return {"ok": False, "hung": True, "frames": frames[-3:]}
                except ConnectionClosed:
                    break
                frame = json.loads(raw)
                if frame["type"] == "stdout":
                    stdout += frame["data"]
                else:
                    frames.append(frame)
    except Exception as exc:  # the figure counts what a client sees, whatever it is
        return {"ok": False, "exception": repr(exc)[:200], "frames": frames[-3:]}
    last = frames[-1] if frames else None
    ok = last == {"type": "exit", "data": 0} and "done" in stdout
    return {"ok": ok, "last": last, "stdout": stdout[-40:]}


def _peaks(connections: dict[str, Any]) -> dict[str, Any]:
    """Peak connections per agent listener and per server, as the simulator
    counted them."""
    http = {
        name: {k: v for k, v in gauge.items() if k in ("Peak", "Refused", "Role")}
        for name, gauge in connections["HTTP"].items()
    }
    return {"limits": connections["Limits"], "http": http, "rpc": connections["RPC"]}


def _max_peak(section: Any) -> int:
    """The highest `Peak` anywhere in a (nested) section of the answer."""
    if isinstance(section, dict):
        own = int(section.get("Peak", 0) or 0)
        return max([own, *(_max_peak(v) for v in section.values())])
    if isinstance(section, list):
        return max([0, *(_max_peak(v) for v in section)])
    return 0


def _refused(section: Any) -> int:
    if isinstance(section, dict):
        own = int(section.get("Refused", 0) or 0)
        return own + sum(_refused(v) for v in section.values())
    if isinstance(section, list):
        return sum(_refused(v) for v in section)
    return 0


def executions_at_once(result: Result, quick: bool) -> None:
    count = 50 if quick else EXECUTIONS
    with child_processes() as procs:
        _, sim = start_sim(
            procs, nodes=NODES, startup_delay_s=0.05, stop_delay_s=0.05, topology="production"
        )
        sim.json("POST", "/_bench/seed", {"env_id": ENV_ID, "runners": count, "pool": count})
        wait_for(lambda: sim.json("GET", "/_bench/status")["running"] >= count, 180)
        setuser = sim.json("GET", "/_bench/status")["setuser"]
        _, api = start_ctlproc(
            procs, sim.address, {"NRC_EXEC_UNPRIVILEGED_WRAPPER": f"{setuser} user"}
        )
        wait_for(lambda: idle_runners(api, ENV_ID) >= count, 180, what="pool adopted")
        runners = [_claim(api) for _ in range(count)]
        start = threading.Barrier(count)
        outcomes: list[dict[str, Any]] = []
        lock = threading.Lock()

        def client(runner: str) -> None:
            outcome = _execute(api, runner, start)
            with lock:
                outcomes.append(outcome)

        began = time.perf_counter()
        threads = [threading.Thread(target=client, args=(r,)) for r in runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - began
        connections = sim.json("GET", "/_sim/connections")
    ok = sum(1 for o in outcomes if o["ok"])
    peaks = _peaks(connections)
    result.add(
        f"{count} executions at once ending `done`, exit 0",
        ok,
        "runs",
        f"== {count}",
        note="through a client agent, Nomad's default connection limits",
    )
    result.add("peak HTTP connections on one agent", _max_peak(peaks["http"]), "conns", "<= 99")
    result.add("peak RPC connections on one server", _max_peak(peaks["rpc"]), "conns", "<= 99")
    result.details["executions"] = {
        "count": count,
        "ok": ok,
        "elapsed_s": elapsed,
        "refused_by_nomad": _refused(peaks["http"]) + _refused(peaks["rpc"]),
        "hung": sum(1 for o in outcomes if o.get("hung")),
        "failures": [o for o in outcomes if not o["ok"]][:10],
        "connections": peaks,
    }


def claims_under_a_second_writer(result: Result, quick: bool) -> None:
    seconds = 4.0 if quick else CLAIM_SECONDS
    pool = 500 if quick else CLAIM_POOL
    with child_processes() as procs:
        _, sim = start_sim(
            procs, nodes=NODES, startup_delay_s=0.05, stop_delay_s=0.05, topology="production"
        )
        seeded = sim.json("POST", "/_bench/seed", {"env_id": ENV_ID, "runners": pool, "pool": pool})
        wait_for(lambda: sim.json("GET", "/_bench/status")["running"] >= pool, 300)
        _, api = start_ctlproc(procs, sim.address)
        wait_for(lambda: idle_runners(api, ENV_ID) >= pool, 300, what="pool adopted")
        conflicts_before = metric_sum(
            api.request("GET", "/metrics")[1].decode(), "nrc_claims_total", {"result": "conflict"}
        )
        claimed: set[str] = set()
        statuses: Counter[str] = Counter()
        latencies: list[float] = []
        lock = threading.Lock()
        stop = threading.Event()
        touched = [0]
        candidates = list(seeded["ids"])
        rng = random.Random(11)

        def writer() -> None:
            if stop.wait(seconds / 3):
                return
            with lock:
                idle = [j for j in candidates if j not in claimed]
            ids = rng.sample(idle, max(1, int(len(idle) * TOUCH_SHARE))) if idle else []
            touched[0] += int(sim.json("POST", "/_bench/touch", {"ids": ids})["touched"])

        period = CLAIM_CLIENTS / CLAIM_RATE
        per_client = int(seconds * CLAIM_RATE / CLAIM_CLIENTS)
        start_at = time.perf_counter() + 0.1

        def client(k: int) -> None:
            first = start_at + k * period / CLAIM_CLIENTS
            for i in range(per_client):
                due = first + i * period
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                body = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": 0}
                status, data = api.request("POST", "/api/v1/runners", body)
                took = time.perf_counter() - due
                key = str(status)
                if status == 500:
                    key = f"500 {json.loads(data).get('errorCode', '?')}"
                with lock:
                    statuses[key] += 1
                    if status == 200:
                        latencies.append(took)
                        claimed.add(str(json.loads(data)["runnerId"]))

        touch = threading.Thread(target=writer)
        touch.start()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLAIM_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        touch.join()
        conflicts = (
            metric_sum(
                api.request("GET", "/metrics")[1].decode(),
                "nrc_claims_total",
                {"result": "conflict"},
            )
            - conflicts_before
        )
    total = sum(statuses.values())
    allowed = statuses["200"] + statuses["500 NOMAD_OVERLOAD"]
    result.add(
        "claims answering 200 or 500 NOMAD_OVERLOAD under a second writer",
        allowed,
        "claims",
        f"== {total}",
        note=f"{CLAIM_RATE:.0f}/s offered; 10 % of idle runners re-registered at once",
    )
    result.add("claim conflicts retried on the next runner", conflicts, "conflicts")
    lat = summary_ms(latencies)
    result.add("claim p99 from its due time, under the second writer", lat["p99_ms"], "ms")
    result.details["claims"] = {
        "offered": total,
        "statuses": dict(statuses),
        "conflicts": conflicts,
        "runners_touched": touched[0],
        "latency_from_due_ms": summary_ms(latencies),
        "unique_runners": len(claimed),
    }


def run(quick: bool = False) -> Result:
    result = Result("production", "The controller on a production cluster (agents, limits)")
    result.details = {"nodes": NODES, "topology": "production"}
    executions_at_once(result, quick)
    claims_under_a_second_writer(result, quick)
    return result
