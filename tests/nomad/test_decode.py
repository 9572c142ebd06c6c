"""Decoding Nomad's JSON into the model, on literal samples: an allocation list
stub as Nomad 1.11 writes it, a full Allocation with its zero-valued fields
omitted, the documentation's older samples, and job list stubs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.model import Allocation, PortMapping
from controller.nomad.decode import (
    decode_allocation,
    decode_job_stub,
    decode_ports,
    parse_go_time,
)
from controller.nomad.gateway import JobStub

SECOND = 1_000_000_000


def event(kind: str, time: int, **details: str) -> dict[str, Any]:
    return {"Type": kind, "Time": time, "Message": "", "Details": details, "ExitCode": 0}


# GET /v1/allocations?resources=true&task_states=true, one stub: a runner that
# was OOM-killed once and restarted in place (fields Nomad always writes).
STUB = json.loads(
    """
{
  "ID": "fcbd04c3-4021-4ef7-8ca5-a5a19e4d6e3c",
  "EvalID": "1846d424-c17c-4279-a3c6-612f48268673",
  "Name": "1-a.default-group[0]",
  "Namespace": "default",
  "NodeID": "e3e70682-c209-4cac-a29f-6fbed82c07cd",
  "NodeName": "agent-1",
  "JobID": "1-a",
  "JobType": "batch",
  "JobVersion": 0,
  "TaskGroup": "default-group",
  "AllocatedResources": {
    "Tasks": {"default-task": {"Cpu": {"CpuShares": 100, "ReservedCores": null},
      "Memory": {"MemoryMB": 256, "MemoryMaxMB": 0}, "Networks": null, "Devices": null}},
    "TaskLifecycles": {"default-task": null},
    "Shared": {
      "Networks": [{"Mode": "bridge", "IP": "10.0.0.7",
        "DynamicPorts": [{"Label": "8080", "Value": 20000, "To": 8080, "HostNetwork": "default"}]}],
      "DiskMB": 300,
      "Ports": [{"Label": "8080", "Value": 20000, "To": 8080, "HostIP": "10.0.0.7"}]
    }
  },
  "DesiredStatus": "run",
  "DesiredDescription": "",
  "ClientStatus": "running",
  "ClientDescription": "Tasks are running",
  "DesiredTransition": {"Migrate": null, "Reschedule": null, "ForceReschedule": null,
    "NoShutdownDelay": null, "MigrateDisablePlacement": null},
  "TaskStates": {
    "default-task": {
      "State": "running",
      "Failed": false,
      "Restarts": 1,
      "LastRestart": "2026-12-02T16:33:07.913259447Z",
      "StartedAt": "2026-12-02T16:33:07.929326544Z",
      "FinishedAt": null,
      "Events": [
        {"Type": "Received", "Time": 1796229187876832233, "Details": {}},
        {"Type": "Started", "Time": 1796229187907489550, "Details": {}},
        {"Type": "Terminated", "Time": 1796229187913259447, "Message": "OOM Killed",
         "Details": {"exit_code": "137", "oom_killed": "true", "signal": "9"}, "ExitCode": 137},
        {"Type": "Restarting", "Time": 1796229187913259447, "Details": {},
         "RestartReason": "Restart within policy", "StartDelay": 15000000000},
        {"Type": "Started", "Time": 1796229187929326544, "Details": {}}
      ],
      "Paused": ""
    }
  },
  "DeploymentStatus": null,
  "FollowupEvalID": "",
  "NextAllocation": "",
  "RescheduleTracker": null,
  "PreemptedAllocations": null,
  "PreemptedByAllocation": "",
  "CreateIndex": 6,
  "ModifyIndex": 11,
  "CreateTime": 1796229187876591878,
  "ModifyTime": 1796229187929363040
}
"""
)


def test_list_stub() -> None:
    assert decode_allocation(STUB) == Allocation(
        id="fcbd04c3-4021-4ef7-8ca5-a5a19e4d6e3c",
        job_id="1-a",
        node_id="e3e70682-c209-4cac-a29f-6fbed82c07cd",
        node_name="agent-1",
        client_status="running",
        desired_status="run",
        desired_description="",
        migrate=False,
        create_index=6,
        modify_index=11,
        create_time=1796229187876591878,
        modify_time=1796229187929363040,
        restarts=1,
        last_exit_oom=True,
        started_at=1796229187929326544,
        ports=(PortMapping(exposed_port=8080, host_address="10.0.0.7:20000"),),
    )


# A full Allocation (GET /v1/allocation/:id or an event payload) being migrated
# off a draining node: every empty field is simply absent.
FULL_MIGRATING = json.loads(
    """
{
  "ID": "a1",
  "Namespace": "default",
  "EvalID": "e1",
  "Name": "7-x.default-group[0]",
  "NodeID": "n3",
  "NodeName": "agent-3",
  "JobID": "7-x",
  "TaskGroup": "default-group",
  "AllocatedResources": {"Tasks": {}, "Shared": {"DiskMB": 300}},
  "DesiredStatus": "stop",
  "DesiredDescription": "alloc is being migrated",
  "DesiredTransition": {"Migrate": true},
  "ClientStatus": "running",
  "TaskStates": {"default-task": {"State": "running", "Failed": false,
    "StartedAt": "2026-01-05T10:00:01.5Z", "LastRestart": null, "FinishedAt": null,
    "Events": [{"Type": "Started", "Time": 1767607201500000000}]}},
  "NextAllocation": "a2",
  "CreateIndex": 40,
  "ModifyIndex": 52,
  "AllocModifyIndex": 40,
  "CreateTime": 1767607200000000000,
  "ModifyTime": 1767607300000000000
}
"""
)


def test_full_allocation_with_omitted_fields() -> None:
    alloc = decode_allocation(FULL_MIGRATING)
    assert alloc.migrate is True
    assert (alloc.desired_status, alloc.desired_description) == ("stop", "alloc is being migrated")
    assert alloc.restarts == 0  # no Restarts key: zero
    assert alloc.last_exit_oom is False
    assert alloc.started_at == 1767607201 * SECOND + SECOND // 2
    assert alloc.ports == ()


def test_a_pending_allocation_with_almost_nothing() -> None:
    alloc = decode_allocation({"ID": "a9", "JobID": "9-z", "CreateIndex": 3})
    assert alloc == Allocation(id="a9", job_id="9-z", create_index=3)
    assert (alloc.client_status, alloc.desired_status, alloc.started_at) == ("pending", "run", None)


def test_null_task_states_and_transition() -> None:
    stub = {**STUB, "TaskStates": None, "DesiredTransition": None, "AllocatedResources": None}
    alloc = decode_allocation(stub)
    assert (alloc.restarts, alloc.last_exit_oom, alloc.started_at, alloc.migrate) == (
        0,
        False,
        None,
        False,
    )
    assert alloc.ports == ()


def test_oom_is_judged_by_the_newest_terminated_event_across_tasks() -> None:
    oom = event("Terminated", 100, oom_killed="true", exit_code="137")
    clean_later = event("Terminated", 200, oom_killed="false", exit_code="1")
    states = {
        "main": {"Restarts": 2, "Events": [oom]},
        "sidecar": {"Restarts": 1, "Events": [event("Started", 50), clean_later]},
    }
    alloc = decode_allocation({"ID": "a", "JobID": "j", "TaskStates": states})
    assert alloc.restarts == 3
    assert alloc.last_exit_oom is False

    states["sidecar"]["Events"] = [event("Started", 50), event("Terminated", 90)]
    assert decode_allocation({"ID": "a", "JobID": "j", "TaskStates": states}).last_exit_oom is True
    # A later Killed or Restarting event is not an exit: the OOM stays the newest.
    states["main"]["Events"] = [oom, event("Restarting", 150), event("Killed", 300)]
    assert decode_allocation({"ID": "a", "JobID": "j", "TaskStates": states}).last_exit_oom is True


def test_started_at_is_the_earliest_start_of_any_task() -> None:
    states = {
        "main": {"StartedAt": "2026-01-05T10:00:03Z"},
        "sidecar": {"StartedAt": "2026-01-05T10:00:01.000000001Z"},
        "prestart": {"StartedAt": None},
        "never": {"StartedAt": "0001-01-01T00:00:00Z"},
    }
    alloc = decode_allocation({"ID": "a", "JobID": "j", "TaskStates": states})
    assert alloc.started_at == 1767607201 * SECOND + 1


# The allocation list sample of Nomad's API docs (2021): offsets instead of
# Z, DesiredTransition with nulls, no AllocatedResources.
DOCS_STUB = json.loads(
    """
{
  "ClientDescription": "Tasks are running",
  "ClientStatus": "running",
  "CreateIndex": 10,
  "CreateTime": 1636017249798459000,
  "DeploymentStatus": {"Canary": false, "Healthy": true, "ModifyIndex": 15,
    "Timestamp": "2021-11-04T10:14:22.054814+01:00"},
  "DesiredDescription": "",
  "DesiredStatus": "run",
  "DesiredTransition": {"ForceReschedule": null, "Migrate": null, "Reschedule": null},
  "EvalID": "cb20d15d-861f-8d8d-8253-e93932beea2e",
  "FollowupEvalID": "",
  "ID": "5457f16d-0f87-8e6b-5e91-0c7da3a41eb7",
  "JobID": "example",
  "JobType": "service",
  "JobVersion": 0,
  "ModifyIndex": 15,
  "ModifyTime": 1636017262190928000,
  "Name": "example.cache[0]",
  "Namespace": "default",
  "NodeID": "f476d2b4-02dc-c216-d031-273396727347",
  "NodeName": "linux",
  "PreemptedAllocations": null,
  "PreemptedByAllocation": "",
  "RescheduleTracker": null,
  "TaskGroup": "cache",
  "TaskStates": {
    "redis": {
      "Events": [
        {"Details": {}, "Time": 1636017249803624000, "Type": "Received"},
        {"Details": {"message": "Building Task Directory"}, "Time": 1636017249805254000,
         "Type": "Task Setup"},
        {"Details": {}, "Time": 1636017252049956000, "Type": "Started"}
      ],
      "Failed": false,
      "FinishedAt": null,
      "LastRestart": null,
      "Restarts": 0,
      "StartedAt": "2021-11-04T09:14:12.04996Z",
      "State": "running",
      "TaskHandle": null
    }
  }
}
"""
)


def test_docs_sample() -> None:
    alloc = decode_allocation(DOCS_STUB)
    assert (alloc.id, alloc.job_id, alloc.node_name) == (
        "5457f16d-0f87-8e6b-5e91-0c7da3a41eb7",
        "example",
        "linux",
    )
    assert alloc.started_at == 1636017252 * SECOND + 49_960_000
    assert (alloc.create_time, alloc.modify_index, alloc.restarts) == (1636017249798459000, 15, 0)


# -- ports -----------------------------------------------------------------------------


def test_ports_fall_back_to_the_networks() -> None:
    allocated = {
        "Shared": {
            "Ports": None,
            "Networks": [
                {
                    "Mode": "host",
                    "IP": "192.168.1.4",
                    "ReservedPorts": [{"Label": "ssh", "Value": 2222}],
                    "DynamicPorts": [{"Label": "http", "Value": 23456, "To": 8080}],
                }
            ],
        }
    }
    assert decode_ports(allocated) == (
        PortMapping(exposed_port=2222, host_address="192.168.1.4:2222"),
        PortMapping(exposed_port=8080, host_address="192.168.1.4:23456"),
    )


def test_ports_of_task_networks_and_ipv6() -> None:
    allocated = {
        "Tasks": {
            "web": {
                "Networks": [
                    {"IP": "fd00::5", "DynamicPorts": [{"Label": "p", "Value": 21000, "To": -1}]}
                ]
            }
        },
        "Shared": {"DiskMB": 300},
    }
    assert decode_ports(allocated) == (
        PortMapping(exposed_port=21000, host_address="[fd00::5]:21000"),
    )


def test_shared_ports_win_and_to_defaults_to_the_host_port() -> None:
    allocated = {
        "Shared": {
            "Ports": [
                {"Label": "a", "Value": 20001, "To": 3000, "HostIP": "10.1.1.1"},
                {"Label": "b", "Value": 20002, "HostIP": "10.1.1.1"},  # To omitted
            ],
            "Networks": [{"IP": "10.9.9.9", "DynamicPorts": [{"Label": "x", "Value": 1}]}],
        }
    }
    assert decode_ports(allocated) == (
        PortMapping(exposed_port=3000, host_address="10.1.1.1:20001"),
        PortMapping(exposed_port=20002, host_address="10.1.1.1:20002"),
    )
    assert decode_ports({}) == ()


# -- times -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-02T16:33:07.90748955Z", 1796229187 * SECOND + 907_489_550),
        ("2026-12-02T16:33:07.123456789Z", 1796229187 * SECOND + 123_456_789),
        ("2026-12-02T16:33:07Z", 1796229187 * SECOND),
        ("2021-11-04T10:14:22.054814+01:00", 1636017262 * SECOND + 54_814_000),
        ("2020-10-15T10:07:37.904159516-04:00", 1602770857 * SECOND + 904_159_516),
        ("1970-01-01T00:00:00.000000001Z", 1),
        ("0001-01-01T00:00:00Z", None),
        (None, None),
        ("", None),
        ("yesterday", None),
        ("2026-13-45T99:00:00Z", None),
        (1796229187907489550, None),  # integers are not RFC 3339 times
    ],
)
def test_parse_go_time(text: Any, expected: int | None) -> None:
    assert parse_go_time(text) == expected


# -- job stubs ---------------------------------------------------------------------------


def test_job_stub_as_nomad_writes_it() -> None:
    raw = json.loads(
        """
        {"ID": "1-a", "ParentID": "", "Name": "1-a", "Namespace": "default", "Datacenters": ["*"],
         "NodePool": "default", "Multiregion": null, "Type": "batch", "Priority": 50,
         "Periodic": false, "ParameterizedJob": false, "Stop": true, "Status": "dead",
         "StatusDescription": "", "JobSummary": {"JobID": "1-a", "Namespace": "default",
         "Summary": {}, "Children": {"Pending": 0, "Running": 0, "Dead": 0},
         "CreateIndex": 5, "ModifyIndex": 11}, "CreateIndex": 5, "ModifyIndex": 14,
         "JobModifyIndex": 13, "SubmitTime": 1796229187876168848}
        """
    )
    assert decode_job_stub(raw) == JobStub(
        id="1-a",
        job_modify_index=13,
        modify_index=14,
        create_index=5,
        submit_time=1796229187876168848,
        status="dead",
        stop=True,
        type="batch",
    )


def test_job_stub_of_the_docs_sample_lacks_fields() -> None:
    raw = json.loads(
        """
        {"ID": "example", "ParentID": "", "Name": "example", "Type": "service", "Priority": 50,
         "Status": "pending", "StatusDescription": "", "JobSummary": null,
         "CreateIndex": 52, "ModifyIndex": 93, "JobModifyIndex": 52}
        """
    )
    stub = decode_job_stub(raw)
    assert (stub.id, stub.job_modify_index, stub.modify_index, stub.create_index) == (
        "example",
        52,
        93,
        52,
    )
    assert (stub.submit_time, stub.stop, stub.status, stub.type) == (0, False, "pending", "service")


# -- how much notice a restart gives (a full Allocation with its Job) -------------------

FAIL_15S = {"Attempts": 3, "Interval": 3600 * SECOND, "Delay": 15 * SECOND, "Mode": "fail"}


def with_job(group: dict[str, Any], name: str = "default-group") -> dict[str, Any]:
    """A full allocation of the group `name` whose job holds `group`."""
    return {"ID": "a", "TaskGroup": name, "Job": {"TaskGroups": [{"Name": name, **group}]}}


def task(**fields: Any) -> dict[str, Any]:
    return {"Name": "default-task", "Driver": "docker", **fields}


@pytest.mark.parametrize(
    ("name", "raw", "notice"),
    [
        ("a list stub or event payload carries no job", {"ID": "a"}, None),
        ("the allocation's group is not in its job", with_job({}) | {"TaskGroup": "x"}, None),
        (
            "the group's policy (Poseidon's template: 15 s)",
            with_job({"RestartPolicy": FAIL_15S, "Tasks": [task()]}),
            15 * SECOND,
        ),
        (
            "a task's own policy wins over its group's",
            with_job(
                {
                    "RestartPolicy": FAIL_15S,
                    "Tasks": [task(RestartPolicy=FAIL_15S | {"Delay": SECOND})],
                }
            ),
            SECOND,
        ),
        (
            "the shortest over the tasks",
            with_job(
                {
                    "RestartPolicy": FAIL_15S,
                    "Tasks": [task(), task(RestartPolicy=FAIL_15S | {"Delay": 2 * SECOND})],
                }
            ),
            2 * SECOND,
        ),
        (
            "mode delay past its attempts waits only until the interval ends",
            with_job({"RestartPolicy": FAIL_15S | {"Mode": "delay"}, "Tasks": [task()]}),
            0,
        ),
        (
            "no attempts: the task never restarts",
            with_job({"RestartPolicy": FAIL_15S | {"Attempts": 0}, "Tasks": [task()]}),
            2**63 - 1,
        ),
        (
            "a template re-rendered restarts its task at once (restart is the default)",
            with_job({"RestartPolicy": FAIL_15S, "Tasks": [task(Templates=[{"DestPath": "x"}])]}),
            0,
        ),
        (
            "a template that only signals does not restart",
            with_job(
                {
                    "RestartPolicy": FAIL_15S,
                    "Tasks": [task(Templates=[{"ChangeMode": "signal"}])],
                }
            ),
            15 * SECOND,
        ),
        (
            "a check's check_restart restarts at once",
            with_job(
                {
                    "RestartPolicy": FAIL_15S,
                    "Tasks": [task(Services=[{"Checks": [{"CheckRestart": {"Limit": 3}}]}])],
                }
            ),
            0,
        ),
        (
            "a group service's check_restart too",
            with_job(
                {
                    "RestartPolicy": FAIL_15S,
                    "Services": [{"CheckRestart": {"Limit": 1}}],
                    "Tasks": [task()],
                }
            ),
            0,
        ),
    ],
)
def test_restart_notice_comes_from_the_job_the_allocation_runs(
    name: str, raw: dict[str, Any], notice: int | None
) -> None:
    assert decode_allocation(raw).restart_notice_ns == notice, name


def test_restart_notice_is_not_part_of_an_allocations_identity() -> None:
    full = decode_allocation(with_job({"RestartPolicy": FAIL_15S, "Tasks": [task()]}))
    assert full.restart_notice_ns == 15 * SECOND
    assert full == decode_allocation({"ID": "a"})


def test_what_many_allocations_and_jobs_name_alike_is_one_string() -> None:
    """Two answers decoded apart: nodes, statuses and job ids come out as one
    object each, as 10,000 runners on a few dozen nodes hold them."""
    first, second = json.loads(json.dumps(STUB)), json.loads(json.dumps(STUB))
    a, b = decode_allocation(first), decode_allocation(second)
    assert first["NodeID"] is not second["NodeID"]  # json made two
    for field in ("job_id", "node_id", "node_name", "client_status", "desired_status"):
        assert getattr(a, field) is getattr(b, field), field
    stub = json.loads('{"ID": "1-a", "Status": "running", "Type": "batch"}')
    again = json.loads('{"ID": "1-a", "Status": "running", "Type": "batch"}')
    s, t = decode_job_stub(stub), decode_job_stub(again)
    assert s.id is t.id is a.job_id and s.status is t.status and s.type is t.type
