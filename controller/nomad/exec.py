"""Nomad's allocation exec: run a command inside a running allocation.

python-nomad has no exec, so this is our own client of Nomad's WebSocket
`GET /v1/client/allocation/:alloc_id/exec` (Nomad's `api/allocations_exec.go`
speaks the same protocol). The protocol, as Nomad (≤ 1.11) serves it:

- Connect with `task`, `command` (a JSON array, URL-encoded) and `tty` in the
  query and the ACL token as `X-Nomad-Token`; TLS as for every other call.
- We send `{"stdin":{"data":<b64>}}`, `{"stdin":{"close":true}}` (EOF),
  `{"tty_size":{"height":H,"width":W}}`, and `{}` every 10 s as a heartbeat:
  Nomad drops exec sessions that stay silent for about ten minutes.
- Nomad sends `{"stdout":{"data":<b64>}}` / `{"stderr":{"data":<b64>}}` (at
  most 1,024 bytes each), `{"stdout":{"close":true}}` / `{"stderr":…}` when a
  stream ends, then `{"exited":true,"result":{"exit_code":N}}` — `exit_code`
  left out when it is 0, as Nomad's encoder omits zero values — and drops the
  connection without a close frame. With `tty` there is no stderr.
- Errors after the upgrade arrive as close frames with Nomad's text: 1008 for
  client errors (unknown allocation, task not started or not running, exec
  not possible on a terminal allocation), 1011 for server errors (Nomad's
  `Permission denied` carries no status and counts as one). A bad `command`
  or `tty` is an HTTP 500 before the upgrade. Errors are told apart by their
  text, which is what Nomad keeps stable.

The exit frame is the only successful end: a connection that ends without it
is `ExecBroken`, never exit 0 (Poseidon reports such breaks as success, its
open bugs #589 and #719). Only this module reads Nomad's exec frames; the rest
of the controller sees typed events and errors: the output of frames that
arrived together joined into one event per run of a stream (`merged`), since
relaying stdout costs per event (see `FrameConnection`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextlib
import ipaddress
import json
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit

import orjson
import pybase64
import tenacity
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.protocol import Event

from controller.nomad.budget import AgentSlots
from controller.nomad.connection import NomadConnection, RequestHook, report_request
from controller.nomad.errors import (
    ConnectionsExhausted,
    ExecBroken,
    ExecError,
    ExecForbidden,
    ExecOverloaded,
    ExecRejected,
    ExecUnreachable,
    TaskNotRunning,
    UnknownAllocation,
    exec_error,
    exec_refusal,
    retry_kwargs,
)
from controller.nomad.nodes import NodeDirectory

__all__ = [
    "ExecBroken",
    "ExecError",
    "ExecForbidden",
    "ExecOverloaded",
    "ExecRejected",
    "ExecUnreachable",
    "TaskNotRunning",
    "UnknownAllocation",
]

log = logging.getLogger(__name__)

Stream = Literal["stdout", "stderr"]
STREAMS: tuple[Stream, ...] = ("stdout", "stderr")
HEARTBEAT_S = 10.0
# How long a connection to a node's own agent may take before the exec goes
# through the configured address instead (Nomad's Go API client: 1 s too).
NODE_CONNECT_TIMEOUT_S = 1.0
# After a node's agent could not be connected to, its execs go straight to the
# configured address for this long before the node is tried again.
UNREACHABLE_NODE_S = 60.0
# A node's agent that refuses the connection, having taken execs before, is
# restarting (its port closed for the seconds systemd takes to stop and start
# it; a host that is gone does not answer at all, and an address that never
# answered is a misconfiguration): its execs wait for it this long, the wait growing
# from NODE_RETRY_FIRST_S to NODE_RETRY_MAX_S, before they go through the
# configured address, which can only answer `No path to node` meanwhile.
NODE_RIDE_THROUGH_S = 6.0
NODE_RETRY_FIRST_S = 0.1
NODE_RETRY_MAX_S = 1.0
# (operation, outcome, HTTP status or "none", seconds) after every handshake:
# operation `exec_node` (on the node's agent), `exec` (the configured
# address) or `exec_fallback` (the node's agent could not be reached).
# Nomad's output frames carry at most 1,024 bytes (4/3 of that in base64);
# anything far larger is not Nomad talking.
MAX_FRAME_BYTES = 1 << 20
# Nomad's frames received and not yet taken by the session's reader, in bytes,
# above which reading from Nomad pauses (TCP then holds Nomad back), and below
# which it goes on again.
READ_HIGH_BYTES = 64 * 1024
READ_LOW_BYTES = 16 * 1024
# Consecutive output of one stream is handed on as one event of about this
# many bytes at most (Nomad writes 1 KiB a frame).
MERGE_BYTES = 16 * 1024


# -- what the rest of the controller sees ------------------------------------------------


@dataclass(frozen=True)
class Output:
    """Bytes the command wrote to one of its streams."""

    stream: Stream
    data: bytes


@dataclass(frozen=True)
class StreamClosed:
    """One output stream reached its end."""

    stream: Stream


@dataclass(frozen=True)
class Exited:
    """The command ended; the last event of a session."""

    code: int


ExecEvent = Output | StreamClosed | Exited


# -- pure protocol pieces (table-tested) -----------------------------------------------


def exec_query(task: str, command: Sequence[str], tty: bool, namespace: str | None) -> str:
    """The query string of an exec request."""
    params = {"task": task, "command": json.dumps(list(command)), "tty": str(tty).lower()}
    if namespace:
        params["namespace"] = namespace
    return urlencode(params)


def classify_close(code: int, reason: str) -> ExecError:
    """Nomad's close frame (or its absence, code 1006) as a typed error."""
    return exec_error(code, reason)


