"""The simulator's exec as a Docker exec runs it (when the simulator runs as
root): the container's user, the task directory as WORKDIR, Docker's default
capabilities as the bounding set, a real unprivileged uid behind `setuser`,
and Docker's stdin rule of Nomad <= 1.8 (input sent once the output has ended
replaces the exit frame with a dropped connection)."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosedError

from nomadsim import SimConfig, SimServer
from nomadsim.driver import DOCKER_CAPS, Driver
from nomadsim.state import StateStore
from tests.helpers import Http, runner_job, wait_until
from tests.sim.test_exec import Session, alive, exec_url, processes, run, task_dir
from tests.support.sim import FAST

root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="Docker's users and capabilities are modelled only as root"
)

# Docker's default set as the kernel numbers it (capability.h).
CAP_BITS = {
    "chown": 0,
    "dac_override": 1,
    "fowner": 3,
    "fsetid": 4,
    "kill": 5,
    "setgid": 6,
    "setuid": 7,
    "setpcap": 8,
    "net_bind_service": 10,
    "net_raw": 13,
    "sys_chroot": 18,
    "mknod": 27,
    "audit_write": 29,
    "setfcap": 31,
}


def start(server: SimServer, job_id: str, user: str | None = None) -> str:
    job = runner_job(job_id)
    if user is not None:
        job["TaskGroups"][0]["Tasks"][0]["User"] = user
    http = Http(server.address)
    http.register(job)
    (alloc,) = http.running(job_id, 1)
    return str(alloc["ID"])


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[SimServer, str]]:
    config: dict[str, Any] = dict(FAST)
    server = SimServer(SimConfig(**config))
    server.start()
    try:
        yield server, start(server, "docker")
    finally:
        server.stop()


def out(server: SimServer, alloc_id: str, script: str, tty: bool = False) -> str:
    return run(server, alloc_id, ["/bin/sh", "-c", script], tty).data("stdout").decode()


def setuser(server: SimServer) -> str:
    return server.setuser_path


@root_only
def test_exec_runs_as_root_in_the_task_directory_with_dockers_bounding_set(
    sim: tuple[SimServer, str],
):
    server, alloc_id = sim
    lines = out(server, alloc_id, "id -u; pwd; grep CapBnd /proc/self/status").split("\n")
    assert lines[0] == "0"
    assert lines[1] == str(task_dir(server, alloc_id))
    expected = sum(1 << CAP_BITS[name] for name in DOCKER_CAPS)
    assert int(lines[2].split()[1], 16) == expected
    # neither SYS_PTRACE (19) nor SYS_ADMIN (21)
    assert not expected & (1 << 19 | 1 << 21)


@root_only
def test_setuser_switches_to_a_real_unprivileged_uid_that_writes_the_workdir(
    sim: tuple[SimServer, str],
):
    server, alloc_id = sim
    script = 'id -u; id -g; id -G; echo "$USER $HOME"; touch mine && stat -c %u mine; pwd'
    lines = run(server, alloc_id, [setuser(server), "user", "/bin/sh", "-c", script])
    uid, gid, groups, names, owner, cwd = lines.data("stdout").decode().split("\n")[:6]
    assert int(uid) >= 1 << 30 and gid == uid and groups == gid  # no supplementary groups
    assert names == f"user {task_dir(server, alloc_id)}"
    assert owner == uid
    assert cwd == str(task_dir(server, alloc_id))
    # `setuser root` stays root
    assert out(server, alloc_id, f"{setuser(server)} root id -u") == "0\n"


@root_only
def test_root_without_sys_ptrace_cannot_read_the_users_environ_but_the_user_can(
    sim: tuple[SimServer, str],
):
    """Appendix A of the production review, in the simulator."""
    server, alloc_id = sim
    sleeper = Session(
        exec_url(
            server,
            alloc_id,
            [setuser(server), "user", "/bin/sh", "-c", "echo $$; exec env SECRET=x sleep 30"],
        )
    )
    sleeper.read_until(b"\n")
    pid = sleeper.result.data("stdout").decode().strip()
    as_root = out(server, alloc_id, f"cat /proc/{pid}/environ >/dev/null 2>&1; echo $?")
    as_user = out(
        server,
        alloc_id,
        f'{setuser(server)} user sh -c \'cat /proc/{pid}/environ | tr "\\0" "\\n" | grep SECRET\'',
    )
    assert as_root == "1\n"  # permission denied
    assert as_user == "SECRET=x\n"
    # root may still signal it (CAP_KILL)
    assert out(server, alloc_id, f"kill -9 {pid}; echo $?") == "0\n"
    assert sleeper.finish().exit_code == 137


@root_only
def test_kill_minus_one_as_the_user_reaches_only_its_allocations_processes(
    make_sim: Callable[..., SimServer],
):
    server = make_sim()
    first, second = start(server, "a"), start(server, "b")
    escapes = "(unset NOMADSIM_ALLOC_ID; setsid sleep 60 &) ; setsid sleep 60 & echo started"
    for alloc_id in (first, second):
        out(server, alloc_id, f"{setuser(server)} user /bin/sh -c '{escapes}'")
    wait_until(lambda: len(processes(server, second)) >= 1)
    survivor = processes(server, second)
    out(server, first, f"{setuser(server)} user /bin/sh -c 'kill -9 -1'")
    uid_first = int(out(server, first, f"{setuser(server)} user id -u"))
    wait_until(lambda: not [p for p in _pids_of(uid_first)])
    assert all(alive(p) for p in survivor)


def _pids_of(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except OSError:
                pass
    return pids


@root_only
def test_the_tasks_user_is_the_containers_user(make_sim: Callable[..., SimServer]):
    server = make_sim()
    alloc_id = start(server, "as-user", user="user")
    uid = int(out(server, alloc_id, "id -u"))
    assert uid >= 1 << 30
    assert out(server, alloc_id, "grep CapEff /proc/self/status").split()[1] == "0" * 16
    numeric = start(server, "numeric", user="4242:4343")
    assert out(server, numeric, "id -u; id -g") == "4242\n4343\n"


@root_only
def test_stopping_the_task_kills_what_cleared_its_environment(make_sim: Callable[..., SimServer]):
    server = make_sim()
    alloc_id = start(server, "gone")
    out(server, alloc_id, f"{setuser(server)} user /bin/sh -c 'env -i setsid sleep 60 &'")
    uid = int(out(server, alloc_id, f"{setuser(server)} user id -u"))
    wait_until(lambda: _pids_of(uid))
    Http(server.address).request("DELETE", "/v1/job/gone")
    wait_until(lambda: not _pids_of(uid))


def test_a_tty_exec_is_a_session_whose_hangup_reaches_it_and_setsid_outlives_it(
    sim: tuple[SimServer, str],
):
    server, alloc_id = sim
    script = "sleep 60 & echo $!; setsid sh -c 'echo $$; exec sleep 60' & sleep 0.3"
    result = run(server, alloc_id, ["/bin/sh", "-c", script], tty=True)
    grouped, detached = (int(p) for p in result.data("stdout").decode().split())
    # The session leader's exit hangs the terminal up: SIGHUP reaches the
    # foreground group (the background job of a non-interactive shell is in
    # it); the child in a session of its own runs on.
    wait_until(lambda: not alive(grouped))
    assert alive(detached)
    os.kill(detached, 9)


def test_a_command_starts_with_default_signals_whatever_the_simulator_ignores(
    sim: tuple[SimServer, str],
):
    """A simulator started under nohup ignores SIGHUP, and fork and exec pass
    that on: the hangup above then never ends the foreground group. A Docker
    exec starts every command with default dispositions and nothing blocked."""
    server, alloc_id = sim
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        status = out(server, alloc_id, "grep -E '^Sig(Ign|Blk):' /proc/self/status")
    finally:
        signal.signal(signal.SIGHUP, previous)
    masks = {line.split(":")[0]: int(line.split()[1], 16) for line in status.splitlines()}
    assert masks["SigIgn"] & (1 << (signal.SIGHUP - 1)) == 0, status
    assert masks["SigBlk"] == 0, status


# -- Docker's stdin rule ---------------------------------------------------------------


def _dropped_without_exit(session: Session) -> list[str]:
    """Read until the connection drops; it must drop without a close frame."""
    frames: list[str] = []
    closed: ConnectionClosedError | None = None
    while closed is None:
        try:
            frames.append(str(session.ws.recv(timeout=5)))
        except ConnectionClosedError as exc:
            closed = exc
    assert closed.rcvd is None
    return frames


def test_input_waiting_when_the_output_ends_replaces_the_exit_frame(
    sim: tuple[SimServer, str],
):
    server, alloc_id = sim
    session = Session(exec_url(server, alloc_id, ["/bin/sh", "-c", "sleep 0.3; exit 3"]))
    chunk = b"x" * 32768
    for _ in range(160):  # 5 MiB, unread: more than the pipe holds
        session.stdin(chunk)
    frames = _dropped_without_exit(session)
    assert not any('"exited"' in f for f in frames)


def test_input_after_the_output_ended_replaces_the_exit_frame(sim: tuple[SimServer, str]):
    server, alloc_id = sim
    # The output ends (both streams closed) while the process still runs.
    session = Session(
        exec_url(server, alloc_id, ["/bin/sh", "-c", "exec >&- 2>&-; sleep 1; exit 0"])
    )
    while len([f for f in session.result.frames if '"close"' in f]) < 2:
        session.result.frames.append(str(session.ws.recv(timeout=5)))
    session.stdin(b"late\n")
    frames = _dropped_without_exit(session)
    assert not any('"exited"' in f for f in frames)


def test_without_the_rule_input_after_the_output_ended_is_dropped(
    make_sim: Callable[..., SimServer],
):
    server = make_sim(docker_stdin_close_on_exit=False)
    alloc_id = start(server, "kind")
    session = Session(exec_url(server, alloc_id, ["/bin/sh", "-c", "sleep 0.3; exit 3"]))
    for _ in range(160):
        session.stdin(b"x" * 32768)
    assert session.finish().exit_code == 3


def test_input_read_before_the_output_ends_is_fine(sim: tuple[SimServer, str]):
    server, alloc_id = sim
    session = Session(exec_url(server, alloc_id, ["/bin/sh", "-c", "cat >/dev/null; exit 4"]))
    for _ in range(160):
        session.stdin(b"x" * 32768)
    session.close_stdin()
    assert session.finish().exit_code == 4


def test_a_client_gone_leaves_a_writing_command_blocked(make_sim: Callable[..., SimServer]):
    """Nomad stops reading an exec's output once a send to its client fails:
    a command that writes more than the pipes hold blocks (and runs on
    until it is killed); it never finishes on its own."""
    server = make_sim()
    alloc_id = start(server, "blocked")
    script = "echo up; head -c 4000000 /dev/zero; touch finished; sleep 60"
    session = Session(exec_url(server, alloc_id, ["/bin/sh", "-c", script]))
    session.read_until(b"up")
    session.ws.close()
    workdir = task_dir(server, alloc_id)
    assert workdir is not None

    def detached() -> bool:
        executions = server.call(lambda: server.sim.driver.executions(alloc_id))
        return [e.attached for e in executions] == [False]

    wait_until(detached)
    deadline = time.monotonic() + 1.0  # ample for 4 MB read and dropped
    while time.monotonic() < deadline:
        assert not (workdir / "finished").exists()
    assert processes(server, alloc_id)


def test_not_root_says_so_once_and_runs_commands_as_before(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with caplog.at_level(logging.WARNING, logger="nomadsim.driver"):
        driver = Driver(StateStore(time.monotonic))
    assert not driver.docker_users
    assert [r.message for r in caplog.records] == [
        "the simulator does not run as root: exec'd commands run as its own user "
        "with its capabilities, and setuser changes no user"
    ]
    assert driver._identity("a", {"User": "user"}) is None
    driver.close()
