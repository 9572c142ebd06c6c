"""The timeout and disconnect kill without CAP_SYS_PTRACE and unforgeable by
the student: against the simulator as root, where an exec has Docker's
capabilities and `setuser` is a real unprivileged uid, so root cannot read the
student's `/proc/PID/environ` (the old marker scan found nothing there)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.execution.command import (
    ExecutionRequest,
    fifo_path,
    kill_command,
    main_command,
    stderr_command,
)
from tests.helpers import wait_until
from tests.sim.test_exec import Session as SimSession
from tests.sim.test_exec import exec_url, task_dir
from tests.support.api_server import sim_settings
from tests.support.world import Run, World, world_with

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="real users and Docker's capabilities need the simulator as root"
)

# The time limit, and how long after it no process of the execution may be left.
LIMIT_S = 1
LEFT_S = 3.0
TASK = "default-task"


@pytest.fixture
def world(make_sim: Any) -> Iterator[World]:
    with world_with(make_sim) as w:
        yield w


def owned_by(uid: int) -> list[int]:
    """Live processes of `uid` (a zombie is dead: an orphan waits for init)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/stat") as f:
                    state = f.read().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                pids.append(int(name))
    return pids


def user_of(world: World, alloc_id: str) -> int:
    uid, _ = world.sim.call(lambda: world.sim.sim.driver.user_ids(alloc_id))
    return uid


def left(world: World, alloc_id: str) -> list[int]:
    """The execution's processes still alive: those with the simulator's
    marker and every process of the allocation's unprivileged user."""
    return sorted({*world.processes(alloc_id), *owned_by(user_of(world, alloc_id))})


def timed_out_and_cleared(world: World, runner: str, command: str, **extra: Any) -> Run:
    alloc = world.alloc_of(runner)["ID"]
    run = world.run(runner, command, timeLimit=LIMIT_S, **extra)
    assert run.last == {"type": "timeout"}
    # run.seconds is about the limit: what is left must be gone within LEFT_S of it.
    wait_until(lambda: not left(world, alloc), timeout=LEFT_S - (run.seconds - LIMIT_S))
    assert world.runner_status(runner)[0] == 200, "the runner is still the client's"
    return run


def test_a_background_child_and_one_that_ignores_sigquit_are_gone_after_a_timeout(
    world: World,
) -> None:
    command = "sleep 1000 & (trap '' QUIT; while :; do sleep 0.1; done)"
    timed_out_and_cleared(world, world.claim(), command)


def test_clearing_the_marker_and_leaving_the_session_no_longer_escapes(world: World) -> None:
    command = "(unset NRC_EXECUTION_ID; setsid sleep 999) & env -i setsid sleep 998 & sleep 60"
    timed_out_and_cleared(world, world.claim(), command)


def test_the_stderr_reader_is_gone_after_a_timeout(world: World) -> None:
    runner = world.claim()
    # A child in a session of its own holds the stderr FIFO open: its reader
    # (`cat`, an exec of its own) never sees the end of it.
    run = timed_out_and_cleared(world, runner, "echo oops >&2; (setsid sleep 500 &); sleep 60")
    assert run.frames[0] == {"type": "start"}


def test_a_client_that_leaves_takes_the_escapees_with_it(world: World) -> None:
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    ws_url = world.execute(runner, "(unset NRC_EXECUTION_ID; setsid sleep 999) & sleep 61")
    with world.connect(ws_url) as ws:
        ws.recv(timeout=5)
        wait_until(lambda: len(owned_by(user_of(world, alloc))) >= 2, timeout=5)
    wait_until(lambda: not left(world, alloc), timeout=LEFT_S)
    assert world.runner_status(runner)[0] == 200


def test_a_privileged_execution_is_ended_too(world: World) -> None:
    command = "sleep 1000 & (trap '' QUIT; while :; do sleep 0.1; done)"
    timed_out_and_cleared(world, world.claim(), command, privilegedExecution=True)


def test_a_second_execution_in_flight_on_the_runner_is_spared(world: World) -> None:
    """Two uses at once: the kill keeps to the timed-out execution's marker,
    and the other execution runs to its end."""
    runner = world.claim()
    results: list[Run] = []
    other = threading.Thread(
        target=lambda: results.append(world.run(runner, "sleep 3; echo survived"))
    )
    other.start()
    time.sleep(0.3)  # the other execution is running before this one starts
    run = world.run(runner, "sleep 60", timeLimit=LIMIT_S)
    other.join(timeout=10)
    assert run.last == {"type": "timeout"}
    assert results and results[0].last == {"type": "exit", "data": 0}
    assert results[0].stdout == "survived\r\n"


def test_the_reader_of_a_half_opened_pair_is_ended_by_the_kill(world: World) -> None:
    """The stderr reader's exec opened, the command's never came (refused):
    the reader waits in open(2) on the FIFO in root's shell, which shows the
    marker only in its script; the kill's pass as root finds it there."""
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    settings = sim_settings(world.sim).execution_settings().exec  # the service's own
    execution = f"halfopen-{uuid.uuid4().hex}"
    reader = SimSession(exec_url(world.sim, alloc, stderr_command(execution, False), task=TASK))
    wait_until(lambda: Path(fifo_path(execution)).exists(), timeout=5)
    kill = kill_command(execution, settings, sweep_user=True)
    assert SimSession(exec_url(world.sim, alloc, kill, task=TASK)).finish().exit_code == 0
    assert reader.finish().exit_code == 137
    assert not left(world, alloc)
    assert not Path(fifo_path(execution)).exists(), "the FIFO is removed"


def test_the_command_of_a_half_opened_pair_never_runs_and_is_ended_by_the_kill(
    world: World,
) -> None:
    """The command's exec opened, the reader's never came: root's shell waits
    for a reader before the wrapper, so nothing of the command has run; the
    kill's pass as root ends it."""
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    settings = sim_settings(world.sim).execution_settings().exec
    execution = f"halfopen-{uuid.uuid4().hex}"
    request = ExecutionRequest("touch ran")
    main = SimSession(
        exec_url(world.sim, alloc, main_command(execution, request, settings), task=TASK)
    )
    wait_until(lambda: Path(fifo_path(execution)).exists(), timeout=5)
    kill = kill_command(execution, settings, sweep_user=True)
    assert SimSession(exec_url(world.sim, alloc, kill, task=TASK)).finish().exit_code == 0
    assert main.finish().exit_code == 137
    assert not left(world, alloc)
    workdir = task_dir(world.sim, alloc)
    assert workdir is not None and not (workdir / "ran").exists(), "the command never ran"
    assert not Path(fifo_path(execution)).exists(), "the FIFO is removed"
