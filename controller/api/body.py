"""Request bodies: a size limit, and JSON parsed and validated by us.

`BodyLimit` answers 413 before reading when Content-Length is over the limit,
and stops a body without one (chunked) as soon as it grows past the limit:
the receive channel raises `BodyTooLarge`, which `read_json` turns into 413.
Nothing larger than the limit is ever held in memory.

Bodies are parsed here rather than by FastAPI so that every failure is
Poseidon's 400 with a message naming the field, whatever FastAPI version runs:
invalid JSON (also NaN/Infinity, duplicate keys, nesting too deep, numbers too
long), a body that is not an object, and any field error. As Poseidon does,
a body is read as JSON whatever its Content-Type (none, `text/plain`, a
form's): the browser defence is the request's origin (`guard`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.api.errors import ApiError, describe_errors, error_response

MAX_BODY_BYTES = 1 << 20  # 1 MiB

M = TypeVar("M", bound=BaseModel)


class BodyTooLarge(Exception):
    """The request body grew past the limit while it was read."""

    def __init__(self, limit: int) -> None:
        super().__init__(too_large_message(limit))
        self.limit = limit


@dataclass(frozen=True)
class RouteLimit:
    """A route whose bodies may be larger (or must be smaller) than the default."""

    method: str
    path: re.Pattern[str]
    max_bytes: int


class BodyLimit:
    """ASGI middleware enforcing `max_bytes` on every request body, or the
    limit of the first `routes` entry the request matches."""

    def __init__(
        self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, routes: Sequence[RouteLimit] = ()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.routes = tuple(routes)

    def limit(self, scope: Scope) -> int:
        for route in self.routes:
            if scope.get("method") == route.method and route.path.fullmatch(scope["path"]):
                return route.max_bytes
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope)
        for name, value in scope.get("headers") or ():
            if name.lower() != b"content-length":
                continue
            if not value.isdigit():
                await error_response(400, "invalid Content-Length")(scope, receive, send)
                return
            if len(value) > 19 or int(value) > limit:
                await error_response(413, too_large_message(limit))(scope, receive, send)
                return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited, send)


def too_large_message(max_bytes: int = MAX_BODY_BYTES) -> str:
    return f"request body larger than {max_bytes} bytes"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_json(raw: bytes) -> Any:
    """The JSON document in `raw`; ApiError 400 when it is not one."""
    if not raw.strip():
        raise ApiError(400, "invalid request: a JSON body is required")
    try:
        return json.loads(raw, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"invalid JSON: {exc.msg} at position {exc.pos}") from None
    except (ValueError, RecursionError) as exc:
        # ValueError: bad encoding, NaN, duplicate keys, an integer of >4300 digits.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ApiError(400, f"invalid JSON: {reason}") from None


def validate(model: type[M], document: Any) -> M:
    if not isinstance(document, dict):
        raise ApiError(400, "invalid request: the body must be a JSON object")
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise ApiError(400, describe_errors(errors)) from None


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency reading the request body as `model`."""

    async def read(request: Request) -> M:
        try:
            raw = await request.body()
        except BodyTooLarge as exc:
            raise ApiError(413, too_large_message(exc.limit)) from None
        return validate(model, parse_json(raw))

    return read


def request_body(model: type[BaseModel], description: str) -> dict[str, Any]:
    """The `openapi_extra` documenting a body read by `json_body(model)`."""
    return {
        "requestBody": {
            "description": description,
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }
