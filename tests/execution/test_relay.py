"""The relay against fakes of Nomad's exec and of the runner: the paths a real
simulator cannot force — an execution that cannot be ended, a client that
never reads — and the order of what a client sees. End-to-end behaviour
against the simulator is in tests/e2e/test_executions.py."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field, replace

import pytest

from controller.dataplane.answers import Look
from controller.dataplane.runners import Ended, Verdict, read_times
from controller.execution.command import ExecSettings, ExecutionRequest, kill_command
from controller.execution.frames import Frame
from controller.execution.relay import Relay, RelaySettings
from controller.execution.store import Execution
from controller.metrics import Metrics
from controller.model import LossReason
from controller.nomad.exec import ExecBroken, ExecRejected, ExecUnreachable, Exited, Output
from controller.reconcile.uses import RunnerUse, Uses
from tests.support.exec_fake import FakeExecs, Open, ScriptedSession, Step, main_then_kills

pytestmark = pytest.mark.anyio
FAST = RelaySettings(
    exec=ExecSettings(separate_stderr=False),
    quit_grace_s=0.05,
    stop_grace_s=0.3,
    stderr_drain_s=0.05,
    loss_poll_s=0.02,
)


def command(ends_on_quit: bool = True) -> ScriptedSession:
    """The command's exec, fed by the test: by default a command that ends on
    Ctrl-\\ (exit 131); otherwise one that ignores everything and never exits."""
    return ScriptedSession(ends_on_quit=ends_on_quit)


@dataclass
class FakeRunners:
    """The runner: lost when `lost` is set (Nomad, read again, shows it at
    once); its uses counted by the real registry."""

    lost: LossReason | None = None
    others: int = 0  # other uses of the runner in flight (file operations, executions)
    settle_s: float = 0.2
    stopped: list[LossReason] = field(default_factory=list)
    ended_uses: list[str] = field(default_factory=list)
    registry: Uses = field(init=False)

    def __post_init__(self) -> None:
        self.registry = Uses(on_end=self.ended_uses.append)

    def use(self) -> RunnerUse:
        return self.registry.begin("7-r", "execution")

    @property
    def uses_ended(self) -> int:
        return len(self.ended_uses)

    def ended(self, runner_id: str) -> bool:
        return self.lost is not None

    async def looked(self, runner_id: str, look: Look) -> Verdict:
        if look is Look.NONE:
            return None
        return await self.verdict(runner_id, settle_s=self.settle_s if look is Look.SETTLE else 0)

    async def verdict(self, runner_id: str, *, read: bool = True, settle_s: float = 0.0) -> Verdict:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for at in read_times(settle_s) if read else (0.0,):
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            if self.lost is not None:
                return Ended(self.lost)
        return None

    def uses(self, runner_id: str) -> int:
        return self.registry.count(runner_id) + self.others

    async def stop(self, runner_id: str, reason: LossReason) -> None:
        self.stopped.append(reason)


class FakeClient:
    def __init__(self, reads: bool = True) -> None:
        self.frames: list[Frame] = []
        self.inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.reads = reads
        self.blocked = asyncio.Event()
        self.gate = asyncio.Event()  # cleared: a client that has not read yet
        self.gate.set()

    async def send(self, frame: Frame) -> None:
        if not self.reads:
            self.blocked.set()
            await asyncio.Event().wait()  # a client that never reads
        await self.gate.wait()
        self.frames.append(frame)

    async def receive(self) -> bytes | None:
        return await self.inbox.get()

    async def close(self) -> None:
        self.closed.set()


def execution(time_limit_s: int = 0) -> Execution:
    return Execution("e1", "7-r", ExecutionRequest("cat", time_limit_s=time_limit_s), 0.0)


def relay(
    main: ScriptedSession, runners: FakeRunners, settings: RelaySettings = FAST
) -> tuple[Relay, FakeExecs]:
    execs = FakeExecs(main_then_kills(main))
    return Relay(execs, runners, Metrics(), settings), execs


async def test_frames_in_order_and_stdin_relayed() -> None:
    main, runners, client = command(), FakeRunners(), FakeClient()
    r, execs = relay(main, runners)
    task = asyncio.ensure_future(r.run(execution(), "alloc-1", client, runners.use()))
    await client.inbox.put(b"hello\n")
    main.feed(Output("stdout", b"hello\r\n"))
    await main.stdin_received()
    main.feed(Exited(0))
    await task
    assert client.frames == [
        {"type": "start"},
        {"type": "stdout", "data": "hello\r\n"},
        {"type": "exit", "data": 0},
    ]
    assert main.sent == [b"hello\n"]
    assert execs.opened[0].alloc_id == "alloc-1" and execs.opened[0].tty is True
    assert client.closed.is_set() and main.closed and runners.uses_ended == 1


async def test_every_byte_of_output_and_stdin_is_counted_in_the_metric() -> None:
    """`nrc_execution_bytes_total` counts every byte of each stream, the
    last output before the exit included."""
    main, runners, client = command(), FakeRunners(), FakeClient()
    metrics = Metrics()
    execs = FakeExecs(main_then_kills(main))
    r = Relay(execs, runners, metrics, FAST)
    task = asyncio.ensure_future(r.run(execution(), "alloc-1", client, runners.use()))
    await client.inbox.put(b"data")
    await main.stdin_received(4)
    big = 40_000
    main.feed(*(Output("stdout", b"x" * big) for _ in range(3)), Output("stderr", b"e" * 10))
    main.feed(Exited(0))
    await task

    def counted(stream: str) -> float | None:
        labels = {"stream": stream}
        return metrics.registry.get_sample_value("nrc_execution_bytes_total", labels)

    assert (counted("stdout"), counted("stderr"), counted("stdin")) == (3 * big, 10, 4)


async def test_output_queued_for_a_busy_client_is_merged_per_stream_in_order() -> None:
    """Frames that wait for the client are sent as one per run of a stream
    (up to 64 KB), in order, a frame of the other stream between them kept."""
    main, runners, client = command(), FakeRunners(), FakeClient()
    client.gate.clear()  # the client takes no frame until the output is queued
    r, _ = relay(main, runners, dataclasses.replace(FAST, output_queue=256 * 1024))
    task = asyncio.ensure_future(r.run(execution(), "alloc-1", client, runners.use()))
    steps: list[Step] = [
        Output("stdout", b"a"),
        Output("stdout", b"b"),
        Output("stdout", b"c"),
        Output("stderr", b"d"),
        Output("stdout", b"e" * 40_000),
        Output("stdout", b"f" * 40_000),
        Output("stdout", b"g"),
        Exited(0),
    ]
    main.feed(*steps)
    await asyncio.wait_for(main.taken(len(steps)), 5)
    client.gate.set()
    await task
    assert client.frames == [
        {"type": "start"},
        {"type": "stdout", "data": "abc"},
        {"type": "stderr", "data": "d"},
        {"type": "stdout", "data": "e" * 40_000 + "f" * 40_000},  # 64 KB reached
        {"type": "stdout", "data": "g"},
        {"type": "exit", "data": 0},
    ]


async def test_a_command_that_cannot_be_ended_costs_the_runner() -> None:
    main, runners, client = command(ends_on_quit=False), FakeRunners(), FakeClient()
    r, execs = relay(main, runners)
    await r.run(execution(time_limit_s=1), "alloc-1", client, runners.use())
    assert client.frames[-1] == {"type": "timeout"}
    assert runners.stopped == []  # not yet: Ctrl-\, the kill exec, then the grace
    assert runners.uses(execution().runner_id) == 1, "the background stop holds the use"
    await r.wait_background()
    assert main.sent == [b"\x1c"], "Ctrl-\\ first"
    assert len(execs.opened) == 2, "then an exec that kills the marked processes"
    assert runners.stopped == [LossReason.EXECUTION_NOT_STOPPED]
    assert runners.uses_ended == 1


async def test_a_command_that_ends_on_sigquit_keeps_the_runner() -> None:
    main, runners, client = command(), FakeRunners(), FakeClient()
    r, _ = relay(main, runners)
    await r.run(execution(time_limit_s=1), "alloc-1", client, runners.use())
    await r.wait_background()
    assert client.frames[-1] == {"type": "timeout"}
    assert runners.stopped == [] and runners.uses_ended == 1


async def test_a_client_that_leaves_gets_no_frame_and_the_command_is_stopped() -> None:
    main, runners, client = command(), FakeRunners(), FakeClient()
    r, execs = relay(main, runners)
    task = asyncio.ensure_future(r.run(execution(), "alloc-1", client, runners.use()))
    await client.inbox.put(None)
    await task
    await r.wait_background()
    assert client.frames == [{"type": "start"}]
    assert main.sent == [b"\x1c"] and len(execs.opened) == 2


async def test_a_shutdown_ends_a_running_execution_with_an_error_frame() -> None:
    """The drain's grace ran out (`Relay.end_all`): never a silent cut, and the
    command is stopped as on a timeout."""
    main, runners, client = command(), FakeRunners(), FakeClient()
    r, execs = relay(main, runners)
    task = asyncio.ensure_future(r.run(execution(), "alloc-1", client, runners.use()))
    main.feed(Output("stdout", b"working"))
    await asyncio.sleep(0.05)
    r.end_all()
    await task
    await r.wait_background()
    assert client.frames[-1]["type"] == "error"
    assert "shutting down" in client.frames[-1]["data"]
    assert main.sent == [b"\x1c"] and len(execs.opened) == 2, "Ctrl-\\, then the kill exec"
    assert client.closed.is_set() and runners.uses_ended == 1


async def test_a_loss_during_the_run_ends_it_with_the_reason() -> None:
    main, runners, client = command(ends_on_quit=False), FakeRunners(), FakeClient()
    r, _ = relay(main, runners)
    task = asyncio.ensure_future(r.run(execution(), "alloc-1", client, runners.use()))
    main.feed(Output("stdout", b"working"))
    await asyncio.sleep(0.05)
    runners.lost = LossReason.OOM_KILLED
    await task
    assert client.frames[-2:] == [
        {"type": "stdout", "data": "working"},
        {"type": "error", "data": "the allocation was OOM Killed"},
    ]


async def test_a_client_that_never_reads_holds_the_exec_back() -> None:
    """Backpressure: output waits in a queue bounded in bytes; Nomad's stream
    is not read further, so nothing grows without bound."""
    main, runners, client = command(), FakeRunners(), FakeClient(reads=False)
    r, _ = relay(main, runners)
    task = asyncio.ensure_future(r.run(execution(), "alloc-1", client, runners.use()))
    for _ in range(10_000):
        main.feed(Output("stdout", b"x" * 1024))
    await client.blocked.wait()
    await asyncio.sleep(0.1)
    # the queue's bound + the frame in the writer's hands + one in the pump's
    assert main.consumed * 1024 <= FAST.output_queue + 4 * 1024
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    ("exit_zero", "last"),
    [
        (
            False,
            {
                "type": "error",
                "data": "Error executing the request: Nomad cut the connection before "
                "the command's exit code; its processes are ended as soon as the runner "
                "can be reached",
            },
        ),
        (True, {"type": "exit", "data": 0}),
    ],
)
async def test_a_broken_exec_is_an_error_frame_or_poseidons_exit_0(
    exit_zero: bool, last: Frame
) -> None:
    """An exec whose connection ends without Nomad's exit frame."""
    main = ScriptedSession(
        [
            Output("stdout", b"partial"),
            ExecBroken("the connection to Nomad ended before the command's exit code"),
        ]
    )
    runners, client = FakeRunners(), FakeClient()
    settings = replace(FAST, broken_as_exit_zero=exit_zero)
    r, execs = relay(main, runners, settings)
    await r.run(execution(), "a", client, runners.use())
    assert client.frames == [{"type": "start"}, {"type": "stdout", "data": "partial"}, last]
    # Docker runs a cut exec's command on: it is killed either way.
    await r.wait_background()
    assert execs.commands[1:] == [kill_command("e1", settings.exec, sweep_user=True)]
    assert runners.uses_ended == 1


