"""1. Claim latency through the HTTP API with a warm pool.

A pool of 2,000 ready runners (registered straight into the simulator, then
adopted by the controller at start-up). Before each run the pool is full and
quiet again (the controller refills it at its default 50 writes/s). Clients
POST /api/v1/runners over keep-alive connections:

- closed loop with 1, 10 and 50 clients (each sends its next claim when the
  last one answered): p50/p99/max latency and claims per second;
- open loop: 50 clients together offering 500 claims/s (each one every 100 ms,
  on a fixed schedule), the latency at that load; and the same at 100
  claims/s, a load the controller sustains.

The controller's own share of a claim is its latency minus the duration of
its Nomad write (the EnforceIndex register), which the controller process
records per runner. An extra run at 100 claims/s takes each claim's way
apart (`bench.marks`): the client's, the controller's and the simulator's
marks of the same claim on the machine's one monotonic clock, as mean
milliseconds per segment over the faster half and the slowest 1 %. CPU of
the controller and of the simulator per claim come from their processes'
CPU time.

Little's law ties the two targets together: 50 clients in a closed loop at
500 claims/s wait 100 ms on average, so the p99 target of 10 ms is checked on
the open-loop run, at 500 claims/s offered by 50 concurrent clients.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from bench import profile as bench_profile
from bench.common import (
    Http,
    Result,
    idle_runners,
    start_ctlproc,
    start_sim,
    summary_ms,
    wait_for,
)
from bench.marks import SEGMENTS, breakdown, now, segments
from tests.support.processes import ChildProcess, child_processes

ENV_ID = 1
POOL = 2000
CLAIM = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": 0}


class Claims:
    """Latencies, statuses and runner ids of the claims of one run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.runners: dict[str, float] = {}
        self.errors: dict[int, int] = {}
        # runner id → when its claim was due, sent and answered (bench.marks' clock)
        self.marks: dict[str, tuple[float, float, float]] = {}

    def record(self, due: float, sent: float, done: float, status: int, body: bytes) -> None:
        with self.lock:
            if status == 200:
                runner = json.loads(body)["runnerId"]
                self.latencies.append(done - sent)
                self.runners[runner] = done - sent
                self.marks[runner] = (due, sent, done)
            else:
                self.errors[status] = self.errors.get(status, 0) + 1


def claim_once(api: Http, claims: Claims, due: float | None = None) -> None:
    """One claim; its latency counts from when it was sent (`due`, when it
    was meant to be, is kept beside it for `bench.marks`)."""
    sent = now()
    status, body = api.request("POST", "/api/v1/runners", CLAIM)
    claims.record(sent if due is None else due, sent, now(), status, body)


def closed_loop(api: Http, clients: int, total: int) -> tuple[Claims, float]:
    claims = Claims()
    left = [total]
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def client() -> None:
        api._conn()  # connect before the clock starts
        barrier.wait()
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            claim_once(api, claims)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return claims, time.perf_counter() - started


def open_loop(api: Http, clients: int, rate: float, seconds: float) -> tuple[Claims, float]:
    """`clients` clients together offering `rate` claims/s for `seconds`."""
    claims = Claims()
    period = clients / rate
    per_client = int(seconds / period)
    barrier = threading.Barrier(clients + 1)
    start_at = [0.0]

    def client(k: int) -> None:
        api._conn()
        barrier.wait()
        first = start_at[0] + k * period / clients  # spread the clients over one period
        for i in range(per_client):
            due = first + i * period
            wait = due - now()
            if wait > 0:
                time.sleep(wait)
            claim_once(api, claims, due)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    start_at[0] = now() + 0.05
    barrier.wait()
    for t in threads:
        t.join()
    return claims, now() - start_at[0]


def measure(
    name: str,
    api: Http,
    ctl: ChildProcess,
    sim: ChildProcess,
    run: Any,
    pool: int,
) -> dict[str, Any]:
    # A warm pool: full again after the previous run (the controller refills
    # at its default 50 writes/s) and nothing left to create.
    wait_for(lambda: idle_runners(api, ENV_ID) >= pool, timeout=300, what="pool refilled")
    time.sleep(1.0)
    api.json("GET", "/_bench/probe?reset=1")
    ctl_cpu, sim_cpu = ctl.cpu_s(), sim.cpu_s()
    claims, elapsed = run()
    ctl_cpu, sim_cpu = ctl.cpu_s() - ctl_cpu, sim.cpu_s() - sim_cpu
    writes: dict[str, float] = api.json("GET", "/_bench/probe?reset=1")["claim_writes"]
    own = [
        latency - writes[runner] for runner, latency in claims.runners.items() if runner in writes
    ]
    n = max(1, len(claims.latencies))
    return {
        "name": name,
        "claims": len(claims.latencies),
        "errors": claims.errors,
        "seconds": elapsed,
        "claims_per_s": len(claims.latencies) / elapsed if elapsed else None,
        "latency": summary_ms(claims.latencies),
        "nomad_write": summary_ms(list(writes.values())),
        "controller_share": summary_ms(own),
        "controller_cpu_ms_per_claim": ctl_cpu * 1000 / n,
        "simulator_cpu_ms_per_claim": sim_cpu * 1000 / n,
    }


