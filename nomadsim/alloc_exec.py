"""Nomad's allocation exec, a WebSocket:
`GET /v1/client/allocation/:alloc_id/exec?task=T&command=<JSON array>&tty=B`.

As Nomad ≤ 1.11 answers it (command/agent/alloc_endpoint.go: allocExec,
readWsHandshake, execStreamImpl, toWsCode): a `command` that does not decode
into a list of strings and a `tty` that is not a Go boolean are plain-text
HTTP 500 answers before the upgrade. Everything after the upgrade (ACLs
included: Nomad resolves them in the RPC) ends with a close frame whose reason
is Nomad's error text: 1011 when the error carries 500 or no code at all
(`Permission denied` has none), 1008 for every other code. A reason longer
than a close frame can hold (123 bytes) is not sent at all: Nomad's write of
the close frame fails and the connection just drops.

Frames are JSON text, byte fields standard base64. In: `{"stdin":{"data":…}}`,
`{"stdin":{"close":true}}`, `{"tty_size":{"height":H,"width":W}}`; anything
else is a heartbeat; a frame that does not decode ends the exec with 1011 and
Go's text (the command runs on). Out: `{"stdout":{"data":…}}` /
`{"stderr":{"data":…}}`, `{"stdout":{"close":true}}` /
`{"stderr":{"close":true}}`, then `{"exited":true,"result":{"exit_code":N}}`
(`"result":{}` for 0), after which the connection is closed WITHOUT a close
frame, as Nomad's `ws.Close()` does. A client that goes away leaves its
command running (driver.py). Under Docker's stdin rule (Nomad <= 1.8, on by
default) input sent once the command's output has ended takes the exit
frame's place: the connection drops without it, and without a close frame.

The simulator's knobs apply as to any /v1 route: `http_latency_ms` before the
upgrade, `http_error_rate` as close 1011 `No cluster leader` after it.

Through a client agent, an exec for an allocation on another node holds a
streaming RPC connection from the agent to its server while it runs
(topology.py). When the server refuses that connection (its RPC limit,
connlimit.py), Nomad's handler returns the agent's read error (`EOF`)
without writing a close frame or closing the WebSocket, which the Go
runtime closes once it collects it: the client sees the connection drop
with no close frame, here at once."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers, QueryParams
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from nomadsim import gojson
from nomadsim.core import Simulator
from nomadsim.driver import Execution
from nomadsim.errors import NomadError
from nomadsim.restarts import until_cut
from nomadsim.topology import Kind

EXEC_ROUTE = "/v1/client/allocation/{alloc_id}/exec"
# A close frame's payload is at most 125 bytes, two of them the code.
MAX_CLOSE_REASON = 123
# gorilla/websocket's refusal of a request that is not an upgrade (Nomad's
# allocExec wraps it): 400, gorilla's status text, then Nomad's own error.
NOT_UPGRADE = (
    "Bad Request\n"
    "failed to upgrade connection: websocket: the client is not using the websocket "
    "protocol: 'upgrade' token not found in 'Connection' header"
)


def ws_code(status: int) -> int:
    """Nomad's toWsCode: 500 is CloseInternalServerErr, everything else
    ClosePolicyViolation."""
    return 1011 if status == 500 else 1008


def _first(params: QueryParams, name: str) -> str:
    # Go's url.Values.Get answers the first of repeated parameters.
    values = params.getlist(name)
    return values[0] if values else ""


@dataclass(frozen=True)
class ExecArgs:
    task: str
    command: list[str]
    tty: bool


def parse_args(params: QueryParams) -> ExecArgs:
    """allocExec's parsing before the upgrade; ValueError carries Nomad's text."""
    try:
        command = gojson.string_list(_first(params, "command")) or []
    except ValueError as exc:
        raise ValueError(f"failed to marshal command into json: {exc}") from None
    tty = False
    raw_tty = _first(params, "tty")
    if raw_tty:
        try:
            tty = gojson.parse_bool(raw_tty)
        except ValueError as exc:
            raise ValueError(f"tty value is not a boolean: {exc}") from None
    return ExecArgs(_first(params, "task"), command, tty)


def request_token(headers: Headers) -> str | None:
    """Nomad's parseToken: X-Nomad-Token, else `Authorization: Bearer <token>`."""
    token = headers.get("X-Nomad-Token", "")
    if token:
        return token.strip()
    parts = headers.get("Authorization", "").split(" ")
    if len(parts) > 1 and parts[0].lower() == "bearer":
        return " ".join(parts[1:]).strip().split(" ")[0]
    return None


