"""The file service against scripted execs: how exits, breaks and short
outputs become answers — in particular that nothing cut off ever looks whole,
and that a copy never waits forever."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import pytest

from controller.execution.command import ExecSettings, kill_command
from controller.files import scripts
from controller.files.errors import (
    Conflict,
    CopyFailed,
    ExecFailed,
    Interrupted,
    RangeNotSatisfiable,
    Unreadable,
)
from controller.files.service import Files
from controller.files.upload import parse
from controller.metrics import Metrics
from controller.nomad.exec import ExecBroken, ExecError, Exited, Output, TaskNotRunning
from tests.support.exec_fake import FakeExecs, Open, ScriptedSession, Step

Script = list[Step]
pytestmark = pytest.mark.anyio


def marker_of(command: Sequence[str]) -> str:
    found = re.search(r"NRC_EXECUTION_ID=(file-[0-9a-f]+)", " ".join(command))
    assert found is not None, command
    return found.group(1)


def is_kill(command: Sequence[str]) -> bool:
    """Whether `command` is the kill of a file operation (every exec of one carries its marker)."""
    return list(command) == kill_command(marker_of(command), ExecSettings(), sweep_user=False)


def file_execs(
    operation: Callable[[], ScriptedSession], refuse: ExecError | None = None
) -> FakeExecs:
    """Every file operation's exec is a new `operation()`; kill execs exit 0
    at once. Nothing opens a TTY."""

    def rule(n: int, opened: Open) -> ScriptedSession:
        assert not opened.tty
        return ScriptedSession([Exited(0)]) if is_kill(opened.command) else operation()

    return FakeExecs(rule, refuse=refuse)


def scripted(script: Script, eager: bool = False, refuse: ExecError | None = None) -> FakeExecs:
    """Each operation plays `script` once the command's input has ended (or at once, `eager`)."""
    if eager:
        return file_execs(lambda: ScriptedSession(script), refuse)
    return file_execs(lambda: ScriptedSession(after_stdin=script), refuse)


def out(data: bytes) -> Output:
    return Output("stdout", data)


def err(data: bytes) -> Output:
    return Output("stderr", data)


async def copy(execs: FakeExecs, body: Mapping[str, object]) -> None:
    with tempfile.TemporaryFile() as spool:
        spool.write(json.dumps(body).encode())
        spool.flush()
        await Files(execs, Metrics()).copy("alloc", spool.fileno(), parse(spool.fileno()))


BODY = {"copy": [{"path": "a", "content": "aGk="}]}


async def test_a_copy_sends_the_preamble_then_the_archive() -> None:
    execs = scripted([Exited(0)])
    await copy(execs, BODY)
    (session,) = execs.sessions
    # no deletions; one check; then the archive of `.`, its size first
    assert session.stdin.startswith(b"\0fa\0\0.\x002048\0")
    assert session.stdin[12 : 12 + 100].rstrip(b"\0") == b"a"
    assert session.stdin.endswith(b"\0" * 1024 + b"\0")
    assert session.closed
    (command,) = execs.commands  # it exited: nothing to kill
    assert command[:2] == ["/bin/bash", "-c"] and command[2].endswith(scripts.COPY)


async def test_a_conflict_names_the_path() -> None:
    execs = scripted([out(b"fa\0ddir\0lout\0"), Exited(scripts.CONFLICT)], eager=True)
    with pytest.raises(
        Conflict, match=r"'a' is a directory.*'dir' is not a directory.*'out' is a symbolic link"
    ):
        await copy(execs, BODY)


async def test_a_failed_copy_gives_its_stderr() -> None:
    execs = scripted([err(b"tar: a: Cannot open: Read-only file system\n"), Exited(1)])
    with pytest.raises(CopyFailed, match="Read-only file system"):
        await copy(execs, BODY)


@pytest.mark.parametrize("eager", [False, True])
async def test_a_broken_exec_is_exec_failed(eager: bool) -> None:
    execs = scripted([ExecBroken("gone")], eager=eager)
    with pytest.raises(ExecFailed):
        await copy(execs, BODY)


async def test_a_refused_exec_is_exec_failed() -> None:
    with pytest.raises(ExecFailed) as failed:
        await copy(scripted([], refuse=TaskNotRunning("task not running")), BODY)
    assert isinstance(failed.value.error, TaskNotRunning)


async def test_input_that_cannot_be_produced_does_not_leave_the_copy_waiting() -> None:
    execs = scripted([Exited(0)])  # would only answer after stdin closed
    with tempfile.TemporaryFile() as spool:
        spool.write(json.dumps(BODY).encode())
        spool.flush()
        upload = parse(spool.fileno())
        spool.truncate(10)  # the spool lost the content: the archive cannot be produced
        files = Files(execs, Metrics())
        with pytest.raises(Exception, match="spool"):
            await asyncio.wait_for(files.copy("alloc", spool.fileno(), upload), 5)
    assert execs.sessions[0].closed


