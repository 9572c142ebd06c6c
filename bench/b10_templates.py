"""9. Runner templates: how many runners fit on a node, and how long a
deleted runner takes to stop.

Runners per node: one simulated node of 16 GB and 8 cores (8 × 2,400 MHz =
19,200 MHz of CPU shares, as Nomad fingerprints it) with 100 GB of free disk
takes as many runners of `memoryLimit` 256 and `cpuLimit` 20 as it can, built
from Poseidon's template (its HCL parsed by `/v1/jobs/parse`, the
environment applied as Poseidon applies it), from ours, and from ours as it
was before it followed Poseidon's (the whole limit reserved, Nomad's 300 MB
disk). One job with a large count is registered; the placed allocations are
the node's capacity, the rest stay queued. The simulator places by Nomad's
reservations (CPU, MemoryMB, ephemeral disk), so the figure says which
reservation binds.

Teardown: time from stopping a running runner (what Nomad does to the
allocations of a purged job) to its allocation being `complete`, for our
template (`kill_signal = "SIGKILL"`, `kill_timeout = "0s"`) and for Nomad's
defaults (SIGTERM, which `sleep` as PID 1 of a container ignores, then
SIGKILL after 5 s). This is the simulator's model of Docker's stop (its
0.2 s stop delay plus the kill timeout), not a measurement of Docker.
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import Result, summary_ms
from controller.model import Environment
from controller.nomad import jobs
from nomadsim import SimConfig, SimServer
from tests.helpers import Http, wait_until
from tests.support.poseidon import POSEIDON_HCL, as_poseidon_registers, group

ENV = Environment(id=1, image="openhpi/co_execenv_python:3.8", cpu_limit=20, memory_limit=256)
NODE = {"node_cpu_mhz": 8 * 2400, "node_memory_mb": 16 * 1024, "node_disk_mb": 100 * 1024}
STOP_DELAY_MS = 200.0


def _runners(template: dict[str, Any], job_id: str, count: int) -> dict[str, Any]:
    spec = jobs.runner_job(template, jobs.environment_from_job(template, ENV.id), job_id)
    group(spec, jobs.RUNNER_GROUP)["Count"] = count
    return spec


def _before(template: dict[str, Any]) -> dict[str, Any]:
    """Our template before it followed Poseidon's: the limit reserved whole,
    Nomad's default disk, logs and kill."""
    spec = jobs.runner_job(template, ENV, "before")
    runner = group(spec, jobs.RUNNER_GROUP)
    for key in ("EphemeralDisk", "Spreads", "ReschedulePolicy"):
        runner.pop(key, None)
    task = runner["Tasks"][0]
    task["Resources"] = {"CPU": ENV.cpu_limit, "MemoryMB": ENV.memory_limit}
    for key in ("KillTimeout", "KillSignal", "LogConfig"):
        task.pop(key, None)
    return spec


def _templates(http: Http) -> dict[str, dict[str, Any]]:
    answer = http.request("POST", "/v1/jobs/parse", json={"JobHCL": POSEIDON_HCL.read_text()})
    answer.raise_for_status()
    ours = jobs.template_job(ENV)
    return {"poseidon": as_poseidon_registers(answer.json(), ENV), "ours": ours}