# How Nomad's encoder writes an output data frame, around the base64.
_DATA_HEADS: tuple[tuple[str, Stream], ...] = (
    ('{"stdout":{"data":"', "stdout"),
    ('{"stderr":{"data":"', "stderr"),
)
_DATA_TAIL = '"}}'


def output_frame(raw: str) -> Output | None:
    """An output data frame exactly as Nomad writes it, `{"stdout":{"data":"<b64>"}}`,
    read without the JSON decoder; None for anything else, which parse_frame
    then reads in full. It gives what the full reading gives: strict base64
    admits only `A-Z a-z 0-9 + / =`, so the text between the quotes holds no
    quote, backslash or control character, and the frame is exactly that one
    object holding that one string."""
    if not raw.endswith(_DATA_TAIL):
        return None
    for head, stream in _DATA_HEADS:
        if raw.startswith(head):
            payload = raw[len(head) : -len(_DATA_TAIL)]
            if not payload:
                return None
            try:
                return Output(stream, pybase64.b64decode(payload, validate=True))
            except (binascii.Error, ValueError):
                return None
    return None


def parse_frame(raw: str | bytes) -> list[ExecEvent]:
    """The events in one frame from Nomad; `{}` heartbeats and fields we do not
    know give none. Raises ExecRejected for a frame that is not Nomad's."""
    if isinstance(raw, str):
        output = output_frame(raw)
        if output is not None:
            return [output]
    return read_frame(raw)


def read_frame(raw: str | bytes) -> list[ExecEvent]:
    """parse_frame's full reading, with the JSON decoder."""
    try:
        frame = orjson.loads(raw)
    except ValueError:
        raise ExecRejected(f"Nomad sent a frame that is not JSON: {raw[:80]!r}") from None
    if not isinstance(frame, dict):
        raise ExecRejected(f"Nomad sent a frame that is not an object: {raw[:80]!r}")
    events: list[ExecEvent] = []
    for stream in STREAMS:
        part = frame.get(stream)
        if not isinstance(part, dict):
            continue
        data = part.get("data")
        if isinstance(data, str) and data:
            try:
                events.append(Output(stream, pybase64.b64decode(data, validate=True)))
            except (binascii.Error, ValueError):
                raise ExecRejected(f"Nomad sent {stream} that is not base64") from None
        if part.get("close") is True:
            events.append(StreamClosed(stream))
    if frame.get("exited") is True:
        result = frame.get("result")
        code = result.get("exit_code", 0) if isinstance(result, dict) else 0
        # Nomad omits a zero exit code; anything else not an integer is not Nomad.
        events.append(Exited(code if isinstance(code, int) and not isinstance(code, bool) else 1))
    return events


