"""One execution, from the client's connect to its terminal frame.

The protocol, stated before the code (see docs/architecture.md, "How an
execution flows"):

1. `start` is sent at once. The main exec (the command, with a TTY) and —
   with separate stderr — the reader of the command's stderr FIFO are opened
   on the allocation the claim was made on, never on a replacement.
2. Output of both is translated to `stdout` / `stderr` frames and queued for
   the client in a queue bounded by the output it holds (`outbox.Outbox`):
   a client that reads slowly holds the exec's reads back (and TCP holds
   Nomad back), nothing grows without bound. Client
   text frames go to the command's stdin verbatim.
3. Exactly one of these ends it, and decides the terminal frame:
   - the command exits: `exit` with its code — unless the allocation died under
     it, which an exit by signal or a broken exec is checked for (the runner's
     loss is then recorded in Nomad and named in an `error` frame; an OOM kill
     gives CodeOcean's exact "the allocation was OOM Killed");
   - the time limit (counted from the connect) runs out: `timeout`;
   - the runner is lost or released meanwhile: `error` naming it;
   - the controller shuts down and its drain's grace ran out (`end_all`):
     `error` saying so, the command stopped as on a timeout;
   - the client disconnects: no frame.
   After the terminal frame the client is closed with 1000. An exec that
   Nomad cut (its stream ended without an exit code: the agent holding it,
   or a hop to it, restarted) ends with an `error` frame saying so.
4. On a timeout or a disconnect the command's whole process tree is ended in
   the background: Ctrl-\\ through the TTY (SIGQUIT to its foreground group),
   then an exec that SIGKILLs, as the unprivileged user, every process of
   that user when nothing else uses the runner — else every process carrying
   the execution's marker — and then, as root, root's processes carrying it
   (the stderr reader, a side still waiting for the other)
   (`command.kill_command`; no CAP_SYS_PTRACE needed).
   The same kill ends one side of a pair of execs whose other side failed.
   If the command's exec has still not ended 3 s after the limit, the runner is
   stopped and its claim ended as `execution_not_stopped`: its client is told
   (410) rather than handed a runner with a runaway process.
   A cut exec's command runs on (Docker does not end it), so the same kill
   is tried in the background until it gets through (the runner reachable
   again), `cut_kill_s` at most; then the runner is stopped as above. A
   runner lost or released meanwhile took its processes with it.
5. While the execution runs, the runner's inactivity timer stays fresh; it
   counts again from the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.dataplane import answers
from controller.dataplane.answers import Look
from controller.dataplane.runners import Ended, Unrecorded, Verdict
from controller.execution.command import (
    ExecSettings,
    kill_command,
    main_command,
    stderr_command,
)
from controller.execution.frames import (
    START,
    Exit,
    Failed,
    Frame,
    Lost,
    Outcome,
    Released,
    TimedOut,
    Translator,
)
from controller.execution.outbox import Outbox
from controller.execution.store import Execution
from controller.metrics import Metrics
from controller.model import LossReason
from controller.nomad.exec import (
    ExecBroken,
    ExecError,
    ExecEvent,
    ExecForbidden,
    ExecUnreachable,
    Exited,
    Output,
    StreamClosed,
)
from controller.reconcile.uses import RunnerUse

log = logging.getLogger(__name__)

CTRL_BACKSLASH = b"\x1c"
CUT_ENDING = "its processes are ended as soon as the runner can be reached"
SHUTTING_DOWN = Failed(
    "the controller is shutting down and ended this execution; run the command again"
)
# Frames merged into one client frame at most (bytes of text).
COALESCE_BYTES = 64 * 1024


class Session(Protocol):
    """One Nomad exec (`controller.nomad.exec.ExecSession`)."""

    async def send(self, data: bytes) -> None: ...
    async def close_stdin(self) -> None: ...
    def events(self) -> AsyncIterator[ExecEvent]: ...
    async def close(self) -> None: ...


class Execs(Protocol):
    """Opens Nomad execs (`controller.nomad.exec.ExecClient`)."""

    async def open(
        self, alloc_id: str, task: str, command: Sequence[str], *, tty: bool = False
    ) -> Session: ...


class Runners(Protocol):
    """What an execution needs to know and do about its runner
    (`controller.dataplane.runners.ClaimedRunners`)."""

    def ended(self, runner_id: str) -> bool:
        """A loss or release shows in what the controller has read (no read)."""

    async def verdict(self, runner_id: str, *, read: bool = True, settle_s: float = 0.0) -> Verdict:
        """The claim's end as Nomad records it (the loss written first), after
        reading Nomad again over `settle_s` unless `read` is false; None while
        the runner is still claimed."""

    async def looked(self, runner_id: str, look: Look) -> Verdict:
        """`verdict` as hard as a failure's `look` asks (no read, one, or the settle)."""

    def uses(self, runner_id: str) -> int:
        """Executions and file operations in flight on the runner (begun, not ended)."""

    async def stop(self, runner_id: str, reason: LossReason) -> None:
        """End the claim with `reason` and stop the runner's job."""


