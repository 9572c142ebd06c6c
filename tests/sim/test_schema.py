"""The simulator's responses against Nomad's published schemas.

Two references are used (copies in `tests/reference/`, see its README):

- `nomad-openapi.yaml` (2023): names, nesting and JSON types of every field.
  Responses are validated with openapi-schema-validator's OAS30Validator
  against `components/schemas`, with all `$ref`s resolving inside that file.
- `nomad-struct-fields.md` (2026, newer, wins where they differ): the order
  Nomad writes keys in, which fields are omitted when empty, and that a nil
  pointer / slice / map or a zero `time.Time` is written as JSON `null`.

The single adjustment made to the OpenAPI schemas (in a copy, see
`_nullable_schemas`) is that rule of the encoder: a property becomes nullable
exactly where Nomad writes `null` for it. Where struct-fields.md lists the Go
type, that means a field whose Go type is a pointer, slice, map,
`interface{}` or `time.Time`, unless the field is `omitempty` (or its struct
carries `_struct omitempty`, like Allocation, Evaluation, NetworkResource,
Port and AllocatedPortMapping): omitted fields are never `null`. For nested
types struct-fields.md does not list (TaskGroup, Task, Resources...), the
same rule is applied to the OpenAPI shape: arrays, maps, `$ref`'d objects and
`date-time` strings are the nilable Go kinds, plus the few pointer-to-scalar
fields listed in `POINTER_SCALARS`. Nothing else is relaxed: wrong
JSON types still fail, and unknown keys were always allowed by OpenAPI (Nomad
writes fields newer than the 2023 schema, such as NodePool or Paused).

Beyond the schemas, the struct-fields rules are asserted directly: full
Allocation and Evaluation objects omit every zero-valued field, list stubs
and the other types keep all their non-omitempty fields, and keys come in Go
declaration order.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
import requests
import yaml
from openapi_schema_validator import OAS30Validator, oas30_format_checker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from nomadsim import SimServer
from tests.helpers import runner_job, wait_until
from tests.reference import document

OPENAPI = document("nomad-openapi.yaml")
STRUCT_FIELDS = document("nomad-struct-fields.md")
ROOT_URI = "urn:nomad-openapi"

JsonDict = dict[str, Any]

# Go struct names in struct-fields.md whose OpenAPI schema is named differently.
OPENAPI_NAME = {
    "AllocListStub": "AllocationListStub",
    "AllocMetric": "AllocationMetric",
    "AllocatedPortMapping": "PortMapping",
    "VariableDecrypted": "Variable",
}
# `_struct omitempty` types that struct-fields.md names without listing their fields.
EXTRA_STRUCT_OMITEMPTY = {"Plan", "Port", "NetworkResource", "AllocatedPortMapping"}
# Pointer-to-scalar fields (Go `*time.Duration`, nil -> null) of nested types that
# struct-fields.md does not list, so their OpenAPI shape (a plain integer) cannot tell.
# From TaskGroup in nomad/structs/structs.go.
POINTER_SCALARS = {
    "TaskGroup": {"ShutdownDelay", "StopAfterClientDisconnect", "MaxClientDisconnect"}
}


# -- struct-fields.md ----------------------------------------------------------


@dataclass(frozen=True)
class GoField:
    name: str
    go_type: str
    omitempty: bool
    omitted: bool

    @property
    def nilable(self) -> bool:
        """Written as JSON null when nil / zero (if not omitted)."""
        t = self.go_type
        return t.startswith(("*", "[]", "map[")) or t in ("time.Time", "interface{}")


@dataclass
class GoStruct:
    name: str
    struct_omitempty: bool
    fields: list[GoField] = field(default_factory=list)

    @property
    def wire_fields(self) -> list[GoField]:
        return [f for f in self.fields if not f.omitted]

    @property
    def order(self) -> list[str]:
        return [f.name for f in self.wire_fields]

    @property
    def always_present(self) -> list[str]:
        if self.struct_omitempty:
            return []
        return [f.name for f in self.wire_fields if not f.omitempty]


@functools.cache
def go_structs() -> dict[str, GoStruct]:
    structs: dict[str, GoStruct] = {}
    current: GoStruct | None = None
    for line in STRUCT_FIELDS.read_text().splitlines():
        heading = re.match(r"^### (\w+)\s", line)
        if heading:
            current = GoStruct(heading.group(1), "[_struct omitempty" in line)
            structs[current.name] = current
        elif current is not None and line.startswith("- "):
            name, go_type, *rest = line[2:].split()
            extra = " ".join(rest)
            current.fields.append(
                GoField(name, go_type, "omitempty" in extra.split(), "OMITTED(-)" in extra)
            )
        elif line.startswith("#"):
            current = None
    return structs


def struct_omitempty_schemas() -> set[str]:
    names = {s.name for s in go_structs().values() if s.struct_omitempty}
    return {OPENAPI_NAME.get(n, n) for n in names | EXTRA_STRUCT_OMITEMPTY}


# -- OpenAPI schemas -----------------------------------------------------------


def _make_nullable(prop: JsonDict) -> JsonDict:
    if "$ref" in prop:
        # OAS 3.0's `nullable` only acts next to a `type` in the same schema
        # object, so a nullable reference is spelled as "the ref, or null".
        return {"anyOf": [{"$ref": prop["$ref"]}, {"enum": [None]}]}
    return {**prop, "nullable": True}


def _nilable_by_shape(prop: JsonDict) -> bool:
    return (
        "$ref" in prop
        or prop.get("type") == "array"
        or (prop.get("type") == "object" and "additionalProperties" in prop)
        or prop.get("format") == "date-time"
    )


@functools.cache
def _nullable_schemas() -> JsonDict:
    """components/schemas, with `null` allowed exactly where Nomad writes it."""
    schemas: JsonDict = copy.deepcopy(yaml.safe_load(OPENAPI.read_text())["components"]["schemas"])
    documented = {OPENAPI_NAME.get(s.name, s.name): s for s in go_structs().values()}
    omit_all = struct_omitempty_schemas()
    for name, schema in schemas.items():
        props: JsonDict = schema.get("properties", {})
        if name in omit_all:
            continue
        if name in documented:
            nilable = {
                f.name for f in documented[name].wire_fields if f.nilable and not f.omitempty
            }
            for key in nilable & props.keys():
                props[key] = _make_nullable(props[key])
        else:
            for key, prop in props.items():
                if _nilable_by_shape(prop) or key in POINTER_SCALARS.get(name, ()):
                    props[key] = _make_nullable(prop)
    return schemas


RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")


def _is_rfc3339(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    if not RFC3339.match(instance):
        return False
    datetime.fromisoformat(instance)
    return True


@functools.cache
def _format_checker() -> Any:
    checker: Any = copy.deepcopy(oas30_format_checker)
    checker.checks("date-time", raises=ValueError)(_is_rfc3339)
    return checker


def validator(schema_name: str) -> Any:
    root = {"components": {"schemas": _nullable_schemas()}}
    registry: Registry[Any] = Registry().with_resource(
        ROOT_URI, Resource.from_contents(root, default_specification=DRAFT4)
    )
    schema = {"$ref": f"{ROOT_URI}#/components/schemas/{schema_name}"}
    return OAS30Validator(schema, registry=registry, format_checker=_format_checker())


def _leaf_errors(errors: Iterable[Any]) -> Iterator[Any]:
    """Look inside our `anyOf: [$ref, null]` wrappers for the $ref branch's own errors."""
    for error in errors:
        if error.validator == "anyOf" and error.context:
            yield from _leaf_errors(e for e in error.context if e.relative_schema_path[0] == 0)
        elif not error.message.startswith("None is not of type"):  # dup of "not nullable"
            yield error


