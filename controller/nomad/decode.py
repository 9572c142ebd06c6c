"""Nomad's JSON → the controller's model: allocations (list stubs and full
objects, e.g. event payloads), with how much notice a restart of one gives
when the job comes with it, and job list stubs.

Nomad writes every zero-valued field of a full Allocation (and of its
NetworkResource and Port entries) as absent, writes a zero `time.Time` as
`null` (older servers and docs: `"0001-01-01T00:00:00Z"`), and uses two time
formats: RFC 3339 strings with up to nanosecond precision in TaskStates, and
integer nanoseconds in CreateTime/ModifyTime/SubmitTime and task event
`Time`. So every field is read with `.get()` and a default, never indexed.
"""

from __future__ import annotations

import calendar
import re
import sys
from collections.abc import Mapping
from typing import Any

from controller.model import Allocation, PortMapping
from controller.nomad.gateway import JobStub

SECOND = 1_000_000_000

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:\d{2})$"
)
# Go's zero time.Time, 0001-01-01T00:00:00Z, in seconds relative to the Unix epoch.
_GO_ZERO_TIME_S = calendar.timegm((1, 1, 1, 0, 0, 0, 0, 0, 0))


def parse_go_time(value: Any) -> int | None:
    """An RFC 3339 time as Go writes it (any precision up to ns, `Z` or an
    offset) → nanoseconds since the epoch.

    None for null, Go's zero time and anything unparsable: a bad timestamp must
    not make a whole listing undecodable, and "unknown" is what it means."""
    if not isinstance(value, str):
        return None
    m = _RFC3339.match(value)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7), m.group(8)
    try:
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    nanos = int(frac.ljust(9, "0")) if frac else 0
    if seconds == _GO_ZERO_TIME_S and nanos == 0:
        return None
    return seconds * SECOND + nanos


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    return 0


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _shared(value: Any) -> str:
    """A string thousands of runners hold alike (a node, a status; a job id,
    which the job list and the allocation list both name): one object for
    all of them instead of one per decoded answer (`sys.intern`)."""
    return sys.intern(_str(value))


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def decode_job_stubs(body: Any) -> tuple[JobStub, ...]:
    """The entries of a GET /v1/jobs answer that are objects (none when the
    answer is no list)."""
    stubs = body if isinstance(body, list) else []
    return tuple(decode_job_stub(s) for s in stubs if isinstance(s, dict))


def decode_allocations(body: Any) -> tuple[Allocation, ...]:
    """The entries of a GET /v1/allocations answer that are objects (none
    when the answer is no list)."""
    stubs = body if isinstance(body, list) else []
    return tuple(decode_allocation(a) for a in stubs if isinstance(a, dict))


def decode_job_stub(raw: Mapping[str, Any]) -> JobStub:
    """One entry of GET /v1/jobs (a JobListStub)."""
    return JobStub(
        id=_shared(raw.get("ID")),
        job_modify_index=_int(raw.get("JobModifyIndex")),
        modify_index=_int(raw.get("ModifyIndex")),
        create_index=_int(raw.get("CreateIndex")),
        submit_time=_int(raw.get("SubmitTime")),
        status=_shared(raw.get("Status")),
        stop=raw.get("Stop") is True,
        type=_shared(raw.get("Type")),
    )


def decode_allocation(raw: Mapping[str, Any]) -> Allocation:
    """An AllocListStub (GET /v1/allocations?resources=true&task_states=true)
    or a full Allocation (GET /v1/allocation/:id, event payloads)."""
    task_states = [_dict(ts) for ts in _dict(raw.get("TaskStates")).values()]
    started = [t for t in (parse_go_time(ts.get("StartedAt")) for ts in task_states) if t]
    return Allocation(
        id=_str(raw.get("ID")),
        job_id=_shared(raw.get("JobID")),
        node_id=_shared(raw.get("NodeID")),
        node_name=_shared(raw.get("NodeName")),
        # Omitted only when empty, which Nomad never stores; keep the model's defaults then.
        client_status=_shared(raw.get("ClientStatus")) or "pending",
        desired_status=_shared(raw.get("DesiredStatus")) or "run",
        desired_description=_shared(raw.get("DesiredDescription")),
        migrate=_dict(raw.get("DesiredTransition")).get("Migrate") is True,
        create_index=_int(raw.get("CreateIndex")),
        modify_index=_int(raw.get("ModifyIndex")),
        create_time=_int(raw.get("CreateTime")),
        modify_time=_int(raw.get("ModifyTime")),
        restarts=sum(_int(ts.get("Restarts")) for ts in task_states),
        last_exit_oom=_last_exit_oom(task_states),
        started_at=min(started) if started else None,
        ports=decode_ports(_dict(raw.get("AllocatedResources"))),
        restart_notice_ns=restart_notice_ns(raw),
    )


