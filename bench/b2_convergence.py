"""2. Pool convergence: an environment with a pool of 1,000 created at once.

The simulator starts each task 0.5 s after placement. The controller runs as
the service with `NRC_NOMAD_WRITE_RATE=0` (unlimited; the default of 50/s
alone would take 20 s for 1,000 creations) and its default write concurrency
(8). The environment is created through the API; the benchmark polls the
statistics route and the simulator's counters every 50 ms until 1,000 runners
are idle and ready, then watches 3 s more for any extra creation.

Run twice: with every list read current, and with `stale_read_rate` 0.5 (half
of all list reads served by a follower up to 500 ms behind), where the
controller must not create a single job more than the pool needs.
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
)
from tests.support.processes import child_processes

ENV_ID = 7
POOL = 1000


def converge(stale_rate: float, pool: int) -> dict[str, Any]:
    with child_processes() as procs:
        sim_proc, sim = start_sim(procs, startup_delay_s=0.5)
        if stale_rate:
            sim.json("PUT", "/_sim/faults", {"stale_read_rate": stale_rate})
        ctl_proc, api = start_ctlproc(procs, sim.address, {"NRC_NOMAD_WRITE_RATE": "0"})
        base = sim.json("GET", "/_bench/status")["registered"]
        ctl_cpu, sim_cpu = ctl_proc.cpu_s(), sim_proc.cpu_s()
        started = time.perf_counter()
        status, body = api.request(
            "PUT", f"/api/v1/execution-environments/{ENV_ID}", environment_body(ENV_ID, pool)
        )
        if status not in (201, 204):
            raise RuntimeError(f"creating the environment: {status} {body[:200]!r}")
        timeline: list[tuple[float, int, int]] = []  # (s, jobs created, idle ready)
        all_created = ready_at = None
        while time.perf_counter() - started < 120:
            created = sim.json("GET", "/_bench/status")["registered"] - base - 1  # the template
            ready = idle_runners(api, ENV_ID)
            now = time.perf_counter() - started
            timeline.append((round(now, 3), created, ready))
            if all_created is None and created >= pool:
                all_created = now
            if ready >= pool:
                ready_at = now
                break
            time.sleep(0.05)
        used_ctl, used_sim = ctl_proc.cpu_s() - ctl_cpu, sim_proc.cpu_s() - sim_cpu
        time.sleep(3.0)  # more passes over (possibly lagging) lists
        created = sim.json("GET", "/_bench/status")["registered"] - base - 1
        metrics = api.request("GET", "/metrics")[1].decode()
        guards = {
            g: _metric(metrics, "nrc_overcreation_guard_total", g)
            for g in ("expectation", "stale_list")
        }
        first = next((t for t, c, _ in timeline if c > 0), None)
    return {
        "stale_read_rate": stale_rate,
        "pool": pool,
        "ready_s": ready_at,
        "first_created_s": first,
        "all_created_s": all_created,
        "creations_per_s": pool / all_created if all_created else None,
        "jobs_created": created,
        "overcreation_guards": guards,
        "controller_cpu_s": used_ctl,
        "simulator_cpu_s": used_sim,
        "timeline": timeline[:: max(1, len(timeline) // 60)],
    }


def _metric(text: str, name: str, guard: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{guard="{guard}"}}'):
            return float(line.split()[-1])
    return 0.0


def run(quick: bool = False) -> Result:
    result = Result("convergence", "Pool convergence: 1,000 runners created at once")
    pool = 300 if quick else POOL
    runs = [converge(0.0, pool), converge(0.5, pool)]
    result.details["runs"] = runs
    for r in runs:
        label = "stale reads on" if r["stale_read_rate"] else "stale reads off"
        result.add(f"pool {pool} ready after creation, {label}", r["ready_s"], "s", "<= 10")
        result.add(f"creations per second, {label}", r["creations_per_s"], "1/s")
        result.add(
            f"jobs created for a pool of {pool}, {label}",
            r["jobs_created"],
            "jobs",
            f"== {pool}",
        )
        result.add(
            f"CPU to converge, {label}: controller / simulator",
            r["controller_cpu_s"],
            "s",
            note=f"simulator {r['simulator_cpu_s']:.2f} s",
        )
    return result
