"""Nomad's JSON rules, in one place.

Nomad encodes responses from its Go structs: keys in declaration order (not
sorted), `time.Duration` as integer nanoseconds, a zero `time.Time` as null and
any other as RFC 3339 with nanoseconds. Allocation and Evaluation carry a
struct-wide `omitempty`, so every zero-valued field is left out of them (a
first allocation has no `PreviousAllocation` key at all), while list stubs,
Job and Node always write every field. Field lists follow
`tests/reference/nomad-struct-fields.md`."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from nomadsim.records import (
    Alloc,
    Eval,
    JsonDict,
    Node,
    TaskEvent,
    TaskState,
    Variable,
)

SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


class JobValidationError(ValueError):
    """A job Nomad would refuse to register."""


def go_time(ns: int) -> str | None:
    """Go's time.Time as JSON: null when zero, else RFC3339Nano in UTC."""
    if ns == 0:
        return None
    seconds, frac = divmod(ns, SECOND)
    base = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        base += "." + f"{frac:09d}".rstrip("0")
    return base + "Z"


def go_duration(ns: int) -> str:
    """Go's time.Duration.String() for whole units, e.g. 15s, 1m30s, 24h0m0s."""
    if ns == 0:
        return "0s"
    total_s, rem = divmod(ns, SECOND)
    hours, rest = divmod(total_s, 3600)
    minutes, seconds = divmod(rest, 60)
    sec = f"{seconds}" if rem == 0 else f"{seconds}.{f'{rem:09d}'.rstrip('0')}"
    if hours:
        return f"{hours}h{minutes}m{sec}s"
    if minutes:
        return f"{minutes}m{sec}s"
    if total_s == 0:
        if rem % 1_000_000 == 0:
            return f"{rem // 1_000_000}ms"
        if rem % 1000 == 0:
            return f"{rem // 1000}µs"
        return f"{rem}ns"
    return f"{sec}s"


