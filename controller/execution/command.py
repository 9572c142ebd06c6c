"""What Nomad runs for a client's command. Pure.

Poseidon's images (and so CodeOcean's) expect a command to be wrapped in
layers, innermost first:

1. `export CODEOCEAN=true K=V …; exec /bin/bash -c <command>`: the request's
   environment on top of the task's. Every word is quoted for the shell, so
   any command and any value works (Poseidon refuses `'` in commands and
   breaks on values with spaces; we do neither).
2. With separate stderr (the default): the command's stderr goes to a FIFO
   that a second exec reads (below), so a program that sees a terminal on
   stdin/stdout still has its stderr delivered as `stderr` frames. Whichever
   of the two shells comes first creates the FIFO; each opening waits for the
   other side (no polling), and the reader unlinks it once both are open.
3. Unless the execution is privileged: the unprivileged wrapper, by default
   Poseidon's `/sbin/setuser user` (phusion baseimage), as a setting.
4. `export NRC_EXECUTION_ID=<id>; unset ${!NOMAD_@}; …` in `/bin/bash -c`:
   Nomad's own variables are hidden from the command, and every process of the
   execution inherits a marker by which `kill_command` finds it.

The main exec runs with a TTY (interactive: echo, `\\r\\n`, Ctrl-\\ is
SIGQUIT); the stderr reader runs without one, its stdout being the command's
stderr. `kill_command` ends an execution's processes without CAP_SYS_PTRACE:
every process of the unprivileged user, killed as that user, when nothing
else uses the runner; else those carrying the marker (docs/architecture.md).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

MARKER = "NRC_EXECUTION_ID"
# What `export NAME=value` takes: Poseidon's pattern for environment variable
# names, loosened to one character. The API validates requests against it.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Names a client's `environment` may not set: they change what bash does
# before or around the command (BASH_ENV and ENV are sourced, SHELLOPTS and
# BASHOPTS turn on options, PS4 is expanded under xtrace, IFS re-splits),
# load code into every program (the loader's LD_*, glibc's GCONV_PATH), define
# functions (BASH_FUNC_*), or are ours and Nomad's (NRC_EXECUTION_ID marks
# the processes the timeout kills; NOMAD_* are hidden from commands). PATH is
# allowed: CodeOcean's images may need it for their toolchains, our own
# programs are started by absolute path, and the command is the platform's.
REFUSED_ENV_NAMES = frozenset(
    {
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PROMPT_COMMAND",
        "PS4",
        "IFS",
        "BASH_XTRACEFD",
        "GLOBIGNORE",
        "EXECIGNORE",
        "CDPATH",
        "GCONV_PATH",
    }
)
REFUSED_ENV_PREFIXES = ("LD_", "BASH_FUNC_", "NRC_", "NOMAD_")


def refused_env_name(name: str) -> bool:
    """Whether a client's `environment` may not set `name` (case as given:
    the shell and the loader only read these names in upper case)."""
    return name in REFUSED_ENV_NAMES or name.startswith(REFUSED_ENV_PREFIXES)


@dataclass(frozen=True)
class ExecSettings:
    """How commands are run in runners (from the NRC_EXEC_* settings)."""

    task: str = "default-task"
    unprivileged_wrapper: tuple[str, ...] = ("/sbin/setuser", "user")
    separate_stderr: bool = True


@dataclass(frozen=True)
class ExecutionRequest:
    """What a client asked for with `POST /runners/{id}/execute`."""

    command: str
    time_limit_s: int = 0  # 0: no limit
    privileged: bool = False
    environment: Mapping[str, str] = field(default_factory=dict)


def fifo_path(execution_id: str) -> str:
    return f"/tmp/nrc-{execution_id}.stderr"


def _bash(script: str) -> str:
    return f"/bin/bash -c {shlex.quote(script)}"


def _with_environment(request: ExecutionRequest) -> str:
    # `export` in the wrapping shell, not env(1): one program start less per run.
    assignments = [f"{k}={v}" for k, v in {"CODEOCEAN": "true", **request.environment}.items()]
    command = shlex.join(["/bin/bash", "-c", request.command])
    return f"export {shlex.join(assignments)}; exec {command}"


def as_client(
    script: str, privileged: bool, settings: ExecSettings, execution_id: str | None = None
) -> list[str]:
    """The argv running `script` in bash as a client's command runs: Nomad's
    variables hidden, through the unprivileged wrapper unless privileged,
    and with an execution's marker when it has an id."""
    inner = _bash(script)
    wrapped = (
        inner
        if privileged or not settings.unprivileged_wrapper
        else (f"{shlex.join(settings.unprivileged_wrapper)} {inner}")
    )
    marker = f"export {shlex.quote(f'{MARKER}={execution_id}')}; " if execution_id else ""
    return ["/bin/bash", "-c", f"{marker}unset ${{!NOMAD_@}}; exec {wrapped}"]


