"""The wrapped commands, run for real by the host's bash: quoting holds for
any command and any value, Nomad's variables are hidden, the marker reaches
every process, stderr takes its own path, and `kill_command` ends the tree."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import psutil
import pytest

from controller.execution.command import (
    ENV_NAME,
    MARKER,
    ExecSettings,
    ExecutionRequest,
    fifo_path,
    kill_command,
    main_command,
    parse_wrapper,
    stderr_command,
)
from tests.helpers import wait_until

MERGED = ExecSettings(unprivileged_wrapper=(), separate_stderr=False)
NASTY = 'it\'s a "test" with $HOME, `backticks`, \\ and\nnew lines; exit 3'


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, env=env)


@pytest.mark.parametrize(
    "command",
    ["echo hello", "printf '%s' \"$0\"", "echo 'single' \"double\" `echo back`", "echo $((6*7))"],
)
def test_any_command_runs_as_written(command: str) -> None:
    expected = run(["/bin/bash", "-c", command])
    got = run(main_command("e1", ExecutionRequest(command), MERGED))
    assert (got.stdout, got.returncode) == (expected.stdout, expected.returncode)


def test_environment_values_arrive_exactly() -> None:
    environment = {"A": NASTY, "B": "two  spaces", "EMPTY": "", "U": "ünïcödé"}
    command = 'printf "%s|" "$A" "$B" "$EMPTY" "$U" "$CODEOCEAN"'
    got = run(main_command("e1", ExecutionRequest(command, environment=environment), MERGED))
    assert got.stdout == f"{NASTY}|two  spaces||ünïcödé|true|"


def test_exit_code_passes_through() -> None:
    assert run(main_command("e1", ExecutionRequest("exit 42"), MERGED)).returncode == 42


def test_nomad_variables_are_hidden_and_the_marker_is_set() -> None:
    env = {**os.environ, "NOMAD_ALLOC_ID": "a1", "NOMAD_TASK_DIR": "/local"}
    command = 'echo "${NOMAD_ALLOC_ID-unset} ${NOMAD_TASK_DIR-unset} $' + MARKER + '"'
    got = run(main_command("e7", ExecutionRequest(command), MERGED), env)
    assert got.stdout == "unset unset e7\n"


def test_the_unprivileged_wrapper_is_used_unless_privileged(tmp_path: Path) -> None:
    folder = tmp_path / "a folder"
    folder.mkdir()
    shim = folder / "setuser"
    shim.write_text('#!/bin/sh\necho "as $1" >&2\nshift\nexec "$@"\n')
    shim.chmod(0o755)
    settings = ExecSettings(unprivileged_wrapper=(str(shim), "user"), separate_stderr=False)
    unprivileged = run(main_command("e1", ExecutionRequest("echo hi"), settings))
    assert (unprivileged.stdout, unprivileged.stderr) == ("hi\n", "as user\n")
    privileged = run(main_command("e1", ExecutionRequest("echo hi", privileged=True), settings))
    assert (privileged.stdout, privileged.stderr) == ("hi\n", "")


def test_the_clients_environment_is_set_after_the_wrapper(tmp_path: Path) -> None:
    """The wrapper (setuser: a Python interpreter, as root) never sees the
    request's environment, and the request's HOME wins over the wrapper's."""
    seen = tmp_path / "seen"
    shim = tmp_path / "setuser"
    shim.write_text(
        f'#!/bin/sh\necho "${{PYTHONPATH-unset}}" > {seen}\nshift\nHOME=/wrapper exec "$@"\n'
    )
    shim.chmod(0o755)
    settings = ExecSettings(unprivileged_wrapper=(str(shim), "user"), separate_stderr=False)
    environment = {"PYTHONPATH": "/evil", "HOME": "/client"}
    request = ExecutionRequest('echo "$PYTHONPATH $HOME"', environment=environment)
    got = run(main_command("e1", request, settings))
    assert (got.stdout, seen.read_text()) == ("/evil /client\n", "unset\n")


def test_stderr_goes_through_the_fifo_to_the_reader(tmp_path: Path) -> None:
    settings = ExecSettings(unprivileged_wrapper=(), separate_stderr=True)
    request = ExecutionRequest("echo out; echo err >&2; echo more-err >&2; exit 5")
    execution = f"t{os.getpid()}"
    reader = subprocess.Popen(stderr_command(execution, request.privileged), stdout=subprocess.PIPE)
    main = run(main_command(execution, request, settings))
    stderr, _ = reader.communicate(timeout=10)
    assert (main.stdout, main.stderr, main.returncode) == ("out\n", "", 5)
    assert stderr == b"err\nmore-err\n"
    assert not Path(f"/tmp/nrc-{execution}.stderr").exists(), "the FIFO is removed"