def json_bytes(obj: Any) -> bytes:
    """Compact JSON as Nomad writes it (no spaces, UTF-8 as is)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == 0 or value is False or value in ({}, [])


def omitempty(pairs: list[tuple[str, Any]]) -> JsonDict:
    return {k: v for k, v in pairs if not _empty(v)}


# -- jobs ---------------------------------------------------------------------

JOB_FIELDS = [
    "Stop",
    "Region",
    "Namespace",
    "ID",
    "ParentID",
    "Name",
    "Type",
    "Priority",
    "AllAtOnce",
    "Datacenters",
    "NodePool",
    "Constraints",
    "Affinities",
    "Spreads",
    "TaskGroups",
    "Update",
    "Multiregion",
    "Periodic",
    "ParameterizedJob",
    "Dispatched",
    "DispatchIdempotencyToken",
    "Payload",
    "Meta",
    "ConsulNamespace",
    "VaultNamespace",
    "NomadTokenID",
    "Status",
    "StatusDescription",
    "Stable",
    "Version",
    "SubmitTime",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
    "UI",
    "VersionTag",
]

TASK_GROUP_FIELDS = [
    "Name",
    "Count",
    "Update",
    "Migrate",
    "Constraints",
    "Scaling",
    "RestartPolicy",
    "Disconnect",
    "Tasks",
    "EphemeralDisk",
    "Meta",
    "ReschedulePolicy",
    "Affinities",
    "Spreads",
    "Networks",
    "Consul",
    "Services",
    "Volumes",
    "ShutdownDelay",
    "StopAfterClientDisconnect",
    "MaxClientDisconnect",
    "PreventRescheduleOnLost",
]

TASK_FIELDS = [
    "Name",
    "Driver",
    "User",
    "Config",
    "Env",
    "Services",
    "Vault",
    "Consul",
    "Templates",
    "Constraints",
    "Affinities",
    "Resources",
    "RestartPolicy",
    "DispatchPayload",
    "Lifecycle",
    "Meta",
    "KillTimeout",
    "LogConfig",
    "Artifacts",
    "Leader",
    "ShutdownDelay",
    "VolumeMounts",
    "ScalingPolicies",
    "KillSignal",
    "Kind",
    "CSIPluginConfig",
]

RESOURCE_FIELDS = [
    "CPU",
    "Cores",
    "MemoryMB",
    "MemoryMaxMB",
    "DiskMB",
    "IOPS",
    "Networks",
    "Devices",
]

UPDATE_FIELDS = [
    "Stagger",
    "MaxParallel",
    "HealthCheck",
    "MinHealthyTime",
    "HealthyDeadline",
    "ProgressDeadline",
    "AutoRevert",
    "AutoPromote",
    "Canary",
]

# Defaults from Nomad's job canonicalisation, by job type.
RESTART_DEFAULTS = {
    "batch": {"Attempts": 3, "Interval": 24 * HOUR, "Delay": 15 * SECOND, "Mode": "fail"},
    "service": {"Attempts": 2, "Interval": 30 * MINUTE, "Delay": 15 * SECOND, "Mode": "fail"},
}
RESCHEDULE_DEFAULTS = {
    "batch": {
        "Attempts": 1,
        "Interval": 24 * HOUR,
        "Delay": 5 * SECOND,
        "DelayFunction": "constant",
        "MaxDelay": 0,
        "Unlimited": False,
    },
    "service": {
        "Attempts": 0,
        "Interval": 0,
        "Delay": 30 * SECOND,
        "DelayFunction": "exponential",
        "MaxDelay": HOUR,
        "Unlimited": True,
    },
}
MIGRATE_DEFAULTS = {
    "MaxParallel": 1,
    "HealthCheck": "checks",
    "MinHealthyTime": 10 * SECOND,
    "HealthyDeadline": 5 * MINUTE,
}
SERVICE_UPDATE_DEFAULTS = {
    "Stagger": 30 * SECOND,
    "MaxParallel": 1,
    "HealthCheck": "checks",
    "MinHealthyTime": 10 * SECOND,
    "HealthyDeadline": 5 * MINUTE,
    "ProgressDeadline": 10 * MINUTE,
    "AutoRevert": False,
    "AutoPromote": False,
    "Canary": 0,
}


def _ordered(raw: JsonDict, fields: list[str], defaults: JsonDict) -> JsonDict:
    out: JsonDict = {}
    for name in fields:
        value = raw.get(name)
        out[name] = defaults.get(name) if value is None else value
    return out


def _merge(raw: Any, defaults: JsonDict) -> JsonDict:
    merged = dict(defaults)
    if isinstance(raw, dict):
        merged.update({k: v for k, v in raw.items() if v is not None and k in defaults})
    return merged


def canonicalize_job(raw: JsonDict, namespace: str) -> JsonDict:
    """Validate a submitted job and fill in Nomad's defaults, in field order.

    Raises JobValidationError with Nomad's multi-error wording."""
    errors: list[str] = []
    job_type = raw.get("Type") or "service"
    if job_type not in ("service", "batch", "system", "sysbatch"):
        errors.append(f'Invalid job type: "{job_type}"')
    groups = raw.get("TaskGroups")
    if not groups:
        errors.append("Missing job task groups")
    names: set[str] = set()
    canonical_groups = []
    for i, group in enumerate(groups or []):
        if not isinstance(group, dict):
            errors.append(f"Task group {i + 1} is not an object")
            continue
        name = group.get("Name") or ""
        if not name:
            errors.append(f"Task group {i + 1} missing name")
        elif name in names:
            errors.append(f"Job task group {i + 1} redefines '{name}' from group {i}")
        names.add(name)
        count = group.get("Count")
        if isinstance(count, int) and count < 0:
            errors.append(f"Task group {name} count can't be negative")
        tasks = group.get("Tasks") or []
        if not tasks:
            errors.append(f"Task group {name} validation failed: Missing tasks for task group")
        for task in tasks:
            if not isinstance(task, dict) or not task.get("Name"):
                errors.append(f"Task group {name} validation failed: Missing task name")
            elif not task.get("Driver"):
                errors.append(
                    f"Task group {name} validation failed: Task {task['Name']} "
                    "validation failed: Missing task driver"
                )
        canonical_groups.append(_canonical_group(group, job_type))
    if errors:
        lines = "".join(f"\n\t* {e}" for e in errors)
        n = len(errors)
        raise JobValidationError(f"{n} error{'s' if n > 1 else ''} occurred:{lines}\n\n")
    job_id = raw["ID"]
    defaults: JsonDict = {
        "Stop": False,
        "Region": "global",
        "Namespace": namespace,
        "ParentID": "",
        "Name": job_id,
        "Type": job_type,
        "Priority": 50,
        "AllAtOnce": False,
        "Datacenters": ["*"],
        "NodePool": "default",
        "Dispatched": False,
        "DispatchIdempotencyToken": "",
        "ConsulNamespace": "",
        "VaultNamespace": "",
        "NomadTokenID": "",
        "Status": "pending",
        "StatusDescription": "",
        "Stable": False,
        "Version": 0,
        "SubmitTime": 0,
        "CreateIndex": 0,
        "ModifyIndex": 0,
        "JobModifyIndex": 0,
    }
    job = _ordered(raw, JOB_FIELDS, defaults)
    job["Namespace"] = namespace
    job["TaskGroups"] = canonical_groups
    update_defaults = (
        SERVICE_UPDATE_DEFAULTS
        if job_type == "service"
        else dict.fromkeys(UPDATE_FIELDS, 0)
        | {"HealthCheck": "", "AutoRevert": False, "AutoPromote": False}
    )
    job["Update"] = _ordered(raw.get("Update") or {}, UPDATE_FIELDS, update_defaults)
    return job