class Client(Protocol):
    """The client's WebSocket, already accepted."""

    async def send(self, frame: Frame) -> None: ...

    async def receive(self) -> bytes | None:
        """The next stdin bytes; None when the client has gone."""

    async def close(self) -> None: ...


@dataclass(frozen=True)
class RelaySettings:
    exec: ExecSettings = field(default_factory=ExecSettings)
    output_queue: int = 64 * 1024  # characters of output waiting for a slow client
    quit_grace_s: float = 1.0  # Ctrl-\ → SIGKILL of the marked processes
    stop_grace_s: float = 3.0  # limit → runner stopped if the exec still runs
    stderr_drain_s: float = 1.0  # after the exit: stderr still arriving
    loss_poll_s: float = 0.2
    # Where we differ from Poseidon, as settings (README, "Migrating from Poseidon"):
    # an exit by a signal (>= 128) looks for a loss this long (Poseidon: 1 s, for 128);
    signal_loss_window_s: float = 0.5
    # an exec broken off without an exit code (runner not lost) is exit 0 (Poseidon)
    # rather than an error frame.
    broken_as_exit_zero: bool = False
    # A cut exec (its agent or a hop to it restarted) leaves the command
    # running: its kill is tried again, `cut_retry_s` doubling up to 4 s, for
    # this long; then the runner is stopped (`execution_not_stopped`).
    cut_kill_s: float = 60.0
    cut_retry_s: float = 0.25


class Relay:
    def __init__(
        self,
        execs: Execs,
        runners: Runners,
        metrics: Metrics,
        settings: RelaySettings | None = None,
    ) -> None:
        self._execs = execs
        self._runners = runners
        self._metrics = metrics
        self.settings = settings or RelaySettings()
        self._background: set[asyncio.Task[None]] = set()
        # Set by `end_all`: every execution running ends with SHUTTING_DOWN.
        self._ending = asyncio.Event()

    async def run(
        self, execution: Execution, alloc_id: str, client: Client, use: RunnerUse
    ) -> None:
        """Relay one execution. `use` is the runner's use for it: the relay ends
        it (or hands it on to the background stop of a command that must not go
        on). The caller has accepted the client's WebSocket; this closes it."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._metrics.executions_active.inc()
        run = _Run(self, execution, alloc_id, client, use)
        result = "error"
        try:
            result = await run.run()
        finally:
            self._metrics.executions_active.dec()
            self._metrics.executions.labels(result).inc()
            self._metrics.execution_seconds.observe(loop.time() - started)

    def end_all(self) -> None:
        """The controller is shutting down: every execution running (and any
        that starts from now on, unless its command has already ended) ends
        with an `error` frame saying so, its command stopped as on a timeout."""
        self._ending.set()

    def background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def wait_background(self) -> None:
        """Let cleanups that are under way finish (at shutdown, in tests)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


