"""Nomad's job parser (`POST /v1/jobs/parse`, jobspec2) for the HCL a runner
template uses: HCL in, the job as Nomad's API JSON out.

Nomad parses with its own HCL2 library in strict mode: an argument or block
the job specification does not know is an error, durations are Go durations,
`${node.unique.name}` and other runtime interpolations stay as written. Here
python-hcl2 reads the HCL and a table per block maps it onto the API's
fields. Covered: `job` (datacenters, type, region, namespace, priority, meta,
constraint, affinity, spread, group), `group` (count, ephemeral_disk, spread,
restart, reschedule, network with ports, meta, constraint, task) and `task`
(driver, user, config as given, env, meta, kill_timeout, kill_signal, logs,
resources with memory_max, leader, shutdown_delay, constraint). Not covered
(refused as unsupported, never silently dropped): variables, locals,
functions, dynamic blocks, and every other block (volumes, services,
templates, vault, ...). Unset fields are left out where Nomad's answer holds
them as null; with `Canonicalize` the job gets the defaults the simulator's
register fills in. Error texts keep Nomad's wording without its
file:line:column positions, which python-hcl2 does not report.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import hcl2

from nomadsim.errors import NomadError

JsonDict = dict[str, Any]

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+|0")
_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9}
_NS["h"] = 60 * _NS["m"]
_VARIABLE = re.compile(r"\$\{\s*(?:var|local)\.")


def _duration(value: Any, name: str) -> int:
    text = str(value)
    if not _DURATION.fullmatch(text):
        raise NomadError(400, f'Unsupported duration; time: invalid duration "{text}" for {name}')
    return sum(round(float(n) * _NS[u]) for n, u in _DURATION_PART.findall(text))


def _plain(value: Any) -> Any:
    if isinstance(value, str) and _VARIABLE.search(value):
        raise NomadError(
            400, f"Unsupported expression; variables and locals are not supported: {value}"
        )
    return value


def _one(blocks: Any, name: str) -> JsonDict:
    items = blocks if isinstance(blocks, list) else [blocks]
    if len(items) != 1 or not isinstance(items[0], dict):
        raise NomadError(
            400, f'Duplicate {name} block; Only one block of type "{name}" is allowed.'
        )
    block: JsonDict = items[0]
    return block


def _labelled(blocks: Any, kind: str) -> list[tuple[str, JsonDict]]:
    out: list[tuple[str, JsonDict]] = []
    for item in blocks if isinstance(blocks, list) else [blocks]:
        if not isinstance(item, dict) or len(item) != 1:
            raise NomadError(400, f"Missing name for {kind}; All {kind} blocks need a name.")
        ((label, body),) = item.items()
        out.append((label, body if isinstance(body, dict) else {}))
    return out


Field = tuple[str, Callable[[Any, str], Any]]


def _as_is(value: Any, name: str) -> Any:
    return _plain(value)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise NomadError(400, f"Incorrect attribute value type; {name}: a number is required.")
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise NomadError(400, f"Incorrect attribute value type; {name}: a bool is required.")
    return value


def _strings(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NomadError(400, f"Incorrect attribute value type; {name}: list of string required.")
    return [_plain(v) for v in value]


def _map(value: Any, name: str) -> dict[str, str]:
    block = _one(value, name) if isinstance(value, list) else value
    if not isinstance(block, dict):
        raise NomadError(400, f"Incorrect attribute value type; {name}: map of string required.")
    return {str(k): str(_plain(v)) for k, v in block.items()}


def _fields(body: JsonDict, table: dict[str, Field], where: str) -> JsonDict:
    """Map `body` by `table` (HCL name → API name and converter); anything
    else is Nomad's strict-mode error."""
    out: JsonDict = {}
    for key, value in body.items():
        if key not in table:
            raise NomadError(
                400,
                f'Unsupported argument; An argument named "{key}" is not expected here ({where}).',
            )
        api, convert = table[key]
        out[api] = convert(value, key)
    return out


def _block(table: dict[str, Field], where: str) -> Callable[[Any, str], JsonDict]:
    def convert(value: Any, name: str) -> JsonDict:
        return _fields(_one(value, name), table, where)

    return convert


def _blocks(table: dict[str, Field], where: str) -> Callable[[Any, str], list[JsonDict]]:
    def convert(value: Any, name: str) -> list[JsonDict]:
        items = value if isinstance(value, list) else [value]
        return [_fields(item, table, where) for item in items]

    return convert


_CONSTRAINT: dict[str, Field] = {
    "attribute": ("LTarget", _as_is),
    "value": ("RTarget", _as_is),
    "operator": ("Operand", _as_is),
}
_AFFINITY: dict[str, Field] = {**_CONSTRAINT, "weight": ("Weight", _int)}
_SPREAD_TARGET: dict[str, Field] = {"value": ("Value", _as_is), "percent": ("Percent", _int)}


def _spread_targets(value: Any, name: str) -> list[JsonDict]:
    return [
        {"Value": label, **_fields(body, _SPREAD_TARGET, "target")}
        for label, body in _labelled(value, "target")
    ]


