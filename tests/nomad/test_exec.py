"""The exec client against a scripted Nomad (a websockets server playing the
frames Nomad sends): what it sends, how it reads exits and errors, and that a
connection ending without an exit frame is an error, never exit 0."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import websockets
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosedError
from websockets.http11 import Response

from controller.nomad.connection import NomadConnection
from controller.nomad.exec import (
    MERGE_BYTES,
    READ_HIGH_BYTES,
    ExecBroken,
    ExecClient,
    ExecError,
    ExecEvent,
    ExecForbidden,
    ExecRejected,
    ExecUnreachable,
    Exited,
    Output,
    StreamClosed,
    TaskNotRunning,
    UnknownAllocation,
    Utf8Streams,
    classify_close,
    merged,
    output_frame,
    parse_frame,
    read_frame,
)

Script = Callable[[ServerConnection], Awaitable[None]]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Nomad:
    """A WebSocket server running `script` for each connection; remembers requests."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Headers]] = []
        self.received: list[Any] = []
        self.script: Script = self.exit0
        self.refuse: tuple[int, str] | None = None

    async def exit0(self, ws: ServerConnection) -> None:
        await ws.send(json.dumps({"exited": True, "result": {}}))

    async def handler(self, ws: ServerConnection) -> None:
        await self.script(ws)

    def process_request(self, ws: ServerConnection, request: Any) -> Response | None:
        self.requests.append((request.path, request.headers))
        if self.refuse is not None:
            status, text = self.refuse
            return Response(status, "refused", Headers(), text.encode())
        return None


@pytest.fixture
async def nomad() -> AsyncIterator[tuple[Nomad, ExecClient]]:
    fake = Nomad()
    async with serve(fake.handler, "127.0.0.1", 0, process_request=fake.process_request) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        client = ExecClient(
            NomadConnection(address=f"http://127.0.0.1:{port}", token="secret", namespace="ns1")
        )
        yield fake, client


async def collect(
    client: ExecClient, command: list[str] | None = None, tty: bool = False
) -> list[ExecEvent]:
    async with client.session("alloc-1", "default-task", command or ["echo", "hi"], tty=tty) as s:
        return [event async for event in s.events()]


@pytest.mark.anyio
async def test_request_carries_task_command_tty_namespace_and_token(
    nomad: tuple[Nomad, ExecClient],
) -> None:
    fake, client = nomad
    assert await collect(client, ["/bin/bash", "-c", "echo 'a b'"], tty=True) == [Exited(0)]
    path, headers = fake.requests[0]
    parts = urlsplit(path)
    assert parts.path == "/v1/client/allocation/alloc-1/exec"
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert query == {
        "task": "default-task",
        "command": json.dumps(["/bin/bash", "-c", "echo 'a b'"]),
        "tty": "true",
        "namespace": "ns1",
    }
    assert headers.get("X-Nomad-Token") == "secret"
    assert headers.get("Origin") is None


@pytest.mark.anyio
async def test_output_close_frames_and_exit_code(nomad: tuple[Nomad, ExecClient]) -> None:
    fake, client = nomad

    async def script(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"stdout": {"data": b64(b"out")}}))
        await ws.send(json.dumps({}))  # a heartbeat: nothing
        await ws.send(json.dumps({"stderr": {"data": b64(b"err")}}))
        await ws.send(json.dumps({"stdout": {"close": True}}))
        await ws.send(json.dumps({"stderr": {"close": True}}))
        await ws.send(json.dumps({"exited": True, "result": {"exit_code": 3}}))

    fake.script = script
    assert await collect(client) == [
        Output("stdout", b"out"),
        Output("stderr", b"err"),
        StreamClosed("stdout"),
        StreamClosed("stderr"),
        Exited(3),
    ]


