"""Placement by what Nomad's scheduler reserves (CPU, MemoryMB, ephemeral
disk, dynamic ports) against each node's capacity, memory oversubscription,
and kill_timeout/kill_signal in stop times."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from controller.model import Environment
from controller.nomad import jobs
from nomadsim import SimServer
from nomadsim.ports import DYNAMIC_PORTS, Ports
from nomadsim.records import Node
from tests.helpers import Http, runner_job, wait_until

MakeSim = Callable[..., SimServer]
ENV = Environment(id=1, image="python:3.12", cpu_limit=20, memory_limit=256)


def queued(http: Http, job_id: str) -> int:
    return int(http.get(f"/v1/job/{job_id}/summary")["Summary"]["default-group"]["Queued"])


def template_runners(count: int) -> dict[str, Any]:
    """Runners as our template builds them (50 MB reserved, MemoryMaxMB 256)."""
    spec = jobs.runner_job(jobs.template_job(ENV), ENV, "runners")
    spec["TaskGroups"][0]["Count"] = count
    return spec


def test_memory_max_is_not_reserved(make_sim: MakeSim) -> None:
    # 1,000 MB: 20 runners of 50 MB reserved each, though each may use 256.
    http = Http(make_sim(nodes=1, node_memory_mb=1000).address)
    http.register(template_runners(21))
    assert len(http.running("runners", 20)) == 20
    assert queued(http, "runners") == 1


def test_the_reservation_is_memory_mb(make_sim: MakeSim) -> None:
    http = Http(make_sim(nodes=1, node_memory_mb=1000).address)
    http.register(runner_job("big", count=5, memory=256))  # MemoryMB 256, no maximum
    assert len(http.running("big", 3)) == 3
    assert queued(http, "big") == 2


def test_ephemeral_disk_is_reserved(make_sim: MakeSim) -> None:
    # Nomad's default disk is 300 MB per allocation: 3 fit in 1,000 MB; ours is 10.
    http = Http(make_sim(nodes=1, node_disk_mb=1000).address)
    http.register(runner_job("default-disk", count=4))
    assert len(http.running("default-disk", 3)) == 3
    assert queued(http, "default-disk") == 1
    node = http.get("/v1/nodes?resources=true")[0]
    assert node["NodeResources"]["Disk"]["DiskMB"] == 1000


def test_a_node_without_free_dynamic_ports_takes_no_more() -> None:
    ports = Ports()
    node = Node(id="n", secret_id="s", name="n", datacenter="dc1", http_addr="1.2.3.4:4646",
                cpu_mhz=1, memory_mb=1)  # fmt: skip
    group = {"Networks": [{"DynamicPorts": [{"Label": "a"}, {"Label": "b"}]}]}
    assert ports.fits(node, group) and ports.fits(node, {"Networks": []})
    for i in range(len(DYNAMIC_PORTS) // 2):
        ports.assign(f"a{i}", node, group)
    assert len(DYNAMIC_PORTS) % 2 == 1, "one port left"
    assert not ports.fits(node, group)
    assert ports.fits(node, {"Networks": [{"DynamicPorts": [{"Label": "a"}]}]})
    assert ports.fits(node, {}), "a group without ports always fits"


def test_without_oversubscription_memory_max_is_a_warning(make_sim: MakeSim) -> None:
    off = Http(make_sim(memory_oversubscription=False).address)
    on = Http(make_sim().address)
    spec = template_runners(1)
    assert off.register(spec)["Warnings"] == (
        "1 warning(s):\n\n* Memory oversubscription is not enabled; Task "
        '"default-group.default-task" memory_max value will be ignored. Update the '
        "Scheduler Configuration to allow oversubscription."
    )
    assert on.register(spec)["Warnings"] == ""


def stop_time(http: Http, job: dict[str, Any]) -> float:
    """Seconds from stopping the job's running allocation to its completion."""
    http.register(job)
    alloc = http.running(job["ID"])[0]
    started = time.monotonic()
    assert http.request("DELETE", f"/v1/job/{job['ID']}").ok
    wait_until(
        lambda: http.get(f"/v1/allocation/{alloc['ID']}")["ClientStatus"] == "complete",
        timeout=10,
    )
    return time.monotonic() - started


def test_a_sleeping_task_takes_its_kill_timeout_unless_killed_with_sigkill(
    make_sim: MakeSim,
) -> None:
    # time_scale 0.1: Nomad's default 5 s kill_timeout waits 0.5 s here.
    http = Http(make_sim(kill_timeouts=True, time_scale=0.1).address)
    default = stop_time(http, runner_job("default"))
    poseidon = stop_time(http, template_runners(1))  # SIGKILL, kill_timeout 0s
    assert default >= 0.5, default
    assert poseidon < 0.3, poseidon
    killing = next(
        e
        for e in http.get("/v1/job/default/allocations")[0]["TaskStates"]["default-task"]["Events"]
        if e["Type"] == "Killing"
    )
    assert killing["KillTimeout"] == 5_000_000_000
