"""3. Event-to-ready: from an allocation becoming `running` in the simulator to
that runner being claimable.

The controller runs as the service with `BENCH_TRACK_READY=1`: after every
refresh it notes, for each runner that became ready, the wall-clock time and
the allocation's `StartedAt` (the simulator's clock, the same machine's). An
environment's pool is created through the API and filled at a limited write
rate, so that runners start one by one rather than all at once:

- events on (the default): pool 200 at the default 50 writes/s;
- events off (`NRC_EVENT_STREAM=false`, resync only, the default 30 s): pool
  60 at 2 writes/s, so that starts spread over one resync interval and the
  figure is the baseline a resync-only controller gives (about half the
  interval on average, the whole interval at worst).
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import (
    Result,
    environment_body,
    idle_runners,
    start_ctlproc,
    start_sim,
    summary_ms,
    wait_for,
)
from tests.support.processes import child_processes

ENV_ID = 3


def measure(events: bool, pool: int, write_rate: float, timeout: float) -> dict[str, Any]:
    env = {
        "BENCH_TRACK_READY": "1",
        "NRC_NOMAD_WRITE_RATE": str(write_rate),
        "NRC_EVENT_STREAM": "true" if events else "false",
    }
    with child_processes() as procs:
        _, sim = start_sim(procs, startup_delay_s=0.5)
        _, api = start_ctlproc(procs, sim.address, env)
        api.json("GET", "/_bench/probe?reset=1")
        started = time.perf_counter()
        status, _ = api.request(
            "PUT", f"/api/v1/execution-environments/{ENV_ID}", environment_body(ENV_ID, pool)
        )
        if status not in (201, 204):
            raise RuntimeError(f"creating the environment: {status}")
        wait_for(
            lambda: idle_runners(api, ENV_ID) >= pool,
            timeout=timeout,
            interval=0.2,
            what=f"{pool} runners ready",
        )
        elapsed = time.perf_counter() - started
        ready: dict[str, tuple[int, int | None]] = api.json("GET", "/_bench/probe")["ready"]
    latencies = [
        (seen - started_at) / 1e9 for seen, started_at in ready.values() if started_at is not None
    ]
    return {
        "events": events,
        "pool": pool,
        "write_rate": write_rate,
        "runners_measured": len(latencies),
        "fill_s": elapsed,
        "latency": summary_ms(latencies),
    }


def run(quick: bool = False) -> Result:
    result = Result("event_to_ready", "Event-to-ready: allocation running → runner claimable")
    on = measure(True, 60 if quick else 200, 50, 120)
    off = measure(False, 20 if quick else 60, 2, 120)
    result.details["runs"] = [on, off]
    result.add("event-to-ready p50, events on", on["latency"]["p50_ms"], "ms")
    result.add("event-to-ready p99, events on", on["latency"]["p99_ms"], "ms", "<= 50")
    result.add("event-to-ready max, events on", on["latency"]["max_ms"], "ms")
    result.add("event-to-ready p50, resync only (30 s)", off["latency"]["p50_ms"], "ms")
    result.add("event-to-ready p99, resync only (30 s)", off["latency"]["p99_ms"], "ms")
    return result
