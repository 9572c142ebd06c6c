"""The Nomad simulator in its own process, for the benchmarks.

It is `nomadsim` as `nomad-runner-controller sim` serves it, plus four
routes under `/_bench/` (five with `--marks`) that the benchmarks use to
set the cluster up without paying for it through HTTP (none of them is part
of Nomad or of `/_sim`):

- `POST /_bench/seed {"env_id", "runners", "pool"}` registers the template
  job of the environment (with that pool size) and `runners` runner jobs in
  Poseidon's layout (`controller.nomad.jobs`), exactly as the controller
  would write them, directly on the simulator's loop;
- `GET /_bench/status` counts jobs, allocations and running allocations, and
  the process's full garbage collections (`gc_pauses`: count, seconds);
- `GET /_bench/processes?alloc=ID` lists the live processes an allocation's
  executions left (by the simulator's marker, and as root by its uid);
  without `alloc`, those of every allocation it knows, by the marker only;
- `POST /_bench/touch {"ids", "kind"}` changes runners as another writer or
  the cluster would: `job` re-registers each job with one more meta key (a
  new JobModifyIndex; the allocation is updated in place), `crash` makes each
  runner's task exit (it restarts in place);
- with `--marks`, `GET /_bench/write_marks?on=1` (and `=0`) hands over and
  clears when the simulator's app saw and answered each EnforceIndex
  register, by job id (`bench.marks`), and records them from then on (or
  not); without it no request passes through the marking middleware.

Its garbage collector is paced as the `sim` command paces it (every
`--gc-freeze-interval` s, 1 by default or `BENCH_SIM_GC_FREEZE_INTERVAL`; the
first time once the seed is in): see docs/simulator.md, "No pauses Nomad does
not have".

`--maintenance` sets the restart timings of a production cluster (nomadsim
`restarts.py`: a 1 s notice, a 3 s election, the 5 s hold), with the
heartbeat TTL and the failover TTL after an election both cut to 10 s (20–30 s
and 5 min in Nomad), so that a night's host reboot loses its node within
the benchmark.

Prints `READY <address>` (the entry's) once it listens; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import threading
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.marks import Recorder, WriteMarks
from controller.gcpacing import CollectorPacer, Pacing
from controller.model import Environment
from controller.nomad import jobs
from nomadsim import SimConfig, SimServer, Simulator
from tests.support.sim import DIRECT, PRODUCTION, TOPOLOGY

NAMESPACE = "default"


def live_processes_of(uid: int) -> list[int]:
    """Processes of `uid` that are not zombies (an orphan's waits for init)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            pids.append(int(name))
    return pids


def environment(env_id: int, pool: int) -> Environment:
    """The environment the benchmarks' runner jobs are built for."""
    return Environment(
        id=env_id,
        image="python:3.12-slim",
        cpu_limit=100,
        memory_limit=256,
        network_access=False,
        exposed_ports=(),
        prewarming_pool_size=pool,
    )


class GcPauses:
    """The simulator process's garbage collector, paced (`controller.gcpacing`)
    once the seed is in and every interval after that, and its full
    collections counted for `/_bench/status`."""

    def __init__(self, freeze_interval_s: float) -> None:
        self.seeded = threading.Event()
        self.count = 0
        self.total_s = 0.0
        self.pacer = CollectorPacer(
            Pacing(freeze_interval_s=freeze_interval_s),
            on_pause=self._paused,
            ready=self.seeded.is_set,
        )

    def _paused(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds


def bench_routes(sim: Simulator, gc_pauses: GcPauses) -> list[Route]:
    rng = random.Random(7)

    async def seed(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        env = environment(int(body["env_id"]), int(body.get("pool", body["runners"])))
        sim.register_job(jobs.template_job(env), NAMESPACE, False, 0)
        template = sim.store.job(NAMESPACE, jobs.template_job_id(env.id))
        assert template is not None
        base = json.dumps(jobs.runner_job(template.spec, env, jobs.runner_job_id(env.id, "x")))
        ids = []
        for n in range(int(body["runners"])):
            job_id = jobs.runner_job_id(env.id, str(uuid.UUID(int=rng.getrandbits(128), version=4)))
            spec = json.loads(base)
            spec["ID"] = spec["Name"] = job_id
            sim.register_job(spec, NAMESPACE, False, 0)
            ids.append(job_id)
            if n % 100 == 99:
                await asyncio.sleep(0)  # let the scheduler and clients run
        gc_pauses.seeded.set()
        return JSONResponse({"index": sim.store.index, "ids": ids})

    async def status(request: Request) -> Response:
        allocs = sim.store.allocs.values()
        return JSONResponse(
            {
                "index": sim.store.index,
                "jobs": len(sim.store.jobs),
                "registered": sim.store.jobs_ever_registered,
                "allocs": len(sim.store.allocs),
                "running": sum(1 for a in allocs if a.client_status == "running"),
                "requests": sim.requests,
                # the stand-in for /sbin/setuser that executions are wrapped in
                "setuser": sim.setuser_path,
                # full garbage collections of this process so far
                "gc_pauses": {"count": gc_pauses.count, "total_s": gc_pauses.total_s},
            }
        )

    async def touch(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        kind = body.get("kind", "job")
        touched = 0
        for job_id in body["ids"]:
            rec = sim.store.job(NAMESPACE, job_id)
            if rec is None:
                continue
            if kind == "crash":
                allocs = sim.store.job_allocs(NAMESPACE, job_id)
                running = [a for a in allocs if a.client_status == "running"]
                if running:
                    sim.task_exit(running[-1].id, oom=False)
                    touched += 1
                continue
            spec = json.loads(json.dumps(rec.spec))
            for group in spec["TaskGroups"]:
                if group["Name"] == jobs.CONFIG_GROUP:
                    meta = dict(group.get("Meta") or {})
                    meta["bench_touch"] = str(int(meta.get("bench_touch", "0")) + 1)
                    group["Meta"] = meta
            sim.register_job(spec, NAMESPACE, False, 0)
            touched += 1
        return JSONResponse({"index": sim.store.index, "touched": touched})

    async def processes(request: Request) -> Response:
        """Live processes an allocation's executions left: those carrying the
        simulator's marker, and (as root) every process of its unprivileged uid."""
        alloc = request.query_params.get("alloc")
        pids: set[int] = set()
        for alloc_id in [alloc] if alloc else list(sim.store.allocs):
            pids.update(sim.exec_processes(alloc_id))
        if alloc and sim.driver.docker_users:
            uid, _ = sim.driver.user_ids(alloc)
            pids.update(live_processes_of(uid))
        return JSONResponse({"pids": sorted(pids)})

    return [
        Route("/_bench/processes", processes, methods=["GET"]),
        Route("/_bench/seed", seed, methods=["POST"]),
        Route("/_bench/status", status, methods=["GET"]),
        Route("/_bench/touch", touch, methods=["POST"]),
    ]


def write_marks_route(writes: Recorder) -> Route:
    async def write_marks(request: Request) -> Response:
        return JSONResponse(writes.take(request.query_params.get("on") == "1"))

    return Route("/_bench/write_marks", write_marks, methods=["GET"])


def _topology(name: str) -> dict[str, Any]:
    """`tests`: the topology the suite runs against (tests/support/sim.py
    `TOPOLOGY`: one switch for both); `production` or `direct` by name."""
    return {"tests": TOPOLOGY, "production": PRODUCTION, "direct": DIRECT}[name]


# `--maintenance`: see the module docstring.
MAINTENANCE: dict[str, Any] = {
    "leader_notice_ms": 1000.0,
    "election_ms": 3000.0,
    "rpc_hold_ms": 5000.0,
    "heartbeat_ttl_ms": 10_000.0,
    "failover_heartbeat_ttl_ms": 10_000.0,
}


def serve(args: argparse.Namespace) -> None:
    """Serve until SIGTERM or SIGINT."""
    server = SimServer(
        SimConfig(
            nodes=args.nodes,
            startup_delay_ms=args.startup_delay * 1000,
            stop_delay_ms=args.stop_delay * 1000,
            event_buffer_size=args.event_buffer,
            **_topology(args.topology),
            **(MAINTENANCE if args.maintenance else {}),
        ),
        port=args.port,
    )
    gc_pauses = GcPauses(args.gc_freeze_interval)
    server.app.router.routes.extend(bench_routes(server.sim, gc_pauses))
    if args.marks:
        writes = Recorder()
        server.app.router.routes.append(write_marks_route(writes))
        server.app.add_middleware(WriteMarks, recorder=writes)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start(timeout=30)
    gc_pauses.pacer.start()
    try:
        print(f"READY {server.address}", flush=True)
        stop.wait()
    finally:
        gc_pauses.pacer.stop()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.simproc")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--nodes", type=int, default=25)
    parser.add_argument("--startup-delay", type=float, default=0.5)
    parser.add_argument("--stop-delay", type=float, default=0.2)
    parser.add_argument("--event-buffer", type=int, default=100)
    parser.add_argument("--topology", choices=["tests", "production", "direct"], default="tests")
    parser.add_argument("--marks", action="store_true", help="mark claim writes (bench.marks)")
    parser.add_argument(
        "--maintenance", action="store_true", help="a maintenance night's restart timings"
    )
    parser.add_argument(
        "--gc-freeze-interval",
        type=float,
        default=float(os.environ.get("BENCH_SIM_GC_FREEZE_INTERVAL", "1")),
        help="seconds between the paced collections (0: Python's collector as is)",
    )
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
