"""Structured logging: context fields on every line, JSON or text."""

from __future__ import annotations

import json
import logging

import pytest

from controller.logs import JsonFormatter, TextFormatter, log_context


def record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("controller.test", logging.WARNING, __file__, 1, msg, (), None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_json_lines_carry_context_and_extras() -> None:
    with log_context(environment_id=7, reconcile_id=3):
        line = json.loads(
            JsonFormatter().format(record("lost", runner_id="7-x", reason="migrated"))
        )
    assert line["message"] == "lost" and line["level"] == "WARNING"
    assert (line["environment_id"], line["reconcile_id"]) == (7, 3)
    assert (line["runner_id"], line["reason"]) == ("7-x", "migrated")
    assert line["time"].endswith("+00:00")


def test_context_ends_with_its_block() -> None:
    with log_context(environment_id=7):
        pass
    assert "environment_id" not in json.loads(JsonFormatter().format(record("x")))


@pytest.mark.parametrize(
    ("extra", "suffix"),
    [({}, ": hello"), ({"runner_id": "7-x"}, ": hello [runner_id=7-x]")],
)
def test_text_lines(extra: dict[str, object], suffix: str) -> None:
    assert TextFormatter().format(record("hello", **extra)).endswith(suffix)
