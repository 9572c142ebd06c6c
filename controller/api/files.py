"""File routes (Poseidon's): `PATCH /runners/{id}/files` deletes then copies,
`GET /runners/{id}/files` lists, `GET /runners/{id}/files/raw` downloads.

Like every runner route, each touches the runner (its inactivity timer starts
again), and answers 410 for an unknown, released or lost runner — a loss the
controller has derived is recorded in Nomad first, so the client hears the
same reason everywhere. While the operation runs, the runner counts as in use
(never released for inactivity under it). When Nomad refuses or breaks off
the exec, Nomad is read again: if the runner was lost meanwhile, the answer
is its 410, not a 500.

Bodies stream both ways: an upload is spooled to a temporary file and never
held in memory (`controller.files.upload`); a listing or download is sent as
the runner produces it. A stream that breaks off after its answer started
ends the connection early, so the client sees an incomplete body.

Query strings are decoded with `surrogateescape`: a path given as
percent-encoded bytes that are not UTF-8 (`%FF`) reaches the file system as
those bytes, and a listing's `\\udcXX` names map back to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import IO, Annotated, Any, TypeVar
from urllib.parse import parse_qsl, quote_from_bytes

import anyio
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from controller.api.body import BodyTooLarge, request_body, require_json, too_large_message
from controller.api.errors import ApiError, responses
from controller.api.models import ErrorCode, FileListing, FileUpdate
from controller.api.runners import claimed_runner, expired_message
from controller.files import ranges
from controller.files.paths import BadPath, to_bytes
from controller.files.ranges import http_date
from controller.files.service import (
    Conflict,
    CopyFailed,
    ExecFailed,
    FileError,
    Files,
    Interrupted,
    RangeNotSatisfiable,
    Unreadable,
)
from controller.files.upload import BadUpload, parse
from controller.model import RunnerView
from controller.nomad.exec import ExecBroken, ExecForbidden, ExecOverloaded
from controller.reconcile.facade import Pools

# Seconds a client waits before retrying a file operation Nomad was too busy for.
RETRY_AFTER_S = 2
log = logging.getLogger(__name__)
T = TypeVar("T")
# After a failure, the runner is read again after these waits (0.85 s in all)
# before the failure is believed (see `lost_meanwhile`).
SETTLE_S = (0.1, 0.25, 0.5)

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
SPOOL_CHUNK = 1 << 16


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


class CutResponses(logging.Filter):
    """Drops uvicorn's ERROR "ASGI callable returned without completing
    response." once for each response `Streamed` cut off on purpose: under
    ASGI, returning without completing is the only way to end a connection
    early, and our own warning already says why. Installed once on uvicorn's
    error logger (logging is process-wide); any other such error still shows."""

    MESSAGE = "ASGI callable returned without completing response."

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._expected = 0

    def expect(self) -> None:
        with self._lock:
            self._expected += 1

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != self.MESSAGE:
            return True
        with self._lock:
            if self._expected == 0:
                return True
            self._expected -= 1
            return False


CUT_RESPONSES = CutResponses()
logging.getLogger("uvicorn.error").addFilter(CUT_RESPONSES)


class Streamed(StreamingResponse):
    """A response whose body comes from `body` as it is produced. If the body
    breaks off (Interrupted) the response ends without completing, and the
    server closes the connection: the client sees an incomplete body. A client
    that leaves stops the stream. `done` gets the result either way."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        done: Callable[[str], None],
        *,
        status_code: int = 200,
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(body, status_code=status_code, media_type=media_type, headers=headers)
        self._body = body
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        result = "interrupted"
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                result = await self._stream(send)
                group.cancel_scope.cancel()
        finally:
            self._done(result)
            with contextlib.suppress(Exception):
                await self._body.aclose()

    async def _stream(self, send: Send) -> str:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self._body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except Interrupted as exc:
            log.warning("cut off a response: %s", exc.message)
            CUT_RESPONSES.expect()
            return "interrupted"
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "ok"


