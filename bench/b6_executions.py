"""6. Executions and claims as a client outside the controller sees them.

The simulator (whose exec runs the commands for real, on this host) and the
controller run in processes of their own; the clients are threads of this
process, speaking HTTP and WebSockets over loopback as CodeOcean does.

- Round trip: `POST /execute` + WebSocket connect + `echo hi` until the
  terminal frame and the close, 20 clients in a closed loop, each on its own
  claimed runner: p50 / p99. Once with separate stderr (two Nomad execs per
  run, the default) and once merged (one exec), at 1 and 20 clients: what
  the second exec costs.
- 100 executions at once (5 on each of 20 runners), each writing 1 MB: all
  complete with every byte; the controller's RSS growth meanwhile.
- Throughput: one execution writing 50 MB to stdout, as the client receives
  it.
- Claims at 100/s offered open loop, latency counted from each claim's
  scheduled start (so queueing in the client counts too), with keep-alive
  connections and with one new connection per claim; once on an idle API and
  once while 20 interactive executions (a line every 0.1 s each) run through
  the same event loop.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from websockets.sync.client import connect

from bench import profile as bench_profile
from bench.common import (
    Http,
    Result,
    RssSampler,
    idle_runners,
    start_ctlproc,
    start_sim,
    summary_ms,
    wait_for,
)
from tests.support.processes import ChildProcess, child_processes

ENV_ID = 1
CLIENTS = 20
ECHO = "echo hi"
CLAIM_POOL = 400
CLAIM_SECONDS = 3.0


def claim(api: Http, timeout_s: int = 0) -> str:
    body = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": timeout_s}
    return str(api.json("POST", "/api/v1/runners", body)["runnerId"])


def execute(api: Http, runner: str, command: str) -> str:
    path = f"/api/v1/runners/{runner}/execute"
    return str(api.json("POST", path, {"command": command})["websocketUrl"])


def run_once(api: Http, runner: str, command: str) -> tuple[float, list[dict[str, Any]], int]:
    """One execution: (seconds from the POST to the close, frames, stdout bytes)."""
    started = time.perf_counter()
    url = execute(api, runner, command)
    frames: list[dict[str, Any]] = []
    size = 0
    with connect(url, max_size=None, compression=None) as ws:
        for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "stdout":
                size += len(frame["data"].encode())
            else:
                frames.append(frame)
    return time.perf_counter() - started, frames, size


def closed_loop(api: Http, runners: list[str], total: int) -> tuple[list[float], int]:
    latencies: list[float] = []
    failures = [0]
    left = [total]
    lock = threading.Lock()
    barrier = threading.Barrier(len(runners) + 1)

    def client(runner: str) -> None:
        api._conn()
        barrier.wait()
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            seconds, frames, _ = run_once(api, runner, ECHO)
            with lock:
                if frames[-1] == {"type": "exit", "data": 0}:
                    latencies.append(seconds)
                else:
                    failures[0] += 1

    threads = [threading.Thread(target=client, args=(r,)) for r in runners]
    for t in threads:
        t.start()
    barrier.wait()
    for t in threads:
        t.join()
    return latencies, failures[0]


def open_loop(api: Http, runners: list[str], rate: float, seconds: float) -> list[float]:
    """One client per runner, together offering `rate` executions/s; latency
    from each execution's scheduled start."""
    latencies: list[float] = []
    lock = threading.Lock()
    period = len(runners) / rate
    per_client = max(1, int(seconds / period))
    barrier = threading.Barrier(len(runners) + 1)
    start_at = [0.0]

    def client(k: int, runner: str) -> None:
        api._conn()
        barrier.wait()
        first = start_at[0] + k * period / len(runners)
        for i in range(per_client):
            due = first + i * period
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            _, frames, _ = run_once(api, runner, ECHO)
            with lock:
                if frames[-1] == {"type": "exit", "data": 0}:
                    latencies.append(time.perf_counter() - due)

    threads = [threading.Thread(target=client, args=(k, r)) for k, r in enumerate(runners)]
    for t in threads:
        t.start()
    start_at[0] = time.perf_counter() + 0.05
    barrier.wait()
    for t in threads:
        t.join()
    return latencies