def test_the_reader_may_come_first_or_last() -> None:
    settings = ExecSettings(unprivileged_wrapper=(), separate_stderr=True)
    request = ExecutionRequest("echo err >&2")
    for reader_first in (True, False):
        execution = f"order{reader_first}{os.getpid()}"
        reader_argv = stderr_command(execution, request.privileged)
        main_argv = main_command(execution, request, settings)
        if reader_first:
            reader = subprocess.Popen(reader_argv, stdout=subprocess.PIPE)
            main = subprocess.Popen(main_argv)
        else:
            main = subprocess.Popen(main_argv)
            reader = subprocess.Popen(reader_argv, stdout=subprocess.PIPE)
        stderr, _ = reader.communicate(timeout=10)
        assert (main.wait(timeout=10), stderr) == (0, b"err\n")


def test_a_reader_whose_command_never_comes_is_ended_by_the_kill_command() -> None:
    execution = f"lonely{os.getpid()}"
    reader = subprocess.Popen(stderr_command(execution, False))
    try:
        wait_until(lambda: Path(f"/tmp/nrc-{execution}.stderr").exists(), timeout=5)
        assert reader.poll() is None, "it waits for the command's side"
        assert run(kill_command(execution)).returncode == 0
        assert reader.wait(timeout=5) == -9
    finally:
        reader.kill()
        Path(f"/tmp/nrc-{execution}.stderr").unlink(missing_ok=True)


def test_kill_command_ends_every_marked_process_and_nothing_else() -> None:
    command = "sleep 60 & (sleep 61 &) ; setsid sleep 62 & sleep 63"
    argv = main_command("victim", ExecutionRequest(command), MERGED)
    main = subprocess.Popen(argv, start_new_session=True)
    bystander = subprocess.Popen(["sleep", "64"])

    def marked() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARKER) == "victim":
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return found

    try:
        wait_until(lambda: len(marked()) >= 4, timeout=5)
        assert run(kill_command("victim")).returncode == 0
        wait_until(lambda: not [p for p in marked() if p.status() != psutil.STATUS_ZOMBIE], 5)
        assert main.wait(timeout=5) != 0
        assert bystander.poll() is None, "a process without the marker was killed"
    finally:
        bystander.kill()
        bystander.wait()
        for p in marked():
            p.kill()


def test_settings_helpers() -> None:
    assert parse_wrapper("/sbin/setuser user") == ("/sbin/setuser", "user")
    assert parse_wrapper("'/opt/my tools/su' 'a b'") == ("/opt/my tools/su", "a b")
    assert parse_wrapper("") == ()
    names = ["A", "_b9", "9x", "a-b"]
    assert [n for n in names if not ENV_NAME.fullmatch(n)] == ["9x", "a-b"]


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return ""


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to other uids")
@pytest.mark.parametrize("sweep", [True, False])
def test_the_kill_as_the_user_needs_no_marker_when_it_may_sweep(sweep: bool) -> None:
    """As root with a wrapper that changes the user (setpriv for setuser):
    sweeping kills every process of the user, an escapee without the marker
    included; without sweeping only the marked ones. Another uid is spared."""
    uid = 1_500_000_000 + os.getpid() % 100_000
    wrapper = ("setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--")
    settings = ExecSettings(unprivileged_wrapper=wrapper, separate_stderr=False)
    marked = subprocess.Popen(main_command("kx", ExecutionRequest("sleep 60"), settings))
    escapee = subprocess.Popen([*wrapper, "env", "-i", "sleep", "61"], start_new_session=True)
    other = subprocess.Popen(
        ["setpriv", f"--reuid={uid + 1}", f"--regid={uid + 1}", "--clear-groups", "sleep", "62"]
    )
    try:
        # the wrappers have exec'd into the users' commands
        wait_until(lambda: all(_name(p.pid) == "sleep" for p in (marked, escapee, other)), 5)
        assert run(kill_command("kx", settings, sweep_user=sweep)).returncode == 0
        assert marked.wait(timeout=5) == -9
        if sweep:
            assert escapee.wait(timeout=5) == -9
        else:
            assert escapee.poll() is None, "without the sweep only the marker counts"
        assert other.poll() is None, "another user's process was killed"
    finally:
        for p in (marked, escapee, other):
            p.kill()
            p.wait()


