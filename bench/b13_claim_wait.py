"""13. Claims right after an environment is created (NRC_CLAIM_WAIT, issue 22).

The controller and the simulator in processes of their own (runners start
0.5 s after placement, as `start_sim` models it). An environment of pool 10
is created; at once 20 clients, threads of this process, each send one claim
on a connection of its own. Reported, with `NRC_CLAIM_WAIT` at 0 (Poseidon's
answer at once) and at its default of 2 s, side by side: how many claims
answered 200 during those first seconds, and how long they took (p50, max)
from the moment they were sent.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.common import Http, Result, environment_body, start_ctlproc, start_sim, summary_ms
from tests.support.processes import child_processes

ENV_ID = 13
POOL = 10
CLIENTS = 20


def first_claims(wait: str) -> dict[str, Any]:
    with child_processes() as procs:
        _, sim = start_sim(procs, nodes=5, startup_delay_s=0.5, stop_delay_s=0.1)
        _, api = start_ctlproc(procs, sim.address, {"NRC_CLAIM_WAIT": wait})
        body = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": 0}
        answers: list[tuple[int, float]] = []
        lock = threading.Lock()
        go = threading.Event()

        def client() -> None:
            http = Http(api.address)
            go.wait()
            began = time.monotonic()
            status = http.status("POST", "/api/v1/runners", body)
            with lock:
                answers.append((status, time.monotonic() - began))
            http.close()

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        api.json("PUT", f"/api/v1/execution-environments/{ENV_ID}", environment_body(ENV_ID, POOL))
        go.set()
        for t in threads:
            t.join(60)
        api.close()
    served = [s for status, s in answers if status == 200]
    return {
        "claims": len(answers),
        "answered_200": len(served),
        "answered_500": sum(1 for status, _ in answers if status == 500),
        "latency_ms": summary_ms([s for _, s in answers]),
        "served_latency_ms": summary_ms(served),
    }


def run(quick: bool) -> Result:
    result = Result("claim_wait", "Claims in the first seconds of a new environment")
    for wait in ("0", "2s"):
        facts = first_claims(wait)
        result.details[f"NRC_CLAIM_WAIT={wait}"] = facts
        result.add(
            f"wait {wait}: claims answered 200 (of {CLIENTS}, pool {POOL})",
            facts["answered_200"],
            "",
        )
        result.add(f"wait {wait}: claim p50", facts["latency_ms"]["p50_ms"], "ms")
        result.add(f"wait {wait}: claim max", facts["latency_ms"]["max_ms"], "ms")
    return result