async def test_a_cut_execution_is_killed_once_the_runner_can_be_reached_again() -> None:
    """The agent that held the exec restarted: the kill's exec is refused
    while it is down, then gets through; the runner's use lasts until then."""
    main = ScriptedSession([ExecBroken("the connection to Nomad ended before the exit code")])
    runners, client = FakeRunners(), FakeClient()
    down = 2  # kill execs refused before one gets through

    async def agent_down(opened: Open) -> None:
        if not opened.tty and len(execs.opened) <= 1 + down:
            raise ExecUnreachable("connection refused")

    execs = FakeExecs(main_then_kills(main), meanwhile=agent_down)
    r = Relay(execs, runners, Metrics(), replace(FAST, cut_retry_s=0.01))
    await r.run(execution(), "a", client, runners.use())
    assert client.frames[-1]["type"] == "error"
    assert runners.uses_ended == 0, "the use ended before the command was"
    await r.wait_background()
    assert len(execs.opened) == 1 + down + 1
    assert runners.uses_ended == 1 and runners.stopped == []


async def test_a_cut_execution_that_cannot_be_killed_costs_the_runner() -> None:
    main = ScriptedSession([ExecBroken("the connection to Nomad ended before the exit code")])
    runners, client = FakeRunners(), FakeClient()

    async def agent_gone(opened: Open) -> None:
        if not opened.tty:
            raise ExecUnreachable("connection refused")

    execs = FakeExecs(main_then_kills(main), meanwhile=agent_gone)
    r = Relay(execs, runners, Metrics(), replace(FAST, cut_kill_s=0.1, cut_retry_s=0.01))
    await r.run(execution(), "a", client, runners.use())
    await r.wait_background()
    assert runners.stopped == [LossReason.EXECUTION_NOT_STOPPED]
    assert runners.uses_ended == 1