def _canonical_group(group: JsonDict, job_type: str) -> JsonDict:
    kind = "batch" if job_type in ("batch", "sysbatch") else "service"
    restart = _merge(group.get("RestartPolicy"), RESTART_DEFAULTS[kind])
    defaults: JsonDict = {
        "Count": 1,
        "RestartPolicy": restart,
        "EphemeralDisk": {"Sticky": False, "SizeMB": 300, "Migrate": False},
        "ReschedulePolicy": _merge(group.get("ReschedulePolicy"), RESCHEDULE_DEFAULTS[kind]),
        "ShutdownDelay": None,
        "PreventRescheduleOnLost": False,
    }
    if kind == "service":
        defaults["Migrate"] = _merge(group.get("Migrate"), MIGRATE_DEFAULTS)
    out = _ordered(group, TASK_GROUP_FIELDS, defaults)
    out["RestartPolicy"] = restart
    out["ReschedulePolicy"] = defaults["ReschedulePolicy"]
    if kind == "service":
        out["Migrate"] = defaults["Migrate"]
    out["Tasks"] = [_canonical_task(t, restart) for t in group.get("Tasks") or []]
    return out


def _canonical_task(task: JsonDict, restart: JsonDict) -> JsonDict:
    resources = _ordered(
        task.get("Resources") or {},
        RESOURCE_FIELDS,
        {"CPU": 100, "Cores": 0, "MemoryMB": 300, "MemoryMaxMB": 0, "DiskMB": 0, "IOPS": 0},
    )
    defaults: JsonDict = {
        "User": "",
        "Resources": resources,
        "RestartPolicy": dict(restart),
        "KillTimeout": 5 * SECOND,
        "LogConfig": {"MaxFiles": 10, "MaxFileSizeMB": 10, "Disabled": False},
        "Leader": False,
        "ShutdownDelay": 0,
        "KillSignal": "",
        "Kind": "",
    }
    out = _ordered(task, TASK_FIELDS, defaults)
    out["Resources"] = resources
    return out


def group_of(job: JsonDict, name: str) -> JsonDict | None:
    for group in job.get("TaskGroups") or []:
        if group.get("Name") == name:
            return dict(group)
    return None


def job_stub(job: JsonDict, summary: JsonDict, with_meta: bool) -> JsonDict:
    periodic = job.get("Periodic")
    out: JsonDict = {
        "ID": job["ID"],
        "ParentID": job["ParentID"],
        "Name": job["Name"],
        "Namespace": job["Namespace"],
        "Datacenters": job["Datacenters"],
        "NodePool": job["NodePool"],
        "Multiregion": job.get("Multiregion"),
        "Type": job["Type"],
        "Priority": job["Priority"],
        "Periodic": bool(periodic and periodic.get("Enabled")),
        "ParameterizedJob": job.get("ParameterizedJob") is not None,
        "Stop": job["Stop"],
        "Status": job["Status"],
        "StatusDescription": job["StatusDescription"],
        "JobSummary": summary,
        "CreateIndex": job["CreateIndex"],
        "ModifyIndex": job["ModifyIndex"],
        "JobModifyIndex": job["JobModifyIndex"],
        "SubmitTime": job["SubmitTime"],
    }
    if with_meta and job.get("Meta"):
        out["Meta"] = job["Meta"]
    return out


