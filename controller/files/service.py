"""File operations as Nomad execs: copy (delete, then extract a tar), list,
read. Each is one exec on the allocation the runner was claimed on, without
a TTY; what the runner runs is in `scripts`.

Failures raise the errors of `controller.files.errors`; a stream cut off
after its answer started raises `Interrupted`: the server then ends the
response early, so the client sees an incomplete body, never a short one
that looks whole.

An operation given up on before its command exited (the client went away,
an error, a cancellation) has its processes killed in the background by the
executions' kill, by a marker of its own (`_Operation`, `command.kill_command`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
)
from dataclasses import dataclass, field
from typing import Any

from controller.execution.command import ExecSettings, kill_command
from controller.execution.relay import Execs, Session
from controller.files import listing, scripts
from controller.files.errors import (
    Conflict,
    CopyFailed,
    ExecFailed,
    Interrupted,
    RangeNotSatisfiable,
    Unreadable,
)
from controller.files.listing import Entry, Records
from controller.files.ranges import MAX_RANGE_HEADER, Span, Unsatisfiable, requested
from controller.files.upload import Limits, Upload
from controller.metrics import Metrics
from controller.nomad.exec import ExecError, ExecEvent, Exited, Output

log = logging.getLogger(__name__)

STDIN_FRAME = 32 * 1024  # what Go's io.Copy (Nomad's own exec client) sends at once
KEEP_OUTPUT = 64 * 1024  # of a failing command's output, for its message
BODY_CHUNK = 64 * 1024
KILL_TIMEOUT_S = 5.0  # the kill exec of an abandoned operation


@dataclass(frozen=True)
class FileSettings:
    exec: ExecSettings = field(default_factory=ExecSettings)
    max_upload_bytes: int = 100 * 1024 * 1024
    upload_limits: Limits = field(default_factory=Limits)
    max_range_header: int = MAX_RANGE_HEADER


@dataclass
class Captured:
    """What a short command printed (capped) and how it ended."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    code: int | None = None

    def add(self, event: ExecEvent) -> None:
        if isinstance(event, Output):
            target = self.stdout if event.stream == "stdout" else self.stderr
            target += event.data[: max(0, KEEP_OUTPUT - len(target))]
        elif isinstance(event, Exited):
            self.code = event.code

    def message(self) -> str:
        text = bytes(self.stderr).decode("utf-8", "replace").strip()
        return text or f"exit code {self.code}"


@dataclass(frozen=True)
class Download:
    """A file about to be streamed: 200 whole or 206 one span."""

    size: int
    mtime: int
    span: Span | None
    body: AsyncGenerator[bytes, None]

    @property
    def length(self) -> int:
        return self.span.length if self.span else self.size


@dataclass(frozen=True)
class Listing:
    body: AsyncGenerator[bytes, None]