def test_a_command_whose_reader_never_comes_never_runs_and_is_ended_by_the_kill(
    tmp_path: Path,
) -> None:
    """The command's side waits for its stderr's reader in root's shell, whose
    environment does not show the marker yet: the kill finds it by its
    script, and the command has not run."""
    settings = ExecSettings(unprivileged_wrapper=(), separate_stderr=True)
    execution = f"readerless{os.getpid()}"
    ran = tmp_path / "ran"
    main = subprocess.Popen(main_command(execution, ExecutionRequest(f"touch {ran}"), settings))
    try:
        wait_until(lambda: Path(fifo_path(execution)).exists(), timeout=5)
        assert main.poll() is None, "it waits for the reader"
        assert run(kill_command(execution)).returncode == 0
        assert main.wait(timeout=5) == -9
        assert not ran.exists()
        assert not Path(fifo_path(execution)).exists(), "the FIFO is removed"
    finally:
        main.kill()
        Path(fifo_path(execution)).unlink(missing_ok=True)


def test_a_symlink_planted_at_the_fifo_path_is_neither_written_nor_read(tmp_path: Path) -> None:
    """The FIFO's path shows in root's command line before `mkfifo`: a
    student's process could plant a symlink there. Neither side writes to,
    truncates or reads what it points to, and the command does not run."""
    settings = ExecSettings(unprivileged_wrapper=(), separate_stderr=True)
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    ran = tmp_path / "ran"
    for side in ("main", "reader"):
        execution = f"planted{side}{os.getpid()}"
        Path(fifo_path(execution)).symlink_to(victim)
        try:
            argv = (
                main_command(execution, ExecutionRequest(f"touch {ran}"), settings)
                if side == "main"
                else stderr_command(execution, False)
            )
            got = run(argv)
            assert got.returncode == 1
            assert "secret" not in got.stdout
        finally:
            Path(fifo_path(execution)).unlink(missing_ok=True)
    assert victim.read_text() == "secret\n"
    assert not ran.exists()


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switches to other uids")


def _as_user(uid: int) -> tuple[str, ...]:
    """A wrapper that really changes the user, as setuser does."""
    return ("setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--")


def _marked(execution: str) -> dict[int, tuple[int, str, dict[str, str]]]:
    """The processes carrying `execution`'s marker: pid → (uid, name, environment)."""
    found = {}
    for p in psutil.process_iter():
        try:
            environ = p.environ()
            if environ.get(MARKER) == execution:
                found[p.pid] = (p.uids().real, p.name(), environ)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@root_only
def test_the_reader_is_roots_and_no_process_of_the_user_sees_nomads_variables() -> None:
    uid = 1_500_000_000 + os.getpid() % 100_000
    settings = ExecSettings(unprivileged_wrapper=_as_user(uid), separate_stderr=True)
    execution = f"census{os.getpid()}"
    env = {**os.environ, "NOMAD_ALLOC_ID": "a1", "NOMAD_TASK_DIR": "/local"}
    request = ExecutionRequest("echo up >&2; sleep 60 & sleep 61")
    reader = subprocess.Popen(stderr_command(execution, False), stdout=subprocess.PIPE, env=env)
    main = subprocess.Popen(main_command(execution, request, settings), env=env)
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline() == b"up\n"
        wait_until(lambda: len(_marked(execution)) >= 4, timeout=5)
        processes = _marked(execution).values()
        assert [(u, n) for u, n, _ in processes if u == 0] == [(0, "cat")]
        users = [environ for u, _, environ in processes if u == uid]
        assert len(users) == 3  # the command's shell and its two sleeps
        assert not [k for environ in users for k in environ if k.startswith("NOMAD_")]
        assert run(kill_command(execution, settings, sweep_user=True)).returncode == 0
        assert main.wait(timeout=5) == -9
        # at the end of its input once the user's processes are gone, or killed as root
        assert reader.wait(timeout=5) in (0, -9)
        wait_until(lambda: not _marked(execution), timeout=5)
    finally:
        for p in (main, reader):
            p.kill()
            p.wait()
        for pid in _marked(execution):
            os.kill(pid, 9)


