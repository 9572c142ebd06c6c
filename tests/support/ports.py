"""Loopback ports for servers the tests and benchmarks start: `free_port`
for one that is started once, `stable_port` for one that is started again
and again on the same port (a controller SIGKILLed and restarted)."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick from its ephemeral range)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stable_port() -> int:
    """A free port below the kernel's ephemeral range: a server can listen on
    it again after every restart, and no outgoing connection meanwhile can be
    given that port as its own (one from the ephemeral range could)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")