def schema_errors(schema_name: str, instance: Any, where: str) -> list[str]:
    errors = _leaf_errors(validator(schema_name).iter_errors(instance))
    return sorted(
        f"{where} ({schema_name}) at {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in errors
    )


# -- struct-fields rules -------------------------------------------------------


def go_zero(key: str, value: Any) -> bool:
    """Empty in go-msgpack's omitempty sense (RecursiveEmptyCheck off)."""
    if value is None or value in ("", [], {}):
        return True
    if isinstance(value, bool | int | float) and not value:
        return True
    # DesiredTransition is a comparable struct of *bool: zero when all are nil.
    return key == "DesiredTransition" and isinstance(value, dict) and not any(value.values())


def zero_valued_keys(obj: JsonDict) -> list[str]:
    return [f"{k}={v!r}" for k, v in obj.items() if go_zero(k, v)]


def order_errors(
    go_type: str, obj: JsonDict, where: str, trailing: tuple[str, ...] = ()
) -> list[str]:
    """Keys must be known fields of `go_type`, in declaration order."""
    expected = [*go_structs()[go_type].order, *trailing]
    unknown = [k for k in obj if k not in expected]
    if unknown:
        return [f"{where} ({go_type}): keys not in the Go struct: {unknown}"]
    keys = list(obj)
    if keys != sorted(keys, key=expected.index):
        return [f"{where} ({go_type}): key order {keys}, expected order {expected}"]
    return []


