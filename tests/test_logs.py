"""Structured logging: context fields on every line, JSON or text."""

from __future__ import annotations

import json
import logging

import pytest

from controller.logs import (
    JsonFormatter,
    Redact,
    TextFormatter,
    configure_logging,
    log_context,
    redact,
)


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


SECRET = "api-token-value-0123456789"


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        # as the websockets library prints a handshake at DEBUG
        ("> Poseidon-Token: abc123def", "> Poseidon-Token: [redacted]"),
        ("> X-Nomad-Token: 3f9c1e1a-aaaa", "> X-Nomad-Token: [redacted]"),
        ("> Authorization: Bearer abc.def", "> Authorization: [redacted]"),
        (
            "headers {'X-Nomad-Token': 'abc', 'Accept': '*/*'}",
            "headers {'X-Nomad-Token': '[redacted]', 'Accept': '*/*'}",
        ),
        ("(b'poseidon-token', b'abc')", "(b'poseidon-token', b'[redacted]')"),
        # the exec URL: the client's command and environment
        (
            "> GET /v1/client/allocation/a1/exec?task=t&command=%5B%22bash%22%5D&tty=true HTTP/1.1",
            "> GET /v1/client/allocation/a1/exec?task=t&command=[redacted]&tty=true HTTP/1.1",
        ),
        (f"anything with {SECRET} in it", "anything with [redacted] in it"),
        ("""> TEXT '{"type":"stdout","data":"x"}' [30 bytes]""", "> TEXT [redacted]"),
        ("< BINARY 01 02 03 [3 bytes]", "< BINARY [redacted]"),
        ("claimed runner 7-x of environment 7", "claimed runner 7-x of environment 7"),
    ],
)
def test_redaction(line: str, kept: str) -> None:
    assert redact(line, [SECRET]) == kept


def test_a_redacted_record_keeps_nothing_secret(caplog: pytest.LogCaptureFixture) -> None:
    rec = logging.LogRecord(
        "websockets.client", logging.DEBUG, __file__, 1, "> %s: %s", ("X-Nomad-Token", SECRET), None
    )
    try:
        raise RuntimeError(f"failed with {SECRET}")
    except RuntimeError:
        import sys

        rec.exc_info = sys.exc_info()
    assert Redact([SECRET]).filter(rec)
    text = TextFormatter().format(rec)
    assert SECRET not in text and "[redacted]" in text
    assert "RuntimeError: failed with [redacted]" in text


def test_configure_logging_redacts_every_logger(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("DEBUG", "text", [SECRET])
        for name in ("websockets.client", "websockets.server", "controller.x", "some.library"):
            logging.getLogger(name).debug("token %s and Poseidon-Token: abc", SECRET)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for f in [f for f in root.filters if isinstance(f, Redact)]:
            root.removeFilter(f)
    err = capsys.readouterr().err
    assert err.count("token [redacted] and Poseidon-Token: [redacted]") == 4, err
    assert SECRET not in err and "abc" not in err
