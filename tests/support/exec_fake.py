"""The fake of Nomad's allocation exec for tests that drive the execution
relay and the file service without a WebSocket: `FakeExecs` stands for
`controller.nomad.exec.ExecClient`, `ScriptedSession` for its `ExecSession`
(the `Execs` and `Session` protocols of `controller.execution.relay`).

A session plays a script of steps — events (`Output`, `StreamClosed`,
`Exited`) and `ExecError`s — as `events()` is read: the steps given at once,
then those given for after stdin has closed (a function of the whole stdin
when the reply depends on it), then any the test feeds live. It keeps the
real session's semantics, where a kinder fake would let a bug pass:

- `events()` ends only with `Exited` (the last event) or by raising an
  `ExecError`; once exited it yields nothing more, once broken it raises the
  same error again. A script that runs out is a command still running and
  silent: `events()` waits, until the test feeds more or the session is
  closed — closing it breaks the stream (`ExecBroken`), as closing the
  connection does. A session with no `Exited` in sight and `ends_on_quit`
  off is a command that ignores everything and never exits.
- `send` of no bytes sends nothing; `send` after the stream ended (exited,
  broken or closed) raises `ExecBroken`, as Nomad has dropped the
  connection; `close_stdin` and `close` never raise and may be repeated.
- With `ends_on_quit`, a Ctrl-\\ (`b"\\x1c"`) in the input ends the command
  with 131 (128 + SIGQUIT), as a shell in a TTY does when it gets SIGQUIT.

`FakeExecs` records every open (`Open`: allocation, task, command, TTY),
hands out sessions from a per-open rule (`main_then_kills` for the relay's
shape: the command first, then kill execs that exit 0 at once), refuses
opens with a given error (every open, or only the n-th), and awaits an
optional `meanwhile` hook on each open — what Nomad does while the exec
connects.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from controller.nomad.exec import ExecBroken, ExecError, ExecEvent, Exited

Step = ExecEvent | ExecError
Reply = Callable[[bytes], Iterable[Step]]

CTRL_BACKSLASH = b"\x1c"
# What Nomad reports for a command ended by SIGQUIT (signal 3).
QUIT_EXIT_CODE = 128 + 3


class ScriptedSession:
    """One exec whose command's behaviour is scripted (see the module docstring).

    `script` is played at once; `after_stdin` once stdin has closed — a list
    of steps, or a function of the whole stdin, called when `events()` gets
    there (a reply that parses the input fails only if it is read)."""

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        after_stdin: Iterable[Step] | Reply = (),
        ends_on_quit: bool = False,
    ) -> None:
        self._pending: deque[Step | Reply] = deque(script)
        if callable(after_stdin):
            self._reply: Reply = after_stdin
        else:
            steps = list(after_stdin)
            self._reply = lambda _stdin: steps
        self._ends_on_quit = ends_on_quit
        self._more = asyncio.Event()
        self._stdin_grew = asyncio.Event()
        self._end: Exited | ExecError | None = None
        self.sent: list[bytes] = []  # every send, as sent
        self.stdin_closed = False
        self.closed = False
        self.consumed = 0  # steps `events()` has taken from the script
        self._took = asyncio.Event()

    @property
    def stdin(self) -> bytes:
        """Everything sent to the command's stdin."""
        return b"".join(self.sent)

    def feed(self, *steps: Step) -> None:
        """More of the script, played after what is already there."""
        self._pending.extend(steps)
        self._more.set()

    async def stdin_received(self, size: int = 1) -> None:
        """Wait until at least `size` bytes of stdin have been sent."""
        while len(self.stdin) < size:
            self._stdin_grew.clear()
            await self._stdin_grew.wait()

    async def taken(self, count: int) -> None:
        """Wait until `events()` has taken `count` steps of the script (each
        one before it is handed on: the steps before it were handled)."""
        while self.consumed < count:
            self._took.clear()
            await self._took.wait()

    async def send(self, data: bytes) -> None:
        if not data:
            return
        if self.closed or self._end is not None:
            raise ExecBroken("the connection to Nomad ended while sending input")
        self.sent.append(data)
        self._stdin_grew.set()
        if self._ends_on_quit and CTRL_BACKSLASH in data:
            self.feed(Exited(QUIT_EXIT_CODE))

    async def close_stdin(self) -> None:
        if self.stdin_closed or self.closed or self._end is not None:
            return
        self.stdin_closed = True
        self._pending.append(self._reply)
        self._more.set()

    async def events(self) -> AsyncIterator[ExecEvent]:
        while self._end is None:
            step = await self._next()
            if isinstance(step, ExecError):
                self._end = step
                break
            yield step
            if isinstance(step, Exited):
                self._end = step
        if isinstance(self._end, ExecError):
            raise self._end

    async def _next(self) -> Step:
        while True:
            if self.closed:
                return ExecBroken("the connection to Nomad ended before the command's exit code")
            if not self._pending:
                self._more.clear()
                await self._more.wait()
                continue
            step = self._pending.popleft()
            if callable(step):
                # The reply to the input: its steps come next, before anything fed later.
                self._pending.extendleft(reversed(list(step(self.stdin))))
                continue
            self.consumed += 1
            self._took.set()
            return step

    async def close(self) -> None:
        self.closed = True
        self._more.set()


@dataclass(frozen=True)
class Open:
    """One call of `FakeExecs.open`, refused or not."""

    alloc_id: str
    task: str
    command: list[str]
    tty: bool


# The session for the n-th open (counted from 1, refused opens included).
SessionRule = Callable[[int, Open], ScriptedSession]


def main_then_kills(main: ScriptedSession) -> SessionRule:
    """The first open gets `main`; every later one is a kill exec that exits 0 at once."""

    def rule(n: int, opened: Open) -> ScriptedSession:
        return main if n == 1 else ScriptedSession([Exited(0)])

    return rule


class FakeExecs:
    """Opens `ScriptedSession`s as `rule` says; refuses with `refuse` every
    open, or only the `refuse_at`-th (counted from 1); awaits `meanwhile`
    on each open before answering it."""

    def __init__(
        self,
        rule: SessionRule,
        *,
        refuse: ExecError | None = None,
        refuse_at: int | None = None,
        meanwhile: Callable[[Open], Awaitable[None]] | None = None,
    ) -> None:
        self._rule = rule
        self._refuse = refuse
        self._refuse_at = refuse_at
        self._meanwhile = meanwhile
        self.opened: list[Open] = []
        self.sessions: list[ScriptedSession] = []  # handed out, in order

    @property
    def commands(self) -> list[list[str]]:
        return [opened.command for opened in self.opened]

    async def open(
        self, alloc_id: str, task: str, command: Sequence[str], *, tty: bool = False
    ) -> ScriptedSession:
        opened = Open(alloc_id, task, list(command), tty)
        self.opened.append(opened)
        n = len(self.opened)
        if self._meanwhile is not None:
            await self._meanwhile(opened)
        if self._refuse is not None and self._refuse_at in (None, n):
            raise self._refuse
        session = self._rule(n, opened)
        self.sessions.append(session)
        return session
