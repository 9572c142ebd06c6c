"""events: Nomad's event frames decoded into typed references.

An event is only a hint to the controller ("look at this job again"), so all
that is kept of one is its topic, its type, its key and the job it names: a
Job event names its job by its Key, an Allocation or Evaluation event by the
JobID of its payload object; a Node event names no job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EventRef:
    topic: str  # Job, Allocation, Evaluation, Node, ...
    type: str  # JobRegistered, AllocationUpdated, ...
    key: str  # Nomad's Key: a job's, an allocation's, an evaluation's or a node's ID
    job_id: str | None  # the job the event is about; None for a Node event


def frame_events(frame: Any) -> tuple[int, list[Any]] | None:
    """A frame's `Index` and its `Events`, still undecoded; None when the
    frame is not of that shape (a heartbeat `{}` is checked before)."""
    if not isinstance(frame, dict):
        return None
    index, events = frame.get("Index"), frame.get("Events")
    if isinstance(index, bool) or not isinstance(index, int) or not isinstance(events, list):
        return None
    return index, events


def decode_events(events: Iterable[Any]) -> tuple[EventRef, ...]:
    """The events of one frame (`Events`); malformed entries are skipped."""
    out: list[EventRef] = []
    for event in events:
        if not isinstance(event, dict):
            continue
        topic = str(event.get("Topic"))
        key = str(event.get("Key") or "")
        job_id: str | None
        if topic == "Job":
            job_id = key
        elif topic == "Node":
            job_id = None
        else:
            payload = event.get("Payload")
            obj = payload.get(topic) if isinstance(payload, dict) else None
            job_id = str(obj.get("JobID") or "") if isinstance(obj, dict) else ""
        out.append(EventRef(topic, str(event.get("Type")), key, job_id))
    return tuple(out)