def job_summary(job: JsonDict, allocs: list[Alloc], queued: dict[str, int], index: int) -> JsonDict:
    summary: JsonDict = {}
    for group in job.get("TaskGroups") or []:
        summary[group["Name"]] = {
            "Queued": queued.get(group["Name"], 0),
            "Complete": 0,
            "Failed": 0,
            "Running": 0,
            "Starting": 0,
            "Lost": 0,
            "Unknown": 0,
        }
    for a in allocs:
        counts = summary.get(a.task_group)
        if counts is None:
            continue
        key = {
            "pending": "Starting",
            "running": "Running",
            "complete": "Complete",
            "failed": "Failed",
            "lost": "Lost",
        }.get(a.client_status)
        if key:
            counts[key] += 1
    return {
        "JobID": job["ID"],
        "Namespace": job["Namespace"],
        "Summary": summary,
        "Children": {"Pending": 0, "Running": 0, "Dead": 0},
        "CreateIndex": job["CreateIndex"],
        "ModifyIndex": max(index, job["CreateIndex"]),
    }


# -- allocations --------------------------------------------------------------


def task_event(ev: TaskEvent) -> JsonDict:
    return {
        "Type": ev.type,
        "Time": ev.time,
        "Message": ev.message,
        "DisplayMessage": ev.display_message,
        "Details": dict(ev.details),
        "FailsTask": ev.fails_task,
        "RestartReason": ev.restart_reason,
        "SetupError": "",
        "DriverError": "",
        "ExitCode": ev.exit_code,
        "Signal": ev.signal,
        "KillTimeout": ev.kill_timeout,
        "KillError": "",
        "KillReason": ev.kill_reason,
        "StartDelay": ev.start_delay,
        "DownloadError": "",
        "ValidationError": "",
        "DiskLimit": 0,
        "FailedSibling": "",
        "VaultError": "",
        "TaskSignalReason": "",
        "TaskSignal": "",
        "DriverMessage": ev.driver_message,
        "GenericSource": "",
    }


def task_state(ts: TaskState) -> JsonDict:
    return {
        "State": ts.state,
        "Failed": ts.failed,
        "Restarts": ts.restarts,
        "LastRestart": go_time(ts.last_restart),
        "StartedAt": go_time(ts.started_at),
        "FinishedAt": go_time(ts.finished_at),
        "Events": [task_event(e) for e in ts.events],
        "Paused": "",
    }


def _task_states(alloc: Alloc) -> JsonDict | None:
    if not alloc.task_states:
        return None
    return {name: task_state(ts) for name, ts in alloc.task_states}


def desired_transition(alloc: Alloc) -> JsonDict:
    return {
        "Migrate": alloc.migrate,
        "Reschedule": alloc.reschedule,
        "ForceReschedule": None,
        "NoShutdownDelay": None,
        "MigrateDisablePlacement": None,
    }


def reschedule_tracker(alloc: Alloc) -> JsonDict | None:
    if not alloc.reschedule_events:
        return None
    return {
        "Events": [
            {
                "RescheduleTime": e.reschedule_time,
                "PrevAllocID": e.prev_alloc_id,
                "PrevNodeID": e.prev_node_id,
                "Delay": e.delay_ns,
            }
            for e in alloc.reschedule_events
        ],
        "LastReschedule": "",
    }


