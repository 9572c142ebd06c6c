"""Our template against Poseidon's: one environment registered through
Poseidon's own template HCL (parsed by Nomad's `/v1/jobs/parse`, with the
environment's fields applied as Poseidon's `nomad_environment.go` applies
them) and through `template_job`, read back from Nomad and diffed. What
differs is exactly what docs/templates.md documents; the environment reads
back whole from both."""

from __future__ import annotations

from typing import Any

import pytest

from controller.model import Environment
from controller.nomad import jobs
from nomadsim import SimServer
from tests.helpers import Http
from tests.support.poseidon import NETWORK_MODE, POSEIDON_HCL, as_poseidon_registers, group


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of a job by its path (groups and tasks keyed by name)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{path}/{key}"))
        return out
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, dict) and "Name" in v for v in value)
    ):
        out = {}
        for item in value:
            out.update(flatten(item, f"{path}[{item['Name']}]"))
        return out
    return {path: value}


# Server-kept fields and ids: not part of what a template says.
IGNORED = {
    "/ID",
    "/Name",
    "/Status",
    "/Version",
    "/SubmitTime",
    "/CreateIndex",
    "/ModifyIndex",
    "/JobModifyIndex",
}

# What docs/templates.md documents as ours on purpose.
DOCUMENTED = {
    # Poseidon's template job runs one allocation itself; ours never runs.
    "/TaskGroups[default-group]/Count",
    # Poseidon's file names a development agent's datacenter; ours is a setting (`*`).
    "/Datacenters",
    # Runner hardening (NRC_TEMPLATE_PIDS_LIMIT, _CAP_DROP, _NO_NEW_PRIVILEGES).
    "/TaskGroups[default-group]/Tasks[default-task]/Config/pids_limit",
    "/TaskGroups[default-group]/Tasks[default-task]/Config/cap_drop",
    "/TaskGroups[default-group]/Tasks[default-task]/Config/security_opt",
    # The site policy the template was written under.
    "/TaskGroups[config]/Meta/nrc_template_policy",
}

ENVIRONMENTS = [
    Environment(id=7, image="openhpi/co_execenv_python:3.8", cpu_limit=20, memory_limit=256),
    Environment(
        id=7,
        image="openhpi/co_execenv_java:17",
        cpu_limit=40,
        memory_limit=1024,
        network_access=True,
        exposed_ports=(3000, 8080),
        prewarming_pool_size=4,
    ),
]


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=["no network", "network and ports"])
def test_our_template_is_poseidons_but_for_what_is_documented(
    sim: SimServer, env: Environment
) -> None:
    http = Http(sim.address)
    answer = http.request("POST", "/v1/jobs/parse", json={"JobHCL": POSEIDON_HCL.read_text()})
    assert answer.status_code == 200, answer.text
    poseidon = as_poseidon_registers(answer.json(), env)
    ours = jobs.template_job(env, jobs.TemplatePolicy(network_mode=NETWORK_MODE))

    read_back = {}
    for name, job in (("poseidon", poseidon), ("ours", ours)):
        http.register(job)
        read_back[name] = http.get(f"/v1/job/{job['ID']}")
        http.request("DELETE", f"/v1/job/{job['ID']}?purge=true").raise_for_status()

    theirs, mine = flatten(read_back["poseidon"]), flatten(read_back["ours"])
    differing = {
        path
        for path in set(theirs) | set(mine)
        if path not in IGNORED and theirs.get(path, "<absent>") != mine.get(path, "<absent>")
    }
    assert differing == DOCUMENTED, {p: (theirs.get(p), mine.get(p)) for p in differing}
    # And the values of what is documented:
    assert theirs["/TaskGroups[default-group]/Count"] == 1
    assert mine["/TaskGroups[default-group]/Count"] == 0
    assert (theirs["/Datacenters"], mine["/Datacenters"]) == (["dc1"], ["*"])

    for spec in read_back.values():
        assert jobs.environment_from_job(spec, env.id) == env, "PUT → GET is exact"


def test_poseidons_template_parses_as_nomad_reads_it(sim: SimServer) -> None:
    parsed = Http(sim.address).request(
        "POST", "/v1/jobs/parse", json={"JobHCL": POSEIDON_HCL.read_text()}
    )
    runner = group(parsed.json(), "default-group")
    task = runner["Tasks"][0]
    assert runner["EphemeralDisk"] == {"Migrate": False, "SizeMB": 10, "Sticky": False}
    assert runner["Spreads"] == [{"Attribute": "${node.unique.name}", "Weight": 100}]
    assert runner["RestartPolicy"]["Delay"] == 15_000_000_000
    assert runner["ReschedulePolicy"]["MaxDelay"] == 240_000_000_000
    assert (task["KillTimeout"], task["KillSignal"]) == (0, "SIGKILL")
    assert task["Resources"] == {"CPU": 40, "MemoryMB": 50}
    assert task["LogConfig"] == {"MaxFiles": 1, "MaxFileSizeMB": 1}