_SPREAD: dict[str, Field] = {
    "attribute": ("Attribute", _as_is),
    "weight": ("Weight", _int),
    "target": ("SpreadTarget", _spread_targets),
}
_RESTART: dict[str, Field] = {
    "attempts": ("Attempts", _int),
    "delay": ("Delay", _duration),
    "interval": ("Interval", _duration),
    "mode": ("Mode", _as_is),
    "render_templates": ("RenderTemplates", _bool),
}
_RESCHEDULE: dict[str, Field] = {
    "attempts": ("Attempts", _int),
    "interval": ("Interval", _duration),
    "delay": ("Delay", _duration),
    "delay_function": ("DelayFunction", _as_is),
    "max_delay": ("MaxDelay", _duration),
    "unlimited": ("Unlimited", _bool),
}
_DISK: dict[str, Field] = {
    "migrate": ("Migrate", _bool),
    "size": ("SizeMB", _int),
    "sticky": ("Sticky", _bool),
}
_LOGS: dict[str, Field] = {
    "max_files": ("MaxFiles", _int),
    "max_file_size": ("MaxFileSizeMB", _int),
    "disabled": ("Disabled", _bool),
}
_RESOURCES: dict[str, Field] = {
    "cpu": ("CPU", _int),
    "cores": ("Cores", _int),
    "memory": ("MemoryMB", _int),
    "memory_max": ("MemoryMaxMB", _int),
}
_PORT: dict[str, Field] = {
    "static": ("Value", _int),
    "to": ("To", _int),
    "host_network": ("HostNetwork", _as_is),
}


def _network(value: Any, name: str) -> list[JsonDict]:
    network = _one(value, name)
    out: JsonDict = {"Mode": str(network.get("mode", "host"))}
    dynamic: list[JsonDict] = []
    reserved: list[JsonDict] = []
    for key, body in network.items():
        if key == "mode":
            continue
        if key != "port":
            raise NomadError(
                400,
                f'Unsupported argument; An argument named "{key}" is not expected here (network).',
            )
        for label, port in _labelled(body, "port"):
            fields = {"Label": label, "Value": 0, "To": 0, **_fields(port, _PORT, "port")}
            (reserved if fields["Value"] else dynamic).append(fields)
    if dynamic:
        out["DynamicPorts"] = dynamic
    if reserved:
        out["ReservedPorts"] = reserved
    return [out]


def _config(value: Any, name: str) -> JsonDict:
    # The driver's own schema (docker's) is checked by the client, not here.
    return {k: _plain(v) for k, v in _one(value, name).items()}


_TASK: dict[str, Field] = {
    "driver": ("Driver", _as_is),
    "user": ("User", _as_is),
    "config": ("Config", _config),
    "env": ("Env", _map),
    "meta": ("Meta", _map),
    "kill_timeout": ("KillTimeout", _duration),
    "kill_signal": ("KillSignal", _as_is),
    "shutdown_delay": ("ShutdownDelay", _duration),
    "leader": ("Leader", _bool),
    "logs": ("LogConfig", _block(_LOGS, "logs")),
    "resources": ("Resources", _block(_RESOURCES, "resources")),
    "constraint": ("Constraints", _blocks(_CONSTRAINT, "constraint")),
}


def _tasks(value: Any, name: str) -> list[JsonDict]:
    return [
        {"Name": label, **_fields(body, _TASK, "task")} for label, body in _labelled(value, "task")
    ]


_GROUP: dict[str, Field] = {
    "count": ("Count", _int),
    "ephemeral_disk": ("EphemeralDisk", _block(_DISK, "ephemeral_disk")),
    "spread": ("Spreads", _blocks(_SPREAD, "spread")),
    "restart": ("RestartPolicy", _block(_RESTART, "restart")),
    "reschedule": ("ReschedulePolicy", _block(_RESCHEDULE, "reschedule")),
    "network": ("Networks", _network),
    "meta": ("Meta", _map),
    "constraint": ("Constraints", _blocks(_CONSTRAINT, "constraint")),
    "affinity": ("Affinities", _blocks(_AFFINITY, "affinity")),
    "task": ("Tasks", _tasks),
}


def _groups(value: Any, name: str) -> list[JsonDict]:
    return [
        {"Name": label, **_fields(body, _GROUP, "group")}
        for label, body in _labelled(value, "group")
    ]


_JOB: dict[str, Field] = {
    "datacenters": ("Datacenters", _strings),
    "type": ("Type", _as_is),
    "region": ("Region", _as_is),
    "namespace": ("Namespace", _as_is),
    "priority": ("Priority", _int),
    "meta": ("Meta", _map),
    "constraint": ("Constraints", _blocks(_CONSTRAINT, "constraint")),
    "affinity": ("Affinities", _blocks(_AFFINITY, "affinity")),
    "spread": ("Spreads", _blocks(_SPREAD, "spread")),
    "group": ("TaskGroups", _groups),
}

_OPTIONS = (
    hcl2.SerializationOptions(
        strip_string_quotes=True,
        explicit_blocks=False,
        with_comments=False,
        preserve_heredocs=False,
    )
    if hasattr(hcl2, "SerializationOptions")
    else None
)


def _load(text: str) -> JsonDict:
    try:
        data: JsonDict = (
            hcl2.loads(text)
            if _OPTIONS is None
            else hcl2.loads(text, serialization_options=_OPTIONS)
        )
    except Exception as exc:  # python-hcl2 raises lark's many exception types
        first = " ".join(str(exc).split())[:300]
        raise NomadError(400, f"Invalid HCL: {first}") from None
    return data


def parse_job(text: str) -> JsonDict:
    """The job in `text` as the API's Job (not canonicalized). Raises
    NomadError(400) with what Nomad would say."""
    data = _load(text)
    unknown = sorted(set(data) - {"job"})
    if unknown:
        raise NomadError(
            400, f'Unsupported block type; Blocks of type "{unknown[0]}" are not expected here.'
        )
    if "job" not in data:
        raise NomadError(400, "Missing job block; A job block is required.")
    jobs = _labelled(data["job"], "job")
    if len(jobs) != 1:
        raise NomadError(400, 'Duplicate job block; Only one block of type "job" is allowed.')
    ((label, body),) = jobs
    return {"ID": label, "Name": label, **_fields(body, _JOB, "job")}
