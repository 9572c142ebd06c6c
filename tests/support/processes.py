"""Child processes of the tests and benchmarks (the simulator, the controller,
Prometheus): started with none of our own settings from this environment,
their output read line by line on a thread (or written to a log file), waited
on by what they print, and stopped without leaving a process behind.

Each child leads a process group of its own, so that whatever it started
itself goes with it when it has to be killed; a graceful stop signals the
child alone and lets it end its own children (a child still there after the
timeout is killed with its group).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
# How much of a child's output an error message quotes.
TAIL_LINES = 40


def clean_environ(**extra: str) -> dict[str, str]:
    """This process's environment without any setting of ours (NRC_*, NOMAD_*), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NRC_", "NOMAD_"))}
    return {**env, **extra}


def python_module(module: str, *args: str) -> list[str]:
    """The command line of `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]


class ChildProcess:
    """One child process (see the module docstring). Its stdout and stderr are
    merged; with `log` they go to that file, else to `lines` (read on a thread)."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        log: Path | None = None,
        cwd: Path = REPO,
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self.lines: queue.Queue[str] = queue.Queue()  # output not yet looked at
        self.seen: list[str] = []  # output looked at, in order
        self.address = ""  # what `wait_ready` read
        self.popen: subprocess.Popen[str]
        if log is None:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=cwd,
                env=clean_environ(**dict(env or {})),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        else:
            with log.open("wb") as out:
                self.popen = subprocess.Popen(
                    self.argv,
                    cwd=cwd,
                    env=clean_environ(**dict(env or {})),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
        self._reader = threading.Thread(target=self._read, name="child-output", daemon=True)
        self._reader.start()
        self._ps: psutil.Process | None = None

    def __repr__(self) -> str:
        return f"<child {self.popen.pid}: {' '.join(self.argv)}>"

    def _read(self) -> None:
        if self.popen.stdout is None:
            return
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))

    # -- its output ----------------------------------------------------------------------

    def drain(self) -> list[str]:
        """The lines printed since the last look (they join `seen`)."""
        new: list[str] = []
        while True:
            try:
                new.append(self.lines.get_nowait())
            except queue.Empty:
                self.seen += new
                return new

    def output(self) -> str:
        """Everything it printed so far."""
        self.drain()
        return "\n".join(self.seen)

    def tail(self) -> str:
        """The end of its output, for error messages."""
        if self.log is not None:
            with suppress(OSError):
                return "\n".join(self.log.read_text(errors="replace").splitlines()[-TAIL_LINES:])
            return ""
        self.drain()
        return "\n".join(self.seen[-TAIL_LINES:])

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """The first line printed (so far or within `timeout`) that `pattern`
        matches; fails at once when the process ended without printing one."""
        if self.log is not None:
            raise TypeError(f"{self} writes to {self.log}: nothing to wait for")
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        looked = 0
        while True:
            ended = not self._reader.is_alive()  # before the last look: nothing is missed
            self.drain()
            for line in self.seen[looked:]:
                match = regex.search(line)
                if match:
                    return match
            looked = len(self.seen)
            if ended or time.monotonic() > deadline:
                why = f"exited with {self.popen.poll()}" if ended else f"within {timeout} s"
                raise AssertionError(
                    f"{self}: no line matching {pattern!r} ({why}):\n{self.tail()}"
                )
            threading.Event().wait(0.01)

    def wait_ready(self, timeout: float = 60.0) -> str:
        """The address of a process that prints `READY <address>` once it serves."""
        self.address = self.wait_for(r"^READY (\S+)", timeout).group(1)
        return self.address

    # -- its life ------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Send `sig` and wait for the exit; a process still there after
        `timeout` is killed with its group. Returns the exit code (negative:
        the signal that ended it)."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self._reaped()

    def kill(self) -> int:
        """SIGKILL to the process and everything in its group (as an OOM killer
        or a node failure would end it)."""
        if self.popen.returncode is None:  # not reaped yet: the group is still its own
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        return self._reaped()

    def _reaped(self) -> int:
        code = self.popen.wait(10)
        self._reader.join(5)
        return code

    # -- its costs -----------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def ps(self) -> psutil.Process:
        if self._ps is None:
            self._ps = psutil.Process(self.popen.pid)
        return self._ps

    def cpu_s(self) -> float:
        """CPU seconds (user and system) it spent so far."""
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def rss_mb(self) -> float:
        return float(self.ps.memory_info().rss) / 2**20


@contextmanager
def child_processes(
    sig: int = signal.SIGTERM, timeout: float = 15.0
) -> Iterator[list[ChildProcess]]:
    """Every ChildProcess appended to the list is stopped on exit (latest
    first, with `sig`, killed after `timeout`), whatever happens."""
    started: list[ChildProcess] = []
    try:
        yield started
    finally:
        for child in reversed(started):
            child.stop(sig, timeout)
