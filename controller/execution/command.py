"""What Nomad runs for a client's command. Pure.

Poseidon's images (and so CodeOcean's) expect a client's command to run
unprivileged through a wrapper — by default phusion baseimage's
`/sbin/setuser user`, a Python script that sets USER, HOME and UID and
exec's the rest as `user`. Every process start counts twice: once in the
runner's CPU, once in the execution's latency, and setuser's Python
interpreter is the dearest of them. So each exec is one chain of `exec`s
from a root shell, and everything that can happen in that shell does.

The execution's own exec (with a TTY, unprivileged, separate stderr):

    /bin/bash -c 'export NRC_EXECUTION_ID=<id>; unset ${!NOMAD_@};
                  mkfifo -m 622 F; set -C; exec 2>F && <F is our FIFO> || exit 1;
                  exec /sbin/setuser user /usr/bin/env CODEOCEAN=true K=V… /bin/bash -c <command>'

- root's shell exports the marker by which `kill_command` finds every process
  of the execution, and unsets Nomad's variables, before anything
  unprivileged starts: no process of the user ever has them in its
  environment, not even in `/proc/PID/environ`;
- with separate stderr (the default) it makes the FIFO and opens it as fd 2
  before the wrapper: the command inherits its stderr open and never opens
  a path itself (root owns the FIFO; the user may write to it, so
  `> /dev/stderr` still works, but not read it). A TTY merges stderr into
  stdout, so a second exec reads the FIFO (below). Whichever side comes
  first makes it; each opening waits for the other side (no polling), so the
  command starts only once its stderr has a reader;
- the request's environment is set by env(1) after the wrapper: a client's
  HOME or USER wins over setuser's, and nothing of the client's reaches a
  root process (PYTHONPATH would reach setuser's interpreter). Every word is
  quoted for the shell, so any command and any value works (Poseidon
  refuses `'` in commands and breaks on values with spaces; we do neither);
  a name is an `ENV_NAME` (never `-…`, never with `=`), so env(1) takes each
  `NAME=value` as an assignment, whatever the value;
- setuser and env exec, so the command's exit code and signals are the
  exec's own.

Privileged, or without a wrapper, root's shell exports the environment
itself and exec's `/bin/bash -c <command>`; without separate stderr the FIFO
part is left out.

The stderr reader (without a TTY) runs as root and never through the
wrapper — it only copies bytes, and runs no code of the student's:

    /bin/bash -c 'export NRC_EXECUTION_ID=<id>; unset ${!NOMAD_@};
                  mkfifo -m 622 F; exec 3<F && <F is our FIFO> || exit 1; rm -f F; exec cat <&3'

Program starts and processes per execution (unprivileged, separate
stderr, the command's own processes not counted):

- before: the command's exec bash → setuser → bash (mkfifo) → bash,
  5 starts in 2 processes; the reader bash → setuser → bash (mkfifo, rm) →
  cat, 6 starts in 3 processes: 11 starts, 2 of them setuser's Python;
- now: the command's exec bash (mkfifo) → setuser → env → bash, 5 starts in
  2 processes; the reader bash (mkfifo, rm) → cat, 4 starts in 3 processes:
  9 starts, 1 of them setuser's, 5 processes.

(privileged: 3 + 4 starts, was 4 + 5.) `mkfifo` and `rm` have no builtin in
bash, and both sides must be able to make the FIFO, since either may come
first.

The FIFO's path is in /tmp, which the student writes too, and it can be
read from root's command lines (`/proc/PID/cmdline` is everyone's) in the
moment before `mkfifo`: a student's process left running could put a
symlink there first. So root opens it with noclobber (`set -C`: no
truncation, never a regular file) and uses the opened descriptor only if it
is a FIFO of its own uid (`[ -p /dev/fd/N ] && [ -O /dev/fd/N ]`); in a
sticky /tmp nobody but root can replace a root-owned entry. A student who
wins that race only fails its own execution.

`kill_command` ends an execution's processes without CAP_SYS_PTRACE: every
process of the unprivileged user, killed as that user, when nothing else
uses the runner; else those carrying the marker; then, as root, those of
root's that carry it (docs/architecture.md, "How an execution flows", step 7).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

MARKER = "NRC_EXECUTION_ID"
# What `export NAME=value` and env(1)'s `NAME=value` take (never `-…`, which
# env would read as an option, never with `=`): Poseidon's pattern for
# environment variable names, loosened to one character. The API validates
# requests against it.
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


BASH = "/bin/bash"
# After the wrapper, what sets the client's environment: one small program
# start, where a shell that exports and exec's again would be a larger one.
ENV = "/usr/bin/env"


def fifo_path(execution_id: str) -> str:
    return f"/tmp/nrc-{execution_id}.stderr"


def _fifo_mode(privileged: bool) -> str:
    # Root (the exec's user) owns it; an unprivileged command may write to it
    # (`> /dev/stderr` reopens its fd 2), never read it. A privileged one's
    # is root's alone. 622, not 602: a user in root's group is a group member.
    return "600" if privileged else "622"


def _started(execution_id: str) -> str:
    """How the script of every root shell of an execution begins: the
    marker exported. Until that shell exec's, this is all that marks it —
    the environment in `/proc/PID/environ` is the one a process was started
    with, and `export` changes only what its children get — so
    `kill_command` reads root's command lines too."""
    return f"export {shlex.quote(f'{MARKER}={execution_id}')}; "