@pytest.mark.anyio
async def test_the_exit_frame_is_final_even_when_the_connection_drops(
    nomad: tuple[Nomad, ExecClient],
) -> None:
    fake, client = nomad

    async def script(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"exited": True, "result": {}}))
        ws.transport.abort()  # Nomad drops the connection without a close frame

    fake.script = script
    assert await collect(client) == [Exited(0)]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "ending",
    ["abort", "close-1000", "close-1006-like"],
)
async def test_no_exit_frame_is_an_error_never_exit_0(
    nomad: tuple[Nomad, ExecClient], ending: str
) -> None:
    fake, client = nomad

    async def script(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"stdout": {"data": b64(b"partial")}}))
        if ending == "abort":
            ws.transport.abort()
        elif ending == "close-1000":
            await ws.close(1000)
        else:
            await ws.close(1001)

    fake.script = script
    events: list[ExecEvent] = []

    async def read() -> None:
        async with client.session("alloc-1", "default-task", ["true"]) as s:
            async for event in s.events():
                events.append(event)

    with pytest.raises(ExecError):
        await read()
    assert events == [Output("stdout", b"partial")]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("code", "reason", "kind"),
    [
        (1008, 'Unknown allocation "alloc-1"', UnknownAllocation),
        (1008, 'task "default-task" not started yet.', TaskNotRunning),
        (1008, 'task "default-task" is not running.', TaskNotRunning),
        (1011, "Permission denied", ExecForbidden),  # Nomad sends it without a code: 500
        (1008, "exec not possible, client status of allocation a1 is complete", TaskNotRunning),
        (1008, "must provide task name", ExecRejected),
        (1011, "rpc error: something broke", ExecRejected),
    ],
)
async def test_close_reasons_become_typed_errors(
    nomad: tuple[Nomad, ExecClient], code: int, reason: str, kind: type[ExecError]
) -> None:
    fake, client = nomad

    async def script(ws: ServerConnection) -> None:
        await ws.close(code, reason)

    fake.script = script
    with pytest.raises(kind) as raised:
        await collect(client)
    assert (raised.value.code, raised.value.reason) == (code, reason)


@pytest.mark.anyio
async def test_an_http_refusal_before_the_upgrade(nomad: tuple[Nomad, ExecClient]) -> None:
    fake, client = nomad
    fake.refuse = (500, "failed to parse command")
    with pytest.raises(ExecRejected) as raised:
        await collect(client)
    assert (raised.value.code, raised.value.reason) == (500, "failed to parse command")