def merged(events: Iterable[ExecEvent], limit: int = MERGE_BYTES) -> Iterator[ExecEvent]:
    """`events` in order, each run of consecutive output of one stream joined
    into events of about `limit` bytes at most: what follows a frame of
    Nomad's costs per event, not per byte. Output before a frame that fails
    to read is handed on before the error."""
    parts: list[bytes] = []
    stream: Stream = "stdout"
    size = 0
    source = iter(events)
    while True:
        try:
            event = next(source)
        except StopIteration:
            break
        except ExecError:
            if parts:
                yield Output(stream, b"".join(parts))
            raise
        if isinstance(event, Output):
            if parts and (event.stream != stream or size >= limit):
                yield Output(stream, b"".join(parts))
                parts, size = [], 0
            stream = event.stream
            parts.append(event.data)
            size += len(event.data)
            continue
        if parts:
            yield Output(stream, b"".join(parts))
            parts, size = [], 0
        yield event
    if parts:
        yield Output(stream, b"".join(parts))


def stdin_frame(data: bytes) -> str:
    return json.dumps({"stdin": {"data": base64.b64encode(data).decode("ascii")}})


STDIN_CLOSE = json.dumps({"stdin": {"close": True}})
HEARTBEAT = "{}"


class Utf8Streams:
    """Bytes of each stream to text, one incremental decoder per stream: a
    character split across two of Nomad's 1,024-byte frames arrives whole.
    Bytes that are not UTF-8 become U+FFFD."""

    def __init__(self) -> None:
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in STREAMS}

    def decode(self, stream: Stream, data: bytes) -> str:
        return str(self._decoders[stream].decode(data))

    def flush(self, stream: Stream) -> str:
        """What a stream still holds at its end (an incomplete character)."""
        return str(self._decoders[stream].decode(b"", final=True))


# -- the session --------------------------------------------------------------------------

_MESSAGE_OPCODES = frozenset({Opcode.TEXT, Opcode.BINARY, Opcode.CONT})


class FrameConnection(ClientConnection):
    """websockets' client connection, whose messages are kept in a plain deque
    that `take` empties about 16 KiB at a time, rather than in websockets'
    queue, which hands out one message a `recv()`.

    Nomad writes output 1 KiB a frame, and a `recv()` a frame (a future and a
    task switch each) was most of what relaying stdout cost the controller:
    one read from the socket holds dozens of frames, and here they are
    appended as websockets' parser yields them and taken in batches. While more
    than READ_HIGH_BYTES wait, reading from the socket pauses, as it does
    behind websockets' own bounded queue: a slow reader holds Nomad back
    through TCP. The handshake and the control frames (ping, pong, close)
    stay websockets' business; `process_event` and `connection_lost` are the
    hooks a subclass given to `connect(create_connection=…)` has."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._messages: deque[str | bytes] = deque()
        self._held = 0
        self._fragments: list[bytes] | None = None
        self._text = False
        self._reading_paused = False
        self._lost = False
        self._wake: asyncio.Future[None] | None = None

    def process_event(self, event: Event) -> None:
        if isinstance(event, Frame) and event.opcode in _MESSAGE_OPCODES:
            self._message_frame(event)
        else:
            super().process_event(event)

    def _message_frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.CONT:
            if self._fragments is None:  # websockets' parser refuses this first
                return
            self._fragments.append(bytes(frame.data))
        else:
            self._fragments = [bytes(frame.data)]
            self._text = frame.opcode is Opcode.TEXT
        if not frame.fin:
            return
        data = self._fragments[0] if len(self._fragments) == 1 else b"".join(self._fragments)
        self._fragments = None
        message: str | bytes = data
        if self._text:
            # Not UTF-8: left as bytes, which parse_frame refuses as not JSON.
            with contextlib.suppress(UnicodeDecodeError):
                message = data.decode()
        self._messages.append(message)
        self._held += len(message)
        if self._held > READ_HIGH_BYTES and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wakeup()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._lost = True
        self._wakeup()

    def _wakeup(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    @property
    def held(self) -> int:
        """Bytes of the messages received and not yet taken."""
        return self._held

    async def take(self, limit: int = MERGE_BYTES) -> list[str | bytes]:
        """The oldest messages received and not yet taken, in order, about
        `limit` bytes of them (one at least; waiting for one); raises
        ConnectionClosed once the connection is closed and every message has
        been taken. Reading goes on once READ_LOW_BYTES or less are left: a
        batch is let go of before the next read's is held beside it."""
        while not self._messages:
            if self._lost:
                raise self.protocol.close_exc
            self._wake = self.loop.create_future()
            try:
                await self._wake
            finally:
                self._wake = None
        queued = self._messages
        messages = [queued.popleft()]
        size = len(messages[0])
        while queued and size < limit:
            messages.append(queued.popleft())
            size += len(messages[-1])
        self._held -= size
        if self._reading_paused and self._held <= READ_LOW_BYTES and not self._lost:
            self._reading_paused = False
            self.transport.resume_reading()
        return messages