def missing_errors(go_type: str, obj: JsonDict, where: str) -> list[str]:
    missing = [k for k in go_structs()[go_type].always_present if k not in obj]
    return [f"{where} ({go_type}): always-written fields missing: {missing}"] if missing else []


# -- the scenario --------------------------------------------------------------


@dataclass
class Snapshot:
    """Responses captured from the simulator; keys name the request."""

    job_id: str
    first_alloc_id: str
    node_id: str
    replacement_id: str = ""
    responses: dict[str, Any] = field(default_factory=dict)


def _get(address: str, path: str) -> Any:
    response = requests.get(f"{address}{path}", timeout=5)
    response.raise_for_status()
    return response.json()


def _capture(snap: Snapshot, address: str, label: str, path: str) -> Any:
    snap.responses[f"{label} GET {path}"] = body = _get(address, path)
    return body


@pytest.fixture
def snapshot(sim: SimServer) -> Snapshot:
    address = sim.address
    job_id = "schema-job"
    response = requests.put(f"{address}/v1/jobs", json={"Job": runner_job(job_id)}, timeout=5)
    response.raise_for_status()

    def running(exclude: str = "") -> list[JsonDict]:
        stubs: list[JsonDict] = _get(address, f"/v1/job/{job_id}/allocations")
        return [a for a in stubs if a["ClientStatus"] == "running" and a["ID"] != exclude]

    first = wait_until(running)[0]
    snap = Snapshot(job_id, first["ID"], first["NodeID"])
    put = requests.put(f"{address}/v1/var/some/path", json={"Items": {"a": "b"}}, timeout=5)
    put.raise_for_status()
    snap.responses["PUT /v1/var/some/path"] = put.json()

    def capture_all(label: str) -> None:
        for path in (
            f"/v1/job/{job_id}",
            "/v1/jobs",
            f"/v1/job/{job_id}/allocations",
            "/v1/allocations",
            f"/v1/allocation/{snap.first_alloc_id}",
            f"/v1/node/{snap.node_id}",
            f"/v1/node/{snap.node_id}/allocations",
            "/v1/nodes",
            "/v1/evaluations",
            "/v1/var/some/path",
            "/v1/vars",
        ):
            _capture(snap, address, label, path)
        for evaluation in snap.responses[f"{label} GET /v1/evaluations"]:
            _capture(snap, address, label, f"/v1/evaluation/{evaluation['ID']}")

    capture_all("before")

    stop = requests.post(f"{address}/v1/allocation/{snap.first_alloc_id}/stop", timeout=5)
    stop.raise_for_status()
    snap.replacement_id = wait_until(lambda: running(exclude=snap.first_alloc_id))[0]["ID"]
    _capture(snap, address, "after", f"/v1/allocation/{snap.replacement_id}")
    replacement = snap.responses[f"after GET /v1/allocation/{snap.replacement_id}"]
    _capture(snap, address, "after", f"/v1/node/{replacement['NodeID']}/allocations")
    capture_all("after")
    return snap


