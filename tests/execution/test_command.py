"""The wrapped commands, run for real by the host's bash: quoting holds for
any command and any value, Nomad's variables are hidden, the marker reaches
every process, stderr takes its own path, and `kill_command` ends the tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from controller.execution.command import (
    ENV_NAME,
    MARKER,
    ExecSettings,
    ExecutionRequest,
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


def test_stderr_goes_through_the_fifo_to_the_reader(tmp_path: Path) -> None:
    settings = ExecSettings(unprivileged_wrapper=(), separate_stderr=True)
    request = ExecutionRequest("echo out; echo err >&2; echo more-err >&2; exit 5")
    execution = f"t{os.getpid()}"
    reader = subprocess.Popen(stderr_command(execution, request, settings), stdout=subprocess.PIPE)
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
        reader_argv = stderr_command(execution, request, settings)
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
    settings = ExecSettings(unprivileged_wrapper=(), separate_stderr=True)
    execution = f"lonely{os.getpid()}"
    reader = subprocess.Popen(stderr_command(execution, ExecutionRequest("true"), settings))
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