@pytest.mark.anyio
async def test_a_connection_reset_before_the_upgrade_is_unreachable(
    nomad: tuple[Nomad, ExecClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an agent restarting does to a connection it had just accepted:
    websockets finds it closed when it sends the request (chaos seed 143
    met it as an unhandled error in a download)."""
    _, client = nomad

    async def reset(*args: Any, **kwargs: Any) -> None:
        raise ConnectionClosedError(None, None, None)

    monkeypatch.setattr(websockets, "connect", reset)
    with pytest.raises(ExecUnreachable):
        await collect(client)


@pytest.mark.anyio
async def test_nomad_unreachable_is_broken() -> None:
    client = ExecClient(address="http://127.0.0.1:9", connect_timeout_s=2)
    with pytest.raises(ExecBroken):
        await collect(client)


@pytest.mark.anyio
async def test_stdin_close_and_heartbeats_are_sent(nomad: tuple[Nomad, ExecClient]) -> None:
    fake, _ = nomad
    got: list[Any] = []

    async def script(ws: ServerConnection) -> None:
        while True:
            frame = json.loads(await ws.recv())
            got.append(frame)
            if frame.get("stdin", {}).get("close"):
                break
        await ws.send(json.dumps({"exited": True, "result": {}}))

    fake.script = script
    client = ExecClient(address=_address(nomad[1]), heartbeat_s=0.05)
    async with client.session("a", "t", ["cat"]) as s:
        await s.send(b"line\n")
        await s.send(b"")  # nothing is sent for nothing
        await asyncio.sleep(0.12)
        await s.resize(24, 80)
        await s.close_stdin()
        assert [e async for e in s.events()] == [Exited(0)]
    assert got[0] == {"stdin": {"data": b64(b"line\n")}}
    assert {} in got, "heartbeats"
    assert {"tty_size": {"height": 24, "width": 80}} in got
    assert got[-1] == {"stdin": {"close": True}}


@pytest.mark.anyio
async def test_after_the_exit_events_yield_nothing_and_closing_never_raises(
    nomad: tuple[Nomad, ExecClient],
) -> None:
    """What tests/support/exec_fake.py's sessions copy."""
    _, client = nomad
    session = await client.open("alloc-1", "default-task", ["true"])
    assert [e async for e in session.events()] == [Exited(0)]
    assert [e async for e in session.events()] == []
    await session.close_stdin()
    await session.close()
    await session.close()


@pytest.mark.anyio
async def test_a_session_closed_while_read_breaks_and_takes_no_input(
    nomad: tuple[Nomad, ExecClient],
) -> None:
    """What tests/support/exec_fake.py's sessions copy: the command keeps
    running (Nomad sends nothing), the client closes its side."""
    fake, client = nomad

    async def silent(ws: ServerConnection) -> None:
        await ws.wait_closed()

    fake.script = silent
    session = await client.open("alloc-1", "default-task", ["sleep", "inf"])
    reader = asyncio.ensure_future(anext(aiter(session.events())))
    await session.close()
    with pytest.raises(ExecBroken):
        await reader
    with pytest.raises(ExecBroken):
        await session.send(b"input")
    await session.close_stdin()


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        # The connection's own state: nothing signals it.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    assert condition(), what


def _output(n: int, stream: str = "stdout") -> str:
    return json.dumps({stream: {"data": b64(bytes([65 + n % 26]) * 1024)}})


@pytest.mark.anyio
async def test_the_output_of_one_read_is_handed_on_as_few_events_whole_and_in_order(
    nomad: tuple[Nomad, ExecClient],
) -> None:
    """Forty frames of 1 KiB that wait together come out as a few events (of
    16 KiB at most each): what follows Nomad's frames costs per event, not
    per frame. A frame of the other stream is not merged across."""
    fake, client = nomad
    frames = [_output(n) for n in range(20)] + [_output(0, "stderr")]
    frames += [_output(n) for n in range(20, 40)]
    frames.append(json.dumps({"exited": True, "result": {"exit_code": 2}}))

    async def script(ws: ServerConnection) -> None:
        for frame in frames:
            await ws.send(frame)

    fake.script = script
    wire = sum(len(f) for f in frames)
    assert wire < READ_HIGH_BYTES
    async with client.session("alloc-1", "default-task", ["yes"]) as session:
        await _until(lambda: session.held == wire, "every frame received")
        events = [event async for event in session.events()]

    def stdout(numbers: range) -> bytes:
        return b"".join(bytes([65 + n % 26]) * 1024 for n in numbers)

    assert len(events) <= 10, f"{len(events)} events for 42 frames"
    assert events[-1] == Exited(2)
    outputs = [e for e in events[:-1] if isinstance(e, Output)]
    assert len(outputs) == len(events) - 1
    streams = [e.stream for e in outputs]
    cut = streams.index("stderr")
    assert streams == ["stdout"] * cut + ["stderr"] + ["stdout"] * (len(streams) - cut - 1)
    assert b"".join(e.data for e in outputs[:cut]) == stdout(range(20))
    assert outputs[cut].data == b"A" * 1024
    assert b"".join(e.data for e in outputs[cut + 1 :]) == stdout(range(20, 40))
    assert max(len(e.data) for e in outputs) <= MERGE_BYTES


@pytest.mark.anyio
async def test_a_reader_that_does_not_read_pauses_reading_from_nomad(
    nomad: tuple[Nomad, ExecClient],
) -> None:
    """Backpressure: while more than READ_HIGH_BYTES of frames wait, nothing
    more is read from the socket (TCP then holds Nomad back); once taken,
    reading goes on and every byte arrives, in order."""
    fake, client = nomad
    count = 4_000  # 4 MiB of output, 5.5 MiB of frames

    async def script(ws: ServerConnection) -> None:
        for n in range(count):
            await ws.send(_output(n))
        await ws.send(json.dumps({"exited": True, "result": {}}))

    fake.script = script
    async with client.session("alloc-1", "default-task", ["yes"]) as session:
        await _until(lambda: session.held > READ_HIGH_BYTES, "the high mark reached")
        transport = session._ws.transport  # what the pause acts on
        assert not transport.is_reading()
        # One read from the socket at most past the mark (asyncio: 256 KiB).
        assert session.held <= READ_HIGH_BYTES + 256 * 1024 + 2048
        received = b""
        async for event in session.events():
            if isinstance(event, Output):
                received += event.data
    assert received == b"".join(bytes([65 + n % 26]) * 1024 for n in range(count))


@pytest.mark.parametrize(
    ("events", "limit", "expected"),
    [
        ([], 8, []),
        ([Exited(0)], 8, [Exited(0)]),
        (
            [Output("stdout", b"ab"), Output("stdout", b"cd"), Exited(1)],
            8,
            [Output("stdout", b"abcd"), Exited(1)],
        ),
        (
            [Output("stdout", b"ab"), Output("stderr", b"x"), Output("stdout", b"cd")],
            8,
            [Output("stdout", b"ab"), Output("stderr", b"x"), Output("stdout", b"cd")],
        ),
        (
            [Output("stdout", b"abcd"), Output("stdout", b"efgh"), Output("stdout", b"ij")],
            4,
            [Output("stdout", b"abcd"), Output("stdout", b"efgh"), Output("stdout", b"ij")],
        ),
        (
            [Output("stdout", b"ab"), Output("stdout", b"cd"), Output("stdout", b"ef")],
            3,
            [Output("stdout", b"abcd"), Output("stdout", b"ef")],
        ),
        (
            [Output("stdout", b"a"), StreamClosed("stdout"), Output("stderr", b"b")],
            8,
            [Output("stdout", b"a"), StreamClosed("stdout"), Output("stderr", b"b")],
        ),
    ],
)
def test_merged_joins_runs_of_one_stream_up_to_the_limit(
    events: list[ExecEvent], limit: int, expected: list[ExecEvent]
) -> None:
    assert list(merged(events, limit)) == expected


def test_merged_hands_on_the_output_before_a_frame_that_fails() -> None:
    def frames() -> Any:
        yield Output("stdout", b"a")
        yield Output("stdout", b"b")
        raise ExecRejected("Nomad sent a frame that is not JSON")

    got: list[ExecEvent] = []

    def drain() -> None:
        got.extend(merged(frames()))

    with pytest.raises(ExecRejected):
        drain()
    assert got == [Output("stdout", b"ab")]


def _address(client: ExecClient) -> str:
    return client.url("x", "t", [], False).split("/v1/")[0].replace("ws://", "http://")


@pytest.mark.parametrize(
    ("raw", "events"),
    [
        ('{"exited":true,"result":{}}', [Exited(0)]),
        ('{"exited":true}', [Exited(0)]),
        ('{"exited":true,"result":{"exit_code":137}}', [Exited(137)]),
        ("{}", []),
        ('{"stdout":{"data":""}}', []),
        ('{"stdout":{"data":"aGk="}}', [Output("stdout", b"hi")]),
        ('{"stderr":{"close":true}}', [StreamClosed("stderr")]),
        ('{"somethingNew":1}', []),
    ],
)
def test_parse_frame(raw: str, events: list[ExecEvent]) -> None:
    assert parse_frame(raw) == events


@pytest.mark.parametrize("raw", ["not json", "[1]", '{"stdout":{"data":"!!!"}}'])
def test_parse_frame_rejects_what_is_not_nomad(raw: str) -> None:
    with pytest.raises(ExecRejected):
        parse_frame(raw)


# -- output frames as Nomad writes them take a short way ------------------------------


def reading(read: Callable[[str], list[ExecEvent]], raw: str) -> list[ExecEvent] | str:
    """The events of a frame, or the text of its rejection."""
    try:
        return read(raw)
    except ExecRejected as exc:
        return f"rejected: {exc.reason}"


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        ('{"stdout":{"data":"aGk="}}', True),
        ('{"stderr":{"data":"aGk="}}', True),
        ('{"stdout":{"data":"/+8A"}}', True),
        ('{"stdout":{"data":"aGl="}}', True),  # trailing bits set: Go and Python agree
        ('{"stdout":{"data":""}}', False),  # no data, no event
        ('{"stdout":{"data":"aGk"}}', False),  # padding missing: not base64
        ('{"stdout":{"data":"QQ==QQ=="}}', False),  # padding inside
        ('{"stdout":{"data":"a Gk="}}', False),
        ('{"stdout":{"data":"aGk=\\n"}}', False),  # an escape in the string
        ('{"stdout":{"data":"a\\u0047k="}}', False),
        ('{"stdout":{"data":"aGké"}}', False),
        ('{"stdout": {"data": "aGk="}}', False),  # not as Nomad spaces it
        ('{"stdout":{"data":"aGk="}} ', False),
        ('{"stdout":{"data":"aGk=","close":true}}', False),
        ('{"stdout":{"data":"aGk="},"exited":true}', False),
        ('{"stdout":{"data":"aGk="}}}', False),  # not JSON
        ('{"stdout":{"data":"aGk="]}', False),
        ('{"stdout":{"data":"aGk=xyz', False),
        ('{"stdout":{"data":"aG"}}{"stdout":{"data":"k="}}', False),  # two values
        ('{"stdout":{"data":"}}', False),  # head and tail overlap
        ('{"stdin":{"data":"aGk="}}', False),
        ('{"Stdout":{"data":"aGk="}}', False),
    ],
)
def test_output_frames_as_nomad_writes_them_take_the_short_way(raw: str, short: bool) -> None:
    output = output_frame(raw)
    assert (output is not None) == short
    if output is not None:
        assert [output] == read_frame(raw)
    assert reading(parse_frame, raw) == reading(read_frame, raw)