def documents(snap: Snapshot) -> list[tuple[str, str, JsonDict]]:
    """(where, Go struct name, object) for every object a response holds."""
    docs: list[tuple[str, str, JsonDict]] = []
    for request, body in snap.responses.items():
        path = request.split(" ")[-1]
        parts = path.strip("/").split("/")[1:]
        items = body if isinstance(body, list) else [body]
        if parts == ["jobs"]:
            go_type = "JobListStub"
        elif parts[0] == "job":
            go_type = "AllocListStub" if parts[-1] == "allocations" else "Job"
        elif parts == ["allocations"]:
            go_type = "AllocListStub"
        elif parts[0] == "allocation" or parts[-1] == "allocations":
            go_type = "Allocation"
        elif parts == ["nodes"]:
            go_type = "NodeListStub"
        elif parts[0] == "node":
            go_type = "Node"
        elif parts[0] in ("evaluation", "evaluations"):
            go_type = "Evaluation"
        elif parts == ["vars"]:
            go_type = "VariableMetadata"
        else:
            assert parts[0] == "var", request
            go_type = "VariableDecrypted"
        assert items, f"{request} returned an empty list"
        docs += [(f"{request}[{i}]", go_type, item) for i, item in enumerate(items)]
    return docs


def nested(go_type: str, obj: JsonDict, where: str) -> list[tuple[str, str, JsonDict]]:
    """Nested objects whose Go struct struct-fields.md lists, for the order/field checks."""
    found: list[tuple[str, str, JsonDict]] = []

    def add(sub_type: str, value: Any, sub_where: str) -> None:
        if isinstance(value, dict):
            found.append((sub_where, sub_type, value))
            found.extend(nested(sub_type, value, sub_where))

    if go_type == "Allocation":
        add("Job", obj.get("Job"), f"{where}.Job")
        add("AllocMetric", obj.get("Metrics"), f"{where}.Metrics")
    if go_type in ("Allocation", "AllocListStub"):
        add("DesiredTransition", obj.get("DesiredTransition"), f"{where}.DesiredTransition")
        for task, state in (obj.get("TaskStates") or {}).items():
            add("TaskState", state, f"{where}.TaskStates.{task}")
    if go_type == "TaskState":
        for i, event in enumerate(obj.get("Events") or []):
            add("TaskEvent", event, f"{where}.Events[{i}]")
    if go_type == "Job":
        add("UpdateStrategy", obj.get("Update"), f"{where}.Update")
    if go_type == "JobListStub":
        add("JobSummary", obj.get("JobSummary"), f"{where}.JobSummary")
    if go_type == "JobSummary":
        for group, summary in (obj.get("Summary") or {}).items():
            add("TaskGroupSummary", summary, f"{where}.Summary.{group}")
        add("JobChildrenSummary", obj.get("Children"), f"{where}.Children")
    if go_type in ("Node", "NodeListStub"):
        for driver, info in (obj.get("Drivers") or {}).items():
            add("DriverInfo", info, f"{where}.Drivers.{driver}")
    if go_type == "Node":
        for i, event in enumerate(obj.get("Events") or []):
            add("NodeEvent", event, f"{where}.Events[{i}]")
    return found


def report(errors: list[str]) -> str:
    return f"{len(errors)} problem(s):\n" + "\n".join(errors)


# -- tests ---------------------------------------------------------------------