def main_command(execution_id: str, request: ExecutionRequest, settings: ExecSettings) -> list[str]:
    """The argv of the execution's own exec (run with a TTY)."""
    command = _with_environment(request)
    if settings.separate_stderr:
        fifo = shlex.quote(fifo_path(execution_id))
        # Whichever side comes first makes the FIFO; opening it waits for the
        # other side; the reader unlinks it once both ends are open.
        command = f"mkfifo -m 600 {fifo} 2>/dev/null; exec 2>{fifo}; {command}"
    return as_client(command, request.privileged, settings, execution_id)


def command_size(request: ExecutionRequest, settings: ExecSettings) -> int:
    """Bytes of the largest argument of the execution's exec: the script bash
    gets, the command and environment quoted (Linux refuses one over 128 KiB)."""
    argv = main_command("0" * 32, request, settings)
    return max(len(a.encode("utf-8", "surrogateescape")) for a in argv)


def stderr_command(
    execution_id: str, request: ExecutionRequest, settings: ExecSettings
) -> list[str]:
    """The argv of the exec that reads the command's stderr (run without a TTY)."""
    fifo = shlex.quote(fifo_path(execution_id))
    # No polling: it waits in open(2) for the command's side (and is ended with
    # the execution's processes if that side never comes).
    reader = f"mkfifo -m 600 {fifo} 2>/dev/null; exec 3<{fifo}; rm -f {fifo}; exec cat <&3"
    return as_client(reader, request.privileged, settings, execution_id)


def _scan(marker: str) -> str:
    """SIGKILL every process whose environment carries `marker` and that this
    shell may read: its own uid's always, another uid's only with
    CAP_SYS_PTRACE (which Docker's default capabilities lack). One grep over
    every environment (NUL-separated entries) rather than one per process."""
    return (
        f"for e in $(grep -lxzF {marker} /proc/[0-9]*/environ 2>/dev/null); do "
        'p=${e#/proc/}; kill -9 "${p%/environ}" 2>/dev/null; done'
    )


def kill_command(
    execution_id: str, settings: ExecSettings | None = None, sweep_user: bool = False
) -> list[str]:
    """The argv of an exec (as the container's user, root, without a TTY)
    that ends an execution's processes (see docs/architecture.md, "Ending an
    execution"):

    1. through the unprivileged wrapper, as the unprivileged user (who reads
       its own processes' environment without any capability):
       - with `sweep_user` (no other use of the runner in flight): every
         process of that user, `kill -9 -1` — which spares only the caller
         and nothing the student can change (no marker, no session, no
         process group): setsid children, double forks, processes that
         cleared their environment, the stderr reader, a reader waiting for
         a command that never came. Only when the wrapper really changed the
         user (its uid differs from the exec's own and is not root): `kill -1`
         as root, or as the simulator's own user, would reach far too much;
       - otherwise: every process of that user carrying the marker;
    2. as root: every process carrying the execution's marker that root can
       see — a privileged execution's (same uid; no CAP_SYS_PTRACE needed);
       then the stderr FIFO is removed (a reader killed while it waited for
       the command's side leaves it).
    """
    marker = shlex.quote(f"{MARKER}={execution_id}")
    # A reader killed while it waited for the command's side leaves its FIFO.
    fifo = f"rm -f -- {shlex.quote(fifo_path(execution_id))}"
    wrapper = settings.unprivileged_wrapper if settings is not None else ()
    if not wrapper:
        return ["/bin/sh", "-c", f"{_scan(marker)}; {fifo}; exit 0"]
    sweep = "1" if sweep_user else "0"
    inner = (
        f'if [ "$2" = 1 ] && [ "$EUID" != 0 ] && [ "$EUID" != "$1" ]; then '
        "kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null; exit 0; fi; "
        f"{_scan(marker)}; exit 0"
    )
    # The user's side first (what a timeout is mostly about), then root's.
    outer = (
        f'{shlex.join(wrapper)} /bin/bash -c {shlex.quote(inner)} nrc-kill "$EUID" {sweep}; '
        f"{_scan(marker)}; {fifo}; exit 0"
    )
    return ["/bin/bash", "-c", outer]


def parse_wrapper(text: str) -> tuple[str, ...]:
    """The unprivileged wrapper setting as words (shell syntax); empty: none."""
    return tuple(shlex.split(text))