class ExecSession:
    """One exec: events from `events()`, stdin through `send` / `close_stdin`.

    Closing the session closes the connection; it does not stop the command
    (Nomad does not either): stopping it is the caller's business."""

    def __init__(self, ws: FrameConnection, heartbeat_s: float) -> None:
        self._ws = ws
        self._heartbeat = asyncio.ensure_future(self._beat(heartbeat_s))
        self._exited = False

    async def _beat(self, interval_s: float) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await asyncio.sleep(interval_s)
                await self._ws.send(HEARTBEAT)

    @property
    def held(self) -> int:
        """Bytes of Nomad's frames received and not yet read through `events`."""
        return self._ws.held

    async def send(self, data: bytes) -> None:
        """Bytes to the command's stdin. Raises ExecBroken when the connection is gone."""
        if not data:
            return
        try:
            await self._ws.send(stdin_frame(data))
        except ConnectionClosed:
            raise ExecBroken("the connection to Nomad ended while sending input") from None

    async def close_stdin(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(STDIN_CLOSE)

    async def resize(self, height: int, width: int) -> None:
        frame = json.dumps({"tty_size": {"height": height, "width": width}})
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(frame)

    async def events(self) -> AsyncIterator[ExecEvent]:
        """Every event up to and including `Exited`; raises ExecError otherwise."""
        while not self._exited:
            try:
                messages = await self._ws.take()
            except ConnectionClosed as closed:
                rcvd = closed.rcvd
                raise classify_close(
                    rcvd.code if rcvd else 1006, rcvd.reason if rcvd else ""
                ) from None
            for event in merged(e for raw in messages for e in parse_frame(raw)):
                yield event
                if isinstance(event, Exited):
                    self._exited = True
                    break

    async def close(self) -> None:
        self._heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._heartbeat
        # After the exit frame Nomad drops the connection itself; otherwise we
        # end it (the command keeps running: see the class docstring).
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._ws.close(), timeout=1.0)


