"""Nomad exec events → Poseidon frames: table tests of the pure translation,
and every frame checked against Poseidon's WebSocket schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft7Validator

from controller.execution.frames import (
    OOM_MESSAGE,
    Exit,
    Failed,
    Lost,
    Outcome,
    Released,
    TimedOut,
    encode,
    translate,
)
from controller.model import LossReason
from controller.nomad.exec import ExecEvent, Output, StreamClosed
from tests.reference import document

SCHEMA = Draft7Validator(json.loads(document("poseidon-websocket.schema.json").read_text()))
EURO = "€".encode()  # three bytes: e2 82 ac
MIGRATED = (
    "the runner was lost: migrated (its allocation was migrated to another node; "
    "its file system was reset)"
)
BROKEN = "Error executing the request: the connection to Nomad ended before the exit code"


def out(data: bytes, stream: Any = "stdout") -> Output:
    return Output(stream, data)


CASES: list[tuple[str, list[ExecEvent], Outcome, list[dict[str, Any]]]] = [
    (
        "echo",
        [out(b"hi\n")],
        Exit(0),
        [{"type": "stdout", "data": "hi\n"}, {"type": "exit", "data": 0}],
    ),
    ("no output at all", [], Exit(0), [{"type": "exit", "data": 0}]),
    (
        "empty chunks make no frame",
        [out(b""), out(b"", "stderr")],
        Exit(1),
        [{"type": "exit", "data": 1}],
    ),
    ("exit 1", [], Exit(1), [{"type": "exit", "data": 1}]),
    ("exit 137", [], Exit(137), [{"type": "exit", "data": 137}]),
    ("exit 255", [], Exit(255), [{"type": "exit", "data": 255}]),
    ("an exit code beyond a byte is cast", [], Exit(256 + 3), [{"type": "exit", "data": 3}]),
    ("a negative exit code is cast", [], Exit(-1), [{"type": "exit", "data": 255}]),
    (
        "stderr apart",
        [out(b"a"), out(b"b", "stderr")],
        Exit(0),
        [
            {"type": "stdout", "data": "a"},
            {"type": "stderr", "data": "b"},
            {"type": "exit", "data": 0},
        ],
    ),
    (
        "a character split across chunks arrives whole",
        [out(b"x" + EURO[:1]), out(EURO[1:2]), out(EURO[2:] + b"y")],
        Exit(0),
        [
            {"type": "stdout", "data": "x"},
            {"type": "stdout", "data": "€y"},
            {"type": "exit", "data": 0},
        ],
    ),
    (
        "splits in both streams at once do not mix",
        [out(EURO[:2]), out(EURO[:1], "stderr"), out(EURO[2:]), out(EURO[1:], "stderr")],
        Exit(0),
        [
            {"type": "stdout", "data": "€"},
            {"type": "stderr", "data": "€"},
            {"type": "exit", "data": 0},
        ],
    ),
    (
        "an incomplete character at a stream's end becomes U+FFFD",
        [out(b"ok" + EURO[:2]), StreamClosed("stdout")],
        Exit(0),
        [
            {"type": "stdout", "data": "ok"},
            {"type": "stdout", "data": "\ufffd"},
            {"type": "exit", "data": 0},
        ],
    ),
    (
        "an incomplete character is flushed before the terminal frame",
        [out(EURO[:1])],
        TimedOut(),
        [{"type": "stdout", "data": "\ufffd"}, {"type": "timeout"}],
    ),
    (
        "bytes that are not UTF-8",
        [out(b"\xff\xfeA")],
        Exit(0),
        [{"type": "stdout", "data": "\ufffd\ufffdA"}, {"type": "exit", "data": 0}],
    ),
    (
        "timeout",
        [out(b"tick\n")],
        TimedOut(),
        [{"type": "stdout", "data": "tick\n"}, {"type": "timeout"}],
    ),
    (
        "OOM kill: CodeOcean's exact text",
        [],
        Lost(LossReason.OOM_KILLED),
        [{"type": "error", "data": OOM_MESSAGE}],
    ),
    (
        "a migration names the loss",
        [],
        Lost(LossReason.MIGRATED),
        [
            {
                "type": "error",
                "data": MIGRATED,
            }
        ],
    ),
    (
        "released meanwhile",
        [],
        Released(),
        [{"type": "error", "data": "the runner was released while the execution ran"}],
    ),
    (
        "Nomad broke off the exec: an error, never exit 0",
        [out(b"partial")],
        Failed(BROKEN),
        [
            {"type": "stdout", "data": "partial"},
            {
                "type": "error",
                "data": BROKEN,
            },
        ],
    ),
]


@pytest.mark.parametrize(("name", "events", "outcome", "frames"), CASES, ids=[c[0] for c in CASES])
def test_translation(
    name: str, events: list[ExecEvent], outcome: Outcome, frames: list[dict[str, Any]]
) -> None:
    got = translate(events, outcome)
    assert got == frames
    for frame in got:
        errors = [e.message for e in SCHEMA.iter_errors(frame)]
        assert not errors, (frame, errors)


def test_the_schema_rejects_frames_with_extra_keys() -> None:
    """The check above can fail: CodeOcean drops frames that do not match."""
    assert list(SCHEMA.iter_errors({"type": "exit", "data": 0, "code": 0}))
    assert list(SCHEMA.iter_errors({"type": "exit", "data": 256}))
    assert not list(SCHEMA.iter_errors({"type": "start"}))


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "start"},
        {"type": "stdout", "data": 'h\u00e9llo \u20ac\r\n\t\x1b[31m\x00\x7f"\\ end'},
        {"type": "stderr", "data": "\ufffd"},
        {"type": "exit", "data": 255},
        {"type": "error", "data": "a message with a lone surrogate \ud800"},
    ],
)
def test_an_encoded_frame_is_compact_json_with_text_as_is(frame: dict[str, Any]) -> None:
    """What the client receives parses back to the frame; characters outside
    ASCII stay as they are (not escaped), separators are compact; a lone
    surrogate, which orjson refuses, still encodes."""
    text = encode(frame)
    assert json.loads(text) == frame
    assert ", " not in text and '": ' not in text
    data = frame.get("data")
    if isinstance(data, str) and "\u20ac" in data:
        assert "\u20ac" in text  # the euro sign itself, not its escape