@root_only
@pytest.mark.parametrize("privileged", [False, True])
def test_the_fifo_is_roots_and_an_unprivileged_command_may_only_write_to_it(
    privileged: bool,
) -> None:
    uid = 1_500_000_000 + os.getpid() % 100_000
    execution = f"modes{privileged}{os.getpid()}"
    fifo = Path(fifo_path(execution))
    reader = subprocess.Popen(stderr_command(execution, privileged))
    try:
        wait_until(fifo.exists, timeout=5)
        st = fifo.stat()
        assert stat.S_ISFIFO(st.st_mode) and st.st_uid == 0
        assert stat.S_IMODE(st.st_mode) == (0o600 if privileged else 0o622)
        access = run(
            [*_as_user(uid), "sh", "-c", f"test -r {fifo}; echo $?; test -w {fifo}; echo $?"]
        )
        assert access.stdout.split() == ["1", "1" if privileged else "0"]
        assert run(kill_command(execution)).returncode == 0
        assert reader.wait(timeout=5) == -9
    finally:
        reader.kill()
        reader.wait()
        fifo.unlink(missing_ok=True)


@root_only
def test_a_planted_fifo_of_another_user_is_not_used() -> None:
    """A FIFO the student made (its own) is opened — its other end held by the
    student — and then refused: nothing of the command runs."""
    uid = 1_500_000_000 + os.getpid() % 100_000
    settings = ExecSettings(unprivileged_wrapper=(), separate_stderr=True)
    execution = f"foreign{os.getpid()}"
    fifo = Path(fifo_path(execution))
    os.mkfifo(fifo, 0o666)
    os.chown(fifo, uid, uid)
    holder = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        got = run(main_command(execution, ExecutionRequest("echo ran; echo ran >&2"), settings))
        assert (got.returncode, got.stdout) == (1, "")
        assert holder.communicate(timeout=5)[0] == b""
    finally:
        holder.kill()
        holder.wait()
        fifo.unlink(missing_ok=True)


def _programs(log: Path) -> list[tuple[str, ...]]:
    """Per process that exec'd (strace -ff: one file each), the programs it
    became, in order."""
    chains = []
    for path in sorted(log.parent.glob(f"{log.name}.*")):
        started = re.findall(r'^execve\("([^"]+)".*= 0$', path.read_text(), re.MULTILINE)
        if started:
            chains.append(tuple(Path(p).name for p in started))
    return sorted(chains)


@pytest.mark.skipif(shutil.which("strace") is None, reason="counts execve with strace")
@pytest.mark.parametrize(
    ("privileged", "separate", "main", "reader"),
    [
        (
            False,
            True,
            [("bash", "nice", "env", "bash"), ("mkfifo",)],
            [("bash", "cat"), ("mkfifo",), ("rm",)],
        ),
        (True, True, [("bash", "bash"), ("mkfifo",)], [("bash", "cat"), ("mkfifo",), ("rm",)]),
        (False, False, [("bash", "nice", "env", "bash")], None),
        (True, False, [("bash", "bash")], None),
    ],
)
def test_the_programs_an_execution_starts(
    tmp_path: Path,
    privileged: bool,
    separate: bool,
    main: list[tuple[str, ...]],
    reader: list[tuple[str, ...]] | None,
) -> None:
    """Counted by the kernel (every successful execve), with a one-program
    wrapper standing in for setuser and a command that starts nothing: the
    command's exec is one process exec'ing from root's bash to the command's
    (plus `mkfifo`); the reader never passes the wrapper. Unprivileged with
    separate stderr: 9 program starts in 5 processes (11 before, 2 of them
    setuser's)."""
    wrapper = (shutil.which("nice") or "nice", "-n", "0")
    settings = ExecSettings(unprivileged_wrapper=wrapper, separate_stderr=separate)
    execution = f"count{privileged}{separate}{os.getpid()}"
    request = ExecutionRequest("echo err >&2", privileged=privileged)

    def traced(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = tmp_path / name
        strace = ["strace", "-ff", "-qq", "-e", "trace=execve", "-e", "signal=none", "-o", str(log)]
        return subprocess.Popen([*strace, *argv], stdout=subprocess.PIPE)

    readers = [traced("reader", stderr_command(execution, privileged))] if separate else []
    command = traced("main", main_command(execution, request, settings))
    errors = [r.communicate(timeout=20)[0] for r in readers]
    assert command.wait(timeout=20) == 0
    assert errors == ([b"err\n"] if separate else [])
    assert _programs(tmp_path / "main") == sorted(main)
    if reader is not None:
        assert _programs(tmp_path / "reader") == sorted(reader)