def concurrent_output(api: Http, runners: list[str], per_runner: int, size: int) -> dict[str, Any]:
    command = f"head -c {size} /dev/zero | tr '\\0' a"
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def one(runner: str) -> None:
        _, frames, got = run_once(api, runner, command)
        with lock:
            results.append((got, json.dumps(frames[-1])))

    threads = [threading.Thread(target=one, args=(r,)) for r in runners for _ in range(per_runner)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    complete = sum(1 for got, end in results if got == size and '"exit"' in end)
    return {
        "executions": len(threads),
        "complete_with_all_output": complete,
        "seconds": time.perf_counter() - started,
    }


class Claimer:
    """Claims over keep-alive connections (one per thread) or a new one each."""

    def __init__(self, address: str, keep_alive: bool) -> None:
        self.api = Http(address)
        self.keep_alive = keep_alive

    def claim(self) -> int:
        body = json.dumps({"executionEnvironmentId": ENV_ID, "inactivityTimeout": 0}).encode()
        headers = {"Content-Type": "application/json"}
        if self.keep_alive:
            return self.api.request("POST", "/api/v1/runners", json.loads(body))[0]
        conn = http.client.HTTPConnection(self.api.host, self.api.port, timeout=60)
        try:
            conn.request("POST", "/api/v1/runners", body=body, headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()


def open_loop_claims(address: str, keep_alive: bool, rate: float, seconds: float) -> dict[str, Any]:
    """Claims offered at `rate`, each from its scheduled start; enough threads
    that a slow answer never delays the next claim's start."""
    claimer = Claimer(address, keep_alive)
    threads = 16
    period = threads / rate
    per_thread = int(seconds / period)
    latencies: list[float] = []
    late_starts: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)
    start_at = [0.0]

    def client(k: int) -> None:
        if keep_alive:
            claimer.api._conn()
        barrier.wait()
        first = start_at[0] + k * period / threads
        for i in range(per_thread):
            due = first + i * period
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            late = time.perf_counter() - due
            status = claimer.claim()
            done = time.perf_counter()
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                latencies.append(done - due)
                late_starts.append(max(0.0, late))

    workers = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    start_at[0] = time.perf_counter() + 0.05
    barrier.wait()
    for t in workers:
        t.join()
    return {
        "keep_alive": keep_alive,
        "offered_per_s": rate,
        "claims": len(latencies),
        "statuses": statuses,
        "latency_from_schedule": summary_ms(latencies),
        "client_late_start": summary_ms(late_starts),
    }


def streaming(api: Http, runners: list[str], stop: threading.Event) -> list[threading.Thread]:
    """Interactive programs running until `stop`: each prints a line every
    0.1 s (bash builtins only; `read -t` on the idle terminal is the pause)."""
    command = (
        "i=0; while true; do i=$((i+1)); "
        'echo "line $i of what a student\'s program prints"; read -t 0.1; done'
    )

    def one(runner: str) -> None:
        url = execute(api, runner, command)
        with connect(url, max_size=None) as ws:
            while not stop.is_set():
                ws.recv(timeout=10)

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in runners]
    for t in threads:
        t.start()
    return threads


def children_cpu_s(proc: ChildProcess) -> float:
    """CPU of the commands the simulator ran (its reaped children)."""
    times = proc.ps.cpu_times()
    return float(times.children_user + times.children_system)


def _with_controller(
    procs: list[ChildProcess],
    sim: Http,
    env: dict[str, str],
    body: Callable[[ChildProcess, Http], None],
) -> None:
    setuser = sim.json("GET", "/_bench/status")["setuser"]
    ctl_proc, api = start_ctlproc(
        procs, sim.address, {"NRC_EXEC_UNPRIVILEGED_WRAPPER": f"{setuser} user", **env}
    )
    try:
        body(ctl_proc, api)
    finally:
        ctl_proc.stop()
        procs.remove(ctl_proc)


def run(quick: bool = False, profile: bool = False) -> Result:
    result = Result("executions", "Executions and claims from clients in their own process")
    scale = 0.3 if quick else 1.0
    # Enough idle runners that 3 s of claims at 100/s never empty the pool.
    pool = CLIENTS + CLAIM_POOL
    details: dict[str, Any] = {}
    with child_processes() as procs:
        sim_proc, sim = start_sim(procs, nodes=5, startup_delay_s=0.05, stop_delay_s=0.05)
        sim.json("POST", "/_bench/seed", {"env_id": ENV_ID, "runners": pool, "pool": pool})
        wait_for(lambda: sim.json("GET", "/_bench/status")["running"] >= pool, 120, what="running")

        def separate(ctl: ChildProcess, api: Http) -> None:
            wait_for(lambda: idle_runners(api, ENV_ID) >= pool, 120, what="pool adopted")
            runners = [claim(api) for _ in range(CLIENTS)]
            details["runners"] = runners
            closed_loop(api, runners[:4], 20)  # warm-up
            one, _ = closed_loop(api, runners[:1], int(100 * scale))
            cpu = ctl.cpu_s(), sim_proc.cpu_s(), children_cpu_s(sim_proc)
            started = time.perf_counter()
            many, failed = closed_loop(api, runners, int(500 * scale))
            elapsed = time.perf_counter() - started
            n = max(1, len(many))
            details["round_trip_1_client"] = summary_ms(one)
            details["round_trip_20_clients"] = summary_ms(many)
            details["round_trip_failures"] = failed
            details["executions_per_s_20_clients"] = len(many) / elapsed
            details["cpu_ms_per_execution"] = {
                "controller": (ctl.cpu_s() - cpu[0]) * 1000 / n,
                "simulator": (sim_proc.cpu_s() - cpu[1]) * 1000 / n,
                "commands": (children_cpu_s(sim_proc) - cpu[2]) * 1000 / n,
            }
            paced = open_loop(api, runners, 20.0, 10 * scale)
            details["round_trip_20_clients_20_per_s"] = summary_ms(paced)
            if profile:
                # An extra run, sampled: 10 executions/s of `echo hi`.
                sampling = bench_profile.Sampling(api, ctl)
                sampling.start()
                sampled = open_loop(api, runners, 10.0, 10 * scale)
                table = bench_profile.per_unit(sampling.stop(), len(sampled))
                details["profile"] = str(bench_profile.write("executions", "execution", table))
            rss_before = ctl.rss_mb()
            with RssSampler(ctl, 0.05) as sampler:
                details["concurrent"] = concurrent_output(api, runners, 5, 1_000_000)
            details["concurrent"]["rss_before_mb"] = rss_before
            details["concurrent"]["rss_peak_mb"] = sampler.peak_mb
            size = int(50_000_000 * scale)
            seconds, frames, got = run_once(
                api, runners[0], f"head -c {size} /dev/zero | tr '\\0' c"
            )
            details["throughput"] = {
                "bytes": got,
                "seconds": seconds,
                "mb_per_s": got / seconds / 1e6,
                "end": frames[-1],
            }
            claims: list[dict[str, Any]] = []

            def claims_run(keep_alive: bool, what: str) -> None:
                # A warm, quiet pool before each run, as in the claims benchmark.
                wait_for(lambda: idle_runners(api, ENV_ID) >= CLAIM_POOL, 300, what="pool refilled")
                time.sleep(1.0)
                run_ = open_loop_claims(api.address, keep_alive, 100.0, CLAIM_SECONDS * scale)
                claims.append({"api": what, **run_})

            for keep_alive in (True, False):
                claims_run(keep_alive, "idle")
            stop = threading.Event()
            streams: list[threading.Thread] = []
            try:
                for keep_alive in (True, False):
                    if not streams:
                        streams = streaming(api, runners, stop)
                    claims_run(keep_alive, "with 20 executions running")
            finally:
                stop.set()
                for t in streams:
                    t.join(15)
            details["claims"] = claims

        _with_controller(procs, sim, {}, separate)

        def merged(ctl: ChildProcess, api: Http) -> None:
            runners = details["runners"]
            closed_loop(api, runners[:4], 20)
            one, _ = closed_loop(api, runners[:1], int(100 * scale))
            many, _ = closed_loop(api, runners, int(500 * scale))
            details["merged_round_trip_1_client"] = summary_ms(one)
            details["merged_round_trip_20_clients"] = summary_ms(many)

        _with_controller(procs, sim, {"NRC_EXEC_SEPARATE_STDERR": "false"}, merged)
    result.details = details
    many = details["round_trip_20_clients"]
    cpu = details["cpu_ms_per_execution"]
    result.add(
        "execution round trip p50, 20 clients (closed loop)",
        many["p50_ms"],
        "ms",
        "<= 15",
        note=f"{details['executions_per_s_20_clients']:.0f} executions/s",
    )
    result.add("execution round trip p99, 20 clients (closed loop)", many["p99_ms"], "ms", "<= 50")
    result.add(
        "CPU per execution: controller",
        cpu["controller"],
        "ms",
        note=f"simulator {cpu['simulator']:.1f} ms, commands {cpu['commands']:.1f} ms",
    )
    paced = details["round_trip_20_clients_20_per_s"]
    result.add(
        "execution round trip p50, 20 clients offering 20/s (from schedule)",
        paced["p50_ms"],
        "ms",
        note=f"p99 {paced['p99_ms']:.1f} ms",
    )
    one = details["round_trip_1_client"]
    result.add(
        "execution round trip p50, 1 client",
        one["p50_ms"],
        "ms",
        note=f"p99 {one['p99_ms']:.1f} ms",
    )
    merged_many = details["merged_round_trip_20_clients"]
    merged_one = details["merged_round_trip_1_client"]
    result.add(
        "round trip p50 with stderr merged (one exec), 1 / 20 clients",
        merged_one["p50_ms"],
        "ms",
        note=f"20 clients: p50 {merged_many['p50_ms']:.1f} ms, p99 {merged_many['p99_ms']:.1f} ms",
    )
    c = details["concurrent"]
    result.add(
        "executions at once that completed with all output",
        c["complete_with_all_output"],
        "",
        f">= {c['executions']}",
    )
    result.add(
        "controller RSS growth, 100 executions of 1 MB at once",
        c["rss_peak_mb"] - c["rss_before_mb"],
        "MB",
        "<= 50",
    )
    result.add(
        "stdout throughput of one execution", details["throughput"]["mb_per_s"], "MB/s", ">= 10"
    )
    for run_ in details["claims"]:
        how = "keep-alive" if run_["keep_alive"] else "new connection per claim"
        target = "<= 50" if run_["keep_alive"] else ""
        result.add(
            f"claim p99 from schedule, 100/s, {how}, API {run_['api']}",
            run_["latency_from_schedule"]["p99_ms"],
            "ms",
            target,
            note=f"p50 {run_['latency_from_schedule']['p50_ms']:.1f} ms, {run_['statuses']}",
        )
    return result
