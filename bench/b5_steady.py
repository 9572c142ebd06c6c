"""5. Steady-state load on Nomad and 6. memory, at 1,000 and 10,000 idle runners.

The runners are registered straight into the simulator (one environment whose
pool is exactly that size) and the controller runs as the service, which
adopts them at start-up. Then nothing changes while the simulator counts every
request the controller sends (the event stream is one long request).

The window is compressed: `NRC_RESYNC_INTERVAL=2s` for 40 s is 20 resyncs, two
of which are full re-lists (every 10th). Requests per minute at the default
30 s resync are the measured requests per resync cycle scaled to 30 s: the
same number of resyncs and full re-lists happen, only 15 times slower.

Memory is the RSS of the controller process after the window (and the
highest seen during it, which includes the full re-lists).
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import (
    Result,
    RssSampler,
    gc_pauses,
    gc_pauses_between,
    idle_runners,
    start_ctlproc,
    start_sim,
    wait_for,
)
from tests.support.processes import child_processes

ENV_ID = 1
RESYNC_S = 2.0
WINDOW_S = 40.0
DEFAULT_RESYNC_S = 30.0


def measure(n: int, window_s: float) -> dict[str, Any]:
    with child_processes() as procs:
        nodes = max(25, n // 400)
        _, sim = start_sim(procs, nodes=nodes, startup_delay_s=0.05, stop_delay_s=0.05)
        sim.json("POST", "/_bench/seed", {"env_id": ENV_ID, "runners": n, "pool": n})
        wait_for(
            lambda: sim.json("GET", "/_bench/status")["running"] >= n,
            timeout=300,
            what="seeded runners running",
        )
        started = time.perf_counter()
        ctl_proc, api = start_ctlproc(
            procs, sim.address, {"NRC_RESYNC_INTERVAL": f"{RESYNC_S:g}s"}, timeout=300
        )
        wait_for(lambda: idle_runners(api, ENV_ID) >= n, timeout=300, what="pool adopted")
        adopt_s = time.perf_counter() - started
        rss_adopted = ctl_proc.rss_mb()
        time.sleep(2 * RESYNC_S)  # past the first full re-list after the stream connects
        before = sim.json("GET", "/_bench/status")["requests"]
        cpu0 = ctl_proc.cpu_s()
        gc0 = gc_pauses(api)
        with RssSampler(ctl_proc) as rss:
            time.sleep(window_s)
        cpu = ctl_proc.cpu_s() - cpu0
        collections = gc_pauses_between(gc0, gc_pauses(api))
        # From the start through the adoption (the pacer's first full collection among them).
        adoption = gc_pauses_between((0, 0.0), gc0)
        after = sim.json("GET", "/_bench/status")["requests"]
        rss_end = ctl_proc.rss_mb()
        registered = sim.json("GET", "/_bench/status")["registered"]
    by_route = {
        k: after.get(k, 0) - before.get(k, 0)
        for k in sorted(set(after) | set(before))
        if k.startswith(("GET /v1", "PUT /v1", "POST /v1", "DELETE /v1"))
        and after.get(k, 0) != before.get(k, 0)
    }
    total = sum(by_route.values())
    resyncs = window_s / RESYNC_S
    per_min_measured = total / window_s * 60
    per_min_default = total / (resyncs * DEFAULT_RESYNC_S) * 60
    return {
        "runners": n,
        "adopt_s": adopt_s,
        "window_s": window_s,
        "resync_interval_s": RESYNC_S,
        "requests_in_window": total,
        "requests_by_route": by_route,
        "requests_per_min_measured": per_min_measured,
        "requests_per_min_at_default_resync": per_min_default,
        "controller_cpu_s_in_window": cpu,
        "controller_cpu_percent": cpu / window_s * 100,
        "rss_mb_after_adoption": rss_adopted,
        "rss_mb": rss_end,
        "rss_mb_peak": rss.peak_mb,
        "jobs_registered": registered,
        "gc_full_collections_in_window": collections,
        "gc_full_collections_before_window": adoption,
    }


def run(quick: bool = False) -> list[Result]:
    steady = Result("steady_load", "Steady-state load on Nomad with idle runners")
    memory = Result("memory", "Controller memory (RSS)")
    sizes = (1000, 3000) if quick else (1000, 10_000)
    window = 12.0 if quick else WINDOW_S
    runs = [measure(n, window) for n in sizes]
    steady.details["runs"] = runs
    memory.details["runs"] = runs
    for r in runs:
        n = f"{r['runners']:,}"
        big = r["runners"] >= 10_000
        steady.add(
            f"Nomad requests/min, {n} idle runners, nothing changing",
            r["requests_per_min_at_default_resync"],
            "1/min",
            "<= 10" if big else "",
            note=f"{r['requests_in_window']} requests in {r['window_s']:.0f} s at a "
            f"{r['resync_interval_s']:g} s resync: {r['requests_by_route']}",
        )
        steady.add(
            f"controller CPU, {n} idle runners (resync {r['resync_interval_s']:g} s)",
            r["controller_cpu_percent"],
            "%",
        )
        memory.add(
            f"RSS, {n} runners",
            r["rss_mb"],
            "MB",
            "<= 200" if big else "",
            note=f"peak {r['rss_mb_peak']:.0f} MB during full re-lists; "
            f"{r['rss_mb_after_adoption']:.0f} MB after adoption",
        )
    return [steady, memory]