class ExecClient:
    """Opens exec sessions with the connection's token, namespace and TLS: on
    the allocation's own node first, when a `NodeDirectory` names it, and on
    the configured address otherwise (its agent forwards to the node)."""

    def __init__(
        self,
        connection: NomadConnection | None = None,
        *,
        address: str | None = None,
        nodes: NodeDirectory | None = None,
        connect_timeout_s: float = 10.0,
        node_connect_timeout_s: float = NODE_CONNECT_TIMEOUT_S,
        heartbeat_s: float = HEARTBEAT_S,
        retry_attempts: int = 5,
        retry_max_wait_s: float = 2.0,
        on_request: RequestHook | None = None,
        budget: AgentSlots | None = None,
        node_ride_through_s: float = NODE_RIDE_THROUGH_S,
    ) -> None:
        """`budget` bounds the handshakes in flight per agent address (see
        controller.nomad.budget); None: unbounded. A node's agent that
        refuses connections is waited for `node_ride_through_s`."""
        if connection is None:
            connection = NomadConnection(address=address or "http://127.0.0.1:4646")
        self.connection = connection
        self._nodes = nodes
        self._connect_timeout_s = connect_timeout_s
        self._node_connect_timeout_s = node_connect_timeout_s
        self._node_ride_through_s = node_ride_through_s
        self._heartbeat_s = heartbeat_s
        self._retry_attempts = retry_attempts
        self._retry_max_wait_s = retry_max_wait_s
        self._on_request = on_request
        self._fell_back: set[str] = set()  # node addresses already logged
        # Node address → until when execs skip it (monotonic): a firewalled
        # node would otherwise cost every exec the connect timeout.
        self._unreachable: dict[str, float] = {}
        # Node addresses an exec has reached: one that refuses later restarts.
        self._reached: set[str] = set()
        self._budget = budget

    def url(
        self,
        alloc_id: str,
        task: str,
        command: Sequence[str],
        tty: bool,
        connection: NomadConnection | None = None,
    ) -> str:
        connection = connection or self.connection
        query = exec_query(task, command, tty, connection.namespace)
        if connection.region:
            query += "&" + urlencode({"region": connection.region})
        base = websocket_base(connection.address)
        return f"{base}/v1/client/allocation/{alloc_id}/exec?{query}"

    async def open(
        self, alloc_id: str, task: str, command: Sequence[str], *, tty: bool = False
    ) -> ExecSession:
        """Start `command` in the allocation's task. Raises ExecError subtypes:
        ExecOverloaded when Nomad kept answering 429, ExecUnreachable when no
        connection could be made, both after the retry policy of every call
        to Nomad; ExecRejected (and its kin) for any other refusal."""
        node = await self._nodes.address_of(alloc_id) if self._nodes is not None else None
        if node is not None and self._unreachable.get(node, 0.0) <= time.monotonic():
            direct = self.connection.at(node)
            if direct.address != self.connection.address:
                deadline = time.monotonic() + self._node_ride_through_s
                wait = NODE_RETRY_FIRST_S
                while True:
                    try:
                        ws = await self._handshake(
                            "exec_node", alloc_id, task, command, tty, direct, node=True
                        )
                        self._reached.add(node)
                        return ExecSession(ws, self._heartbeat_s)
                    except _NoConnection as exc:
                        # Refused by an agent that answered before: it restarts.
                        refused = isinstance(exc.cause, ConnectionRefusedError)
                        restarting = refused and node in self._reached
                        if restarting and time.monotonic() + wait < deadline:
                            await asyncio.sleep(wait)  # the agent restarts
                            wait = min(wait * 2, NODE_RETRY_MAX_S)
                            continue
                        self._fall_back(node, exc)
                        break
        ws = await self._handshake("exec", alloc_id, task, command, tty, self.connection)
        return ExecSession(ws, self._heartbeat_s)

    def _fall_back(self, node: str, exc: _NoConnection) -> None:
        self._report("exec_fallback", "unavailable", "none", 0.0)
        self._unreachable[node] = time.monotonic() + UNREACHABLE_NODE_S
        if self._nodes is not None:
            self._nodes.forget(node)
        if node not in self._fell_back:
            self._fell_back.add(node)
            log.warning(
                "cannot connect to the Nomad agent of node %s (%s): execs on that node go "
                "through %s instead (logged once per node)",
                node,
                exc.cause,
                self.connection.address,
            )

    async def _handshake(
        self,
        operation: str,
        alloc_id: str,
        task: str,
        command: Sequence[str],
        tty: bool,
        connection: NomadConnection,
        *,
        node: bool = False,
    ) -> FrameConnection:
        url = self.url(alloc_id, task, command, tty, connection)
        retrying = tenacity.AsyncRetrying(
            **retry_kwargs(self._retry_attempts, self._retry_max_wait_s, before_sleep=_log_retry)
        )
        ws: FrameConnection = await retrying(self._connect, operation, url, connection, node)
        return ws

    async def _connect(
        self, operation: str, url: str, connection: NomadConnection, node: bool
    ) -> FrameConnection:
        """One handshake; what a refusal means is `errors.exec_refusal`'s call.
        On a node's agent, failing to connect at all raises _NoConnection
        (fall back), not ExecUnreachable (retry)."""
        started = time.monotonic()
        outcome, status = "error", "none"
        parts = urlsplit(connection.address)
        host, port = parts.hostname or "127.0.0.1", parts.port or (443 if connection.tls else 80)
        timeout = self._node_connect_timeout_s if node else self._connect_timeout_s
        slot = (
            self._budget.slot(connection.address)
            if self._budget is not None
            else contextlib.nullcontext()
        )
        try:
            async with slot:
                ws = await self._upgrade(url, connection, host, port, timeout, node)
            outcome, status = "ok", "101"
            return ws
        except ConnectionsExhausted:
            # Never sent: counted as `budget` (no HTTP status).
            outcome, status = "unavailable", "budget"
            raise
        except (_NoConnection, ExecUnreachable):
            outcome = "unavailable"
            raise
        except ExecError as exc:
            outcome = "unavailable" if isinstance(exc, ExecOverloaded) else "error"
            status = str(exc.code) if exc.code else "none"
            raise
        finally:
            self._report(operation, outcome, status, time.monotonic() - started)

    async def _upgrade(
        self,
        url: str,
        connection: NomadConnection,
        host: str,
        port: int,
        timeout: float,
        node: bool,
    ) -> FrameConnection:
        try:
            sock = await _dial(host, port, timeout)
        except (OSError, TimeoutError) as exc:
            if node:
                raise _NoConnection(exc) from None
            raise ExecUnreachable(f"could not reach Nomad for exec: {exc!r}") from None
        try:
            ws = await websockets.connect(
                url,
                sock=sock,
                additional_headers=connection.headers,
                ssl=connection.ssl_context,
                open_timeout=self._connect_timeout_s,
                # Nomad answers pings, but our own {} heartbeats are what it counts.
                ping_interval=None,
                max_size=MAX_FRAME_BYTES,
                compression=None,
                # Output waits in FrameConnection, bounded; then TCP
                # backpressure reaches Nomad.
                create_connection=FrameConnection,
            )
        except InvalidStatus as exc:
            body = exc.response.body or b""
            raise exec_refusal(exc.response.status_code, body.decode("utf-8", "replace")) from None
        except (
            OSError,
            InvalidHandshake,
            ConnectionClosed,
            TimeoutError,
            EOFError,
            AssertionError,
        ) as exc:
            # AssertionError: websockets' client asserts on an answer it
            # could not read whole (a 429 whose connection Nomad closes at
            # once). ConnectionClosed: the connection was reset before the
            # request went out (an agent restarting resets what it accepted).
            # All of these: refused or cut before the upgrade.
            sock.close()
            raise ExecUnreachable(f"could not reach Nomad for exec: {exc!r}") from None
        # Outside the try: this is our own wiring, never "Nomad unreachable".
        assert isinstance(ws, FrameConnection)
        return ws

    def _report(self, operation: str, outcome: str, status: str, seconds: float) -> None:
        report_request(self._on_request, operation, outcome, status, seconds)

    @contextlib.asynccontextmanager
    async def session(
        self, alloc_id: str, task: str, command: Sequence[str], *, tty: bool = False
    ) -> AsyncIterator[ExecSession]:
        session = await self.open(alloc_id, task, command, tty=tty)
        try:
            yield session
        finally:
            await session.close()


class _NoConnection(Exception):
    """No TCP connection to a node's agent: fall back to the configured address."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def _dial(host: str, port: int, timeout_s: float) -> socket.socket:
    """A connected non-blocking socket to host:port within `timeout_s` (each
    address tried in turn), so that "cannot connect" is told apart from a
    slow handshake."""
    loop = asyncio.get_running_loop()
    infos: list[tuple[Any, ...]]
    try:
        # An address literal (a node's HTTPAddr is one) needs no lookup, and
        # the lookup would queue in the loop's small default thread pool.
        literal = ipaddress.ip_address(host)
        family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
        infos = [(family, socket.SOCK_STREAM, 0, "", (host, port))]
    except ValueError:
        lookup = loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        infos = list(await asyncio.wait_for(lookup, timeout_s))
    last: BaseException = OSError(f"no address for {host}:{port}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout_s)
            return sock
        except (OSError, TimeoutError) as exc:
            sock.close()
            last = exc
    raise last


def websocket_base(address: str) -> str:
    """`ws://host:port` (`wss://` for https) of an HTTP address."""
    parts = urlsplit(address.rstrip("/"))
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}{parts.path}"


def _log_retry(state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    log.info("retrying an exec handshake after attempt %d: %s", state.attempt_number, exc)
