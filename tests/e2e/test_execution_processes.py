"""The processes of an execution, looked at from outside while it runs —
against the simulator as root, where an exec is root with Docker's
capabilities and `setuser` a real unprivileged uid: the stderr reader is
root's and never passes the wrapper, and no process of the unprivileged user
ever has Nomad's variables in its environment (`/proc/PID/environ`, which
the user may read), not even for the moment before the command starts."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controller.execution.command import MARKER
from tests.e2e.test_execution_kill import owned_by, user_of
from tests.helpers import wait_until
from tests.support.world import World, world_with

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="real users and Docker's capabilities need the simulator as root"
)


@pytest.fixture
def world(make_sim: Any) -> Iterator[World]:
    with world_with(make_sim) as w:
        yield w


def environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:  # gone
        return None
    pairs = (e.decode(errors="replace").partition("=") for e in entries if e)
    return {k: v for k, _, v in pairs}


def name_and_uid(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip(), os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_no_process_of_the_user_ever_shows_nomads_variables(world: World) -> None:
    runner = world.claim()
    uid = user_of(world, world.alloc_of(runner)["ID"])
    seen: dict[int, dict[str, str]] = {}
    done = threading.Event()

    def watch() -> None:
        # From before the connect to the end: the wrapper's and env's moments too.
        while not done.is_set():
            for pid in owned_by(uid):
                found = environ(pid)
                if found is not None:
                    seen.setdefault(pid, found)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(5):
            run = world.run(runner, "echo oops >&2; sleep 0.3 & (sleep 0.3 &); sleep 0.3")
            assert run.last == {"type": "exit", "data": 0} and run.stderr == "oops\n"
    finally:
        done.set()
        watcher.join()
    assert len(seen) >= 10, "the watcher saw the executions' processes"
    assert not [k for found in seen.values() for k in found if k.startswith("NOMAD_")]
    assert all(MARKER in found or not found for found in seen.values())


def test_the_stderr_reader_is_roots_and_the_command_the_users(world: World) -> None:
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    uid = user_of(world, alloc)
    ws_url = world.execute(runner, "echo up >&2; sleep 60")
    with world.connect(ws_url) as ws:
        assert json.loads(ws.recv(timeout=5)) == {"type": "start"}
        assert json.loads(ws.recv(timeout=5)) == {"type": "stderr", "data": "up\n"}

        def marked() -> list[tuple[str, int]]:
            return sorted(
                found
                for pid in world.processes(alloc)
                if (found := name_and_uid(pid)) is not None and MARKER in (environ(pid) or {})
            )

        # once the command's shell has exec'd its last command
        wait_until(lambda: marked() == [("cat", 0), ("sleep", uid)], timeout=5)