async def test_a_cut_execution_on_a_runner_lost_meanwhile_is_not_killed() -> None:
    """Its runner's loss took the processes with it: nothing to kill."""
    main = ScriptedSession([ExecBroken("the connection to Nomad ended before the exit code")])
    runners, client = FakeRunners(lost=LossReason.LOST), FakeClient()
    r, execs = relay(main, runners)
    await r.run(execution(), "a", client, runners.use())
    await r.wait_background()
    assert client.frames[-1]["type"] == "error" and "was lost" in client.frames[-1]["data"]
    assert len(execs.opened) == 1


@pytest.mark.parametrize(
    ("window_s", "last"),
    [
        (0.05, {"type": "exit", "data": 137}),
        (2.0, {"type": "error", "data": "the allocation was OOM Killed"}),
    ],
)
async def test_an_exit_by_signal_waits_the_loss_window_for_an_oom_kill(
    window_s: float, last: Frame
) -> None:
    """Nomad learns of the OOM kill 0.3 s after the exec's exit 137: a window of
    1 s (Poseidon's) or more finds it, one of 0.05 s reports the exit code."""
    main, runners, client = command(), FakeRunners(), FakeClient()
    settings = replace(FAST, signal_loss_window_s=window_s)
    r, _ = relay(main, runners, settings)
    task = asyncio.ensure_future(r.run(execution(), "a", client, runners.use()))
    main.feed(Exited(137))

    async def oom_reported_late() -> None:
        await asyncio.sleep(0.3)
        runners.lost = LossReason.OOM_KILLED

    reporter = asyncio.ensure_future(oom_reported_late())
    await task
    await reporter
    assert client.frames[-1] == last