def test_schema_adjustment_is_limited_to_null() -> None:
    """The nullable copy still rejects wrong types, and nulls where Nomad never writes one."""
    job: JsonDict = {"ID": "j", "Priority": 50, "TaskGroups": [], "Payload": None}
    assert schema_errors("Job", job, "job") == []
    assert schema_errors("Job", {**job, "Priority": "50"}, "job")
    assert schema_errors("Job", {**job, "ID": None}, "job")  # string fields stay non-null
    assert schema_errors("Job", {**job, "TaskGroups": {}}, "job")
    # Allocation is `_struct omitempty`: nil fields are left out, never written as null.
    assert schema_errors("Allocation", {"ID": "a", "Job": None}, "alloc")
    assert schema_errors("Allocation", {"ID": "a", "CreateIndex": -1}, "alloc")
    assert schema_errors("Allocation", {"ID": "a", "Job": {"Priority": True}}, "alloc")
    # TaskState is not: a zero time.Time is null, any other must be RFC 3339.
    state: JsonDict = {"State": "running", "StartedAt": None, "Events": None}
    assert schema_errors("TaskState", state, "state") == []
    assert schema_errors("TaskState", {**state, "StartedAt": "yesterday"}, "state")
    assert schema_errors("TaskState", {**state, "Restarts": "0"}, "state")
    # Unknown keys are allowed (Nomad is newer than the schema).
    assert schema_errors("TaskState", {**state, "Paused": ""}, "state") == []


def test_responses_match_openapi_schemas(snapshot: Snapshot) -> None:
    errors: list[str] = []
    seen: set[str] = set()
    for where, go_type, obj in documents(snapshot):
        seen.add(go_type)
        errors += schema_errors(OPENAPI_NAME.get(go_type, go_type), obj, where)
    assert seen == {
        "Job",
        "JobListStub",
        "Allocation",
        "AllocListStub",
        "Node",
        "NodeListStub",
        "Evaluation",
        "VariableDecrypted",
        "VariableMetadata",
    }
    assert not errors, report(errors)


def test_full_allocations_and_evaluations_omit_zero_values(snapshot: Snapshot) -> None:
    errors = [
        f"{where} ({go_type}) writes zero-valued fields: {zero_valued_keys(obj)}"
        for where, go_type, obj in documents(snapshot)
        if go_type in ("Allocation", "Evaluation") and zero_valued_keys(obj)
    ]
    assert not errors, report(errors)


def test_first_allocation_has_no_previous_allocation(snapshot: Snapshot) -> None:
    alloc = snapshot.responses[f"before GET /v1/allocation/{snapshot.first_alloc_id}"]
    assert "PreviousAllocation" not in alloc
    assert "NextAllocation" not in alloc
    assert "DesiredTransition" not in alloc  # all-nil comparable struct: omitted
    assert "DesiredDescription" not in alloc
    assert "FollowupEvalID" not in alloc
    assert alloc["ClientStatus"] == "running"


def test_list_stubs_and_other_types_keep_all_fields(snapshot: Snapshot) -> None:
    errors: list[str] = []
    for where, go_type, obj in documents(snapshot):
        if go_type == "AllocListStub" and "PreviousAllocation" in obj:
            errors.append(f"{where}: AllocListStub has no PreviousAllocation field")
        errors += missing_errors(go_type, obj, where)
        for sub_where, sub_type, sub in nested(go_type, obj, where):
            errors += missing_errors(sub_type, sub, sub_where)
    stub = snapshot.responses["before GET /v1/jobs"][0]
    assert stub["ParentID"] == ""
    assert stub["StatusDescription"] == ""
    assert not errors, report(errors)


def test_keys_follow_go_declaration_order(snapshot: Snapshot) -> None:
    errors: list[str] = []
    for where, go_type, obj in documents(snapshot):
        # Node's encoding extension appends the legacy `Drain` after all fields.
        trailing = ("Drain",) if go_type == "Node" else ()
        errors += order_errors(go_type, obj, where, trailing)
        for sub_where, sub_type, sub in nested(go_type, obj, where):
            errors += order_errors(sub_type, sub, sub_where)
    assert not errors, report(errors)