async def body_of(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([piece async for piece in stream])


RECORD = b"-rw-r--r--\x005\x001700000000.5\x00root\x00root\x00\x00a\x00"


async def test_a_listing_streams_entries() -> None:
    execs = scripted([out(RECORD[:7]), out(RECORD[7:] + RECORD), Exited(0)])
    listing = await Files(execs, Metrics()).listing("alloc", "./", True, False)
    entries = json.loads(await body_of(listing.body))["files"]
    assert [e["name"] for e in entries] == ["./a", "./a"]
    assert execs.sessions[0].stdin == b"./\x001\x000\x00"  # path, recursive, not privileged


async def test_a_listing_without_output_that_fails_is_not_found() -> None:
    execs = scripted([err(b"no such file or directory\n"), Exited(2)])
    with pytest.raises(Unreadable, match="no such file"):
        await Files(execs, Metrics()).listing("alloc", "x", True, False)
    assert execs.sessions[0].closed


async def test_an_empty_listing() -> None:
    listing = await Files(scripted([Exited(0)]), Metrics()).listing("alloc", "x", True, False)
    assert json.loads(await body_of(listing.body)) == {"files": []}


async def test_a_listing_failing_after_output_keeps_what_it_has() -> None:
    execs = scripted([out(RECORD), err(b"find: 'x': Permission denied\n"), Exited(1)])
    listing = await Files(execs, Metrics()).listing("alloc", "./", True, False)
    assert len(json.loads(await body_of(listing.body))["files"]) == 1


@pytest.mark.parametrize(
    "tail", [[ExecBroken("gone")], [out(RECORD[:9]), Exited(0)]], ids=["broken", "half a record"]
)
async def test_a_listing_cut_off_is_interrupted(tail: Script) -> None:
    execs = scripted([out(RECORD), *tail])
    listing = await Files(execs, Metrics()).listing("alloc", "./", True, False)
    with pytest.raises(Interrupted):
        await body_of(listing.body)
    assert execs.sessions[0].closed


def interactive(content: bytes, tail: Script | None = None) -> FakeExecs:
    """A read script: the stat line at once, the bytes once the span was sent
    (the span follows the path and the flag), then `tail` (exit 0 by default)."""

    def span(stdin: bytes) -> Script:
        start, length = map(int, stdin.split(b"\0")[2].split())
        data = content[start : start + length]
        chunks: Script = [out(data[at : at + 1024]) for at in range(0, len(data), 1024)]
        return chunks + (tail or [Exited(0)])

    stat = out(f"{len(content)} 1700000000\n".encode())
    return file_execs(lambda: ScriptedSession([stat], after_stdin=span))


async def test_a_download_sends_exactly_the_span() -> None:
    content = bytes(range(256)) * 100
    file = await Files(interactive(content), Metrics()).download("alloc", "f", False, "bytes=5-")
    assert (file.size, file.mtime, file.length) == (len(content), 1700000000, len(content) - 5)
    assert await body_of(file.body) == content[5:]


async def test_a_range_beyond_the_end() -> None:
    execs = interactive(b"12345")
    with pytest.raises(RangeNotSatisfiable) as refused:
        await Files(execs, Metrics()).download("alloc", "f", False, "bytes=5-")
    assert refused.value.size == 5


async def test_a_download_that_ends_short_is_interrupted() -> None:
    execs = interactive(b"x" * 5000, tail=[ExecBroken("gone")])
    file = await Files(execs, Metrics()).download("alloc", "f", False)
    with pytest.raises(Interrupted):
        await body_of(file.body)
    assert execs.sessions[0].closed


@pytest.mark.parametrize(
    ("code", "message"),
    [(scripts.MISSING, "cannot be read"), (scripts.IS_DIRECTORY, "is not a file")],
)
async def test_what_cannot_be_downloaded(code: int, message: str) -> None:
    execs = scripted([err(b"why\n"), Exited(code)], eager=True)
    with pytest.raises(Unreadable, match=message):
        await Files(execs, Metrics()).download("alloc", "f", False)


@pytest.mark.parametrize("eager", [False, True])
async def test_a_copy_given_up_on_is_killed_by_its_marker(eager: bool) -> None:
    execs = scripted([ExecBroken("gone")], eager=eager)
    files = Files(execs, Metrics())
    with tempfile.TemporaryFile() as spool:
        spool.write(json.dumps(BODY).encode())
        spool.flush()
        with pytest.raises(ExecFailed):
            await files.copy("alloc", spool.fileno(), parse(spool.fileno()))
    await files.wait_background()
    copy_argv, kill_argv = execs.commands
    assert kill_argv == kill_command(marker_of(copy_argv), ExecSettings(), sweep_user=False)


async def test_a_download_abandoned_midway_is_killed_but_a_finished_one_is_not() -> None:
    events: Script = [out(b"10 1700000000\n0123"), out(b"456789"), Exited(0)]
    execs = scripted(events, eager=True)
    files = Files(execs, Metrics())
    whole = await files.download("alloc", "f", privileged=False)
    assert await body_of(whole.body) == b"0123456789"
    await files.wait_background()
    assert len(execs.commands) == 1
    cut = await files.download("alloc", "f", privileged=False)
    await cut.body.aclose()  # the client went away before the body
    await files.wait_background()
    assert len(execs.commands) == 3
    assert marker_of(execs.commands[2]) == marker_of(execs.commands[1])
