"""Structured logging: JSON lines (for containers and log shippers) or text
(for a terminal), each line carrying the context it happened in
(`environment_id`, `runner_id`, `reconcile_id`, `reason`) from `log_context`
or from a call's `extra=`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
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


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send the controller's logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Per-request lines from the HTTP stacks would drown the controller's own.
    for noisy in ("urllib3", "uvicorn.access", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