def test_migrated_allocation_links_and_transition(snapshot: Snapshot) -> None:
    old_id, new_id = snapshot.first_alloc_id, snapshot.replacement_id
    old = snapshot.responses[f"after GET /v1/allocation/{old_id}"]
    new = snapshot.responses[f"after GET /v1/allocation/{new_id}"]
    # (Both are schema-validated with every other response in test_responses_match_openapi_schemas.)
    assert old["NextAllocation"] == new_id
    assert old["DesiredStatus"] == "stop"
    assert old["DesiredTransition"] == {
        "Migrate": True,
        "Reschedule": None,
        "ForceReschedule": None,
        "NoShutdownDelay": None,
        "MigrateDisablePlacement": None,
    }
    assert "NextAllocation" not in new
    assert "DesiredTransition" not in new
    stubs = {
        a["ID"]: a for a in snapshot.responses[f"after GET /v1/job/{snapshot.job_id}/allocations"]
    }
    assert stubs[old_id]["NextAllocation"] == new_id
    assert stubs[old_id]["DesiredTransition"]["Migrate"] is True
    assert stubs[new_id]["NextAllocation"] == ""
    assert stubs[new_id]["DesiredTransition"] == dict.fromkeys(old["DesiredTransition"])
    # The default migration ordering is the one observed in production, where
    # the replacement carries no PreviousAllocation (the client ordering sets
    # it; see test_lifecycle.test_drain_client_ordering).
    assert "PreviousAllocation" not in new


def test_network_resources_omit_zero_values(snapshot: Snapshot) -> None:
    """NetworkResource, Port and AllocatedPortMapping are `_struct omitempty` too."""
    errors: list[str] = []
    for where, go_type, obj in documents(snapshot):
        if go_type != "Allocation":
            continue
        shared = obj["AllocatedResources"]["Shared"]
        for i, network in enumerate(shared.get("Networks") or []):
            if zero_valued_keys(network):
                errors.append(f"{where} Shared.Networks[{i}]: {zero_valued_keys(network)}")
            for kind in ("DynamicPorts", "ReservedPorts"):
                for j, port in enumerate(network.get(kind) or []):
                    if zero_valued_keys(port):
                        errors.append(f"{where} Shared.Networks[{i}].{kind}[{j}]: {port}")
        for i, mapping in enumerate(shared.get("Ports") or []):
            if zero_valued_keys(mapping):
                errors.append(f"{where} Shared.Ports[{i}]: {zero_valued_keys(mapping)}")
    assert not errors, report(errors)


def test_struct_rule_checks_detect_violations() -> None:
    """The order / omission / presence helpers are not vacuous."""
    assert order_errors("Allocation", {"ID": "a", "EvalID": "e", "Namespace": "n"}, "x")
    assert order_errors("Allocation", {"ID": "a", "Services": {}}, "x")
    assert order_errors("Allocation", {"ID": "a", "Namespace": "n", "EvalID": "e"}, "x") == []
    assert order_errors("Node", {"ID": "n", "Drain": False}, "x", ("Drain",)) == []
    assert order_errors("Node", {"Drain": False, "ID": "n"}, "x", ("Drain",))
    assert zero_valued_keys({"A": "", "B": 0, "C": None, "D": False, "E": {}, "F": [], "G": 1}) == [
        "A=''",
        "B=0",
        "C=None",
        "D=False",
        "E={}",
        "F=[]",
    ]
    assert zero_valued_keys({"DesiredTransition": {"Migrate": None}}) == [
        "DesiredTransition={'Migrate': None}"
    ]
    assert zero_valued_keys({"DesiredTransition": {"Migrate": True}}) == []
    assert missing_errors("JobListStub", {"ID": "j"}, "x")
    assert missing_errors("Allocation", {"ID": "a"}, "x") == []