def router(
    controller: Pools, files: Files, dependencies: list[Any], max_upload_bytes: int
) -> APIRouter:
    api = APIRouter(prefix="/runners", tags=["runner"], dependencies=dependencies)
    metrics = controller.metrics

    def count(operation: str, result: str) -> None:
        metrics.file_operations.labels(operation, result).inc()

    async def in_use(runner_id: str) -> RunnerView:
        """The claimed runner (410 otherwise), in use until `end_use`."""
        view = await run_in_threadpool(claimed_runner, controller, runner_id)
        claim = view.job.claim
        assert claim is not None
        if not controller.begin_use(runner_id):
            raise ApiError(410, expired_message(runner_id, claim.timeout))
        return view

    async def lost_meanwhile(runner_id: str, settle: bool = False) -> ApiError | None:
        """The runner's 410 if Nomad, read again now, shows it was reset (or
        gone): an answer that may come from a reset file system — a missing
        path, an empty listing, a copy into a fresh directory — must not reach
        the client as if the runner were still what it claimed. None when it
        is still claimed, or Nomad cannot be read (the answer stands).

        `settle`, for a failure (a path missing, the exec refused or killed):
        Nomad's servers hear of a restart a little after it happened (a
        client reports its allocations in batches; a lagging server answers
        from before), so the runner is read again a few times over
        `SETTLE_S` before the failure is believed."""
        for wait_s in (0.0, *SETTLE_S) if settle else (0.0,):
            await asyncio.sleep(wait_s)
            try:
                await run_in_threadpool(controller.reread, [runner_id])
            except Exception as exc:
                log.warning("reading runner %s again from Nomad: %s", runner_id, exc)
                return None
            try:
                await run_in_threadpool(claimed_runner, controller, runner_id)
            except ApiError as gone:
                return gone
        return None

    async def exec_failed(runner_id: str, failure: ExecFailed) -> ApiError:
        """The answer for an exec Nomad refused or broke off: the runner's 410
        if it was lost meanwhile, else Nomad's error."""
        gone = await lost_meanwhile(runner_id, settle=True)
        if gone is not None:
            return gone
        error = failure.error
        if isinstance(error, ExecOverloaded):
            # The controller's connection budget is spent, or Nomad's agent
            # kept answering 429 through every retry: nothing ran; later may work.
            retry_after = getattr(error, "retry_after_s", RETRY_AFTER_S)
            return ApiError(
                503,
                f"Nomad is overloaded, the file operation was not started: {error.reason}",
                ErrorCode.NOMAD_OVERLOAD,
                headers={"Retry-After": str(retry_after)},
            )
        if isinstance(error, ExecBroken):
            return ApiError(
                500,
                f"Nomad could not run the file operation: {error.reason}",
                ErrorCode.NOMAD_UNREACHABLE,
            )
        if isinstance(error, ExecForbidden):
            return ApiError(
                500,
                f"Nomad refused the exec ({error.reason}): the controller's token needs "
                "the alloc-exec capability",
                ErrorCode.NOMAD_INTERNAL_SERVER_ERROR,
            )
        return ApiError(
            500, f"Nomad refused the exec: {error.reason}", ErrorCode.NOMAD_INTERNAL_SERVER_ERROR
        )

    async def answer(runner_id: str, operation: str, exc: FileError) -> ApiError:
        if isinstance(exc, ExecFailed):
            error = await exec_failed(runner_id, exc)
            count(operation, "lost" if error.status == 410 else "nomad_error")
            return error
        if isinstance(exc, Unreadable | Conflict | CopyFailed):
            gone = await lost_meanwhile(runner_id, settle=not isinstance(exc, Conflict))
            if gone is not None:
                count(operation, "lost")
                return gone
        if isinstance(exc, Unreadable):
            count(operation, "not_found")
            return ApiError(424, exc.message)
        if isinstance(exc, Conflict):
            count(operation, "conflict")
            return ApiError(409, exc.message)
        if isinstance(exc, RangeNotSatisfiable):
            count(operation, "bad_request")
            return ApiError(416, exc.message, headers={"Content-Range": f"bytes */{exc.size}"})
        count(operation, "failed")
        return ApiError(500, exc.message, ErrorCode.UNKNOWN)

    async def opened(runner_id: str, operation: str, start: Callable[[str], Awaitable[T]]) -> T:
        """`start(allocation id)` with the runner in use. If it fails, the use
        ends and the failure becomes the answer; otherwise the response that
        streams the result ends the use (`ended`)."""
        view = await in_use(runner_id)
        claim = view.job.claim
        assert claim is not None
        try:
            return await start(claim.alloc_id)
        except FileError as exc:
            controller.end_use(runner_id)
            raise await answer(runner_id, operation, exc) from None
        except ApiError:
            controller.end_use(runner_id)
            count(operation, "bad_request")
            raise
        except BaseException:
            controller.end_use(runner_id)
            raise

    def ended(runner_id: str, operation: str) -> Callable[[str], None]:
        def done(result: str) -> None:
            controller.end_use(runner_id)
            count(operation, result)

        return done

    @api.patch(
        "/{runnerId}/files",
        summary="Manipulate the runner's file system",
        description=(
            "Deletes the `delete` paths (recursively; `./*` is a glob), then copies the "
            "`copy` items: directories (a path ending in `/`) mode 1777, files 0744, owned by "
            "root, missing parents created. The body is checked whole before the runner is "
            "touched (400 names the item); a file copied onto a directory (or a directory "
            "needed where a file is) is 409 before anything is copied. 500 names what failed; "
            "what could be written is written. Restarts the runner's inactivity timer."
        ),
        status_code=204,
        response_class=Response,
        responses={
            204: {"description": "Everything was deleted and copied."},
            **responses(400, 409, 410, 413, 415, 500, 503),
        },
        openapi_extra=request_body(FileUpdate, "What to delete, then what to copy."),
    )
    async def update(runnerId: RunnerId, request: Request) -> Response:
        try:
            view = await in_use(runnerId)
        except ApiError:
            # Poseidon reads the body before it answers: Ruby clients broke on
            # an early answer (Poseidon #54).
            with contextlib.suppress(BodyTooLarge):
                async for _ in request.stream():
                    pass
            count("copy", "lost")
            raise
        try:
            with tempfile.TemporaryFile(prefix="nrc-upload-") as spool:
                try:
                    await _spool(request, spool)
                    require_json(request)  # 415, once the body is read as for any answer
                    upload = await run_in_threadpool(parse, spool.fileno(), files.upload_limits)
                except ApiError:
                    count("copy", "bad_request")
                    raise
                except BodyTooLarge:
                    count("copy", "bad_request")
                    raise ApiError(413, too_large_message(max_upload_bytes)) from None
                except BadUpload as exc:
                    count("copy", "bad_request")
                    raise ApiError(400, str(exc)) from None
                claim = view.job.claim
                assert claim is not None
                try:
                    await files.copy(claim.alloc_id, spool.fileno(), upload)
                except FileError as exc:
                    raise await answer(runnerId, "copy", exc) from None
            gone = await lost_meanwhile(runnerId)
            if gone is not None:
                count("copy", "lost")
                raise gone
        finally:
            controller.end_use(runnerId)
        count("copy", "ok")
        metrics.file_bytes.labels("copy").inc(upload.content_bytes)
        return Response(status_code=204)

    @api.get(
        "/{runnerId}/files",
        summary="List the runner's file system",
        description=(
            "Entries below `path` (default `./`), as Poseidon names them: `./a.txt` when "
            "`./` is listed recursively, bare names otherwise. Exact for every name (listed "
            "by GNU find, NUL-separated) and streamed as it is produced. 424 when the path "
            "does not exist or cannot be read. Restarts the runner's inactivity timer."
        ),
        response_model=FileListing,
        responses=responses(400, 409, 410, 424, 500, 503),
    )
    async def list_files(
        runnerId: RunnerId,
        request: Request,
        path: PathQuery = "./",
        recursive: Recursive = None,
        privileged: Privileged = None,
    ) -> Response:
        params = query(request)
        # The runner first, then the path: Poseidon answers 410 before anything else.
        listing = await opened(
            runnerId,
            "list",
            lambda alloc_id: files.listing(
                alloc_id,
                checked_path(params.get("path") or "./"),
                go_bool(params.get("recursive"), True),
                go_bool(params.get("privilegedExecution"), False),
            ),
        )
        gone = await lost_meanwhile(runnerId)
        if gone is not None:
            await listing.body.aclose()
            controller.end_use(runnerId)
            count("list", "lost")
            raise gone
        return Streamed(listing.body, ended(runnerId, "list"), media_type="application/json")

    @api.get(
        "/{runnerId}/files/raw",
        summary="Download a file",
        description=(
            "The file's bytes, streamed, with Content-Length, `application/octet-stream` and "
            "Content-Disposition. Beyond Poseidon: one `Range` (206; 416 beyond the end), "
            "`If-Range` with the Last-Modified date. 424 when the path is missing, cannot be "
            "read or is not a regular file. Restarts the runner's inactivity timer."
        ),
        response_class=Response,
        responses={
            200: {
                "description": "The file.",
                "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            },
            206: {"description": "The requested range of the file."},
            **responses(400, 409, 410, 416, 424, 500, 503),
        },
    )
    async def download(
        runnerId: RunnerId,
        request: Request,
        path: RequiredPath,
        privileged: Privileged = None,
    ) -> Response:
        params = query(request)
        target = params.get("path") or path
        file = await opened(
            runnerId,
            "download",
            lambda alloc_id: files.download(
                alloc_id,
                checked_path(target),
                go_bool(params.get("privilegedExecution"), False),
                checked_range(request.headers.get("range"), files.max_range_header),
                request.headers.get("if-range"),
            ),
        )
        headers = {
            "Content-Length": str(file.length),
            "Content-Disposition": content_disposition(target),
            "Accept-Ranges": "bytes",
            "Last-Modified": http_date(file.mtime),
        }
        if file.span is not None:
            headers["Content-Range"] = file.span.content_range(file.size)
        return Streamed(
            file.body,
            ended(runnerId, "download"),
            status_code=206 if file.span else 200,
            media_type="application/octet-stream",
            headers=headers,
        )

    return api


async def _spool(request: Request, spool: IO[bytes]) -> None:
    async for chunk in request.stream():
        if chunk:
            spool.write(chunk)
    spool.flush()  # parse and send read it with pread
