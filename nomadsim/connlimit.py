"""Nomad's per-client connection limits, counted as go-connlimit counts them.

HTTP (`http_max_conns_per_client`, default 100, 0 = unlimited): every agent's
HTTP listener counts the connections open from each client IP. A connection
counts from accept until it is closed or hijacked: go-connlimit's
HTTPConnStateFunc frees it on `StateHijacked` as if it were closed, and a
WebSocket upgrade hijacks. So a running exec does not count; its handshake
does. The connection beyond the limit gets Nomad's answer and is closed
(command/agent/http.go `connLimiter`): a fixed `429 Too Many Requests` with
a one-line text, written only while a limiter of 10 answers a second (burst
100) allows, else the connection is just closed.

RPC (`rpc_max_conns_per_client`, default 100, 0 = unlimited; Nomad refuses
a value from 1 to 25): each server counts the connections from each agent
IP (nomad/rpc.go `listen`); streaming RPC connections, one per exec on
another node or event stream through a client agent, are also held to the
limit less 20 (`LimitsNonStreamingConnsPerClient`, nomad/structs/config/
limits.go), leaving room for the agent's one multiplexed RPC connection,
which it always holds. A refused connection is closed by the server without
a word; the agent sees EOF while reading the acknowledgement
(client/rpc.go `streamingRpcConn`).

The simulator's agents all live in this process: their RPC connections are
counted, not opened. HTTP connections are real sockets, counted by
`LimitedHttp`, the uvicorn protocol every listener uses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from nomadsim.records import JsonDict

# Reserved for non-streaming RPC connections per client IP (Nomad's constant).
NON_STREAMING_CONNS = 20
# Nomad refuses rpc_max_conns_per_client from 1 up to this value.
RPC_MIN_LIMIT = NON_STREAMING_CONNS + 5
TOO_MANY = "Your IP is issuing too many concurrent connections, please rate limit your calls\n"
TOO_MANY_RESPONSE = (
    "HTTP/1.1 429 Too Many Requests\r\n"
    "Content-Type: text/plain\r\n"
    f"Content-Length: {len(TOO_MANY)}\r\n"
    "Connection: close\r\n\r\n"
    f"{TOO_MANY}"
).encode()


def check_rpc_limit(limit: int) -> None:
    """Nomad's own check at agent start (command/agent/agent.go)."""
    if limit < 0 or 0 < limit <= RPC_MIN_LIMIT:
        raise ValueError(f"rpc_max_conns_per_client must be > {RPC_MIN_LIMIT}; found: {limit}")


class TokenBucket:
    """golang.org/x/time/rate's Limiter as `connLimiter` uses it: `allow()`
    is `Reserve()` with no delay."""

    def __init__(self, rate: float, burst: int, now: Callable[[], float] = time.monotonic):
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._now = now
        self._at = now()

    def allow(self) -> bool:
        now = self._now()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


@dataclass
class Gauge:
    """Connections open now, the most ever open at once, and refusals."""

    current: int = 0
    peak: int = 0
    refused: int = 0
    by_ip: dict[str, int] = field(default_factory=dict)

    def take(self, ip: str, limit: int) -> bool:
        held = self.by_ip.get(ip, 0)
        if limit and held >= limit:
            self.refused += 1
            return False
        self.by_ip[ip] = held + 1
        self.current += 1
        self.peak = max(self.peak, self.current)
        return True

    def give(self, ip: str) -> None:
        held = self.by_ip.get(ip, 0) - 1
        if held > 0:
            self.by_ip[ip] = held
        else:
            self.by_ip.pop(ip, None)
        self.current -= 1

    def as_dict(self) -> JsonDict:
        return {
            "Current": self.current,
            "Peak": self.peak,
            "Refused": self.refused,
            "ByClientIP": dict(sorted(self.by_ip.items())),
        }


class HttpLimits:
    """The HTTP limit of every listener, keyed by the listener's local port."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"http_max_conns_per_client must not be negative; found: {limit}")
        self.limit = limit
        self.gauges: dict[int, Gauge] = {}
        self._answers = TokenBucket(10, 100)

    def gauge(self, port: int) -> Gauge:
        return self.gauges.setdefault(port, Gauge())

    def accept(self, port: int, ip: str) -> bool:
        return self.gauge(port).take(ip, self.limit)

    def free(self, port: int, ip: str) -> None:
        self.gauge(port).give(ip)

    def answer_refusal(self) -> bool:
        """Whether this refusal gets the 429 text (else a bare close)."""
        return self._answers.allow()


class RpcLimits:
    """Each server's RPC limit over the agents' connections to it. Every
    client agent holds one multiplexed connection to its server."""

    def __init__(self, limit: int, held: dict[str, list[str]]) -> None:
        check_rpc_limit(limit)
        self.limit = limit
        self.stream_limit = limit - NON_STREAMING_CONNS if limit else 0
        self.conns: dict[str, Gauge] = {}
        self.streams: dict[str, Gauge] = {}
        for server, ips in held.items():
            self.conns[server] = Gauge()
            self.streams[server] = Gauge()
            for ip in ips:
                self.conns[server].take(ip, 0)

    def open_stream(self, server: str, ip: str) -> bool:
        """A streaming RPC connection from `ip` to `server`: accepted by the
        listener's limit, then by the streaming limit (nomad/rpc.go)."""
        conns = self.conns.setdefault(server, Gauge())
        streams = self.streams.setdefault(server, Gauge())
        if not conns.take(ip, self.limit):
            return False
        if not streams.take(ip, self.stream_limit):
            conns.give(ip)
            conns.refused += 1
            return False
        return True

    def close_stream(self, server: str, ip: str) -> None:
        self.streams[server].give(ip)
        self.conns[server].give(ip)

    def as_dict(self) -> JsonDict:
        return {
            server: {"Connections": self.conns[server].as_dict(), "Streams": stream.as_dict()}
            for server, stream in sorted(self.streams.items())
        }


def limited_http(limits: HttpLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with `limits` applied at accept; an upgrade
    frees the connection, as a hijack does in Go."""

    class LimitedHttp(HttpToolsProtocol):
        _slot: tuple[int, str] | None = None
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            local = transport.get_extra_info("sockname")
            peer = transport.get_extra_info("peername")
            if isinstance(local, tuple) and isinstance(peer, tuple):
                slot = (int(local[1]), str(peer[0]))
                if not limits.accept(*slot):
                    self._refused = True
                    if limits.answer_refusal():
                        transport.write(TOO_MANY_RESPONSE)
                    transport.close()
                    return
                self._slot = slot
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            self._free()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, *args: Any) -> None:
            self._free()
            super().handle_websocket_upgrade(*args)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            super().data_received(data)

        def _free(self) -> None:
            if self._slot is not None:
                limits.free(*self._slot)
                self._slot = None

    return LimitedHttp