# A task that never restarts gives no bound: as long as Nomad's durations go.
NEVER_NS = 2**63 - 1


def restart_notice_ns(raw: Mapping[str, Any]) -> int | None:
    """How long, at least, a task of the allocation waits between a restart
    being decided and running again (its client reports the decision when it
    is made): the shortest over its tasks, 0 when some restart may come at
    once, `NEVER_NS` when none restarts; None when `raw` carries no job (a
    list stub, an event payload).

    As Nomad's task runner (v1.6) decides: a task's own restart policy, else
    its group's; no attempts, no restart; within its attempts, the delay plus
    a jitter that only adds; mode `delay` past its attempts waits only until
    the interval ends, which may be now. A template re-rendered with change
    mode `restart` (the default) and a check's `check_restart` restart at
    once, as does a restart asked through the API (which no job shows)."""
    job = raw.get("Job")
    if not isinstance(job, Mapping):
        return None
    name = raw.get("TaskGroup")
    group = next(
        (g for g in map(_dict, _list(job.get("TaskGroups"))) if g.get("Name") == name), None
    )
    if group is None:
        return None
    if _restarts_on_checks(_list(group.get("Services"))):
        return 0
    notice = NEVER_NS
    for task in map(_dict, _list(group.get("Tasks"))):
        templates = map(_dict, _list(task.get("Templates")))
        if _restarts_on_checks(_list(task.get("Services"))) or any(
            t.get("ChangeMode") in (None, "", "restart") for t in templates
        ):
            return 0
        policy = _dict(task.get("RestartPolicy") or group.get("RestartPolicy"))
        if _int(policy.get("Attempts")) == 0:
            continue
        if policy.get("Mode") != "fail":
            return 0
        notice = min(notice, _int(policy.get("Delay")))
    return notice


def _restarts_on_checks(services: list[Any]) -> bool:
    """Whether a failing check of one of these services restarts its task."""
    for service in map(_dict, services):
        if service.get("CheckRestart") or any(
            _dict(check).get("CheckRestart") for check in _list(service.get("Checks"))
        ):
            return True
    return False


def _last_exit_oom(task_states: list[Mapping[str, Any]]) -> bool:
    """Whether the newest `Terminated` task event of the allocation, across its
    tasks, says the kernel OOM-killed the task (the docker driver reports
    `Details.oom_killed` as the string "true" or "false")."""
    newest: Mapping[str, Any] | None = None
    newest_time = -1
    for ts in task_states:
        for event in _list(ts.get("Events")):
            event = _dict(event)
            if event.get("Type") != "Terminated":
                continue
            # >= keeps the later of two events at the same nanosecond in list order.
            if _int(event.get("Time")) >= newest_time:
                newest, newest_time = event, _int(event.get("Time"))
    if newest is None:
        return False
    return _dict(newest.get("Details")).get("oom_killed") == "true"


def decode_ports(allocated: Mapping[str, Any]) -> tuple[PortMapping, ...]:
    """Where the host publishes each exposed port of an allocation.

    Nomad ≥ 1.0 lists group ports in AllocatedResources.Shared.Ports
    (`Label, Value, To, HostIP`); allocations made without them carry only
    the network's `DynamicPorts`/`ReservedPorts` with the network's IP, in
    Shared.Networks or, older still, in each task's Networks."""
    shared = _dict(allocated.get("Shared"))
    ports = [_dict(p) for p in _list(shared.get("Ports"))]
    if ports:
        return tuple(_mapping(p, _str(p.get("HostIP"))) for p in ports)
    networks = [_dict(n) for n in _list(shared.get("Networks"))]
    if not networks:
        for task in _dict(allocated.get("Tasks")).values():
            networks.extend(_dict(n) for n in _list(_dict(task).get("Networks")))
    out: list[PortMapping] = []
    for network in networks:
        ip = _str(network.get("IP"))
        for key in ("ReservedPorts", "DynamicPorts"):
            out.extend(_mapping(_dict(p), ip) for p in _list(network.get(key)))
    return tuple(out)


def _mapping(port: Mapping[str, Any], ip: str) -> PortMapping:
    value = _int(port.get("Value"))
    to = _int(port.get("To"))
    # `To` omitted (0) or -1 means the task sees the host port itself.
    exposed = to if to > 0 else value
    host = f"[{ip}]" if ":" in ip else ip
    return PortMapping(exposed_port=exposed, host_address=f"{host}:{value}")