def run(quick: bool = False, profile: bool = False, pool: int | None = None) -> Result:
    """`pool` other than the default's is written as `claims_pool<N>`: a claim
    touches one runner, so its figures should not move with the pool's size."""
    name = "claims" if pool is None else f"claims_pool{pool}"
    scale = 0.3 if quick else 1.0
    pool = pool or int(POOL * scale)
    result = Result(name, f"Claim latency through the HTTP API (warm pool of {pool:,})")
    with child_processes() as procs:
        sim_proc, sim = start_sim(procs, marks=True)
        sim.json("POST", "/_bench/seed", {"env_id": ENV_ID, "runners": pool, "pool": pool})
        wait_for(
            lambda: sim.json("GET", "/_bench/status")["running"] >= pool,
            timeout=300,
            what="seeded runners running",
        )
        started = time.perf_counter()
        ctl_proc, api = start_ctlproc(procs, sim.address, {"BENCH_MARKS": "1"})
        wait_for(lambda: idle_runners(api, ENV_ID) >= pool, timeout=300, what="pool adopted")
        result.details["adopt_pool_s"] = time.perf_counter() - started
        closed_loop(api, 1, 20)  # warm-up, not recorded
        runs = []
        for clients, total in ((1, 200), (10, 1000), (50, 1500)):
            total = max(50, int(total * scale))
            runs.append(
                measure(
                    f"closed loop, {clients} client{'s' if clients > 1 else ''}",
                    api,
                    ctl_proc,
                    sim_proc,
                    lambda c=clients, t=total: closed_loop(api, c, t),
                    pool,
                )
            )
        for rate in (500, 100):
            runs.append(
                measure(
                    f"open loop, 50 clients offering {rate} claims/s",
                    api,
                    ctl_proc,
                    sim_proc,
                    lambda r=rate: open_loop(api, 50, float(r), 3.0 * scale),
                    pool,
                )
            )
        if profile:
            # An extra run, sampled: 50 clients offering 100 claims/s.
            wait_for(lambda: idle_runners(api, ENV_ID) >= pool, timeout=300, what="pool refilled")
            time.sleep(1.0)
            sampling = bench_profile.Sampling(api, ctl_proc)
            sampling.start()
            sampled, _ = open_loop(api, 50, 100.0, 10.0 * scale)  # ~600 samples
            table = bench_profile.per_unit(sampling.stop(), len(sampled.latencies))
            result.details["profile"] = str(bench_profile.write(name, "claim", table))
        # An extra run, marked: where each claim's time went (bench.marks).
        wait_for(lambda: idle_runners(api, ENV_ID) >= pool, timeout=300, what="pool refilled")
        time.sleep(1.0)
        api.json("GET", "/_bench/marks?on=1")
        sim.json("GET", "/_bench/write_marks?on=1")
        marked, _ = open_loop(api, 50, 100.0, 10.0 * scale)
        ctl_marks = api.json("GET", "/_bench/marks?on=0")
        sim_marks = sim.json("GET", "/_bench/write_marks?on=0")
        rows = segments(
            marked.marks,
            _pairs(ctl_marks["api"]),
            _pairs(ctl_marks["writes"]),
            _pairs(sim_marks),
        )
        result.details["where_claims_wait"] = {
            "run": "open loop, 50 clients offering 100 claims/s",
            "claims": len(marked.latencies),
            "marked": len(rows),
            "mean_ms": breakdown(rows),
        }
        result.details["runs"] = runs
        result.details["pool"] = pool
        result.details["idle_after"] = idle_runners(api, ENV_ID)
    by_name = {r["name"]: r for r in runs}
    for clients in (1, 10, 50):
        who = f"{clients} client{'s' if clients > 1 else ''}"
        r = by_name[f"closed loop, {who}"]
        lat = r["latency"]
        result.add(f"claim p50, {who} (closed loop)", lat["p50_ms"], "ms")
        result.add(f"claim p99, {who} (closed loop)", lat["p99_ms"], "ms")
        result.add(f"claim max, {who} (closed loop)", lat["max_ms"], "ms")
        result.add(
            f"claims/s, {who} (closed loop)",
            r["claims_per_s"],
            "1/s",
            ">= 500" if clients == 50 else "",
        )
        result.add(
            f"controller share p50, {who} (closed loop)",
            r["controller_share"]["p50_ms"],
            "ms",
            note=f"p99 {_ms(r['controller_share']['p99_ms'])} ms",
        )
    for rate in (500, 100):
        o = by_name[f"open loop, 50 clients offering {rate} claims/s"]
        at = f"50 clients at {rate} claims/s offered"
        result.add(
            f"claim p50, {at}",
            o["latency"]["p50_ms"],
            "ms",
            note=f"achieved {o['claims_per_s']:.0f} claims/s",
        )
        result.add(f"claim p99, {at}", o["latency"]["p99_ms"], "ms", "<= 10" if rate == 500 else "")
        result.add(f"claim max, {at}", o["latency"]["max_ms"], "ms")
        result.add(
            f"controller share p99, {at}",
            o["controller_share"]["p99_ms"],
            "ms",
            note=f"p50 {_ms(o['controller_share']['p50_ms'])} ms",
        )
        result.add(
            f"CPU per claim, {at}: controller",
            o["controller_cpu_ms_per_claim"],
            "ms",
            note=f"simulator {_ms(o['simulator_cpu_ms_per_claim'])} ms",
        )
    for group, means in result.details["where_claims_wait"]["mean_ms"].items():
        result.add(
            f"{group} of claims at 100 claims/s offered: mean latency from due",
            means["total"],
            "ms",
            note=", ".join(f"{k} {means[k]:.2f}" for k in SEGMENTS),
        )
    return result


def _pairs(marks: dict[str, list[float]]) -> dict[str, tuple[float, float]]:
    return {key: (seen, answered) for key, (seen, answered) in marks.items()}


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