def runners_per_node(count: int) -> dict[str, Any]:
    sim = SimServer(
        SimConfig(
            nodes=1,
            startup_delay_ms=10,
            stop_delay_ms=10,
            node_cpu_mhz=NODE["node_cpu_mhz"],
            node_memory_mb=NODE["node_memory_mb"],
            node_disk_mb=NODE["node_disk_mb"],
        )
    )
    sim.start()
    try:
        http = Http(sim.address)
        templates = _templates(http)
        specs = {
            "poseidon": _runners(templates["poseidon"], "poseidon", count),
            "ours": _runners(templates["ours"], "ours", count),
            "ours before": _before(templates["ours"]),
        }
        group(specs["ours before"], jobs.RUNNER_GROUP)["Count"] = count
        placed: dict[str, int] = {}
        reserved: dict[str, dict[str, int]] = {}
        for name, spec in specs.items():
            job_id = spec["ID"]
            http.register(spec)

            def settled(job_id: str = job_id) -> bool:
                summary = http.get(f"/v1/job/{job_id}/summary")["Summary"][jobs.RUNNER_GROUP]
                return bool(summary["Queued"] + summary["Running"] == count)

            wait_until(settled, timeout=60, interval=0.05)
            summary = http.get(f"/v1/job/{job_id}/summary")["Summary"][jobs.RUNNER_GROUP]
            placed[name] = int(summary["Running"])
            job = http.get(f"/v1/job/{job_id}")
            runner = group(job, jobs.RUNNER_GROUP)
            resources = runner["Tasks"][0]["Resources"]
            reserved[name] = {
                "cpu_mhz": resources["CPU"],
                "memory_mb": resources["MemoryMB"],
                "memory_max_mb": resources["MemoryMaxMB"],
                "disk_mb": runner["EphemeralDisk"]["SizeMB"],
            }
            http.request("DELETE", f"/v1/job/{job_id}?purge=true").raise_for_status()
    finally:
        sim.stop()
    bounds = {
        name: min(
            ("cpu", NODE["node_cpu_mhz"] // max(r["cpu_mhz"], 1)),
            ("memory", NODE["node_memory_mb"] // max(r["memory_mb"], 1)),
            ("disk", NODE["node_disk_mb"] // max(r["disk_mb"], 1)),
            key=lambda pair: pair[1],
        )[0]
        for name, r in reserved.items()
    }
    return {"node": NODE, "placed": placed, "reserved": reserved, "bound_by": bounds}


def _stop_seconds(http: Http, spec: dict[str, Any]) -> float:
    http.register(spec)
    alloc = http.running(spec["ID"])[0]
    started = time.perf_counter()
    http.request("DELETE", f"/v1/job/{spec['ID']}").raise_for_status()
    wait_until(
        lambda: http.get(f"/v1/allocation/{alloc['ID']}")["ClientStatus"] == "complete",
        timeout=30,
        interval=0.01,
    )
    return time.perf_counter() - started


def teardown(runs: int) -> dict[str, Any]:
    sim = SimServer(SimConfig(nodes=1, startup_delay_ms=10, stop_delay_ms=STOP_DELAY_MS))
    sim.start()
    try:
        http = Http(sim.address)
        template = jobs.template_job(ENV)
        ours = [_stop_seconds(http, _runners(template, f"ours-{i}", 1)) for i in range(runs)]
        default = [
            _stop_seconds(http, _before(template) | {"ID": f"nomad-{i}", "Name": f"nomad-{i}"})
            for i in range(runs)
        ]
    finally:
        sim.stop()
    return {
        "stop_delay_ms": STOP_DELAY_MS,
        "ours": summary_ms(ours),
        "nomad_default": summary_ms(default),
    }


def run(quick: bool = False) -> Result:
    result = Result("templates", "Runner templates: runners per node, teardown")
    density = runners_per_node(600 if quick else 1000)
    stops = teardown(2 if quick else 5)
    result.details = {"runners_per_node": density, "teardown": stops}
    placed = density["placed"]
    bound = density["bound_by"]
    result.add(
        "runners per 16 GB/8-core node, Poseidon's template",
        placed["poseidon"],
        "runners",
        note=f"bound by {bound['poseidon']}",
    )
    result.add(
        "runners per 16 GB/8-core node, ours",
        placed["ours"],
        "runners",
        f"== {placed['poseidon']}",
        note=f"bound by {bound['ours']}",
    )
    result.add(
        "runners per 16 GB/8-core node, ours before (limit reserved)",
        placed["ours before"],
        "runners",
        note=f"bound by {bound['ours before']}",
    )
    result.add(
        "teardown (stop → complete), ours: SIGKILL, 0s",
        stops["ours"]["p50_ms"],
        "ms",
        note="median; the simulator's model",
    )
    result.add(
        "teardown (stop → complete), Nomad's default 5 s",
        stops["nomad_default"]["p50_ms"],
        "ms",
        note="median; the simulator's model",
    )
    return result
