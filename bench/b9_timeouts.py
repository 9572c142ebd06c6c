"""9. Timeouts that leave nothing behind (issue 20, the kill without
CAP_SYS_PTRACE).

The simulator (as root: an exec has Docker's capabilities, `setuser` is a
real unprivileged uid per allocation) and the controller run in processes
of their own; the clients are threads of this process. Each run is an
unprivileged execution with `timeLimit` 1 s whose command leaves a
background child, a child in a session of its own that cleared the
execution's marker (`(unset NRC_EXECUTION_ID; setsid sleep 999) &`) and a
foreground child that ignores SIGQUIT. A run counts as clean when, 3 s after
its `timeout` frame (which arrives at the limit), no process of it is left:
none carrying the simulator's allocation marker, none of the allocation's
unprivileged uid. The runner must still be the client's after every run.

200 runs, `CONCURRENCY` at once, each client on its own claimed runner (runs
on one runner follow each other). Without root the simulator cannot change
users and the figure is not produced.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from websockets.sync.client import connect

from bench.common import Http, Result, idle_runners, start_ctlproc, start_sim, wait_for
from tests.support.processes import child_processes

ENV_ID = 1
RUNS = 200
CONCURRENCY = 10
LIMIT_S = 1
LEFT_S = 3.0
COMMAND = (
    "sleep 1000 & (unset NRC_EXECUTION_ID; setsid sleep 999) & "
    "(trap '' QUIT; while :; do sleep 0.1; done)"
)


def _one(api: Http, sim: Http, runner: str, alloc_id: str) -> dict[str, Any]:
    body = {"command": COMMAND, "timeLimit": LIMIT_S}
    url = api.json("POST", f"/api/v1/runners/{runner}/execute", body)["websocketUrl"]
    last: dict[str, Any] = {}
    with connect(url, compression=None) as ws:
        for raw in ws:
            last = json.loads(raw)
    ended = time.monotonic()
    left: list[int] = []
    while True:
        left = sim.json("GET", f"/_bench/processes?alloc={alloc_id}")["pids"]
        waited = time.monotonic() - ended
        if not left or waited > LEFT_S:
            break
        time.sleep(0.05)
    status = api.status("GET", f"/api/v1/runners/{runner}")
    return {
        "timeout": last == {"type": "timeout"},
        "clean": not left,
        "cleared_s": waited,
        "left": left,
        "runner_kept": status == 200,
    }


def run(quick: bool = False) -> Result:
    result = Result("timeouts", "Timeouts of unprivileged executions leave no process")
    if os.geteuid() != 0:
        result.details = {"skipped": "needs root: the simulator models users only as root"}
        return result
    runs = 40 if quick else RUNS
    outcomes: list[dict[str, Any]] = []
    lock = threading.Lock()
    with child_processes() as procs:
        _, sim = start_sim(procs, nodes=3, startup_delay_s=0.05, stop_delay_s=0.05)
        sim.json(
            "POST", "/_bench/seed", {"env_id": ENV_ID, "runners": CONCURRENCY, "pool": CONCURRENCY}
        )
        wait_for(lambda: sim.json("GET", "/_bench/status")["running"] >= CONCURRENCY, 120)
        setuser = sim.json("GET", "/_bench/status")["setuser"]
        _, api = start_ctlproc(
            procs, sim.address, {"NRC_EXEC_UNPRIVILEGED_WRAPPER": f"{setuser} user"}
        )
        wait_for(lambda: idle_runners(api, ENV_ID) >= CONCURRENCY, 120, what="pool adopted")
        runners = []
        for _ in range(CONCURRENCY):
            claim = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": 0}
            runners.append(str(api.json("POST", "/api/v1/runners", claim)["runnerId"]))
        allocs = {}
        for runner in runners:
            found = sim.json("GET", f"/v1/job/{runner}/allocations")
            allocs[runner] = next(a["ID"] for a in found if a["ClientStatus"] == "running")
        left = [runs]

        def client(runner: str) -> None:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                outcome = _one(api, sim, runner, allocs[runner])
                with lock:
                    outcomes.append(outcome)

        started = time.perf_counter()
        threads = [threading.Thread(target=client, args=(r,)) for r in runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
    clean = sum(1 for o in outcomes if o["clean"] and o["timeout"] and o["runner_kept"])
    cleared = sorted(o["cleared_s"] for o in outcomes if o["clean"])
    result.add(
        "runs with no process left 3 s after the limit",
        clean,
        "runs",
        f"== {runs}",
        note=f"of {len(outcomes)}; timeout frame, runner still claimed, nothing left",
    )
    result.add(
        "slowest clean-up after the timeout frame",
        cleared[-1] if cleared else None,
        "s",
        f"<= {LEFT_S}",
    )
    result.details = {
        "runs": len(outcomes),
        "concurrency": CONCURRENCY,
        "limit_s": LIMIT_S,
        "command": COMMAND,
        "clean": clean,
        "not_clean": [o for o in outcomes if not (o["clean"] and o["timeout"])][:10],
        "runner_lost": sum(1 for o in outcomes if not o["runner_kept"]),
        "cleared_s_p50": cleared[len(cleared) // 2] if cleared else None,
        "cleared_s_max": cleared[-1] if cleared else None,
        "elapsed_s": elapsed,
    }
    return result
