"""4. Reconcile pass cost at 1,000 and 10,000 runners.

The runners (one environment whose pool is exactly that size, so a pass has
nothing to do) are registered straight into the simulator. The controller is
built in this process but not started: no worker, resync or refresh threads,
only its event-stream reader, so `time.process_time()` over a pass is the
controller's own CPU. A pass is what a resync does: a refresh of the observed
state followed by a reconcile of every environment. Requests to Nomad and the
bytes of their answers are counted on the gateway's HTTP session; the
simulator's CPU is read from its process.

Measured: the initial sync (a full list and every spec), a full re-list (what
runs every 10th resync and after the event stream reconnects), a pass with
nothing changed (the median of 10), and a pass after 1 % of the runners
changed, twice: their allocations (each task crashed and is restarting in
place) and their jobs (re-registered by another writer with one more meta
key: a new JobModifyIndex, the allocation updated in place). The CPU of a
changed pass includes reading the change's events.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import requests

from bench.common import Result, start_sim, wait_for
from controller.nomad.client import NomadClient
from controller.nomad.stream import EventStream
from controller.reconcile.loop import EVENT_TOPICS, Controller, ControllerSettings
from tests.support.processes import ChildProcess, child_processes

ENV_ID = 1


class Counter:
    """Requests and answer bytes on one requests.Session."""

    def __init__(self, session: requests.Session) -> None:
        self.requests = 0
        self.bytes = 0
        session.hooks["response"].append(self._count)

    def _count(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.requests += 1
        self.bytes += len(response.content)


def timed(
    work: Callable[[], object],
    counter: Counter,
    sim: ChildProcess,
    before: Callable[[], object] = lambda: None,
) -> dict[str, float]:
    requests0, bytes0 = counter.requests, counter.bytes
    cpu0, wall0, sim0 = time.process_time(), time.perf_counter(), sim.cpu_s()
    before()
    work()
    return {
        "cpu_ms": (time.process_time() - cpu0) * 1000,
        "wall_ms": (time.perf_counter() - wall0) * 1000,
        "requests": counter.requests - requests0,
        "bytes": counter.bytes - bytes0,
        "simulator_cpu_ms": (sim.cpu_s() - sim0) * 1000,
    }


def measure(n: int) -> dict[str, Any]:
    with child_processes() as procs:
        nodes = max(25, n // 400)
        sim_proc, sim = start_sim(procs, nodes=nodes, startup_delay_s=0.05, stop_delay_s=0.05)
        seeded = time.perf_counter()
        ids: list[str] = sim.json(
            "POST", "/_bench/seed", {"env_id": ENV_ID, "runners": n, "pool": n}
        )["ids"]
        wait_for(
            lambda: sim.json("GET", "/_bench/status")["running"] >= n,
            timeout=300,
            what="seeded runners running",
        )
        seed_s = time.perf_counter() - seeded
        gateway = NomadClient(address=sim.address, timeout_s=60.0)
        counter = Counter(gateway._session)
        controller = Controller(gateway, ControllerSettings(write_rate_per_s=0))
        observer = controller.observer

        def one_pass() -> None:
            snap = observer.refresh()
            for env_id in snap.env_ids():
                controller.reconciler.reconcile(env_id)

        initial = timed(observer.refresh, counter, sim_proc)
        snap = observer.snapshot
        stream = EventStream(
            address=sim.address,
            topics=EVENT_TOPICS,
            on_events=controller._on_events,
            on_state=controller._on_stream,
            start_index=max(snap.jobs_index, snap.allocs_index) + 1,
        )
        stream.start()
        try:
            wait_for(lambda: stream.connected, timeout=30, what="event stream")
            one_pass()  # the full refresh that follows a (re)connection
            # A full re-list after something changed (in a busy cluster the
            # indexes always move, so the lists are decoded and merged).
            index = sim.json("POST", "/_bench/touch", {"ids": ids[-1:], "kind": "crash"})["index"]
            wait_for(lambda: stream.last_index >= index, timeout=30, interval=0.001)
            full = timed(lambda: observer.refresh(full=True), counter, sim_proc)
            time.sleep(1.5)
            one_pass()
            idle = [timed(one_pass, counter, sim_proc) for _ in range(10)]
            changed = {}
            for kind in ("crash", "job"):
                touched = ids[: max(1, n // 100)]

                def touch(kind: str = kind, touched: list[str] = touched) -> None:
                    index = sim.json("POST", "/_bench/touch", {"ids": touched, "kind": kind})[
                        "index"
                    ]
                    wait_for(lambda: stream.last_index >= index, timeout=30, interval=0.001)

                changed[kind] = timed(one_pass, counter, sim_proc, before=touch)
                changed[kind]["changed_runners"] = len(touched)
                time.sleep(1.5)  # crashed tasks restart after 1 s; let that settle
                one_pass()
            views = len(observer.snapshot.runners)
        finally:
            stream.stop()
            gateway.close()
    return {
        "runners": n,
        "views": views,
        "nodes": nodes,
        "seed_s": seed_s,
        "initial_sync": initial,
        "full_relist": full,
        "pass_nothing_changed": {k: statistics.median(p[k] for p in idle) for k in idle[0]},
        "pass_nothing_changed_all": idle,
        "pass_1pct_allocations_changed": changed["crash"],
        "pass_1pct_jobs_changed": changed["job"],
        "refreshes": dict(observer.refreshes),
    }


def run(quick: bool = False) -> Result:
    result = Result("pass_cost", "Reconcile pass cost at 1,000 and 10,000 runners")
    sizes = (1000, 3000) if quick else (1000, 10_000)
    runs = [measure(n) for n in sizes]
    result.details["runs"] = runs
    for r in runs:
        n = f"{r['runners']:,}"
        big = r["runners"] >= 10_000
        idle = r["pass_nothing_changed"]
        result.add(
            f"pass CPU, {n} runners, nothing changed",
            idle["cpu_ms"],
            "ms",
            "<= 50" if big else "",
            note=f"wall {idle['wall_ms']:.1f} ms, {idle['requests']:.0f} requests, "
            f"{idle['bytes']:.0f} bytes",
        )
        for key, label in (
            ("pass_1pct_allocations_changed", "1 % allocations changed"),
            ("pass_1pct_jobs_changed", "1 % jobs changed"),
        ):
            p = r[key]
            result.add(
                f"pass CPU, {n} runners, {label}",
                p["cpu_ms"],
                "ms",
                "<= 300" if big else "",
                note=f"wall {p['wall_ms']:.0f} ms, {p['requests']} requests, "
                f"{p['bytes'] / 1e3:.0f} kB; simulator {p['simulator_cpu_ms']:.0f} ms",
            )
        f = r["full_relist"]
        result.add(
            f"full re-list CPU, {n} runners (every 10th resync)",
            f["cpu_ms"],
            "ms",
            note=f"wall {f['wall_ms']:.0f} ms, {f['requests']} requests, "
            f"{f['bytes'] / 1e6:.1f} MB; simulator {f['simulator_cpu_ms']:.0f} ms",
        )
        i = r["initial_sync"]
        result.add(
            f"initial sync, {n} runners (wall)",
            i["wall_ms"] / 1000,
            "s",
            note=f"CPU {i['cpu_ms'] / 1000:.1f} s, {i['requests']} requests, "
            f"{i['bytes'] / 1e6:.1f} MB; simulator {i['simulator_cpu_ms'] / 1000:.1f} s",
        )
    return result
