"""The simulator's `/v1/jobs/parse`: the HCL of a runner template to Nomad's
API JSON, strict like jobspec2 (an unknown argument is an error, never
dropped)."""

from __future__ import annotations

import pytest

from nomadsim import SimServer
from nomadsim.errors import NomadError
from nomadsim.jobspec import parse_job
from tests.helpers import Http

S = 1_000_000_000

NETWORK_JOB = """
job "runner" {
  type = "batch"
  meta { team = "co" }
  group "default-group" {
    network {
      mode = "cni/secure-bridge"
      port "8080" { to = 8080 }
      port "admin" { static = 9000 }
    }
    constraint {
      attribute = "${node.class}"
      value     = "runner"
    }
    task "default-task" {
      driver = "docker"
      shutdown_delay = "1m30s"
      config {
        image   = "img"
        runtime = "runsc"
        cap_drop = ["net_raw"]
      }
      env { LANG = "C.UTF-8" }
      resources {
        cpu        = 20
        memory     = 50
        memory_max = 256
      }
    }
  }
}
"""


def test_a_runner_template_with_network_and_constraints() -> None:
    job = parse_job(NETWORK_JOB)
    assert (job["ID"], job["Type"], job["Meta"]) == ("runner", "batch", {"team": "co"})
    group = job["TaskGroups"][0]
    assert group["Networks"] == [
        {
            "Mode": "cni/secure-bridge",
            "DynamicPorts": [{"Label": "8080", "Value": 0, "To": 8080}],
            "ReservedPorts": [{"Label": "admin", "Value": 9000, "To": 0}],
        }
    ]
    assert group["Constraints"] == [{"LTarget": "${node.class}", "RTarget": "runner"}]
    task = group["Tasks"][0]
    assert task["Config"] == {"image": "img", "runtime": "runsc", "cap_drop": ["net_raw"]}
    assert task["Env"] == {"LANG": "C.UTF-8"}
    assert task["ShutdownDelay"] == 90 * S
    assert task["Resources"] == {"CPU": 20, "MemoryMB": 50, "MemoryMaxMB": 256}


@pytest.mark.parametrize(
    ("hcl", "says"),
    [
        ('job "a" { colour = "red" }', 'An argument named "colour" is not expected here'),
        ('job "a" { group "g" { volume "v" {} } }', 'An argument named "volume"'),
        ('variable "image" {}\njob "a" {}', 'Blocks of type "variable" are not expected here'),
        ('job "a" { group "g" { task "t" { kill_timeout = "5 s" } } }', "invalid duration"),
        ('job "a" { datacenters = ["${var.dc}"] }', "variables and locals are not supported"),
        ('job "a" { group "g" { count = "two" } }', "a number is required"),
        ('job "a" {', "Invalid HCL"),
        ("", "A job block is required"),
    ],
)
def test_what_nomad_would_refuse_is_refused_with_its_words(hcl: str, says: str) -> None:
    with pytest.raises(NomadError) as caught:
        parse_job(hcl)
    assert caught.value.status == 400 and says in caught.value.text


def test_the_endpoint_parses_and_canonicalizes(sim: SimServer) -> None:
    http = Http(sim.address)
    plain = http.request("POST", "/v1/jobs/parse", json={"JobHCL": NETWORK_JOB})
    assert plain.status_code == 200 and "Priority" not in plain.json()
    full = http.request("PUT", "/v1/jobs/parse", json={"JobHCL": NETWORK_JOB, "Canonicalize": True})
    assert full.status_code == 200
    assert full.json()["Priority"] == 50 and full.json()["Datacenters"] == ["*"]
    bad = http.request("POST", "/v1/jobs/parse", json={"JobHCL": 'job "a" { x = 1 }'})
    assert bad.status_code == 400 and 'argument named "x"' in bad.text
    missing = http.request("POST", "/v1/jobs/parse", json={})
    assert (missing.status_code, missing.text) == (400, "Job HCL must be specified")