@settings(max_examples=300, deadline=None)
@given(
    stream=st.sampled_from(["stdout", "stderr"]),
    data=st.binary(min_size=1, max_size=1024),
    edit=st.tuples(
        st.integers(min_value=0),
        st.sampled_from(["", '"', "\\", "=", "A", "}", "]", " "]),
        st.booleans(),
    ),
)
def test_the_short_way_reads_what_the_json_decoder_reads(
    stream: str, data: bytes, edit: tuple[int, str, bool]
) -> None:
    raw = json.dumps({stream: {"data": b64(data)}}, separators=(",", ":"))
    assert output_frame(raw) == Output(stream, data)  # type: ignore[arg-type]
    # One character put in or replaced anywhere: the same events, or the same rejection.
    at, char, replace = edit[0] % (len(raw) + 1), edit[1], edit[2]
    changed = raw[:at] + char + raw[at + replace :]
    assert reading(parse_frame, changed) == reading(read_frame, changed)


def test_classify_close() -> None:
    assert isinstance(classify_close(1006, ""), ExecBroken)
    assert isinstance(classify_close(1000, ""), ExecBroken)
    assert isinstance(classify_close(1008, "Permission denied"), ExecForbidden)
    assert isinstance(classify_close(4000, ""), ExecRejected)