def allocated_resources(alloc: Alloc, ports: list[JsonDict], host_ip: str) -> JsonDict:
    group = group_of(alloc.job, alloc.task_group) or {}
    tasks: JsonDict = {}
    for task in group.get("Tasks") or []:
        res = task.get("Resources") or {}
        tasks[task["Name"]] = {
            "Cpu": {"CpuShares": res.get("CPU", 0), "ReservedCores": None},
            "Memory": {
                "MemoryMB": res.get("MemoryMB", 0),
                "MemoryMaxMB": res.get("MemoryMaxMB", 0),
            },
            "Networks": None,
            "Devices": None,
        }
    disk = (group.get("EphemeralDisk") or {}).get("SizeMB", 0)
    networks = None
    if ports:
        # NetworkResource and Port carry a struct-wide omitempty, like Allocation.
        requested = (group.get("Networks") or [{}])[0]
        networks = [
            omitempty(
                [
                    ("Mode", requested.get("Mode") or "host"),
                    ("IP", host_ip),
                    (
                        "DynamicPorts",
                        [
                            omitempty(
                                [
                                    ("Label", p["Label"]),
                                    ("Value", p["Value"]),
                                    ("To", p["To"]),
                                    ("HostNetwork", "default"),
                                ]
                            )
                            for p in ports
                        ],
                    ),
                ]
            )
        ]
        ports = [
            omitempty(
                [
                    ("Label", p["Label"]),
                    ("Value", p["Value"]),
                    ("To", p["To"]),
                    ("HostIP", p["HostIP"]),
                ]
            )
            for p in ports
        ]
    return {
        "Tasks": tasks,
        "TaskLifecycles": {t: None for t in tasks},
        "Shared": {"Networks": networks, "DiskMB": disk, "Ports": ports or None},
    }


def _alloc_fields(
    alloc: Alloc, ports: list[JsonDict], host_ip: str, with_job: bool
) -> list[tuple[str, Any]]:
    dt = desired_transition(alloc)
    any_transition = any(v is not None for v in dt.values())
    return [
        ("ID", alloc.id),
        ("Namespace", alloc.namespace),
        ("EvalID", alloc.eval_id),
        ("Name", alloc.name),
        ("NodeID", alloc.node_id),
        ("NodeName", alloc.node_name),
        ("JobID", alloc.job_id),
        ("Job", alloc.job if with_job else None),
        ("TaskGroup", alloc.task_group),
        ("AllocatedResources", allocated_resources(alloc, ports, host_ip)),
        ("Metrics", alloc_metric()),
        ("DesiredStatus", alloc.desired_status),
        ("DesiredDescription", alloc.desired_description),
        ("DesiredTransition", dt if any_transition else None),
        ("ClientStatus", alloc.client_status),
        ("ClientDescription", alloc.client_description),
        ("TaskStates", _task_states(alloc)),
        ("PreviousAllocation", alloc.previous_allocation),
        ("NextAllocation", alloc.next_allocation),
        ("RescheduleTracker", reschedule_tracker(alloc)),
        ("FollowupEvalID", alloc.followup_eval_id),
        ("CreateIndex", alloc.create_index),
        ("ModifyIndex", alloc.modify_index),
        ("AllocModifyIndex", alloc.alloc_modify_index),
        ("CreateTime", alloc.create_time),
        ("ModifyTime", alloc.modify_time),
    ]


def alloc_full(
    alloc: Alloc, ports: list[JsonDict], host_ip: str, with_job: bool = True
) -> JsonDict:
    """The full Allocation (GET /v1/allocation/:id, node allocations, events)."""
    return omitempty(_alloc_fields(alloc, ports, host_ip, with_job))


def alloc_datum(alloc: Alloc, ports: list[JsonDict], host_ip: str) -> JsonDict:
    """The Allocation struct as a filter expression sees it: every field, zero
    ones included (the struct has them), DesiredTransition never nil."""
    datum = dict(_alloc_fields(alloc, ports, host_ip, True))
    datum["DesiredTransition"] = desired_transition(alloc)
    return datum


def alloc_metric(nodes: int = 1, exhausted: int = 0) -> JsonDict:
    """AllocMetric: how the scheduler looked at `nodes` nodes, `exhausted` of them full."""
    return {
        "NodesEvaluated": nodes,
        "NodesFiltered": 0,
        "NodesInPool": nodes,
        "NodePool": "default",
        "NodesAvailable": {"dc1": nodes} if exhausted else None,
        "ClassFiltered": None,
        "ConstraintFiltered": None,
        "NodesExhausted": exhausted,
        "ClassExhausted": None,
        "DimensionExhausted": {"cpu": exhausted} if exhausted else None,
        "QuotaExhausted": None,
        "ResourcesExhausted": None,
        "Scores": None,
        "ScoreMetaData": None,
        "AllocationTime": 0,
        "CoalescedFailures": 0,
    }


