"""wire: the parts of Nomad's largest answers that the controller reads, as
msgspec types, so those answers are decoded into dicts holding only them.

An allocation list stub with its task states and resources is about 3 KB of
JSON, of which `decode.decode_allocation` reads a tenth; a job stub about
800 bytes, of which `decode_job_stub` reads eight fields; an event frame a
whole job or allocation, of which `events.decode_events` reads three. Decoded
by the json module, every field becomes a Python object first: at 10,000
runners a full allocation list was over 100 MB of dicts held at once. msgspec
skips the fields a type does not name while it parses, and makes the others
into the same dicts and values the json module would have made, so the
decoders behind it are unchanged.

Every scalar is typed `Any` and every container may be null: a type that
refused a value Nomad can send would turn the fast path into the slow one,
and the decoders read each value leniently anyway. An answer of another shape
(a container where none is declared, an error object instead of a list, or
no JSON at all) is decoded by `loads`' fallback as a whole, keeping every
field, so the caller sees what it saw before.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict, TypeVar

import msgspec

T = TypeVar("T")


class _TaskEvent(TypedDict, total=False):
    Type: Any
    Time: Any
    Details: Any


class _TaskState(TypedDict, total=False):
    Restarts: Any
    StartedAt: Any
    Events: list[_TaskEvent] | None


class _SharedResources(TypedDict, total=False):
    Ports: Any
    Networks: Any


class _TaskResources(TypedDict, total=False):
    Networks: Any


class _AllocatedResources(TypedDict, total=False):
    Shared: _SharedResources | None
    Tasks: dict[str, _TaskResources] | None


class _DesiredTransition(TypedDict, total=False):
    Migrate: Any


class AllocListStub(TypedDict, total=False):
    """What `decode_allocation` reads of an AllocListStub."""

    ID: Any
    JobID: Any
    NodeID: Any
    NodeName: Any
    ClientStatus: Any
    DesiredStatus: Any
    DesiredDescription: Any
    DesiredTransition: _DesiredTransition | None
    CreateIndex: Any
    ModifyIndex: Any
    CreateTime: Any
    ModifyTime: Any
    TaskStates: dict[str, _TaskState] | None
    AllocatedResources: _AllocatedResources | None


class JobListStub(TypedDict, total=False):
    """What `decode_job_stub` reads of a JobListStub."""

    ID: Any
    JobModifyIndex: Any
    ModifyIndex: Any
    CreateIndex: Any
    SubmitTime: Any
    Status: Any
    Stop: Any
    Type: Any


class _Named(TypedDict, total=False):
    JobID: Any


class _Event(TypedDict, total=False):
    Topic: Any
    Type: Any
    Key: Any
    # Keyed by the topic: {"Allocation": {...}}, {"Job": {...}}.
    Payload: dict[str, _Named | None] | None


class Frame(TypedDict, total=False):
    """What `events.decode_events` and the stream read of an event frame
    (`{}` is a heartbeat)."""

    Index: Any
    Events: list[_Event] | None


ALLOC_LIST: msgspec.json.Decoder[list[AllocListStub] | None] = msgspec.json.Decoder(
    list[AllocListStub] | None
)
JOB_LIST: msgspec.json.Decoder[list[JobListStub] | None] = msgspec.json.Decoder(
    list[JobListStub] | None
)
FRAME: msgspec.json.Decoder[Frame] = msgspec.json.Decoder(Frame)


def loads(data: bytes, typed: msgspec.json.Decoder[T] | None = None) -> T | Any:
    """`data` decoded by `typed` when it has that shape, else by the json
    module (every field kept; ValueError when `data` is no JSON)."""
    if typed is not None:
        try:
            return typed.decode(data)
        except msgspec.DecodeError:
            pass  # another shape, or no JSON: the json module says which
    return json.loads(data)


def frame(line: bytes) -> Any:
    """One line of the event stream: a frame of Nomad's shape decoded into the
    fields it is read for, anything else whole (ValueError when no JSON).
    A heartbeat is `{}`; a line the type sees as empty but which held fields
    it skips (`{"Error": ...}`) is decoded whole, so it is not taken for one."""
    decoded = loads(line, FRAME)
    if decoded == {} and b"".join(line.split()) != b"{}":
        return json.loads(line)
    return decoded