def half_open() -> FakeExecs:
    """The command's exec is refused; the stderr reader's (a command waiting
    for its other side) and the kill's (exits 0 at once) open."""

    def rule(n: int, opened: Open) -> ScriptedSession:
        return ScriptedSession([Exited(0)]) if n > 2 else ScriptedSession()

    return FakeExecs(rule, refuse=ExecRejected("refused"), refuse_at=1)


@pytest.mark.parametrize(("uses", "sweep"), [(1, True), (2, False)])
async def test_the_lone_side_of_a_half_opened_pair_is_killed(uses: int, sweep: bool) -> None:
    """The kill sweeps the unprivileged user's processes only when this
    execution is the runner's sole use; otherwise it keeps to the marker."""
    execs, runners, client = half_open(), FakeRunners(), FakeClient()
    runners.others = uses - 1
    settings = replace(FAST, exec=ExecSettings(separate_stderr=True))
    r = Relay(execs, runners, Metrics(), settings)
    await r.run(execution(), "a", client, runners.use())
    await r.wait_background()
    assert client.frames[-1]["type"] == "error"
    assert execs.opened[0].tty, "the command's exec is the one refused"
    kill = execs.opened[-1]
    assert not kill.tty
    assert kill.command == kill_command("e1", settings.exec, sweep_user=sweep)
