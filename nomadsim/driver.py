"""The simulator's task driver: like Nomad's `raw_exec`, it runs what
`/v1/client/allocation/:id/exec` asks for as real child processes of the
simulator, on this host, WITHOUT isolation (docs/simulator.md says what that
means). As root it runs them as a Docker exec would (`Identity`): as the
container's user with Docker's default capabilities as the bounding set, and
its `setuser` stand-in switches to a real uid of the allocation's own; it
also keeps Docker's stdin rule of Nomad <= 1.8 (`Execution.broken`). Not
root, everything runs as the simulator's own user.

It follows the task states the client writes (a state store listener, as
Nomad's task runner drives its driver; it never calls the scheduler). Every
start of a task — the first and each restart in place — gets a fresh, empty
working directory, because a restart, an OOM kill, a reschedule, a migration
and a lost node each mean a new container. When the task stops running
(killed, exited, allocation terminal, lost or deleted, node down) every
process its executions started gets SIGKILL: each execution's session, and
every process whose environment carries the allocation's marker, which finds
those that left the session too. Stopping the simulator does the same for all
of them and removes the directories.

One execution is one child process in a session of its own. With a tty it
runs on a real pseudo-terminal, so the kernel echoes input, turns `\\n` into
`\\r\\n`, merges stderr into stdout and turns 0x1C into SIGQUIT; without one
it has three pipes. Output is read without blocking on the simulator's event
loop and the exit is learnt from a pidfd: no thread runs per execution. A
client that goes away does not stop its process (Nomad's does not either),
and its output is no longer read (as Nomad's): a process that writes on
blocks once the pipe is full."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import termios
import threading
import uuid
import weakref
from binascii import b2a_base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from nomadsim.encode import group_of
from nomadsim.gojson import quote
from nomadsim.records import RUNNING, Alloc, JsonDict
from nomadsim.state import ALLOCS, NODES, Commit, StateStore

log = logging.getLogger(__name__)

# Nomad reads exec output 1 KiB at a time (plugins/drivers/execstreaming.go),
# so no data frame carries more than 1,024 bytes.
FRAME_SIZE = 1024
# The simulator reads up to 64 KiB at once (a pipe's whole buffer) and cuts
# it into frames of 1,024 bytes and a last shorter one: the frames that 64
# reads of 1 KiB in a row would give, for one system call instead of 64.
READ_SIZE = 64 * FRAME_SIZE
# After the command's main process exits, how long its output may take to
# reach end of file before the execution ends anyway: a background child that
# inherited the pipe or the terminal would otherwise hold it open forever.
DRAIN_S = 0.2
# At that point at most this much more (1 MiB) of what is buffered.
DRAIN_BYTES = 1 << 20
# A client that reads slower than the command writes: reading pauses once
# this many frames wait and resumes at the low mark (a read's worth of
# frames and more between them, so that one read does not pause at once).
QUEUE_HIGH = 256
QUEUE_LOW = 128
# Input waiting for a command that does not read it: the client's frames are
# not read further until it is below this.
STDIN_HIGH = 1 << 20
# What a terminal's end of file is (VEOF, ^D) and what stdin `close` writes
# with a tty: closing the terminal itself would hang the session up.
EOF_CHAR = b"\x04"
# Environment markers of every process an execution starts: the allocation
# and the simulator instance (two simulators with one seed share alloc IDs).
MARKER = "NOMADSIM_ALLOC_ID"
INSTANCE_MARKER = "NOMADSIM_INSTANCE"

# The exec's environment names the allocation's unprivileged account for
# `setuser` (uid:gid:home) when the simulator runs as root.
USER_IDS = "NOMADSIM_USER_IDS"

SETUSER = """#!/bin/sh
# nomad-sim: stands in for phusion baseimage's /sbin/setuser, which Poseidon
# wraps unprivileged commands in. Run by root in a simulator running as root,
# it switches to the allocation's unprivileged account (a real uid, no host
# account) as phusion's does: groups cleared, USER and HOME set. Otherwise it
# drops the user name and runs the rest as the caller's own user.
if [ "$#" -lt 2 ]; then
    echo "Usage: setuser USERNAME COMMAND [args..]" >&2
    exit 1