# -- decoding what the client sends, as Go's encoding/json does ---------------------


def _field(obj: dict[str, Any], name: str) -> Any:
    """A struct field as Go decodes it: keys match case-insensitively, the last wins."""
    value = None
    for key, item in obj.items():
        if key.casefold() == name.casefold():
            value = item
    return value


def _type_error(value: Any, where: str, go_type: str) -> ValueError:
    return ValueError(f"json: cannot unmarshal {gojson.kind(value)} into {where} of type {go_type}")


def _int32(value: Any, where: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, gojson.Number):
        raise _type_error(value, where, "int32")
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not -(2**31) <= number < 2**31:
        raise ValueError(f"json: cannot unmarshal number {value} into {where} of type int32")
    return number


def _base64(value: str) -> bytes:
    # Go's StdEncoding skips CR and LF and wants padding.
    text = value.replace("\r", "").replace("\n", "")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        at = next((i for i, c in enumerate(value) if not (c.isalnum() or c in "+/=\r\n")), None)
        raise ValueError(
            f"illegal base64 data at input byte {at if at is not None else 0}"
        ) from None


@dataclass(frozen=True)
class InputFrame:
    stdin: bool = False
    data: bytes = b""
    close: bool = False
    tty_size: tuple[int, int] | None = None


# The frame that carries input as clients write it, `{"stdin":{"data":"<b64>"}}`,
# with JSON's whitespace (Go's four characters) between the tokens and after
# them: what comes before the string, and what comes from its closing quote on.
_STDIN_HEAD = re.compile(
    r'[ \t\n\r]*\{[ \t\n\r]*"stdin"[ \t\n\r]*:[ \t\n\r]*\{[ \t\n\r]*"data"[ \t\n\r]*:[ \t\n\r]*"'
)
_STDIN_TAIL = re.compile(r'"[ \t\n\r]*\}[ \t\n\r]*\}[ \t\n\r]*')