@dataclass
class _Run:
    """The state of one execution while it is relayed."""

    relay: Relay
    execution: Execution
    alloc_id: str
    client: Client
    use: RunnerUse  # ended with the run, or handed on to the background stop
    queue: Outbox = field(init=False)
    translator: Translator = field(default_factory=Translator)
    discard: bool = False  # the client is done: output is read and dropped
    client_gone: bool = False
    main: Session | None = None
    err: Session | None = None

    def __post_init__(self) -> None:
        self.queue = Outbox(self.relay.settings.output_queue)

    @property
    def runner_id(self) -> str:
        return self.execution.runner_id

    # -- the whole run --------------------------------------------------------------

    async def run(self) -> str:
        writer = asyncio.ensure_future(self._write())
        helpers: list[asyncio.Future[Any]] = []
        streams: list[asyncio.Task[int]] = []
        try:
            await self._put(START)
            try:
                await self._open()
            except ExecError as exc:
                outcome = await self._explain(exc)
                await self._finish(outcome)
                return _result(outcome)
            assert self.main is not None
            main = asyncio.ensure_future(self._pump(self.main, None))
            err = asyncio.ensure_future(self._pump(self.err, "stderr")) if self.err else None
            streams = [main] + ([err] if err is not None else [])
            limit = self.execution.request.time_limit_s
            stdin = asyncio.ensure_future(self._stdin())
            timer = asyncio.ensure_future(asyncio.sleep(limit if limit > 0 else float("inf")))
            watch = asyncio.ensure_future(self._watch())
            ending = asyncio.ensure_future(self.relay._ending.wait())
            helpers = [stdin, timer, watch, ending]
            done, _ = await asyncio.wait([main, *helpers], return_when=asyncio.FIRST_COMPLETED)
            if main in done:
                outcome = await self._ended(main, err)
                if _cut(main) and not isinstance(outcome, (Lost, Released)):
                    # Docker does not end a command whose exec stream was cut.
                    if isinstance(outcome, Failed):
                        outcome = Failed(f"{outcome.message}; {CUT_ENDING}")
                    self.relay.background(self._end_cut(err, self.use.hand_on()))
            elif watch in done:
                outcome = watch.result()
            else:
                self._stop_in_background(main, err)
                if stdin in done:  # the client left
                    self.client_gone = True
                    return "client_disconnected"
                outcome = SHUTTING_DOWN if ending in done else TimedOut()
            await self._finish(outcome)
            return _result(outcome)
        except asyncio.CancelledError:
            # Shutting down: nothing more reaches the client, nothing may block.
            self.client_gone = self.discard = True
            writer.cancel()
            raise
        finally:
            # Handed on: the background stop owns the execs and the runner's use.
            handed_on = self.use.ended
            for task in [*helpers, *([] if handed_on else streams)]:
                task.cancel()
            await self._close_queue(writer)
            if not handed_on:
                await self._close_sessions()
                self.use.end()
            with contextlib.suppress(Exception):
                await self.client.close()

    async def _open(self) -> None:
        s = self.relay.settings.exec
        request = self.execution.request
        opener = self.relay._execs
        main_argv = main_command(self.execution.marker, request, s)
        if not s.separate_stderr:
            self.main = await opener.open(self.alloc_id, s.task, main_argv, tty=True)
            return
        err_argv = stderr_command(self.execution.marker, request.privileged)
        # Both at once: the connects overlap, and each side of the FIFO waits
        # for the other inside the runner.
        results = await asyncio.gather(
            opener.open(self.alloc_id, s.task, main_argv, tty=True),
            opener.open(self.alloc_id, s.task, err_argv, tty=False),
            return_exceptions=True,
        )
        sessions = [r for r in results if not isinstance(r, BaseException)]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            for session in sessions:
                await session.close()
            if sessions:
                # One side runs and waits for the other: end it.
                self.relay.background(self._kill_lone_side())
            raise failures[0]
        main, err = results
        assert not isinstance(main, BaseException) and not isinstance(err, BaseException)
        self.main, self.err = main, err

    # -- output, input, loss ----------------------------------------------------------

    async def _pump(self, session: Session | None, rename: str | None) -> int:
        """Relay one exec's output; its exit code (raises ExecError)."""
        assert session is not None
        metrics = self.relay._metrics
        async for event in session.events():
            if isinstance(event, Exited):
                return event.code
            if rename is not None:
                # The stderr reader's stdout is the command's stderr; its own
                # stderr (a failing `cat`) is not the command's.
                if event.stream != "stdout":
                    continue
                event = (
                    Output("stderr", event.data)
                    if isinstance(event, Output)
                    else StreamClosed("stderr")
                )
            if isinstance(event, Output):
                metrics.execution_bytes.labels(event.stream).inc(len(event.data))
            if self.discard:
                continue
            for frame in self.translator.on_event(event):
                await self._put(frame)
        raise ExecError("the exec ended without an exit code")  # events() raises first

    async def _stdin(self) -> None:
        """Client frames to the command's stdin, until the client leaves."""
        assert self.main is not None
        metrics = self.relay._metrics
        while True:
            data = await self.client.receive()
            if data is None:
                return
            metrics.execution_bytes.labels("stdin").inc(len(data))
            with contextlib.suppress(ExecError):
                await self.main.send(data)

    async def _watch(self) -> Outcome:
        """Ends when the runner is lost or released while the command runs."""
        runners = self.relay._runners
        while True:
            await asyncio.sleep(self.relay.settings.loss_poll_s)
            if runners.ended(self.runner_id):
                # Told only once Nomad records it; until then, look again.
                verdict = await runners.verdict(self.runner_id, read=False)
                if isinstance(verdict, Ended):
                    return _ended_as(verdict)

    # -- how it ended -----------------------------------------------------------------

    async def _ended(self, main: asyncio.Task[int], err: asyncio.Task[int] | None) -> Outcome:
        if err is not None:
            # stderr the command wrote before it exited is still on its way
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(err), self.relay.settings.stderr_drain_s)
        try:
            code = main.result()
        except ExecError as exc:
            outcome = await self._explain(exc)
            if (
                isinstance(outcome, Failed)
                and isinstance(exc, ExecBroken)
                and self.relay.settings.broken_as_exit_zero
            ):
                # Poseidon's answer: a stream that ended without its exit code is exit 0.
                return Exit(0)
            return outcome
        if code >= 128:
            # Killed by a signal: perhaps with its allocation (OOM, drain, stop).
            window = self.relay.settings.signal_loss_window_s
            verdict = await self.relay._runners.verdict(self.runner_id, settle_s=window)
            if isinstance(verdict, Ended):
                return _ended_as(verdict)
        return Exit(code)

    async def _explain(self, exc: ExecError) -> Outcome:
        """The outcome of an exec Nomad refused or broke off: the runner's loss
        if it was lost meanwhile, else the answer table's message."""
        answer = answers.exec_failure(exc, "command")
        verdict = await self.relay._runners.looked(self.runner_id, answer.look)
        if isinstance(verdict, Ended):
            return _ended_as(verdict)
        if isinstance(verdict, Unrecorded):
            answer = verdict.answer(self.runner_id)
        log.log(
            logging.ERROR if isinstance(exc, ExecForbidden) else logging.WARNING,
            "execution on runner %s failed: %s (Nomad: %s)",
            self.runner_id,
            answer.message,
            exc.reason,
            extra={"runner_id": self.runner_id},
        )
        return Failed(f"Error executing the request: {answer.message}")

    async def _finish(self, outcome: Outcome) -> None:
        for frame in self.translator.finish(outcome):
            await self._put(frame)

    # -- stopping a command that must not go on ---------------------------------------

    def _stop_in_background(self, main: asyncio.Task[int], err: asyncio.Task[int] | None) -> None:
        self.discard = True
        self.relay.background(self._stop(main, err, self.use.hand_on()))

    async def _stop(
        self, main: asyncio.Task[int], err: asyncio.Task[int] | None, use: RunnerUse
    ) -> None:
        settings = self.relay.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.stop_grace_s
        try:
            if self.main is not None:
                with contextlib.suppress(ExecError):
                    await self.main.send(CTRL_BACKSLASH)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(main), settings.quit_grace_s)
            # Always: background jobs and the stderr reader outlive the shell.
            await self._kill_marked()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(main), max(0.0, deadline - loop.time()))
            if not main.done():
                log.warning(
                    "execution on runner %s could not be ended: stopping the runner",
                    self.runner_id,
                    extra={"runner_id": self.runner_id},
                )
                with contextlib.suppress(Exception):
                    await self.relay._runners.stop(self.runner_id, LossReason.EXECUTION_NOT_STOPPED)
        finally:
            main.cancel()
            if err is not None:
                err.cancel()
            await self._close_sessions()
            use.end()

    async def _end_cut(self, err: asyncio.Task[int] | None, use: RunnerUse) -> None:
        """The command's exec was cut: its processes run on in the runner.
        Kill them as a timed-out execution's are, as soon as the runner can
        be reached again; a runner lost or released meanwhile took them with
        it. If no kill gets through within `cut_kill_s`, the runner is
        stopped rather than left with a command nobody can end."""
        settings = self.relay.settings
        runners = self.relay._runners
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.cut_kill_s
        wait = settings.cut_retry_s
        try:
            while not runners.ended(self.runner_id):
                if await self._kill_marked():
                    return
                if loop.time() + wait > deadline:
                    log.warning(
                        "the cut execution on runner %s could not be ended: stopping the runner",
                        self.runner_id,
                        extra={"runner_id": self.runner_id},
                    )
                    with contextlib.suppress(Exception):
                        await runners.stop(self.runner_id, LossReason.EXECUTION_NOT_STOPPED)
                    return
                await asyncio.sleep(wait)
                wait = min(wait * 2, 4.0)
        finally:
            if err is not None:
                err.cancel()
            await self._close_sessions()
            use.end()

    async def _kill_lone_side(self) -> None:
        await self._kill_marked()

    async def _kill_marked(self) -> bool:
        """End the execution's processes (`command.kill_command`): all of the
        unprivileged user's when this execution is the runner's only use in
        flight (its own use still counts here), else those with its marker;
        and root's with its marker (the stderr reader among them). True when
        the kill ran to its end."""
        s = self.relay.settings.exec
        alone = self.relay._runners.uses(self.runner_id) <= 1
        argv = kill_command(self.execution.marker, s, sweep_user=alone)
        try:
            session = await self.relay._execs.open(self.alloc_id, s.task, argv, tty=False)
        except ExecError as exc:
            log.info("could not end execution %s: %s", self.execution.id, exc.reason)
            return False
        try:
            async with asyncio.timeout(self.relay.settings.stop_grace_s):
                async for event in session.events():
                    if isinstance(event, Exited):
                        return True
        except (ExecError, TimeoutError):
            pass
        finally:
            await session.close()
        return False

    async def _close_sessions(self) -> None:
        for session in (self.main, self.err):
            if session is not None:
                with contextlib.suppress(Exception):
                    await session.close()

    # -- the client side --------------------------------------------------------------

    async def _put(self, frame: Frame) -> None:
        if not self.client_gone:
            await self.queue.put(frame)

    async def _close_queue(self, writer: asyncio.Future[None]) -> None:
        """Let the writer send what is queued (the terminal frame last), then stop;
        without a client there is nothing to wait for."""
        if self.client_gone:
            writer.cancel()
        elif not writer.done():
            await self.queue.put(None)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await writer

    async def _write(self) -> None:
        """Queued frames to the client, consecutive output of one stream merged."""
        queue = self.queue
        pending: Frame | None = None
        while True:
            frame = pending if pending is not None else await queue.get()
            pending = None
            if frame is None:
                return
            if frame["type"] in ("stdout", "stderr"):
                size = len(frame["data"])
                while size < COALESCE_BYTES and not queue.empty():
                    following = queue.get_nowait()
                    if following is None or following["type"] != frame["type"]:
                        pending = following
                        break
                    frame = {"type": frame["type"], "data": frame["data"] + following["data"]}
                    size += len(following["data"])
            if self.client_gone:
                continue
            try:
                await self.client.send(frame)
            except Exception:
                # Gone: keep emptying the queue so nobody blocks on it.
                self.client_gone = True
                self.discard = True


def _cut(main: asyncio.Task[int]) -> bool:
    """The command's exec broke off after it ran (not refused before)."""
    error = main.exception() if not main.cancelled() else None
    return isinstance(error, ExecBroken) and not isinstance(error, ExecUnreachable)


def _ended_as(verdict: Ended) -> Outcome:
    return Released() if verdict.reason is None else Lost(verdict.reason)


def _result(outcome: Outcome) -> str:
    if isinstance(outcome, Exit):
        return "exit"
    if isinstance(outcome, TimedOut):
        return "timeout"
    if isinstance(outcome, Lost):
        return "lost"
    return "error"