fi
name=$1
shift
if [ "$name" != root ] && [ -n "$NOMADSIM_USER_IDS" ] && [ "$(id -u)" = 0 ]; then
    ids=$NOMADSIM_USER_IDS
    uid=${ids%%:*}; rest=${ids#*:}; gid=${rest%%:*}; home=${rest#*:}
    export USER="$name" LOGNAME="$name" HOME="$home"
    exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"
fi
exec "$@"
"""

# Docker's default capability set (moby's oci/caps defaults), which Nomad's
# docker driver keeps (`allow_caps`): an exec'd process gets it as its
# bounding set. Neither SYS_PTRACE nor SYS_ADMIN is in it.
DOCKER_CAPS = (
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
)
# Their numbers (linux/capability.h).
_CAP_NUMBERS = {
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
_PR_CAPBSET_DROP = 24
# Unprivileged accounts: each allocation gets a uid (and gid) of its own
# from a block picked at random per simulator, so that `kill -9 -1` as that
# user reaches only the allocation's processes, as a container's own PID
# namespace scopes it under Docker (and two simulators on one host do not
# meet). The ids are above any host account's and need none.
_UID_FLOOR = 1 << 30
_UID_BLOCK = 1 << 16
_UID_BLOCKS = 1 << 14


class ExecRefused(Exception):
    """Nomad's client refused the execution: its status code and text."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def data_frames(stream: str, data: bytes) -> list[str]:
    """The data frames of one read: 1,024 bytes each, the last one shorter."""
    head = f'{{"{stream}":{{"data":"'
    return [
        head + b2a_base64(data[at : at + FRAME_SIZE], newline=False).decode() + '"}}'
        for at in range(0, len(data), FRAME_SIZE)
    ]


def close_frame(stream: str) -> str:
    return f'{{"{stream}":{{"close":true}}}}'


def exit_frame(code: int) -> str:
    # Nomad's frames are protobuf structs with omitempty tags: exit code 0 is
    # left out, so a success is `"result":{}`.
    if code == 0:
        return '{"exited":true,"result":{}}'
    return f'{{"exited":true,"result":{{"exit_code":{code}}}}}'


def _default_signals() -> None:
    # Runs in the child between fork and exec. A command starts as Docker
    # starts it: every signal at its default disposition and none blocked,
    # whatever the simulator's process ignores or its thread blocks, which
    # fork and exec would pass on — SIGINT and SIGQUIT ignored (a background
    # job of a shell: Ctrl-\ on the terminal must still end the foreground
    # process), SIGHUP ignored (started under nohup: a terminal's hangup
    # must still end what runs on it).
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # the C library's own real-time signals
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


@dataclass(frozen=True)
class Identity:
    """Who an exec'd process is under Docker: the container's user (uid, gid)
    with Docker's default capabilities as its bounding set."""

    uid: int
    gid: int


def _caps_to_drop() -> list[int]:
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 40
    keep = {_CAP_NUMBERS[name] for name in DOCKER_CAPS}
    return [cap for cap in range(last + 1) if cap not in keep]


def _child_setup(tty: bool, identity: Identity | None) -> Callable[[], None]:
    """What runs in the child between fork and exec: default signals, the
    terminal as controlling tty, then (as a Docker exec) the capability
    bounding set cut to Docker's and the container's user. Everything it
    needs is looked up here, before the fork."""
    drop = _caps_to_drop() if identity is not None else []
    prctl = None
    if identity is not None:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        prctl.restype = ctypes.c_int

    def setup() -> None:
        _default_signals()
        if tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if identity is None or prctl is None:
            return
        for cap in drop:
            if prctl(_PR_CAPBSET_DROP, cap, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
        if identity.uid != 0 or identity.gid != 0:
            os.setgroups([])
            os.setgid(identity.gid)
            os.setuid(identity.uid)

    return setup


# -- finding and killing marked processes -----------------------------------------


def _needles(instance: str, alloc_id: str | None) -> list[bytes]:
    needles = [f"\0{INSTANCE_MARKER}={instance}\0".encode()]
    if alloc_id is not None:
        needles.append(f"\0{MARKER}={alloc_id}\0".encode())
    return needles


def _marked(pid: int, needles: list[bytes]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = b"\0" + f.read() + b"\0"
    except OSError:  # gone, or another user's
        return False
    return all(n in environ for n in needles)


def marked_processes(instance: str, alloc_id: str | None = None) -> list[int]:
    """Live processes whose environment carries the markers (zombies have none)."""
    needles = _needles(instance, alloc_id)
    pids = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit() and _marked(int(entry.name), needles):
                pids.append(int(entry.name))
    return sorted(pids)


def kill_marked(instance: str, alloc_id: str | None = None) -> None:
    """SIGKILL every marked process. Each is pinned with a pidfd and checked
    again before the signal, so a pid reused meanwhile is never hit; a few
    rounds catch children forked while their parents were being killed."""
    needles = _needles(instance, alloc_id)
    for _ in range(3):
        pids = marked_processes(instance, alloc_id)
        if not pids:
            return
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if _marked(pid, needles):
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            finally:
                os.close(pidfd)


def kill_user(uid: int) -> None:
    """SIGKILL every process of `uid` (an allocation's own unprivileged
    account: what the marker misses, such as a process that cleared its
    environment). Pinned with a pidfd and checked again, as `kill_marked`."""
    for _ in range(3):
        pids = []
        with os.scandir("/proc") as entries:
            for entry in entries:
                if entry.name.isdigit() and _owner(int(entry.name)) == uid:
                    pids.append(int(entry.name))
        if not pids:
            return
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if _owner(pid) == uid:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            finally:
                os.close(pidfd)


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


# -- one execution -------------------------------------------------------------------


class _Stream:
    """One output of an execution. `announced`: its close frame is sent; it
    is still read (and what it gives dropped) until end of file. `ended`: end
    of file seen; its descriptor may stay open a little longer (a terminal's
    until the process has exited)."""

    __slots__ = ("announced", "ended", "fd", "name", "reading")

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self.fd: int | None = fd
        self.announced = False
        self.ended = False
        self.reading = False


class Execution:
    """One command started by an exec request, and the frames it produces.

    `frames` holds Nomad's output frames as JSON text, in batches (a read's
    data frames, or one frame) with a flag marking the last batch, the exit
    frame: data frames, each stream's close frame, then the exit frame, with
    128+N as the exit code of a process killed by signal N. The client's
    side takes a batch whole and calls `consumed` once it is sent."""

    def __init__(
        self,
        driver: Driver,
        alloc_id: str,
        process: subprocess.Popen[bytes],
        tty: bool,
        stdin_fd: int,
        outputs: list[tuple[str, int]],
        docker_stdin_close: bool = False,
    ) -> None:
        self.driver = driver
        self.alloc_id = alloc_id
        self.process = process
        self.pid = process.pid
        self.tty = tty
        self.loop = driver.loop
        self.frames: asyncio.Queue[tuple[list[str], bool]] = asyncio.Queue()
        self._waiting = 0  # frames in `frames`
        self.attached = True
        self.exit_code: int | None = None
        self.finished = False
        self._streams = [_Stream(name, fd) for name, fd in outputs]
        self._stdin_fd: int | None = stdin_fd
        self._stdin_buffer = bytearray()
        self._stdin_closing = False
        self._stdin_writing = False
        self._stdin_room = asyncio.Event()
        self._stdin_room.set()
        self._paused = False
        # Docker's stdin rule (Nomad <= 1.8, go-dockerclient): once the output
        # has ended the exec's stdin pipe is closed; input then waiting or
        # arriving fails Nomad's write, and that error replaces the exit frame.
        self.docker_stdin_close = docker_stdin_close
        self._stdin_shut = False
        self._input_lost = False
        self.broken: str | None = None
        self.exit_sent = False  # the client's side sent the exit frame
        self._deadline: asyncio.TimerHandle | None = None
        self._poll: asyncio.TimerHandle | None = None
        os.set_blocking(stdin_fd, False)
        for stream in self._streams:
            assert stream.fd is not None
            os.set_blocking(stream.fd, False)
            self._start_reading(stream)
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except OSError:
            # No pidfds (Linux < 5.3): look for the exit on a timer instead.
            self._poll = self.loop.call_later(0.02, self._poll_exit)
        else:
            self.loop.add_reader(self._pidfd, self._exit_readable)

    # -- output --------------------------------------------------------------------

    def _start_reading(self, stream: _Stream) -> None:
        if stream.fd is not None and not stream.ended and not stream.reading:
            self.loop.add_reader(stream.fd, self._readable, stream)
            stream.reading = True

    def _stop_reading(self, stream: _Stream) -> None:
        if stream.fd is not None and stream.reading:
            self.loop.remove_reader(stream.fd)
            stream.reading = False

    def _read(self, stream: _Stream, size: int = READ_SIZE) -> bytes | None:
        """One read: bytes, b"" at end of file, None when nothing is there now."""
        assert stream.fd is not None
        try:
            return os.read(stream.fd, size)
        except BlockingIOError:
            return None
        except OSError as exc:
            # EIO is how a pseudo-terminal says every slave side is closed.
            if exc.errno != errno.EIO:
                log.warning("reading the output of exec process %d: %s", self.pid, exc)
            return b""

    def _readable(self, stream: _Stream) -> None:
        data = self._read(stream)
        if data is None:
            return
        if not data:
            self._end_stream(stream)
        elif not stream.announced:
            self._emit(data_frames(stream.name, data))

    def _emit(self, texts: list[str], last: bool = False) -> None:
        if not self.attached:
            return
        self.frames.put_nowait((texts, last))
        self._waiting += len(texts)
        if not self._paused and self._waiting >= QUEUE_HIGH:
            self._paused = True
            for stream in self._streams:
                if not stream.announced:
                    self._stop_reading(stream)

    def consumed(self, texts: list[str]) -> None:
        """The client took a batch: resume reading once it has caught up."""
        self._waiting -= len(texts)
        if self._paused and self._waiting <= QUEUE_LOW:
            self._resume()

    def _resume(self) -> None:
        self._paused = False
        for stream in self._streams:
            self._start_reading(stream)

    def _announce(self, stream: _Stream) -> None:
        stream.announced = True
        self._emit([close_frame(stream.name)])
        # From now on what it gives is dropped, so it is read whatever the client does.
        self._start_reading(stream)

    def _end_stream(self, stream: _Stream) -> None:
        """End of file: announce it; release the descriptor unless it is the
        terminal of a process still exiting. The slave side closes as the
        process exits, before it is reaped, and closing the master then
        would hang the terminal up and kill the process with SIGHUP (Nomad
        closes it after the process has exited, too)."""
        self._stop_reading(stream)
        stream.ended = True
        if self.docker_stdin_close and all(s.ended for s in self._streams):
            self._shut_stdin()
        if not (self.tty and self.exit_code is None):
            self._release(stream)
        if not stream.announced:
            self._announce(stream)
        self._check_done()

    def _release(self, stream: _Stream) -> None:
        if stream.fd is None:
            return
        self._stop_reading(stream)
        if self.tty:
            self._drop_stdin()  # the terminal is stdin too
        os.close(stream.fd)
        stream.fd = None

    # -- exit ------------------------------------------------------------------------

    def _exit_readable(self) -> None:
        code = self.process.poll()
        if code is not None:
            self._exited(code)

    def _poll_exit(self) -> None:
        code = self.process.poll()
        if code is None:
            self._poll = self.loop.call_later(0.02, self._poll_exit)
        else:
            self._poll = None
            self._exited(code)

    def _exited(self, returncode: int) -> None:
        if self.exit_code is not None:
            return
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        # Popen reports death by signal N as -N; Nomad as 128+N.
        self.exit_code = 128 - returncode if returncode < 0 else returncode
        if not self.tty:
            # Nomad's executor closes the command's stdin once it has exited.
            # Under Docker's rule, input still waiting then was a write that
            # blocks until the pipe closes under it.
            self._input_lost = bool(self._stdin_buffer)
            self._drop_stdin()
        for stream in self._streams:
            if stream.ended:
                self._release(stream)
        self._deadline = self.loop.call_later(DRAIN_S, self._drain)
        self._check_done()

    def _drain(self) -> None:
        """The output has not ended a while after the exit: send what is
        buffered, announce the end of every stream, and finish."""
        self._deadline = None
        for stream in self._streams:
            left = DRAIN_BYTES
            while left > 0:
                if stream.fd is None or stream.ended or stream.announced:
                    break
                data = self._read(stream, min(READ_SIZE, left))
                if data is None:
                    break
                if not data:
                    self._end_stream(stream)
                else:
                    left -= len(data)
                    self._emit(data_frames(stream.name, data))
            if not stream.announced:
                self._announce(stream)
        self._check_done()

    def _check_done(self) -> None:
        if self.exit_code is None:
            return
        if not self.finished and all(s.announced for s in self._streams):
            self.finished = True
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            self._emit([exit_frame(self.exit_code)], last=True)
        if self.finished and all(s.fd is None for s in self._streams):
            self.driver.retire(self)

    # -- input -----------------------------------------------------------------------

    def _shut_stdin(self) -> None:
        """Docker's rule: the output has ended, the exec's stdin pipe closes.
        A write waiting on it fails."""
        if self._stdin_shut:
            return
        self._stdin_shut = True
        if self._stdin_buffer or self._input_lost:
            self._break()
        self._drop_stdin()

    def _break(self) -> None:
        """Nomad's write of stdin failed (`io: read/write on closed pipe`): that
        error takes the exit frame's place. It contains "closed", so Nomad's
        HTTP agent sends no close frame: the connection just drops."""
        if self.broken is not None or self.exit_sent:
            return
        self.broken = "io: read/write on closed pipe"
        if not self.finished:
            self._emit([], last=True)

    def write(self, data: bytes) -> None:
        """Queue bytes for the command's stdin (dropped once stdin is closed;
        under Docker's rule, ending the exec once its output has ended)."""
        if self._stdin_shut and data:
            self._break()
            return
        if self._stdin_fd is None or self._stdin_closing or not data:
            return
        self._stdin_buffer += data
        self._flush_stdin()

    def close_stdin(self) -> None:
        """End of input: the pipe's write end closes once what is queued is
        written; on a terminal it is the EOF character."""
        if self.tty:
            self.write(EOF_CHAR)
            return
        self._stdin_closing = True
        self._flush_stdin()

    async def stdin_room(self) -> None:
        await self._stdin_room.wait()

    def _flush_stdin(self) -> None:
        fd = self._stdin_fd
        if fd is None:
            return
        while self._stdin_buffer:
            try:
                written = os.write(fd, self._stdin_buffer)
            except BlockingIOError:
                break
            except OSError:
                # The command is gone (EPIPE, or EIO on a terminal): input is dropped.
                self._stdin_buffer.clear()
                break
            del self._stdin_buffer[:written]
        if self._stdin_buffer and not self._stdin_writing:
            self.loop.add_writer(fd, self._flush_stdin)
            self._stdin_writing = True
        elif not self._stdin_buffer and self._stdin_writing:
            self.loop.remove_writer(fd)
            self._stdin_writing = False
        if len(self._stdin_buffer) < STDIN_HIGH:
            self._stdin_room.set()
        else:
            self._stdin_room.clear()
        if not self._stdin_buffer and self._stdin_closing:
            self._drop_stdin()

    def _drop_stdin(self) -> None:
        fd = self._stdin_fd
        if fd is None:
            return
        if self._stdin_writing:
            self.loop.remove_writer(fd)
            self._stdin_writing = False
        self._stdin_fd = None
        self._stdin_buffer.clear()
        self._stdin_room.set()
        if not self.tty:
            os.close(fd)

    def resize(self, height: int, width: int) -> None:
        """TIOCSWINSZ on the terminal (the foreground process gets SIGWINCH)."""
        if self.tty and self._stdin_fd is not None:
            size = struct.pack("HHHH", height, width, 0, 0)
            with contextlib.suppress(OSError):
                fcntl.ioctl(self._stdin_fd, termios.TIOCSWINSZ, size)

    # -- the client and the end ------------------------------------------------------

    def detach(self) -> None:
        """The client went away: the command runs on, and its output is no
        longer read — Nomad's output loop stops at the first send that fails
        (plugins/drivers/execstreaming.go), so a command that writes more
        than the pipes hold blocks until it is killed. Once it has exited, what
        is left is read and dropped as usual."""
        self.attached = False
        while not self.frames.empty():
            self.frames.get_nowait()
        self._waiting = 0
        self._paused = True
        for stream in self._streams:
            if not stream.announced:
                self._stop_reading(stream)

    def kill(self) -> None:
        """SIGKILL the session. Only while the main process is not reaped: its
        pid, which is the session's and group's id, cannot be reused until then."""
        if self.exit_code is None and self.process.returncode is None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)

    def shutdown(self) -> None:
        """The simulator stops: reap the killed process, send the last frames,
        release every descriptor."""
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        if self.exit_code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(1.0)
            # One that even SIGKILL has not ended in a second is reported killed.
            returncode = self.process.returncode
            self._exited(-signal.SIGKILL if returncode is None else returncode)
        if self._deadline is not None:
            self._deadline.cancel()
            self._drain()
        for stream in self._streams:
            if not stream.announced:
                self._announce(stream)
            self._release(stream)
        self._check_done()
        self._drop_stdin()
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


# -- the driver ----------------------------------------------------------------------


class Driver:
    def __init__(
        self, store: StateStore, docker_users: bool = True, docker_stdin_close: bool = True
    ) -> None:
        self._store = store
        self.instance = uuid.uuid4().hex
        # Users and capabilities as a Docker exec has them: only as root.
        self.docker_users = docker_users and os.geteuid() == 0
        if docker_users and not self.docker_users:
            log.warning(
                "the simulator does not run as root: exec'd commands run as its own user "
                "with its capabilities, and setuser changes no user"
            )
        self.docker_stdin_close = docker_stdin_close
        self._uid_base = _UID_FLOOR + random.SystemRandom().randrange(_UID_BLOCKS) * _UID_BLOCK
        self._uids: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._root: Path | None = None
        self._root_lock = threading.Lock()
        # allocation -> StartedAt of the run its tasks are in, while they run
        self._runs: dict[str, int] = {}
        # Nodes whose agent is down: Docker runs their containers on, whatever
        # the servers decide meanwhile, until the agent is back (`release`).
        self._held: set[str] = set()
        # The allocation as its node knows it (the client's view, set by the
        # simulator): a task's container follows the node, not the servers.
        self.client_view: Callable[[str], Alloc | None] = self._store.allocs.get
        self._executions: dict[str, set[Execution]] = {}
        # Allocations whose processes may be around, and those with a directory.
        self._with_processes: set[str] = set()
        self._with_dir: set[str] = set()
        self.closed = False
        _DRIVERS.add(self)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("simulator not started")
        return self._loop

    # -- directories -----------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The simulator's directory (created on first use, removed at stop)."""
        with self._root_lock:
            if self.closed:
                raise RuntimeError("simulator stopped")
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="nomad-sim-"))
                if self.docker_users:
                    # The unprivileged accounts reach setuser and the task directories.
                    self._root.chmod(0o755)
            return self._root

    @property
    def setuser_path(self) -> str:
        """An executable `setuser USER COMMAND...` that runs COMMAND as is."""
        path = self.root / "bin" / "setuser"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            staged = path.with_name(f".setuser-{uuid.uuid4().hex}")
            staged.write_text(SETUSER)
            staged.chmod(0o755)
            staged.replace(path)
        return str(path)

    def _alloc_dir(self, alloc_id: str) -> Path:
        return self.root / "allocs" / alloc_id

    def _make_task_dir(self, alloc: Alloc, task: str) -> Path:
        alloc_dir = self._alloc_dir(alloc.id)
        # A task name is one path component (Nomad forbids slashes in it).
        name = task.replace("/", "_").replace("\0", "_")
        workdir = alloc_dir / ("_" + name if name in ("", ".", "..") else name)
        (alloc_dir / "alloc").mkdir(parents=True, exist_ok=True)
        created = not workdir.exists()
        workdir.mkdir(exist_ok=True)
        if created and self.docker_users:
            # World-writable with the sticky bit, as openHPI images' WORKDIR
            # /workspace: the unprivileged user writes there too.
            for path in (self.root / "allocs", alloc_dir):
                path.chmod(0o755)
            (alloc_dir / "alloc").chmod(0o1777)
            workdir.chmod(0o1777)
        self._with_dir.add(alloc.id)
        return workdir

    def _discard_dir(self, alloc_id: str) -> None:
        """Move the allocation's directory out of the way and delete it: a
        process still dying in it cannot write into its successor."""
        if alloc_id not in self._with_dir:
            return
        self._with_dir.discard(alloc_id)
        root = self._root
        if root is None:
            return
        trash = root / "trash" / uuid.uuid4().hex
        try:
            trash.parent.mkdir(exist_ok=True)
            self._alloc_dir(alloc_id).rename(trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    # -- following the client --------------------------------------------------------

    def on_commit(self, commit: Commit) -> None:
        for change in commit.changes:
            if change.table == ALLOCS:
                after = change.after
                if after is not None and after.node_id in self._held:
                    continue
                # The node's own view when it lived a change not yet reported.
                self._alloc_changed(change.key, after and self.client_view(change.key))
            elif (
                change.table == NODES
                and change.after is not None
                and change.after.status == "down"
                and change.key not in self._held
                and self._runs
            ):
                # A node that stopped heartbeating: its containers are gone.
                self.kill_node(change.key)

    def client_changed(self, alloc_id: str, alloc: Alloc) -> None:
        """A change on the node, before its client reports it to the servers."""
        self._alloc_changed(alloc_id, alloc)

    def hold(self, node_id: str) -> None:
        """The node's agent went away: its containers run on as they are."""
        self._held.add(node_id)

    def _runs_on(self, node_id: str) -> list[str]:
        on_node = self._store.allocs_by_node.get(node_id, set())
        return [a for a in self._runs if a in on_node]

    def kill_node(self, node_id: str) -> None:
        """The node's containers are gone (its host went down, or it stopped
        heartbeating)."""
        for alloc_id in self._runs_on(node_id):
            self._stop_run(alloc_id)

    def release(self, node_id: str) -> None:
        """The node's agent is back: what ended meanwhile (its allocations
        lost while the node was down) is killed now."""
        self._held.discard(node_id)
        for alloc_id in self._runs_on(node_id):
            self._alloc_changed(alloc_id, self.client_view(alloc_id))

    def _run_of(self, alloc: Alloc | None) -> int | None:
        """StartedAt of the run the allocation's tasks are in, None when they
        do not run (the simulator's client moves all tasks of a group together)."""
        if alloc is None or alloc.client_status != RUNNING or not alloc.task_states:
            return None
        state = alloc.task_states[0][1]
        if state.state != RUNNING:
            return None
        node = self._store.nodes.get(alloc.node_id)
        # A node re-registering after its agent restarted keeps its containers.
        if node is None or node.status not in ("ready", "initializing"):
            return None
        return state.started_at

    def _alloc_changed(self, alloc_id: str, alloc: Alloc | None) -> None:
        started = self._run_of(alloc)
        current = self._runs.get(alloc_id)
        if started == current:
            return
        if current is not None:
            self._stop_run(alloc_id)
        if started is not None:
            # A new start is a new container: a fresh file system.
            self._runs[alloc_id] = started
            self._discard_dir(alloc_id)

    def _stop_run(self, alloc_id: str) -> None:
        self._runs.pop(alloc_id, None)
        self._kill(alloc_id)
        self._discard_dir(alloc_id)

    def _kill(self, alloc_id: str) -> None:
        for execution in list(self._executions.get(alloc_id, ())):
            execution.kill()
        if alloc_id in self._with_processes:
            self._with_processes.discard(alloc_id)
            kill_marked(self.instance, alloc_id)
            uid = self._uids.get(alloc_id)
            if uid is not None:
                kill_user(uid)

    def user_ids(self, alloc_id: str) -> tuple[int, int]:
        """The allocation's unprivileged account (uid, gid): the image's
        `user`, which setuser switches to."""
        uid = self._uids.get(alloc_id)
        if uid is None:
            uid = self._uid_base + len(self._uids) % _UID_BLOCK
            self._uids[alloc_id] = uid
        return uid, uid

    def _identity(self, alloc_id: str, spec: JsonDict) -> Identity | None:
        """The container's user, as the task's `user` sets it (Docker's exec
        runs as the container's user; the image's USER is root in openHPI's
        images): root when unset, `uid[:gid]` as given, any other name the
        allocation's unprivileged account. None without Docker's users."""
        if not self.docker_users:
            return None
        user = str(spec.get("User") or "")
        if user in ("", "root", "0", "0:0"):
            return Identity(0, 0)
        numeric = re.fullmatch(r"(\d+)(?::(\d+))?", user)
        if numeric:
            uid = int(numeric.group(1))
            return Identity(uid, int(numeric.group(2) or uid))
        uid, gid = self.user_ids(alloc_id)
        return Identity(uid, gid)

    def retire(self, execution: Execution) -> None:
        executions = self._executions.get(execution.alloc_id)
        if executions is not None:
            executions.discard(execution)
            if not executions:
                del self._executions[execution.alloc_id]

    # -- queries ---------------------------------------------------------------------

    def _task_names(self, alloc: Alloc) -> list[str]:
        group = group_of(alloc.job, alloc.task_group) or {}
        return [str(t.get("Name")) for t in group.get("Tasks") or []]

    def task_dir(self, alloc_id: str, task: str | None = None) -> Path | None:
        """The working directory of the allocation's task (its group's first
        task by default) while it runs, else None."""
        alloc = self._store.allocs.get(alloc_id)
        if alloc is None or alloc_id not in self._runs or self.closed:
            return None
        names = self._task_names(alloc)
        name = task if task is not None else (names[0] if names else None)
        if name is None or name not in names:
            return None
        return self._make_task_dir(alloc, name)

    def processes(self, alloc_id: str) -> list[int]:
        """Live processes started by the allocation's executions."""
        return marked_processes(self.instance, alloc_id)

    def executions(self, alloc_id: str) -> list[Execution]:
        return sorted(self._executions.get(alloc_id, ()), key=lambda e: e.pid)

    # -- executing ---------------------------------------------------------------------

    def exec(
        self,
        alloc: Alloc,
        task: str,
        command: list[str],
        tty: bool,
        allowed: Callable[[str], bool],
    ) -> Execution:
        """Nomad's client side of an exec (client/alloc_endpoint.go execImpl),
        its checks in its order, then the command started."""
        if not alloc.task_states:
            # The client has not received the allocation yet: no alloc runner.
            raise ExecRefused(404, f"Unknown allocation {quote(alloc.id)}")
        if not task:
            raise ExecRefused(400, "must provide task name")  # client/fs_endpoint.go
        if not command:
            raise ExecRefused(400, "command is not present")
        group = group_of(alloc.job, alloc.task_group) or {}
        spec = next((t for t in group.get("Tasks") or [] if t.get("Name") == task), None)
        if spec is None:
            # allocRunner.GetTaskDriverCapabilities; it carries no code: 500.
            raise ExecRefused(500, "task not found")
        if spec.get("Driver") == "raw_exec" and not allowed("alloc-node-exec"):
            # A driver without file system isolation needs alloc-node-exec too.
            raise ExecRefused(500, "Permission denied")
        state = dict(alloc.task_states).get(task)
        if state is None:
            raise ExecRefused(400, f"unknown task name {quote(task)}")
        if state.started_at == 0:
            raise ExecRefused(404, f"task {quote(task)} not started yet.")
        if alloc.id not in self._runs or self.closed:
            raise ExecRefused(404, f"task {quote(task)} is not running.")
        workdir = self._make_task_dir(alloc, task)
        env = self._environment(alloc, spec, workdir)
        identity = self._identity(alloc.id, spec)
        if identity is not None:
            uid, gid = self.user_ids(alloc.id)
            env[USER_IDS] = f"{uid}:{gid}:{workdir}"
        try:
            execution = self._spawn(alloc.id, command, tty, workdir, env, identity)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # As raw_exec's executor plugin answers over gRPC.
            raise ExecRefused(
                500,
                "rpc error: code = Unknown desc = failed to start command: "
                + _start_error(command[0], exc),
            ) from None
        self._executions.setdefault(alloc.id, set()).add(execution)
        self._with_processes.add(alloc.id)
        return execution

    def _environment(self, alloc: Alloc, spec: JsonDict, workdir: Path) -> dict[str, str]:
        env = dict(os.environ)
        for key, value in (spec.get("Env") or {}).items():
            env[str(key)] = str(value)
        resources = spec.get("Resources") or {}
        node = self._store.nodes.get(alloc.node_id)
        index = re.search(r"\[(\d+)\]$", alloc.name)
        env.update(
            {
                "NOMAD_ALLOC_DIR": str(self._alloc_dir(alloc.id) / "alloc"),
                "NOMAD_TASK_DIR": str(workdir),
                "NOMAD_ALLOC_ID": alloc.id,
                "NOMAD_SHORT_ALLOC_ID": alloc.id[:8],
                "NOMAD_ALLOC_NAME": alloc.name,
                "NOMAD_ALLOC_INDEX": index.group(1) if index else "0",
                "NOMAD_TASK_NAME": str(spec.get("Name")),
                "NOMAD_GROUP_NAME": alloc.task_group,
                "NOMAD_JOB_ID": alloc.job_id,
                "NOMAD_JOB_NAME": str(alloc.job.get("Name") or alloc.job_id),
                "NOMAD_NAMESPACE": alloc.namespace,
                "NOMAD_REGION": str(alloc.job.get("Region") or "global"),
                "NOMAD_DC": node.datacenter if node is not None else "dc1",
                "NOMAD_CPU_LIMIT": str(resources.get("CPU") or 0),
                "NOMAD_MEMORY_LIMIT": str(resources.get("MemoryMB") or 0),
                MARKER: alloc.id,
                INSTANCE_MARKER: self.instance,
            }
        )
        return env

    def _spawn(
        self,
        alloc_id: str,
        command: list[str],
        tty: bool,
        workdir: Path,
        env: dict[str, str],
        identity: Identity | None,
    ) -> Execution:
        if tty:
            master, slave = os.openpty()
            try:
                process = subprocess.Popen(
                    command,
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_child_setup(True, identity),
                )
            except BaseException:
                os.close(master)
                raise
            finally:
                os.close(slave)
            return Execution(
                self, alloc_id, process, True, master, [("stdout", master)], self.docker_stdin_close
            )
        parent: list[int] = []
        child: list[int] = []
        try:
            for child_reads in (True, False, False):  # stdin, stdout, stderr
                read_end, write_end = os.pipe()
                child.append(read_end if child_reads else write_end)
                parent.append(write_end if child_reads else read_end)
            process = subprocess.Popen(
                command,
                stdin=child[0],
                stdout=child[1],
                stderr=child[2],
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_child_setup(False, identity),
            )
        except BaseException:
            _close_all(parent)
            raise
        finally:
            _close_all(child)
        stdin, stdout, stderr = parent
        return Execution(
            self,
            alloc_id,
            process,
            False,
            stdin,
            [("stdout", stdout), ("stderr", stderr)],
            self.docker_stdin_close,
        )

    # -- stopping ----------------------------------------------------------------------

    def close(self) -> None:
        """The simulator stops: kill every process it started, end every
        execution's stream, remove the directories. Idempotent."""
        if self.closed:
            return
        executions = [e for group in self._executions.values() for e in group]
        for execution in executions:
            execution.kill()
        kill_marked(self.instance)
        for execution in executions:
            execution.shutdown()
        self._executions.clear()
        self._runs.clear()
        self._with_processes.clear()
        self._with_dir.clear()
        self._remove_root()

    def abandon(self) -> None:
        """Kill everything from any thread without the event loop (the
        simulator's thread died, or the interpreter exits)."""
        if self.closed:
            return
        for group in list(self._executions.values()):
            for execution in list(group):
                execution.kill()
        kill_marked(self.instance)
        self._remove_root()

    def _remove_root(self) -> None:
        with self._root_lock:
            self.closed = True
            root, self._root = self._root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _start_error(name: str, exc: BaseException) -> str:
    """How Go's os/exec words a failed start."""
    if isinstance(exc, ValueError):  # a NUL byte in an argument or variable
        return f"fork/exec {name}: invalid argument"
    if "/" not in name and isinstance(exc, FileNotFoundError | PermissionError):
        return f"exec: {quote(name)}: executable file not found in $PATH"
    if isinstance(exc, OSError) and exc.strerror:
        return f"fork/exec {name}: {exc.strerror[:1].lower()}{exc.strerror[1:]}"
    return str(exc)


# Every driver not yet closed: the interpreter's exit kills what they started,
# whatever happened to the simulator's thread.
_DRIVERS: weakref.WeakSet[Driver] = weakref.WeakSet()


@atexit.register
def _abandon_all() -> None:
    for driver in list(_DRIVERS):
        driver.abandon()
