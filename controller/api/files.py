"""File routes (Poseidon's): `PATCH /runners/{id}/files` deletes then copies,
`GET /runners/{id}/files` lists, `GET /runners/{id}/files/raw` downloads.

Like every runner route, each touches the runner (its inactivity timer starts
again), and answers 410 for an unknown, released or lost runner
(`dataplane.runners.ClaimedRunners`). While the operation runs, the runner
is in use (a `RunnerUse`, never released for inactivity under it); a
response that streams takes the use on and ends it when the stream ends.

A failure is answered from one table (`dataplane.answers`), which also says
how hard to look for a loss first: an answer that may come from a reset file
system (a missing path, an empty listing, a copy into a fresh directory)
must not reach the client as if the runner were still what it claimed, so
Nomad is read again (over the settle time after a failure) and the runner's
410 answered if it was lost meanwhile.

Bodies stream both ways: an upload is spooled to a temporary file and never
held in memory (`controller.files.upload`); a listing or download is sent as
the runner produces it (`streamed.Streamed`). Parameters are read as
Poseidon reads them (`file_params`).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable
from typing import IO, Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from controller.api.body import BodyTooLarge, request_body, too_large_message
from controller.api.errors import ApiError, from_answer, responses
from controller.api.file_params import (
    PathQuery,
    Privileged,
    Recursive,
    RequiredPath,
    RunnerId,
    checked_path,
    checked_range,
    content_disposition,
    go_bool,
    query,
)
from controller.api.models import FileListing, FileUpdate
from controller.api.streamed import Streamed
from controller.dataplane import answers
from controller.dataplane.answers import Look
from controller.dataplane.runners import ClaimedRunners, Unusable
from controller.files.errors import FileError
from controller.files.ranges import http_date
from controller.files.service import Files
from controller.files.upload import BadUpload, parse
from controller.metrics import Metrics
from controller.model import RunnerView
from controller.reconcile.uses import RunnerUse

log = logging.getLogger(__name__)


def router(
    runners: ClaimedRunners,
    files: Files,
    metrics: Metrics,
    dependencies: list[Any],
    max_upload_bytes: int,
) -> APIRouter:
    api = APIRouter(prefix="/runners", tags=["runner"], dependencies=dependencies)

    def count(operation: str, result: str) -> None:
        metrics.file_operations.labels(operation, result).inc()

    async def in_use(runner_id: str, operation: str) -> tuple[RunnerView, RunnerUse]:
        """The claimed runner (410 otherwise) and its use for `operation`."""
        try:
            view = await runners.claimed_async(runner_id)
            return view, runners.begin(view, operation)
        except Unusable as refused:
            count(operation, refused.answer.result)
            raise

    async def lost_meanwhile(
        runner_id: str, operation: str, look: Look = Look.ONCE, since: float | None = None
    ) -> ApiError | None:
        """The runner's 410 (or 503 while its loss cannot be recorded) if Nomad,
        read again, shows its claim is over; None while it is still claimed."""
        verdict = await runners.looked(runner_id, look, since)
        if verdict is None:
            return None
        answer = verdict.answer(runner_id)
        count(operation, answer.result)
        return from_answer(answer)

    async def failed(runner_id: str, operation: str, exc: FileError) -> ApiError:
        """The answer for a failed operation: the runner's 410 if it was lost
        meanwhile, else the table's."""
        answer = answers.file_failure(exc)
        gone = await lost_meanwhile(runner_id, operation, answer.look, exc.since)
        if gone is not None:
            return gone
        if answer.result == "nomad_error":
            log.warning(
                "%s on runner %s: %s (Nomad: %s)",
                operation,
                runner_id,
                answer.message,
                exc.message,
                extra={"runner_id": runner_id},
            )
        count(operation, answer.result)
        return from_answer(answer)

    def ended(use: RunnerUse, operation: str) -> Callable[[str], None]:
        def done(result: str) -> None:
            use.end()
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
            **responses(400, 409, 410, 413, 500, 503),
        },
        openapi_extra=request_body(FileUpdate, "What to delete, then what to copy."),
    )
    async def update(runnerId: RunnerId, request: Request) -> Response:
        try:
            view, use = await in_use(runnerId, "copy")
        except Exception:
            # Poseidon reads the body before it answers: Ruby clients broke on
            # an early answer (Poseidon #54).
            with contextlib.suppress(BodyTooLarge):
                async for _ in request.stream():
                    pass
            raise
        with use:
            with tempfile.TemporaryFile(prefix="nrc-upload-") as spool:
                try:
                    await _spool(request, spool)
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
                try:
                    await files.copy(alloc_of(view), spool.fileno(), upload)
                except FileError as exc:
                    raise await failed(runnerId, "copy", exc) from None
            gone = await lost_meanwhile(runnerId, "copy")
            if gone is not None:
                raise gone
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
        view, use = await in_use(runnerId, "list")
        with use:
            try:
                listing = await files.listing(
                    alloc_of(view),
                    checked_path(params.get("path") or "./"),
                    go_bool(params.get("recursive"), True),
                    go_bool(params.get("privilegedExecution"), False),
                )
            except FileError as exc:
                raise await failed(runnerId, "list", exc) from None
            except ApiError:
                count("list", "bad_request")
                raise
            gone = await lost_meanwhile(runnerId, "list")
            if gone is not None:
                await listing.body.aclose()
                raise gone
            done = ended(use.hand_on(), "list")
        return Streamed(listing.body, done, media_type="application/json")

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
        view, use = await in_use(runnerId, "download")
        with use:
            try:
                file = await files.download(
                    alloc_of(view),
                    checked_path(target),
                    go_bool(params.get("privilegedExecution"), False),
                    checked_range(request.headers.get("range"), files.max_range_header),
                    request.headers.get("if-range"),
                )
            except FileError as exc:
                raise await failed(runnerId, "download", exc) from None
            except ApiError:
                count("download", "bad_request")
                raise
            done = ended(use.hand_on(), "download")
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
            done,
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


def alloc_of(view: RunnerView) -> str:
    """The allocation the claim was made on: file operations run there, never
    on a replacement."""
    claim = view.job.claim
    assert claim is not None
    return claim.alloc_id