def stdin_data(raw: str | bytes) -> InputFrame | None:
    """An input frame of exactly that shape, read without the Go-compatible
    decoder; None for anything else, which read_input then reads in full.
    It gives what the full reading gives: the string runs to the first quote
    after the head, and strict base64 admits only `A-Z a-z 0-9 + / =` in it,
    so it holds no escape, control character or quote; the frame is then one
    complete object holding one object holding that one string, whitespace
    after it (which Go's decoder leaves unread), and Go decodes the string as
    `_base64` does here, with nothing to skip."""
    if not isinstance(raw, str):
        return None
    head = _STDIN_HEAD.match(raw)
    if head is None:
        return None
    end = raw.find('"', head.end())
    if end < 0 or _STDIN_TAIL.fullmatch(raw, end) is None:
        return None
    try:
        data = binascii.a2b_base64(raw[head.end() : end], strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    return InputFrame(stdin=True, data=data)


def decode_input(raw: str | bytes) -> InputFrame:
    """One client frame (drivers.ExecTaskStreamingRequestMsg); ValueError with Go's text."""
    frame = stdin_data(raw)
    return frame if frame is not None else read_input(raw)


def read_input(raw: str | bytes) -> InputFrame:
    """decode_input's full reading, as Go's decoder reads any frame."""
    msg = gojson.loads_message(raw)
    if msg is None:
        return InputFrame()
    if not isinstance(msg, dict):
        raise _type_error(msg, "Go value", "proto.ExecTaskStreamingRequest")
    stdin = _field(msg, "stdin")
    size = _field(msg, "tty_size")
    if stdin is not None and not isinstance(stdin, dict):
        raise _type_error(
            stdin,
            "Go struct field ExecTaskStreamingRequest.stdin",
            "proto.ExecTaskStreamingIOOperation",
        )
    if size is not None and not isinstance(size, dict):
        raise _type_error(
            size,
            "Go struct field ExecTaskStreamingRequest.tty_size",
            "proto.ExecTaskStreamingRequest_TerminalSize",
        )
    tty_size = None
    if size is not None:
        where = "Go struct field ExecTaskStreamingRequest_TerminalSize.tty_size."
        height = _int32(_field(size, "height"), where + "height")
        width = _int32(_field(size, "width"), where + "width")
        # A window size is two unsigned shorts.
        tty_size = (min(max(height, 0), 0xFFFF), min(max(width, 0), 0xFFFF))
    if stdin is None:
        return InputFrame(tty_size=tty_size)
    data = _field(stdin, "data")
    close = _field(stdin, "close")
    where = "Go struct field ExecTaskStreamingIOOperation.stdin."
    if data is not None and (not isinstance(data, str) or isinstance(data, gojson.Number)):
        raise _type_error(data, where + "data", "[]uint8")
    if close is not None and not isinstance(close, bool):
        raise _type_error(close, where + "close", "bool")
    return InputFrame(True, _base64(data) if data else b"", bool(close), tty_size)


def decode_handshake(raw: str | bytes) -> str:
    """readWsHandshake: the auth token of `{"version":1,"auth_token":…}`."""
    msg = gojson.loads_message(raw)
    if msg is None:
        msg = {}
    if not isinstance(msg, dict):
        raise _type_error(msg, "Go value", "agent.wsHandshakeMessage")
    version = _field(msg, "version")
    token = _field(msg, "auth_token")
    where = "Go struct field wsHandshakeMessage."
    if version is not None and not isinstance(version, gojson.Number):
        raise _type_error(version, where + "version", "int")
    try:
        number = int(version or 0)
    except ValueError:
        raise ValueError(
            f"json: cannot unmarshal number {version} into {where}version of type int"
        ) from None
    if token is not None and (not isinstance(token, str) or isinstance(token, gojson.Number)):
        raise _type_error(token, where + "auth_token", "string")
    if number != 1:
        raise ValueError(f"unexpected handshake value: {number}")
    return token or ""


# -- the route ----------------------------------------------------------------------


async def close(websocket: WebSocket, code: int, reason: str) -> None:
    if len(reason.encode()) > MAX_CLOSE_REASON:
        return  # returning without a close frame drops the connection
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await websocket.close(code, reason)


async def _receive(websocket: WebSocket) -> str | bytes | None:
    """The next message's payload, None once the client is gone."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    text: str | None = message.get("text")
    return text if text is not None else (message.get("bytes") or b"")


async def _pump_input(websocket: WebSocket, execution: Execution) -> str | None:
    """Client frames into the command until the client goes (None) or sends
    a frame that does not decode (its error text)."""
    while True:
        raw = await _receive(websocket)
        if raw is None:
            return None
        try:
            frame = decode_input(raw)
        except ValueError as exc:
            return str(exc)
        if frame.stdin:
            execution.write(frame.data)
            await execution.stdin_room()
            if frame.close:
                execution.close_stdin()
        elif frame.tty_size is not None:
            execution.resize(*frame.tty_size)


async def _pump_output(websocket: WebSocket, execution: Execution) -> bool:
    """The command's frames to the client: True once the exit frame is sent,
    False when the client is gone."""
    frames = execution.frames
    while True:
        texts, last = await frames.get()
        if last and execution.broken is not None:
            # Docker's stdin rule broke the exec: its error takes the exit
            # frame's place, and that error ("closed pipe") drops the connection.
            return False
        if last:
            execution.exit_sent = True
        try:
            for text in texts:
                await websocket.send_text(text)
        except (RuntimeError, OSError, WebSocketDisconnect):
            return False
        execution.consumed(texts)
        if last:
            return True


async def bridge(websocket: WebSocket, execution: Execution) -> None:
    """Both directions at once, one task each, until one ends: the exit frame
    sent ends the exec without a close frame (Nomad closes the connection
    itself); a client gone detaches the command; a frame that does not decode
    ends it with 1011, output not sent by then dropped."""
    inbound = asyncio.ensure_future(_pump_input(websocket, execution))
    outbound = asyncio.ensure_future(_pump_output(websocket, execution))
    try:
        done, _ = await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
        if outbound in done:
            if not outbound.result():
                execution.detach()
            return
        outbound.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await outbound
        problem = inbound.result()
        execution.detach()
        if problem is not None:
            await close(websocket, 1011, problem)
    finally:
        for task in (inbound, outbound):
            task.cancel()
            with contextlib.suppress(
                asyncio.CancelledError, RuntimeError, OSError, WebSocketDisconnect
            ):
                await task


def exec_endpoint(sim: Simulator) -> Callable[[WebSocket], Awaitable[None]]:
    key = f"GET {EXEC_ROUTE}"

    async def endpoint(websocket: WebSocket) -> None:
        sim.requests[key] = sim.requests.get(key, 0) + 1
        if sim.faults.http_latency_ms:
            await asyncio.sleep(sim.faults.http_latency_ms / 1000)
        params = websocket.query_params
        try:
            args = parse_args(params)
        except ValueError as exc:
            await websocket.send_denial_response(PlainTextResponse(str(exc), status_code=500))
            return
        token = request_token(websocket.headers)
        await websocket.accept()
        if sim.stopped:
            return  # a stopping agent: the connection drops
        handshake = _first(params, "ws_handshake")
        if handshake:
            try:
                wanted = gojson.parse_bool(handshake)
            except ValueError as exc:
                await close(websocket, 1008, f"ws_handshake value is not a boolean: {exc}")
                return
            if wanted:
                raw = await _receive(websocket)
                if raw is None:
                    return
                try:
                    # The handshake's token replaces the header's, even when empty.
                    token = decode_handshake(raw)
                except ValueError as exc:
                    await close(websocket, 1008, str(exc))
                    return
        faults = sim.faults
        if faults.http_error_rate and sim.fault_rng.random() < faults.http_error_rate:
            await close(websocket, 1011, "No cluster leader")
            return
        alloc_id = websocket.path_params["alloc_id"]
        agent = sim.frontends.agent_of(websocket.scope)
        hop = sim.frontends.hop(agent, Kind.EXEC, alloc_node=_node_name(sim, alloc_id))
        server = hop.stream_to
        if server is not None and not sim.frontends.rpc.open_stream(server, agent.ip):
            return  # no close frame: the connection drops
        remote = None
        try:
            try:
                remote = sim.restarts.track_exec(_node_id(sim, alloc_id), agent, hop)
                execution = sim.alloc_endpoint.exec(
                    alloc_id, args.task, args.command, args.tty, token
                )
            except NomadError as exc:
                await close(websocket, ws_code(exc.status), exc.text)
                return
            served: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            sim.exec_streams.add(served)
            try:
                if await until_cut(remote, lambda: bridge(websocket, execution)):
                    # The node's agent restarted: a hop behind this one read
                    # EOF, and the exec ends as finished but with no exit
                    # frame; the command runs on in its container.
                    execution.detach()
                    await close(websocket, 1000, "")
            finally:
                sim.exec_streams.discard(served)
                served.set_result(None)
        finally:
            sim.restarts.forget(remote)
            if server is not None:
                sim.frontends.rpc.close_stream(server, agent.ip)

    return endpoint


def _node_id(sim: Simulator, alloc_id: str) -> str | None:
    alloc = sim.store.allocs.get(alloc_id)
    return alloc.node_id if alloc is not None else None


def _node_name(sim: Simulator, alloc_id: str) -> str | None:
    """The name of the node the allocation is on, if it is known."""
    alloc = sim.store.allocs.get(alloc_id)
    node = sim.store.nodes.get(alloc.node_id) if alloc is not None else None
    return node.name if node is not None else None


def not_upgraded_endpoint(sim: Simulator) -> Callable[[Request], Awaitable[Response]]:
    """The exec route asked without an upgrade: Nomad parses the arguments,
    then gorilla refuses the upgrade."""
    key = f"GET {EXEC_ROUTE}"

    async def endpoint(request: Request) -> Response:
        sim.requests[key] = sim.requests.get(key, 0) + 1
        try:
            parse_args(request.query_params)
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=500)
        return PlainTextResponse(NOT_UPGRADE, status_code=400)

    return endpoint
