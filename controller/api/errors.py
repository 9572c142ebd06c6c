"""Every error the API answers, in one shape: `{message, errorCode?}`.

- `ApiError` is raised by routes for the answers they decide on (400, 404, 410...);
  a draining replica's 503 SHUTTING_DOWN comes from `drain.DrainGate`.
- A runner that cannot be used (`dataplane.runners.Unusable`) and a file
  operation or exec that failed are answered from one table,
  `controller.dataplane.answers` (`from_answer`).
- Controller and Nomad exceptions map to Poseidon's codes: `NotLeader` → 503
  NOT_LEADER, `NomadUnavailable` → 500 NOMAD_UNREACHABLE, `NomadAPIError` →
  500 NOMAD_INTERNAL_SERVER_ERROR; `TemplateUnread` (an environment whose
  template job is listed but not yet readable) → 500 NOMAD_UNREACHABLE, never
  404, which CodeOcean answers by putting the environment again.
- The rule every answer follows: messages are ours. Nomad's own text (which
  can name internal addresses or policies) is logged with the request or the
  runner, never answered; a file operation's 409/424/500 carries what the
  runner's own script saw (a path, "no such file"), which is the client's.
- FastAPI's parameter validation errors become 400 (Poseidon's code, not 422),
  and Starlette's 404 / 405 take the same shape.
- `CatchAll` is the last resort: any other exception is logged and answered
  500 UNKNOWN (one of Poseidon's codes) without a traceback. Unlike an
  exception handler for `Exception`, it does not re-raise to the server.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.api.models import Error, ErrorCode
from controller.dataplane.answers import Answer
from controller.dataplane.runners import Unusable
from controller.nomad.gateway import NomadAPIError, NomadUnavailable
from controller.reconcile.claims import NotLeader, TemplateUnread
from controller.reconcile.facade import Pools

log = logging.getLogger(__name__)

INTERNAL_ERROR = "internal error"
OPERATION_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


class ApiError(Exception):
    """An error answer decided by a route."""

    def __init__(
        self,
        status: int,
        message: str,
        code: ErrorCode | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


def from_answer(answer: Answer) -> ApiError:
    """The table's answer (`controller.dataplane.answers`) as an HTTP error."""
    code = ErrorCode(answer.code) if answer.code is not None else None
    return ApiError(answer.status, answer.message, code, dict(answer.headers))


def error_response(
    status: int,
    message: str,
    code: ErrorCode | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = Error(message=message, errorCode=code).model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def describe_errors(errors: Iterable[Mapping[str, Any]]) -> str:
    """`field.path: what is wrong; …` from pydantic/FastAPI validation errors."""
    parts = []
    for error in errors:
        loc: Sequence[Any] = error.get("loc") or ()
        if loc and loc[0] in ("body", "path", "query", "header"):
            loc = loc[1:]
        where = ".".join(str(part) for part in loc) or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def not_serving_message(controller: Pools) -> str:
    """Why a replica does not serve yet (503 NOT_LEADER, the code kept for the
    clients that know it): every replica serves once it has observed Nomad."""
    return "this replica has not observed Nomad yet; retry shortly or on another replica"


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method the API description lists for `path`."""
    methods: set[str] = set()
    for template, item in app.openapi().get("paths", {}).items():
        regex, _, _ = compile_path(template)
        if regex.match(path):
            methods |= {m.upper() for m in item if m in OPERATION_METHODS}
    return sorted(methods)


def install(app: FastAPI, controller: Pools) -> None:
    """Register the handlers and the catch-all on `app`."""

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.message, exc.code, exc.headers)

    async def refused(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Unusable)
        error = from_answer(exc.answer)
        return error_response(error.status, error.message, error.code, error.headers)

    async def not_leader(_: Request, __: Exception) -> JSONResponse:
        return error_response(503, not_serving_message(controller), ErrorCode.NOT_LEADER)

    async def nomad_unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("%s %s: Nomad unreachable: %s", request.method, request.url.path, exc)
        return error_response(500, "Nomad is unreachable", ErrorCode.NOMAD_UNREACHABLE)

    async def template_unread(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TemplateUnread)
        log.warning(
            "%s %s: the template of environment %d is not readable yet",
            request.method,
            request.url.path,
            exc.env_id,
        )
        return error_response(
            500,
            f"execution environment {exc.env_id} exists, but Nomad did not answer the read "
            "of its template yet; retry later",
            ErrorCode.NOMAD_UNREACHABLE,
        )

    async def nomad_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, NomadAPIError)
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return error_response(
            500,
            f"Nomad answered with an error (status {exc.status})",
            ErrorCode.NOMAD_INTERNAL_SERVER_ERROR,
        )

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(400, describe_errors(exc.errors()))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        messages = {404: "no such route", 405: "method not allowed"}
        message = messages.get(exc.status_code) or str(exc.detail)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route matching the path only.
            allowed = allowed_methods(app, request.url.path)
            if allowed:
                headers["Allow"] = ", ".join(allowed)
        return error_response(exc.status_code, message, headers=headers)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(Unusable, refused)
    app.add_exception_handler(NotLeader, not_leader)
    app.add_exception_handler(NomadUnavailable, nomad_unavailable)
    app.add_exception_handler(NomadAPIError, nomad_api_error)
    app.add_exception_handler(TemplateUnread, template_unread)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)


class CatchAll:
    """ASGI middleware: an exception no handler took becomes 500 UNKNOWN."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise  # the answer is under way: let the server cut it off
            response = error_response(500, INTERNAL_ERROR, ErrorCode.UNKNOWN)
            await response(scope, receive, send)


# -- OpenAPI ---------------------------------------------------------------------

DESCRIPTIONS = {
    400: "Invalid request: malformed JSON, a missing, unknown or wrongly typed field, "
    "a value out of range, or an invalid path or query parameter. The message names it.",
    401: "Authentication is required: `Poseidon-Token: <token>` or `Authorization: Bearer "
    "<token>` is missing or wrong.",
    404: "The entity does not exist.",
    410: "The runner is not available any longer: unknown, released, or lost (the "
    "message says why it was lost).",
    408: "The request body sent nothing for NRC_FILES_UPLOAD_IDLE_TIMEOUT.",
    409: "The runner's file system conflicts with the request: a directory where a file "
    "is to be copied, or a file where a directory is needed (delete it first); or a "
    "symbolic link on the path, which file operations never follow (for list and "
    "download: privileged ones).",
    413: "The request body exceeds its limit (1 MiB; PATCH /files: NRC_FILES_MAX_UPLOAD).",
    403: "A request from a web page whose Origin is not in NRC_API_ALLOWED_ORIGINS.",
    429: "Too many executions wait for their WebSocket connect (per runner or in all): "
    "connect to them first.",
    416: "The Range lies beyond the end of the file (Content-Range names its size).",
    424: "The path does not exist, cannot be read, or (for a download) is not a file.",
    426: "A plain GET: the execution runs over a WebSocket; connect with an upgrade.",
    500: "The request could not be handled: NOMAD_OVERLOAD (no idle runner ready), "
    "NOMAD_UNREACHABLE, NOMAD_INTERNAL_SERVER_ERROR, or UNKNOWN.",
    503: "NOT_LEADER: this replica does not serve yet (it has not observed Nomad since it "
    "started; every replica serves once it has, leader or not); SHUTTING_DOWN: this replica "
    "drains before it stops (Retry-After: retry, another replica serves).",
}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for error statuses, all with the Error body."""
    return {s: {"model": Error, "description": DESCRIPTIONS[s]} for s in statuses}
