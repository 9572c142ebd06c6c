"""wire: Nomad's lists and event frames decoded into only the fields that are
read give what the whole answer decoded by the json module gives, and
answers as Nomad writes them take the fast path."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.nomad import wire
from controller.nomad.decode import decode_allocations, decode_job_stubs
from controller.nomad.events import decode_events, frame_events
from tests.nomad.test_decode import DOCS_STUB, FULL_MIGRATING, STUB

# -- what the stream makes of a frame ----------------------------------------------


def delivered(frame: Any) -> Any:
    """A frame as the stream takes it: a heartbeat, refused, or its events."""
    if frame == {}:
        return "heartbeat"
    shaped = frame_events(frame)
    return "refused" if shaped is None else (shaped[0], decode_events(shaped[1]))


# -- answers as Nomad writes them --------------------------------------------------

PENDING = {"ID": "a9", "JobID": "9-z", "CreateIndex": 3, "TaskStates": None}
NULLS = {**STUB, "TaskStates": None, "DesiredTransition": None, "AllocatedResources": None}
NO_EVENTS = {**STUB, "TaskStates": {"t": {"State": "pending", "Events": None}}}


@pytest.mark.parametrize(
    "alloc",
    [STUB, DOCS_STUB, FULL_MIGRATING, PENDING, NULLS, NO_EVENTS],
    ids=["stub", "docs", "full", "pending", "nulls", "no-events"],
)
def test_an_allocation_list_takes_the_fast_path_and_decodes_alike(alloc: dict[str, Any]) -> None:
    data = json.dumps([alloc, alloc]).encode()
    typed = wire.ALLOC_LIST.decode(data)  # raises if Nomad's shape left the fast path
    assert typed is not None
    assert set(typed[0]) <= set(wire.AllocListStub.__annotations__)
    assert decode_allocations(wire.loads(data, wire.ALLOC_LIST)) == decode_allocations(
        json.loads(data)
    )


def test_only_the_read_fields_of_an_allocation_are_kept() -> None:
    data = json.dumps([FULL_MIGRATING]).encode()
    (kept,) = wire.ALLOC_LIST.decode(data) or []
    assert "EvalID" not in kept and "NextAllocation" not in kept
    assert (kept.get("TaskStates") or {})["default-task"] == {
        "StartedAt": "2026-01-05T10:00:01.5Z",
        "Events": [{"Type": "Started", "Time": 1767607201500000000}],
    }


def test_a_job_list_takes_the_fast_path() -> None:
    stub = {
        "ID": "7-x",
        "Name": "7-x",
        "Datacenters": ["dc1"],
        "JobSummary": {"Summary": {"g": {"Running": 1}}},
        "JobModifyIndex": 9,
        "ModifyIndex": 10,
        "CreateIndex": 2,
        "SubmitTime": 1767607200000000000,
        "Status": "running",
        "Stop": False,
        "Type": "batch",
        "Meta": None,
    }
    data = json.dumps([stub]).encode()
    (kept,) = wire.JOB_LIST.decode(data) or []
    assert "JobSummary" not in kept and "Datacenters" not in kept
    assert decode_job_stubs(wire.loads(data, wire.JOB_LIST)) == decode_job_stubs(json.loads(data))


@pytest.mark.parametrize(
    "body",
    [
        {"Error": "Permission denied"},  # an object, not a list
        [{"ID": "a", "TaskStates": ["not", "a", "map"]}],  # a container of another kind
        [1, "two", {"ID": "a3", "JobID": "j"}],  # entries that are no objects
        None,
    ],
    ids=["object", "wrong-container", "no-objects", "null"],
)
def test_an_answer_of_another_shape_is_decoded_whole(body: Any) -> None:
    data = json.dumps(body).encode()
    assert wire.loads(data, wire.ALLOC_LIST) == body
    assert decode_allocations(wire.loads(data, wire.ALLOC_LIST)) == decode_allocations(body)


def test_no_json_is_a_value_error() -> None:
    with pytest.raises(json.JSONDecodeError, match="Expecting value"):
        wire.loads(b"<html>bad gateway</html>", wire.ALLOC_LIST)


def test_a_heartbeat_is_only_an_empty_object() -> None:
    assert wire.frame(b"{}") == {}
    # Every field of this line is one the frame type skips; it is no heartbeat.
    assert wire.frame(b'{"Error":"subscription closed by server"}') == {
        "Error": "subscription closed by server"
    }


def test_a_frame_keeps_what_its_events_are_read_from() -> None:
    line = orjson.dumps(
        {
            "Index": 7,
            "Events": [
                {
                    "Topic": "Allocation",
                    "Type": "AllocationUpdated",
                    "Key": "a1",
                    "Namespace": "default",
                    "FilterKeys": ["7-x"],
                    "Index": 7,
                    "Payload": {"Allocation": FULL_MIGRATING},
                }
            ],
        }
    )
    frame = wire.FRAME.decode(line)
    assert frame == {
        "Index": 7,
        "Events": [
            {
                "Topic": "Allocation",
                "Type": "AllocationUpdated",
                "Key": "a1",
                "Payload": {"Allocation": {"JobID": "7-x"}},
            }
        ],
    }
    assert delivered(wire.frame(line)) == delivered(orjson.loads(line))


# -- any answer: both decodings agree ----------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def shaped(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with any of these fields, each of its likely shape or any JSON,
    and now and then a field nobody reads."""
    optional: dict[str, st.SearchStrategy[Any]] = {k: s | ANY_JSON for k, s in fields.items()}
    optional["Unread"] = ANY_JSON
    return st.fixed_dictionaries({}, optional=optional)


NAMES = st.sampled_from(["a1", "7-x", "n1", ""])
TIMES = st.sampled_from(["2026-01-05T10:00:01.5Z", "0001-01-01T00:00:00Z", None, "x"])
PORT = shaped(
    Label=st.just("http"),
    Value=st.integers(0, 65535),
    To=st.integers(-1, 65535),
    HostIP=st.sampled_from(["10.0.0.7", "::1", ""]),
)
NETWORK = shaped(IP=st.just("10.0.0.8"), DynamicPorts=st.lists(PORT, max_size=2))
TASK_EVENT = shaped(
    Type=st.sampled_from(["Terminated", "Started"]),
    Time=st.integers(0, 10),
    Details=shaped(oom_killed=st.sampled_from(["true", "false"])),
)
TASK_STATE = shaped(
    Restarts=st.integers(0, 3),
    StartedAt=TIMES,
    Events=st.lists(TASK_EVENT, max_size=3) | st.none(),
)
ALLOC = shaped(
    ID=NAMES,
    JobID=NAMES,
    NodeID=NAMES,
    ClientStatus=st.sampled_from(["running", "pending", "failed"]),
    DesiredTransition=shaped(Migrate=st.booleans()) | st.none(),
    CreateIndex=st.integers(0, 99),
    ModifyTime=st.integers(0, 2**63 - 1),
    TaskStates=st.dictionaries(st.text(max_size=3), TASK_STATE, max_size=2) | st.none(),
    AllocatedResources=shaped(
        Shared=shaped(Ports=st.lists(PORT, max_size=2), Networks=st.lists(NETWORK, max_size=1))
        | st.none(),
        Tasks=st.dictionaries(st.text(max_size=2), shaped(Networks=st.lists(NETWORK, max_size=1)))
        | st.none(),
    )
    | st.none(),
)
JOB = shaped(
    ID=NAMES,
    JobModifyIndex=st.integers(0, 99),
    Status=st.sampled_from(["running", "dead"]),
    Stop=st.booleans(),
    Type=st.sampled_from(["batch", "service"]),
)
EVENT = shaped(
    Topic=st.sampled_from(["Job", "Allocation", "Evaluation", "Node", "Deployment"]),
    Type=st.just("Updated"),
    Key=NAMES,
    Payload=st.dictionaries(
        st.sampled_from(["Job", "Allocation", "Evaluation", "Node"]),
        shaped(JobID=NAMES) | st.none(),
        max_size=2,
    ),
)
FRAME = shaped(Index=st.integers(0, 99), Events=st.lists(EVENT, max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.lists(ALLOC | ANY_JSON, max_size=3) | ANY_JSON)
def test_any_allocation_list_decodes_as_the_json_module_decodes_it(body: Any) -> None:
    data = json.dumps(body).encode()
    assert decode_allocations(wire.loads(data, wire.ALLOC_LIST)) == decode_allocations(
        json.loads(data)
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(JOB | ANY_JSON, max_size=3) | ANY_JSON)
def test_any_job_list_decodes_as_the_json_module_decodes_it(body: Any) -> None:
    data = json.dumps(body).encode()
    assert decode_job_stubs(wire.loads(data, wire.JOB_LIST)) == decode_job_stubs(json.loads(data))


@settings(max_examples=300, deadline=None)
@given(FRAME | ANY_JSON)
def test_any_frame_is_delivered_as_the_whole_frame_would_be(body: Any) -> None:
    line = json.dumps(body, separators=(",", ":")).encode()
    assert delivered(wire.frame(line)) == delivered(orjson.loads(line))


def test_the_decoders_refuse_what_they_cannot_type() -> None:
    # The premise of the fallback: a shape the types exclude raises, never
    # passes through half decoded.
    with pytest.raises(msgspec.ValidationError):
        wire.ALLOC_LIST.decode(b'[{"TaskStates": []}]')