def alloc_stub(
    alloc: Alloc,
    ports: list[JsonDict],
    host_ip: str,
    resources: bool = False,
    task_states: bool = True,
) -> JsonDict:
    """AllocListStub: every field always present; no PreviousAllocation field."""
    out: JsonDict = {
        "ID": alloc.id,
        "EvalID": alloc.eval_id,
        "Name": alloc.name,
        "Namespace": alloc.namespace,
        "NodeID": alloc.node_id,
        "NodeName": alloc.node_name,
        "JobID": alloc.job_id,
        "JobType": alloc.job_type,
        "JobVersion": alloc.job_version,
        "TaskGroup": alloc.task_group,
    }
    if resources:
        out["AllocatedResources"] = allocated_resources(alloc, ports, host_ip)
    out.update(
        {
            "DesiredStatus": alloc.desired_status,
            "DesiredDescription": alloc.desired_description,
            "ClientStatus": alloc.client_status,
            "ClientDescription": alloc.client_description,
            "DesiredTransition": desired_transition(alloc),
            "TaskStates": _task_states(alloc) if task_states else None,
            "DeploymentStatus": None,
            "FollowupEvalID": alloc.followup_eval_id,
            "NextAllocation": alloc.next_allocation,
            "RescheduleTracker": reschedule_tracker(alloc),
            "PreemptedAllocations": None,
            "PreemptedByAllocation": "",
            "CreateIndex": alloc.create_index,
            "ModifyIndex": alloc.modify_index,
            "CreateTime": alloc.create_time,
            "ModifyTime": alloc.modify_time,
        }
    )
    return out


# -- evaluations --------------------------------------------------------------


def evaluation(ev: Eval) -> JsonDict:
    return omitempty(
        [
            ("ID", ev.id),
            ("Namespace", ev.namespace),
            ("Priority", ev.priority),
            ("Type", ev.type),
            ("TriggeredBy", ev.triggered_by),
            ("JobID", ev.job_id),
            ("JobModifyIndex", ev.job_modify_index),
            ("NodeID", ev.node_id),
            ("NodeModifyIndex", ev.node_modify_index),
            ("Status", ev.status),
            ("StatusDescription", ev.status_description),
            ("WaitUntil", go_time(ev.wait_until)),
            ("PreviousEval", ev.previous_eval),
            ("BlockedEval", ev.blocked_eval),
            ("FailedTGAllocs", dict(ev.failed_tg_allocs) or None),
            ("QueuedAllocations", dict(ev.queued_allocations) or None),
            ("SnapshotIndex", ev.snapshot_index),
            ("CreateIndex", ev.create_index),
            ("ModifyIndex", ev.modify_index),
            ("CreateTime", ev.create_time),
            ("ModifyTime", ev.modify_time),
        ]
    )


# -- nodes --------------------------------------------------------------------


def _node_attributes(node: Node) -> JsonDict:
    return {
        "cpu.arch": "amd64",
        "cpu.numcores": "8",
        "cpu.totalcompute": str(node.cpu_mhz),
        "driver.docker": "1",
        "kernel.name": "linux",
        "memory.totalbytes": str(node.memory_mb * 1024 * 1024),
        "nomad.version": "1.11.1",
        "os.name": "debian",
        "unique.hostname": node.name,
        "unique.network.ip-address": node.address,
    }


def _node_resources(node: Node) -> JsonDict:
    return {
        "Cpu": {"CpuShares": node.cpu_mhz, "TotalCpuCores": 8, "ReservableCpuCores": None},
        "Memory": {"MemoryMB": node.memory_mb},
        "Disk": {"DiskMB": node.disk_mb},
        "Networks": None,
        "NodeNetworks": None,
        "Devices": None,
        "MinDynamicPort": 20000,
        "MaxDynamicPort": 32000,
    }


def _node_reserved() -> JsonDict:
    return {
        "Cpu": {"CpuShares": 0, "ReservedCpuCores": None},
        "Memory": {"MemoryMB": 0},
        "Disk": {"DiskMB": 0},
        "Networks": {"ReservedHostPorts": ""},
    }


def _drivers(node: Node) -> JsonDict:
    return {
        "docker": {
            "Attributes": {"driver.docker": "true"},
            "Detected": True,
            "Healthy": True,
            "HealthDescription": "Healthy",
            "UpdateTime": go_time(node.status_updated_at * SECOND),
        }
    }


