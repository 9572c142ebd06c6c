"""The fake of Nomad's exec (tests/support/exec_fake.py) keeps the real
session's semantics, as tests/nomad/test_exec.py shows them for
`ExecSession` — the end of a stream, input after it, closing — and plays
its scripts, replies and refusals as the relay and file tests rely on."""

from __future__ import annotations

import asyncio

import pytest

from controller.nomad.exec import ExecBroken, ExecEvent, Exited, Output, TaskNotRunning
from tests.support.exec_fake import FakeExecs, Open, ScriptedSession, Step, main_then_kills

pytestmark = pytest.mark.anyio


async def read(session: ScriptedSession) -> list[ExecEvent]:
    return [event async for event in session.events()]


async def test_after_the_exit_events_yield_nothing_and_closing_never_raises() -> None:
    session = ScriptedSession([Output("stdout", b"hi"), Exited(0), Output("stdout", b"never")])
    assert await read(session) == [Output("stdout", b"hi"), Exited(0)]
    assert await read(session) == []
    with pytest.raises(ExecBroken):
        await session.send(b"input")  # Nomad dropped the connection after the exit
    await session.close_stdin()
    await session.close()
    await session.close()


async def test_a_break_is_raised_again_and_takes_no_input() -> None:
    session = ScriptedSession([Output("stdout", b"partial"), ExecBroken("gone")])
    events = session.events()
    assert await anext(events) == Output("stdout", b"partial")
    with pytest.raises(ExecBroken):
        await anext(events)
    with pytest.raises(ExecBroken):
        await read(session)
    with pytest.raises(ExecBroken):
        await session.send(b"input")


async def test_a_session_closed_while_read_breaks_and_takes_no_input() -> None:
    session = ScriptedSession()  # a command still running, silent
    reader = asyncio.ensure_future(read(session))
    await session.close()
    with pytest.raises(ExecBroken):
        await reader
    with pytest.raises(ExecBroken):
        await session.send(b"input")
    await session.close_stdin()


async def test_input_is_recorded_as_sent_and_nothing_is_sent_for_nothing() -> None:
    session = ScriptedSession()
    await session.send(b"a")
    await session.send(b"")
    await session.send(b"bc")
    await session.stdin_received(3)
    assert session.sent == [b"a", b"bc"] and session.stdin == b"abc"


async def test_ctrl_backslash_ends_a_command_that_ends_on_quit() -> None:
    session = ScriptedSession(ends_on_quit=True)
    await session.send(b"x\x1c")
    assert await read(session) == [Exited(131)]


async def test_a_command_that_ignores_everything_runs_until_closed() -> None:
    session = ScriptedSession()
    await session.send(b"\x1c")
    await session.close_stdin()
    session.feed(Output("stdout", b"still here"))
    events = session.events()
    assert await anext(events) == Output("stdout", b"still here")
    await session.close()
    with pytest.raises(ExecBroken):
        await anext(events)


async def test_the_reply_comes_once_stdin_closed_and_before_what_is_fed_later() -> None:
    def reply(stdin: bytes) -> list[Step]:
        return [Output("stdout", stdin.upper()), Exited(0)]

    session = ScriptedSession([Output("stdout", b"ready")], after_stdin=reply)
    events = session.events()
    assert await anext(events) == Output("stdout", b"ready")
    waiting = asyncio.ensure_future(anext(events))
    await session.send(b"abc")
    assert not waiting.done()
    await session.close_stdin()
    session.feed(Output("stdout", b"after"))
    assert await waiting == Output("stdout", b"ABC")
    assert [e async for e in events] == [Exited(0)]
    assert session.consumed == 3


async def test_the_opener_records_refuses_the_nth_and_hands_out_by_its_rule() -> None:
    main = ScriptedSession()
    seen: list[Open] = []

    async def meanwhile(opened: Open) -> None:
        seen.append(opened)

    execs = FakeExecs(
        main_then_kills(main), refuse=TaskNotRunning("not yet"), refuse_at=2, meanwhile=meanwhile
    )
    assert await execs.open("a1", "t", ["cmd"], tty=True) is main
    with pytest.raises(TaskNotRunning):
        await execs.open("a1", "t", ["reader"])
    kill = await execs.open("a1", "t", ["kill"])
    assert await read(kill) == [Exited(0)]
    assert (
        execs.opened
        == seen
        == [
            Open("a1", "t", ["cmd"], True),
            Open("a1", "t", ["reader"], False),
            Open("a1", "t", ["kill"], False),
        ]
    )
    assert execs.commands == [["cmd"], ["reader"], ["kill"]]
    assert execs.sessions == [main, kill]


async def test_an_opener_that_refuses_every_open() -> None:
    execs = FakeExecs(lambda n, opened: ScriptedSession(), refuse=TaskNotRunning("stopped"))
    for _ in range(2):
        with pytest.raises(TaskNotRunning):
            await execs.open("a1", "t", ["cmd"])
    assert len(execs.opened) == 2 and execs.sessions == []
