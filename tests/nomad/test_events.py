"""events: Nomad's event frames decoded into typed references."""

from __future__ import annotations

from typing import Any

import pytest

from controller.nomad.events import EventRef, decode_events

CASES: list[tuple[str, dict[str, Any], EventRef]] = [
    (
        "a job names itself by its key",
        {"Topic": "Job", "Type": "JobRegistered", "Key": "7-x", "Payload": {"Job": {}}},
        EventRef("Job", "JobRegistered", "7-x", "7-x"),
    ),
    (
        "an allocation names its job",
        {
            "Topic": "Allocation",
            "Type": "AllocationUpdated",
            "Key": "a1",
            "Payload": {"Allocation": {"ID": "a1", "JobID": "7-x"}},
        },
        EventRef("Allocation", "AllocationUpdated", "a1", "7-x"),
    ),
    (
        "an evaluation names its job",
        {
            "Topic": "Evaluation",
            "Type": "EvaluationUpdated",
            "Key": "e1",
            "Payload": {"Evaluation": {"JobID": "7-x"}},
        },
        EventRef("Evaluation", "EvaluationUpdated", "e1", "7-x"),
    ),
    (
        "a node names no job",
        {"Topic": "Node", "Type": "NodeDrain", "Key": "n1", "Payload": {"Node": {}}},
        EventRef("Node", "NodeDrain", "n1", None),
    ),
    (
        "a payload without the object names nothing",
        {"Topic": "Allocation", "Type": "AllocationUpdated", "Key": "a1", "Payload": None},
        EventRef("Allocation", "AllocationUpdated", "a1", ""),
    ),
]


@pytest.mark.parametrize(("name", "raw", "decoded"), CASES, ids=[c[0] for c in CASES])
def test_decode(name: str, raw: dict[str, Any], decoded: EventRef) -> None:
    assert decode_events([raw]) == (decoded,)


def test_entries_that_are_not_objects_are_skipped() -> None:
    assert decode_events(["x", None, 3]) == ()