def drain_strategy(node: Node) -> JsonDict | None:
    if node.drain is None:
        return None
    return {
        "Deadline": node.drain.deadline_ns,
        "IgnoreSystemJobs": node.drain.ignore_system_jobs,
        "ForceDeadline": go_time(node.drain.force_deadline),
        "StartedAt": go_time(node.drain.started_at),
    }


def node_events(
    node: Node, message: str, subsystem: str, index: int, now_ns: int
) -> tuple[JsonDict, ...]:
    """The node's events with one more NodeEvent; Nomad keeps the last 10."""
    event = {
        "Message": message,
        "Subsystem": subsystem,
        "Details": None,
        "Timestamp": go_time(now_ns),
        "CreateIndex": index,
    }
    return (*node.events, event)[-10:]


def node_full(node: Node) -> JsonDict:
    return {
        "ID": node.id,
        "SecretID": "",  # Nomad sanitises the secret before encoding
        "Datacenter": node.datacenter,
        "Name": node.name,
        "CgroupParent": "",
        "HTTPAddr": node.http_addr,
        "TLSEnabled": False,
        "Attributes": _node_attributes(node),
        "NodeResources": _node_resources(node),
        "ReservedResources": _node_reserved(),
        "Links": None,
        "Meta": {"connect.log_level": "info"},
        "NodeClass": "",
        "NodePool": "default",
        "ComputedClass": "v1:1234567890",
        "DrainStrategy": drain_strategy(node),
        "SchedulingEligibility": node.eligibility,
        "Status": node.status,
        "StatusDescription": "",
        "IdentitySigningKeyID": "",
        "StatusUpdatedAt": node.status_updated_at,
        "Events": list(node.events),
        "Drivers": _drivers(node),
        "CSIControllerPlugins": None,
        "CSINodePlugins": None,
        "HostVolumes": None,
        "GCVolumesOnNodeGC": False,
        "HostNetworks": None,
        "LastDrain": node.last_drain,
        "NodeMaxAllocs": 0,
        "LastMissedHeartbeatIndex": 0,
        "LastAllocUpdateIndex": 0,
        "CreateIndex": node.create_index,
        "ModifyIndex": node.modify_index,
        "Drain": node.drain is not None,
    }


def node_stub(node: Node, resources: bool = False) -> JsonDict:
    out: JsonDict = {
        "Address": node.http_addr.split(":")[0],
        "ID": node.id,
        "Attributes": None,
        "Datacenter": node.datacenter,
        "Name": node.name,
        "NodePool": "default",
        "NodeClass": "",
        "Version": "1.11.1",
        "Drain": node.drain is not None,
        "SchedulingEligibility": node.eligibility,
        "Status": node.status,
        "StatusDescription": "",
        "Drivers": _drivers(node),
        "HostVolumes": None,
        "NodeResources": _node_resources(node) if resources else None,
        "ReservedResources": _node_reserved() if resources else None,
        "LastDrain": node.last_drain,
        "CreateIndex": node.create_index,
        "ModifyIndex": node.modify_index,
    }
    # Attributes/NodeResources/ReservedResources are omitempty on the stub.
    return {k: v for k, v in out.items() if not (v is None and k in _STUB_OMITEMPTY)}


_STUB_OMITEMPTY = frozenset({"Attributes", "NodeResources", "ReservedResources"})


# -- variables ----------------------------------------------------------------


def variable_lock(var: Variable, with_id: bool) -> JsonDict | None:
    if var.lock is None:
        return None
    out: JsonDict = {
        "TTL": go_duration(var.lock.ttl_ns),
        "LockDelay": go_duration(var.lock.lock_delay_ns),
    }
    if with_id:
        out["ID"] = var.lock.id
    return out


def variable(var: Variable, with_items: bool = True, lock_id: bool = False) -> JsonDict:
    out: JsonDict = {"Namespace": var.namespace, "Path": var.path}
    lock = variable_lock(var, lock_id)
    if lock is not None:
        out["Lock"] = lock
    out.update(
        {
            "CreateIndex": var.create_index,
            "CreateTime": var.create_time,
            "ModifyIndex": var.modify_index,
            "ModifyTime": var.modify_time,
        }
    )
    if with_items and var.items:
        out["Items"] = dict(var.items)
    return out
