"""Structured logging: JSON lines (for containers and log shippers) or text
(for a terminal), each line carrying the context it happened in
(`environment_id`, `runner_id`, `reconcile_id`, `reason`) from `log_context`
or from a call's `extra=`.

No secret reaches a log line at any level (`Redact`, the last line of
defence): the tokens' values, whatever prints them; the values of the
`Poseidon-Token`, `X-Nomad-Token` and `Authorization` headers, which the
`websockets` library prints at DEBUG; the command of Nomad's exec URL,
which carries a client's command and environment; and the WebSocket frames
websockets prints at DEBUG (a client's input and output).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

CONTEXT_FIELDS = ("environment_id", "runner_id", "reconcile_id", "reason")

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "nrc_log_context", default=None
)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Attach fields to every log line written inside the block (this thread/task)."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out = dict(_context.get() or {})
    for name in CONTEXT_FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            out[name] = value
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _fields(record)
        if fields:
            first, nl, rest = text.partition("\n")
            extra = " ".join(f"{k}={v}" for k, v in fields.items())
            text = f"{first} [{extra}]{nl}{rest}"
        return text


REDACTED = "[redacted]"
# A header's name, its separator as a log may print it (`Name: v`, `'Name': 'v'`,
# `(b'name', b'v')`), an optional scheme, then the value. Linear: no nesting.
_SECRET_HEADER = re.compile(
    r"""(?i)((?:poseidon-token|x-nomad-token|authorization)['"]?\s*[:=,]\s*(?:b?['"])?)"""
    r"""(?:(?:bearer|basic)\s+)?[^\s'",)}\]]+"""
)
# The exec URL's command (a client's command and environment), encoded or not.
_EXEC_COMMAND = re.compile(r"(?i)([?&]command=)[^&\s'\"]+")
# WebSocket frames as websockets prints them at DEBUG (`> TEXT '...' [n bytes]`):
# a client's input and output, and Nomad's frames carrying them.
_FRAME = re.compile(r"([<>] (?:TEXT|BINARY|CONT) )[^\n]*")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the secrets' values, secret headers' values and exec commands."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    text = _SECRET_HEADER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _FRAME.sub(lambda m: m.group(1) + REDACTED, text)
    return _EXEC_COMMAND.sub(lambda m: m.group(1) + REDACTED, text)


class Redact(logging.Filter):
    """Rewrites a record's message (and its traceback's text) through `redact`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: shown as it is, still redacted
            message = f"{record.msg!r} {record.args!r}"
        record.msg, record.args = redact(message, self.secrets), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        return True


# Loggers that print what a peer sent or what we send, headers included.
CHATTY_LOGGERS = ("websockets", "uvicorn", "uvicorn.error", "httpx", "httpcore", "urllib3")


def configure_logging(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Send the controller's logs to stderr in the chosen format, redacted
    (`secrets`: the values never to show)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    redaction = Redact(secrets)
    # On the handler: every record that is written passes it, whichever
    # logger made it; on the chatty loggers too, for handlers added later.
    handler.addFilter(redaction)
    for name in CHATTY_LOGGERS:
        logger = logging.getLogger(name)
        for old_filter in [f for f in logger.filters if isinstance(f, Redact)]:
            logger.removeFilter(old_filter)
        logger.addFilter(redaction)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    for old_filter in [f for f in root.filters if isinstance(f, Redact)]:
        root.removeFilter(old_filter)
    root.addFilter(redaction)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Per-request lines from the HTTP stacks would drown the controller's own.
    for noisy in ("urllib3", "uvicorn.access", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
