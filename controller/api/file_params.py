"""The file routes' parameters: path and query annotations for the API
description, and how Poseidon reads them — Go's booleans, the first of a
repeated name, percent-encoded bytes that are not UTF-8 kept as bytes
(`surrogateescape`), a bounded Range header, Content-Disposition for any
path.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qsl, quote_from_bytes

from fastapi import Path, Query, Request

from controller.api.errors import ApiError
from controller.files import ranges
from controller.files.paths import BadPath, to_bytes

RunnerId = Annotated[str, Path(description="The runner's id (its Nomad job id).")]
PathQuery = Annotated[
    str | None,
    Query(
        alias="path",
        description="Relative to the working directory, or absolute; percent-encoded bytes "
        "that are not UTF-8 are taken as bytes.",
    ),
]
RequiredPath = Annotated[
    str,
    Query(
        alias="path",
        min_length=1,
        description="The file: relative to the working directory, or absolute; "
        "percent-encoded bytes that are not UTF-8 are taken as bytes.",
    ),
]
Privileged = Annotated[
    str | None,
    Query(
        alias="privilegedExecution",
        description="`true`: as root; otherwise as the unprivileged user (default false).",
    ),
]
Recursive = Annotated[
    str | None,
    Query(
        alias="recursive",
        description="List below subdirectories too (default true; like Poseidon, any value "
        "that is not a boolean means true).",
    ),
]

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def go_bool(value: str | None, default: bool) -> bool:
    """A query boolean as Go's strconv.ParseBool reads it; anything else is
    `default`, as Poseidon takes it."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return default


def query(request: Request) -> dict[str, str]:
    """The query parameters, bytes that are not UTF-8 kept as surrogates; the
    first value of a repeated name wins (Go's `Query().Get`)."""
    raw = request.scope.get("query_string", b"").decode("utf-8", "surrogateescape")
    out: dict[str, str] = {}
    for name, value in parse_qsl(
        raw, keep_blank_values=True, encoding="utf-8", errors="surrogateescape"
    ):
        out.setdefault(name, value)
    return out


def checked_path(value: str, name: str = "path") -> str:
    try:
        to_bytes(value)
    except BadPath as exc:
        raise ApiError(400, f"{name} {exc}") from None
    return value


def checked_range(value: str | None, max_length: int) -> str | None:
    try:
        return ranges.checked(value, max_length)
    except ranges.RangeTooLong as exc:
        raise ApiError(400, str(exc)) from None


def content_disposition(path: str) -> str:
    """`attachment` named after the path as given, as Poseidon does; an ASCII
    fallback and the exact bytes in `filename*` (RFC 6266) when needed."""
    plain = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in path)
    value = f'attachment; filename="{plain}"'
    if plain != path:
        raw = path.encode("utf-8", "surrogateescape")
        value += "; filename*=UTF-8''" + quote_from_bytes(raw, safe="")
    return value