def _root(execution_id: str | None) -> str:
    """The start of a root shell's script: the marker (when there is one), and
    Nomad's variables unset before anything else starts."""
    return f"{_started(execution_id) if execution_id else ''}unset ${{!NOMAD_@}}; "


def _open_fifo(execution_id: str, privileged: bool, redirect: str) -> str:
    """Make the FIFO unless the other side has, and open it as the
    redirection `redirect` ("2>" or "3<") says; exit 1 unless what was
    opened is a FIFO of this shell's own uid (see the module docstring)."""
    fifo = shlex.quote(fifo_path(execution_id))
    fd = redirect[0]
    mode = _fifo_mode(privileged)
    return (
        f"mkfifo -m {mode} {fifo} 2>/dev/null; set -C; exec {redirect}{fifo} "
        f"&& [ -p /dev/fd/{fd} ] && [ -O /dev/fd/{fd} ] || exit 1; "
    )


def as_client(
    script: str, privileged: bool, settings: ExecSettings, execution_id: str | None = None
) -> list[str]:
    """The argv running `script` in bash as a client's command runs: Nomad's
    variables hidden, through the unprivileged wrapper unless privileged,
    and with an execution's marker when it has an id."""
    inner = shlex.join([BASH, "-c", script])
    wrapper = () if privileged else settings.unprivileged_wrapper
    wrapped = f"{shlex.join(wrapper)} {inner}" if wrapper else inner
    return [BASH, "-c", f"{_root(execution_id)}exec {wrapped}"]


def main_command(execution_id: str, request: ExecutionRequest, settings: ExecSettings) -> list[str]:
    """The argv of the execution's own exec (run with a TTY)."""
    script = _root(execution_id)
    if settings.separate_stderr:
        script += _open_fifo(execution_id, request.privileged, "2>")
    assignments = [f"{k}={v}" for k, v in {"CODEOCEAN": "true", **request.environment}.items()]
    command = [BASH, "-c", request.command]
    wrapper = () if request.privileged else settings.unprivileged_wrapper
    if wrapper:
        script += f"exec {shlex.join([*wrapper, ENV, *assignments, *command])}"
    else:
        script += f"export {shlex.join(assignments)}; exec {shlex.join(command)}"
    return [BASH, "-c", script]


def command_size(request: ExecutionRequest, settings: ExecSettings) -> int:
    """Bytes of the largest argument of the execution's exec: the script bash
    gets, the command and environment quoted (Linux refuses one over 128 KiB).
    Every argument the chain passes on after it is a part of it."""
    argv = main_command("0" * 32, request, settings)
    return max(len(a.encode("utf-8", "surrogateescape")) for a in argv)