def _batched(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    buffer = bytearray()
    for piece in pieces:
        buffer += piece
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


class Files:
    def __init__(
        self,
        execs: Execs,
        metrics: Metrics,
        settings: FileSettings | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._execs = execs
        self._metrics = metrics
        self._settings = settings or FileSettings()
        self._wall_clock = wall_clock
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def max_range_header(self) -> int:
        return self._settings.max_range_header

    @property
    def upload_limits(self) -> Limits:
        """What one upload may list (`upload.parse`)."""
        return self._settings.upload_limits

    async def _open(self, alloc_id: str, command: Callable[[str], list[str]]) -> _Operation:
        """Open the exec of `command(marker)`: closed before its command was
        seen to exit (given up on: a client gone, an error, a cancellation),
        the processes carrying its marker are killed."""
        marker = f"file-{uuid.uuid4().hex}"
        opened_at = asyncio.get_running_loop().time()
        try:
            session = await self._execs.open(
                alloc_id, self._settings.exec.task, command(marker), tty=False
            )
        except ExecError as exc:
            raise ExecFailed(exc) from None
        return _Operation(
            session, lambda: self._background(self._kill(alloc_id, marker)), opened_at
        )

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def wait_background(self) -> None:
        """Let kills that are under way finish (at shutdown, in tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def _kill(self, alloc_id: str, marker: str) -> None:
        """The executions' kill (`command.kill_command`) by the operation's
        marker only: its scripts never leave it, and the unprivileged user's
        other processes are not this operation's to end."""
        argv = kill_command(marker, self._settings.exec, sweep_user=False)
        try:
            session = await self._execs.open(alloc_id, self._settings.exec.task, argv, tty=False)
        except ExecError as exc:
            log.info("could not end an abandoned file operation: %s", exc.reason)
            return
        try:
            async with asyncio.timeout(KILL_TIMEOUT_S):
                async for _ in session.events():
                    pass
        except (ExecError, TimeoutError):
            pass
        finally:
            await session.close()

    # -- copy ------------------------------------------------------------------------

    async def copy(self, alloc_id: str, spool: int, upload: Upload) -> None:
        """Delete, then copy, as `upload` says (its contents in the spool `spool`)."""
        session = await self._open(alloc_id, scripts.copy_command)
        try:
            result = Captured()
            events = session.events()
            stdin = scripts.copy_input(spool, upload, int(self._wall_clock()))
            sending = _send_all(session, _batched(stdin, STDIN_FRAME))
            try:
                await _run_with_input(events, result, sending)
            except ExecError as exc:
                raise ExecFailed(exc) from None
        finally:
            await session.close()
        if result.code == 0:
            return
        if result.code == scripts.CONFLICT:
            found = scripts.conflicts(bytes(result.stdout))
            raise Conflict("; ".join(_conflict_message(k, p) for k, p in found) or result.message())
        raise CopyFailed(f"copying failed: {result.message()}")

    # -- list ------------------------------------------------------------------------

    async def listing(self, alloc_id: str, path: str, recursive: bool, privileged: bool) -> Listing:
        """The listing, once it is known to exist (Unreadable otherwise)."""
        session = await self._open(
            alloc_id, lambda marker: scripts.list_command(privileged, self._settings.exec, marker)
        )
        async with _closed_on_failure(session):
            events = session.events()
            await session.send(scripts.list_input(path, recursive, privileged))
            await session.close_stdin()
            result = Captured()
            first = b""
            async for event in events:
                if isinstance(event, Output) and event.stream == "stdout" and event.data:
                    first = event.data
                    break
                result.add(event)
            else:
                if result.code == scripts.LINK:
                    raise Conflict(
                        _link_message(scripts.link_refused(bytes(result.stderr)) or path)
                    )
                if result.code != 0:
                    raise Unreadable(
                        f"{path!r} cannot be listed: {result.message()}", session.opened_at
                    )
        return Listing(_Body(self._listing_body(session, events, first, path, recursive), session))

    async def _listing_body(
        self,
        session: Session,
        events: AsyncIterator[ExecEvent],
        first: bytes,
        path: str,
        recursive: bool,
    ) -> AsyncGenerator[bytes, None]:
        records = Records()
        count = 0
        buffer = bytearray(listing.OPEN)

        def add(data: bytes) -> None:
            nonlocal count
            for fields in records.feed(data):
                item: Entry = listing.entry(fields, path, recursive)
                if count:
                    buffer.extend(b",")
                buffer.extend(item.json())
                count += 1

        try:
            add(first)
            ended = Captured()  # its stderr and exit code
            async for event in events:
                if isinstance(event, Output) and event.stream == "stdout":
                    add(event.data)
                    if len(buffer) >= BODY_CHUNK:
                        yield bytes(buffer)
                        buffer.clear()
                else:
                    ended.add(event)
            if ended.code:
                # Poseidon's rule: once output started, a failure (an
                # unreadable subdirectory) leaves a partial listing.
                log.warning("listing %r ended with %s", path, ended.message())
            if records.partial:
                raise Interrupted(f"the listing of {path!r} was cut off")
            buffer.extend(listing.CLOSE)
            yield bytes(buffer)
        except ExecError as exc:
            raise Interrupted(f"the listing of {path!r} broke off: {exc.reason}") from None
        finally:
            await session.close()

    # -- read ------------------------------------------------------------------------

    async def download(
        self,
        alloc_id: str,
        path: str,
        privileged: bool,
        range_header: str | None = None,
        if_range: str | None = None,
    ) -> Download:
        """The file's size and the body to stream; Unreadable, or Unsatisfiable
        (with the size) for a range beyond its end."""
        session = await self._open(
            alloc_id, lambda marker: scripts.read_command(privileged, self._settings.exec, marker)
        )
        async with _closed_on_failure(session):
            events = session.events()
            await session.send(scripts.read_input(path, privileged))
            result = Captured()
            head = bytearray()
            async for event in events:
                if isinstance(event, Output) and event.stream == "stdout":
                    head += event.data
                    if b"\n" in head:
                        break
                else:
                    result.add(event)
            else:
                if result.code == scripts.LINK:
                    raise Conflict(
                        _link_message(scripts.link_refused(bytes(result.stderr)) or path)
                    )
                if result.code in (scripts.IS_DIRECTORY, scripts.NOT_REGULAR):
                    raise Unreadable(
                        f"{path!r} is not a file: {result.message()}", session.opened_at
                    )
                raise Unreadable(f"{path!r} cannot be read: {result.message()}", session.opened_at)
            line, _, rest = bytes(head).partition(b"\n")
            size, mtime = scripts.parse_stat(line)
            try:
                span = requested(range_header, size, if_range, mtime)
            except Unsatisfiable:
                await session.close_stdin()
                raise RangeNotSatisfiable(size) from None
            start, length = (span.start, span.length) if span else (0, size)
            await session.send(scripts.range_input(start, length))
            await session.close_stdin()
        body = self._download_body(session, events, rest, length, path)
        return Download(size, mtime, span, _Body(body, session))

    async def _download_body(
        self,
        session: Session,
        events: AsyncIterator[ExecEvent],
        first: bytes,
        length: int,
        path: str,
    ) -> AsyncGenerator[bytes, None]:
        sent = 0
        buffer = bytearray(first[:length])
        try:
            async for event in events:
                if isinstance(event, Output) and event.stream == "stdout":
                    buffer += event.data[: max(0, length - sent - len(buffer))]
                    if len(buffer) >= BODY_CHUNK:
                        sent += len(buffer)
                        self._metrics.file_bytes.labels("download").inc(len(buffer))
                        yield bytes(buffer)
                        buffer.clear()
            if buffer:
                sent += len(buffer)
                self._metrics.file_bytes.labels("download").inc(len(buffer))
                yield bytes(buffer)
            if sent < length:
                raise Interrupted(f"{path!r} ended after {sent} of {length} bytes")
        except ExecError as exc:
            raise Interrupted(f"reading {path!r} broke off: {exc.reason}") from None
        finally:
            await session.close()


class _Operation:
    """A file operation's exec: a `Session` that calls `abandoned` when it is
    closed before its command's exit was seen (Nomad and Docker leave an
    exec's process running when its client goes: a read script waiting on
    its input, a `tail` blocked writing, a copy's `rm -rf`)."""

    def __init__(self, session: Session, abandoned: Callable[[], None], opened_at: float) -> None:
        self._session = session
        self._abandoned = abandoned
        self.opened_at = opened_at  # event loop time, before the exec was asked for
        self._exited = False
        self._closed = False

    async def send(self, data: bytes) -> None:
        await self._session.send(data)

    async def close_stdin(self) -> None:
        await self._session.close_stdin()

    async def events(self) -> AsyncIterator[ExecEvent]:
        async for event in self._session.events():
            if isinstance(event, Exited):
                self._exited = True
            yield event

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._session.close()
        finally:
            if not self._exited:
                self._abandoned()


class _Body(AsyncGenerator[bytes, None]):
    """A streamed body that owns its exec: closing it closes the exec even
    when it was never read (a generator that never started runs no
    `finally`), so an answer whose client left before its body still ends
    its command."""

    def __init__(self, body: AsyncGenerator[bytes, None], session: Session) -> None:
        self._body = body
        self._session = session

    async def asend(self, value: None) -> bytes:
        return await self._body.asend(value)

    async def athrow(self, *args: Any) -> bytes:
        return await self._body.athrow(*args)

    async def aclose(self) -> None:
        try:
            await self._body.aclose()
        finally:
            await self._session.close()


@contextlib.asynccontextmanager
async def _closed_on_failure(session: Session) -> AsyncIterator[None]:
    """The opening of a streamed operation: if it fails, the session is closed
    (on success the body's stream owns it)."""
    try:
        yield
    except ExecError as exc:
        await session.close()
        raise ExecFailed(exc) from None
    except BaseException:
        await session.close()
        raise


def _link_message(path: str) -> str:
    return f"{path!r} is a symbolic link: file operations never follow one"


def _conflict_message(kind: str, path: str) -> str:
    if kind == "l":
        return _link_message(path)
    if kind == "d":
        return f"{path!r} is not a directory, but a copied path needs it to be one"
    return f"{path!r} is a directory, where a file is to be copied: delete it first"


async def _send_all(session: Session, frames: Iterator[bytes]) -> None:
    for frame in frames:
        await session.send(frame)
    await session.close_stdin()


async def _read_all(events: AsyncIterator[ExecEvent], result: Captured) -> None:
    async for event in events:
        result.add(event)


async def _run_with_input(
    events: AsyncIterator[ExecEvent], result: Captured, sending: Coroutine[Any, Any, None]
) -> None:
    """Read the command's events to its exit while its input is sent. Input
    left unsent when it exits (it refused: a conflict) is dropped; input that
    cannot be produced ends the wait with that error (the session is closed
    by the caller, which ends the command's input)."""
    sender = asyncio.ensure_future(sending)
    reader = asyncio.ensure_future(_read_all(events, result))
    try:
        done, _ = await asyncio.wait({sender, reader}, return_when=asyncio.FIRST_COMPLETED)
        if sender in done:
            problem = sender.exception()
            # A broken connection shows in the events too; anything else is ours.
            if problem is not None and not isinstance(problem, ExecError):
                raise problem
        await reader
    finally:
        for task in (sender, reader):
            if not task.done():
                task.cancel()
            # Cleanup only: what either raised was handled above.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