def test_utf8_streams_keep_split_characters_whole() -> None:
    streams = Utf8Streams()
    euro = "€".encode()
    assert streams.decode("stdout", euro[:1]) == ""
    assert streams.decode("stderr", b"x") == "x"
    assert streams.decode("stdout", euro[1:]) == "€"
    assert streams.decode("stdout", euro[:2]) == ""
    assert streams.flush("stdout") == "\ufffd"


# -- TLS, from the same NOMAD_* settings as the rest of the gateway -----------------------


@pytest.fixture
async def tls_nomad(tmp_path: Any) -> AsyncIterator[tuple[str, Any, str]]:
    """A scripted Nomad on wss:// with a certificate of a throw-away CA that
    also demands a client certificate (mutual TLS)."""
    import ssl

    import trustme

    ca = trustme.CA()
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ssl)
    ca.configure_trust(server_ssl)
    server_ssl.verify_mode = ssl.CERT_REQUIRED
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client = ca.issue_cert("nomad-runner-controller")
    cert_file, key_file = tmp_path / "client.pem", tmp_path / "client-key.pem"
    client.cert_chain_pems[0].write_to_path(str(cert_file))
    client.private_key_pem.write_to_path(str(key_file))
    fake = Nomad()
    async with serve(fake.handler, "127.0.0.1", 0, ssl=server_ssl) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"https://127.0.0.1:{port}", (str(cert_file), str(key_file)), str(ca_file)


@pytest.mark.anyio
async def test_mutual_tls_with_the_nomad_ca(tls_nomad: tuple[str, Any, str]) -> None:
    address, (cert, key), ca = tls_nomad
    client = ExecClient(NomadConnection(address, ca_cert=ca, client_cert=cert, client_key=key))
    assert client.url("a", "t", ["true"], False).startswith("wss://127.0.0.1:")
    assert await collect(client) == [Exited(0)]
    unverified = ExecClient(
        NomadConnection(address, client_cert=cert, client_key=key, verify=False)
    )
    assert await collect(unverified) == [Exited(0)]  # NOMAD_SKIP_VERIFY


@pytest.mark.anyio
async def test_tls_refuses_an_unknown_ca_and_a_missing_client_certificate(
    tls_nomad: tuple[str, Any, str],
) -> None:
    address, (cert, key), ca = tls_nomad
    with pytest.raises(ExecBroken):  # the server's certificate is not trusted
        await collect(ExecClient(NomadConnection(address, client_cert=cert, client_key=key)))
    with pytest.raises(ExecBroken):  # no client certificate
        await collect(ExecClient(NomadConnection(address, ca_cert=ca)))