def stderr_command(execution_id: str, privileged: bool) -> list[str]:
    """The argv of the exec that reads the command's stderr (run without a
    TTY, as the exec's user — root — whether or not the command is
    privileged). No polling: it waits in open(2) for the command's side (and
    is ended by `kill_command` if that side never comes); it unlinks the
    FIFO once both ends are open."""
    fifo = shlex.quote(fifo_path(execution_id))
    script = (
        _root(execution_id)
        + _open_fifo(execution_id, privileged, "3<")
        + f"rm -f -- {fifo}; exec cat <&3"
    )
    return [BASH, "-c", script]


def _bre(text: str) -> str:
    """`text` as a basic regular expression matching it literally."""
    return re.sub(r"([\\.\[*^$])", r"\\\1", text)


def _scan(execution_id: str) -> str:
    """SIGKILL every process that this shell may read and that carries the
    execution's marker: in its environment (`NRC_EXECUTION_ID=<id>` as a
    whole entry), or — a root shell of the execution that has not exec'd
    yet, such as one waiting for the other side of the FIFO — at the start of
    its script (`_started`). Its own uid's always, another uid's environment
    only with CAP_SYS_PTRACE (which Docker's default capabilities lack). One
    grep over every environment and command line (NUL-separated entries),
    whose own arguments begin with `^` and so never match; a process the
    student starts with such an argument is the student's own."""
    patterns = shlex.join(
        ["-e", f"^{_bre(f'{MARKER}={execution_id}')}$", "-e", f"^{_bre(_started(execution_id))}"]
    )
    return (
        f"for e in $(grep -lz {patterns} /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
        '2>/dev/null); do p=${e#/proc/}; kill -9 "${p%%/*}" 2>/dev/null; done'
    )


def kill_command(
    execution_id: str, settings: ExecSettings | None = None, sweep_user: bool = False
) -> list[str]:
    """The argv of an exec (as the container's user, root, without a TTY)
    that ends an execution's processes (see docs/architecture.md, "How an
    execution flows", step 7):

    1. through the unprivileged wrapper, as the unprivileged user (who reads
       its own processes' environment without any capability):
       - with `sweep_user` (no other use of the runner in flight): every
         process of that user, `kill -9 -1` — which spares only the caller
         and nothing the student can change (no marker, no session, no
         process group): setsid children, double forks, processes that
         cleared their environment. Only when the wrapper really changed the
         user (its uid differs from the exec's own and is not root): `kill -1`
         as root, or as the simulator's own user, would reach far too much;
       - otherwise: every process of that user carrying the marker;
    2. as root: every process of root's carrying the execution's marker — the
       stderr reader, a root shell still waiting for the other side of the
       FIFO (a pair of execs whose other side never came), a privileged
       execution's processes (same uid; no CAP_SYS_PTRACE needed); then the
       stderr FIFO is removed (a side killed while it waited leaves it).
    """
    # A side killed while it waited for the other leaves the FIFO.
    fifo = f"rm -f -- {shlex.quote(fifo_path(execution_id))}"
    wrapper = settings.unprivileged_wrapper if settings is not None else ()
    if not wrapper:
        return ["/bin/sh", "-c", f"{_scan(execution_id)}; {fifo}; exit 0"]
    sweep = "1" if sweep_user else "0"
    inner = (
        f'if [ "$2" = 1 ] && [ "$EUID" != 0 ] && [ "$EUID" != "$1" ]; then '
        "kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null; exit 0; fi; "
        f"{_scan(execution_id)}; exit 0"
    )
    # The user's side first (what a timeout is mostly about), then root's.
    outer = (
        f'{shlex.join(wrapper)} {BASH} -c {shlex.quote(inner)} nrc-kill "$EUID" {sweep}; '
        f"{_scan(execution_id)}; {fifo}; exit 0"
    )
    return [BASH, "-c", outer]


def parse_wrapper(text: str) -> tuple[str, ...]:
    """The unprivileged wrapper setting as words (shell syntax); empty: none."""
    return tuple(shlex.split(text))
