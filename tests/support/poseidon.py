"""Poseidon's runner template as Poseidon registers it: its default template
HCL (tests/reference, MIT) parsed by Nomad's `/v1/jobs/parse`, then the
environment's fields applied as Poseidon's `nomad_environment.go` applies
them. Shared by the template diff test and the density benchmark."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from controller.model import Environment
from controller.nomad import jobs

POSEIDON_HCL = Path(__file__).parent.parent / "reference" / "poseidon-production-template.hcl"

# Poseidon's configuration example: network-enabled runners on a CNI bridge.
NETWORK_MODE = "cni/secure-bridge"


def group(job: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(g for g in job["TaskGroups"] if g["Name"] == name)
    return found


def as_poseidon_registers(parsed: dict[str, Any], env: Environment) -> dict[str, Any]:
    """What Poseidon registers for `env` from its parsed template: its id,
    pool size, CPU, memory limit as MemoryMaxMB, image, network, then
    force_pull (NewNomadEnvironmentFromRequest, then Register)."""
    job = copy.deepcopy(parsed)
    job["ID"] = job["Name"] = jobs.template_job_id(env.id)
    group(job, "config").setdefault("Meta", {})["prewarmingPoolSize"] = str(
        env.prewarming_pool_size
    )
    runner = group(job, "default-group")
    task = runner["Tasks"][0]
    task["Resources"]["CPU"] = env.cpu_limit
    task["Resources"]["MemoryMaxMB"] = env.memory_limit
    task["Config"]["image"] = env.image
    if env.network_access:
        ports = [{"Label": str(p), "To": p} for p in env.exposed_ports]
        runner["Networks"] = [{"Mode": NETWORK_MODE, "DynamicPorts": ports}]
        task["Config"]["network_mode"] = ""
    else:
        task["Config"]["network_mode"] = "none"
        runner["Networks"] = []
    task["Config"]["force_pull"] = True
    return job
