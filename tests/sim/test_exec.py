"""Allocation exec against the simulator: Nomad's WebSocket frames and
errors, and the raw_exec-like driver that really runs the commands (a fresh
directory per task start, processes killed with their task, none left when
the simulator stops)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psutil
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from nomadsim import SimConfig, SimServer, gojson
from nomadsim.alloc_exec import InputFrame, decode_input, read_input, stdin_data
from nomadsim.driver import FRAME_SIZE, data_frames, marked_processes
from tests.helpers import SECOND, Http, runner_job, wait_until
from tests.support.sim import FAST

TASK = "default-task"


def exec_url(
    server: SimServer,
    alloc_id: str,
    command: list[str] | str,
    tty: bool | str = False,
    task: str = TASK,
    **extra: str,
) -> str:
    params = {
        "task": task,
        "command": command if isinstance(command, str) else json.dumps(command),
        "tty": str(tty).lower() if isinstance(tty, bool) else tty,
        **extra,
    }
    return f"ws://127.0.0.1:{server.port}/v1/client/allocation/{alloc_id}/exec?{urlencode(params)}"


@dataclass
class Result:
    frames: list[str] = field(default_factory=list)

    def parsed(self) -> list[dict[str, Any]]:
        return [json.loads(f) for f in self.frames]

    def data(self, stream: str) -> bytes:
        return b"".join(
            base64.b64decode(f[stream]["data"])
            for f in self.parsed()
            if "data" in f.get(stream, {})
        )

    @property
    def exit_code(self) -> int:
        code: int = self.parsed()[-1]["result"].get("exit_code", 0)
        return code


class Session:
    """One exec: send Nomad's input frames, read its output frames."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        # Entered as its context manager would be (websockets 17.1 deprecates
        # a bare connect()); the server's drop, or the test, closes it.
        self.ws: ClientConnection = connect(
            url, additional_headers=headers, open_timeout=5
        ).__enter__()
        self.result = Result()

    def send(self, frame: dict[str, Any]) -> None:
        self.ws.send(json.dumps(frame))

    def stdin(self, data: bytes) -> None:
        self.send({"stdin": {"data": base64.b64encode(data).decode()}})

    def close_stdin(self) -> None:
        self.send({"stdin": {"close": True}})

    def read_until(self, wanted: bytes, stream: str = "stdout") -> None:
        """Read frames until the stream's output so far contains `wanted`."""
        while wanted not in self.result.data(stream):
            self.result.frames.append(str(self.ws.recv(timeout=5)))

    def finish(self) -> Result:
        """Read to the exit frame; then the connection drops without a close frame."""
        while not self.result.frames or '"exited"' not in self.result.frames[-1]:
            self.result.frames.append(str(self.ws.recv(timeout=5)))
        with pytest.raises(ConnectionClosedError) as closed:
            self.ws.recv(timeout=5)
        assert closed.value.rcvd is None  # 1006: no close frame
        return self.result


def run(server: SimServer, alloc_id: str, command: list[str], tty: bool = False) -> Result:
    return Session(exec_url(server, alloc_id, command, tty)).finish()


def refused(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """The close frame an exec ends with before any output."""
    with (
        connect(url, additional_headers=headers, open_timeout=5) as ws,
        pytest.raises(ConnectionClosedError) as closed,
    ):
        ws.recv(timeout=5)
    assert closed.value.rcvd is not None, "expected a close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def processes(server: SimServer, alloc_id: str) -> list[int]:
    return server.call(lambda: server.sim.exec_processes(alloc_id))


def wait_for_processes(server: SimServer, alloc_id: str, n: int) -> list[int]:
    def found() -> list[int]:
        pids = processes(server, alloc_id)
        return pids if len(pids) == n else []

    return wait_until(found)


def task_dir(server: SimServer, alloc_id: str) -> Path | None:
    return server.call(lambda: server.sim.task_dir(alloc_id))


def start_job(
    server: SimServer, job_id: str = "exec", count: int = 1, token: str = "", **kw: Any
) -> list[str]:
    http = Http(server.address)
    if token:
        http.session.headers["X-Nomad-Token"] = token
    http.register(runner_job(job_id, count=count, **kw))
    return [a["ID"] for a in http.running(job_id, count)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[SimServer, list[str]]]:
    """One simulator with two running allocations, for tests that only exec."""
    config: dict[str, Any] = dict(FAST)
    server = SimServer(SimConfig(**config))
    server.start()
    try:
        yield server, start_job(server, count=2)
    finally:
        server.stop()


@pytest.fixture
def one(cluster: tuple[SimServer, list[str]]) -> tuple[SimServer, str]:
    server, allocs = cluster
    return server, allocs[0]


# -- frames --------------------------------------------------------------------------


def test_echo_ends_with_close_frames_then_exit_zero_then_a_drop(one: tuple[SimServer, str]):
    server, alloc_id = one
    result = run(server, alloc_id, ["echo", "hi"])
    assert result.frames[0] == '{"stdout":{"data":"aGkK"}}'
    assert sorted(result.frames[1:3]) == ['{"stderr":{"close":true}}', '{"stdout":{"close":true}}']
    assert result.frames[3:] == ['{"exited":true,"result":{}}']  # exit code 0 is omitted


@pytest.mark.parametrize(
    ("script", "code"), [("exit 1", 1), ("kill -9 $$", 137), ("exit 255", 255)]
)
def test_exit_codes_and_death_by_signal(one: tuple[SimServer, str], script: str, code: int):
    server, alloc_id = one
    result = run(server, alloc_id, ["sh", "-c", script])
    assert result.frames[-1] == f'{{"exited":true,"result":{{"exit_code":{code}}}}}'


def test_without_tty_stdout_and_stderr_stay_apart(one: tuple[SimServer, str]):
    server, alloc_id = one
    result = run(server, alloc_id, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.data("stdout"), result.data("stderr"), result.exit_code) == (
        b"out\n",
        b"err\n",
        3,
    )
    # Each stream's data comes before its close frame, the exit frame last.
    for stream in ("stdout", "stderr"):
        kinds = [next(iter(f[stream])) for f in result.parsed() if stream in f]
        assert kinds[-1] == "close" and kinds.count("close") == 1


def test_tty_merges_stderr_and_turns_newlines_into_crlf(one: tuple[SimServer, str]):
    server, alloc_id = one
    result = run(server, alloc_id, ["sh", "-c", "echo out; echo err >&2"], tty=True)
    assert result.data("stdout") == b"out\r\nerr\r\n"
    assert not [f for f in result.parsed() if "stderr" in f]
    assert result.frames[-2:] == ['{"stdout":{"close":true}}', '{"exited":true,"result":{}}']


def test_tty_echoes_input_and_stdin_close_is_the_eof_character(one: tuple[SimServer, str]):
    server, alloc_id = one
    session = Session(exec_url(server, alloc_id, ["cat"], tty=True))
    session.stdin(b"hello\n")
    session.read_until(b"hello\r\nhello\r\n")  # the terminal's echo, then cat's copy
    session.close_stdin()
    assert session.finish().exit_code == 0


def test_tty_ctrl_backslash_is_sigquit(one: tuple[SimServer, str]):
    server, alloc_id = one
    before = set(processes(server, alloc_id))
    session = Session(exec_url(server, alloc_id, ["bash", "-c", "exec sleep 30"], tty=True))

    def sleeping() -> bool:
        # Once bash has become sleep (a shell about to exec may ignore SIGQUIT)
        # holding the terminal as its own (a VQUIT typed before that reaches
        # nobody): this session's process, not any other sleep of the allocation.
        for pid in set(processes(server, alloc_id)) - before:
            with contextlib.suppress(psutil.NoSuchProcess):
                process = psutil.Process(pid)
                if process.cmdline() == ["sleep", "30"] and process.terminal() is not None:
                    return os.getsid(pid) == pid
        return False

    wait_until(sleeping)
    session.stdin(b"\x1c")  # the terminal's VQUIT: SIGQUIT to the foreground group
    assert session.finish().exit_code == 128 + 3


@pytest.mark.parametrize(
    ("command", "stdin", "out"),
    [(["head", "-n", "1"], b"first\nsecond\n", b"first\n"), (["cat"], b"abc", b"abc")],
)
def test_stdin_close_is_end_of_file(
    one: tuple[SimServer, str], command: list[str], stdin: bytes, out: bytes
):
    server, alloc_id = one
    session = Session(exec_url(server, alloc_id, command))
    session.stdin(stdin)
    session.close_stdin()
    result = session.finish()
    assert (result.data("stdout"), result.exit_code) == (out, 0)


def test_large_output_arrives_in_frames_of_at_most_1024_bytes(one: tuple[SimServer, str]):
    server, alloc_id = one
    result = run(server, alloc_id, ["sh", "-c", "yes abcdefghi | head -c 5000"])
    chunks = [
        base64.b64decode(f["stdout"]["data"])
        for f in result.parsed()
        if "data" in f.get("stdout", {})
    ]
    assert b"".join(chunks) == (b"abcdefghi\n" * 500)
    assert len(chunks) >= 5 and max(len(c) for c in chunks) <= 1024


def test_input_and_output_larger_than_the_pipes_flow_through(one: tuple[SimServer, str]):
    server, alloc_id = one
    session = Session(exec_url(server, alloc_id, ["sh", "-c", "wc -c; head -c 300000 /dev/zero"]))
    for _ in range(8):
        session.stdin(b"x" * 65536)
    session.close_stdin()
    result = session.finish()
    out = result.data("stdout")
    assert out[:7].strip() == b"524288" and out.count(b"\0") == 300_000


def test_heartbeats_are_ignored_and_tty_size_resizes_the_terminal(one: tuple[SimServer, str]):
    server, alloc_id = one
    session = Session(exec_url(server, alloc_id, ["sh", "-c", "read x; stty size"], tty=True))
    session.send({})
    session.send({"tty_size": {"height": 40, "width": 100}})
    session.send({})
    session.stdin(b"\n")
    result = session.finish()
    assert b"40 100\r\n" in result.data("stdout") and result.exit_code == 0


def test_a_frame_that_does_not_decode_ends_with_1011_and_gos_text(one: tuple[SimServer, str]):
    server, alloc_id = one
    session = Session(exec_url(server, alloc_id, ["sleep", "5"]))
    session.ws.send("{nope")
    with pytest.raises(ConnectionClosedError) as closed:
        session.ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
        1011,
        "invalid character 'n' looking for beginning of object key string",
    )


@pytest.mark.parametrize("size", [1, 1023, 1024, 1025, 65536])
def test_a_read_is_cut_into_frames_of_1024_bytes_as_nomads_reads_give(size: int):
    data = os.urandom(size)
    frames = data_frames("stderr", data)
    chunks = [base64.b64decode(json.loads(f)["stderr"]["data"]) for f in frames]
    assert b"".join(chunks) == data
    assert [len(c) for c in chunks[:-1]] == [FRAME_SIZE] * (len(chunks) - 1)
    assert 0 < len(chunks[-1]) <= FRAME_SIZE
    first = {"stderr": {"data": base64.b64encode(data[:FRAME_SIZE]).decode()}}
    assert frames[0] == json.dumps(first, separators=(",", ":"))


# -- input frames: the short way, and Go's reading of everything else ---------------


def reading(read: Callable[[str | bytes], InputFrame], raw: str | bytes) -> InputFrame | str:
    """The frame as read, or Go's error text."""
    try:
        return read(raw)
    except ValueError as exc:
        return f"error: {exc}"


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        ('{"stdin":{"data":"aGk="}}', True),  # as Nomad's CLI writes it
        ('{"stdin": {"data": "aGk="}}', True),  # as Python's json.dumps does
        ('\t{ "stdin" :\n{ "data" :\r"aGk=" } } \n', True),
        ('{"stdin":{"data":""}}', True),
        ('{"stdin":{"data":"aGl="}}', True),  # trailing bits set: Go takes it
        ('{"stdin":{"data":"aGk"}}', False),  # Go's base64 error
        ('{"stdin":{"data":"aGk=\\n"}}', False),  # Go skips the newline
        ('{"stdin":{"data":"aGk\\u003d"}}', False),
        ('{"stdin":{"data":"aGké"}}', False),
        ('{"stdin":{"data":"aGk=","close":true}}', False),
        ('{"stdin":{"close":true,"data":"aGk="}}', False),
        ('{"Stdin":{"data":"aGk="}}', False),  # Go matches keys in any case
        ('{"stdin":{"data":"aGk="},"stdin":{"data":"b2s="}}', False),  # the last wins
        ('{"stdin":{"data":"aGk="}}{"nope"', False),  # Go reads the first value only
        ('{"stdin":{"data":"aGk="}}\x0b', False),
        ('{"stdin":{"data":"aGk="}', False),  # unexpected EOF
        ('{"stdin":{"data":"aGk="}}}', False),
        ('{"tty_size":{"height":40,"width":100}}', False),
        ("{}", False),
        (b'{"stdin":{"data":"aGk="}}', False),  # a binary message
    ],
)
def test_input_frames_as_clients_write_them_take_the_short_way(raw: str | bytes, short: bool):
    frame = stdin_data(raw)
    assert (frame is not None) == short
    if frame is not None:
        assert frame == read_input(raw)
    assert reading(decode_input, raw) == reading(read_input, raw)


SPACE = st.text(alphabet=" \t\n\r", max_size=2)


@settings(max_examples=300, deadline=None)
@given(
    spaces=st.lists(SPACE, min_size=10, max_size=10),
    keys=st.tuples(st.sampled_from(["stdin", "Stdin"]), st.sampled_from(["data", "Data", "close"])),
    data=st.binary(max_size=100),
    edit=st.tuples(
        st.integers(min_value=0),
        st.sampled_from(["", '"', "\\", "=", "A", "}", "]", "\n", "\x0b"]),
        st.booleans(),
    ),
)
def test_the_short_way_reads_what_gos_decoder_reads(
    spaces: list[str], keys: tuple[str, str], data: bytes, edit: tuple[int, str, bool]
):
    value = base64.b64encode(data).decode()
    tokens = ["{", f'"{keys[0]}"', ":", "{", f'"{keys[1]}"', ":", f'"{value}"', "}", "}", ""]
    raw = "".join(space + token for space, token in zip(spaces, tokens, strict=True))
    if keys == ("stdin", "data"):
        assert stdin_data(raw) == InputFrame(stdin=True, data=data)
    # One character put in or replaced anywhere: the same frame, or the same error.
    at, char, replace = edit[0] % (len(raw) + 1), edit[1], edit[2]
    for frame in (raw, raw[:at] + char + raw[at + replace :]):
        short = stdin_data(frame)
        if short is not None:
            assert short == read_input(frame)
        assert reading(decode_input, frame) == reading(read_input, frame)


def scanned(data: bytes) -> tuple[int | None, str | None]:
    """Go's scanner fed every byte of a message, one at a time, as a
    json.Decoder does: where its first value ends (None: it does not) and the
    syntax error that stops it first."""
    scanner = gojson._Scanner()
    step: gojson.Step = scanner.begin_value
    for i, c in enumerate(data):
        if scanner.ended():
            return i, None
        try:
            step = step(c)
        except gojson.GoSyntaxError as exc:
            return (i, None) if scanner.ended() else (None, str(exc))
    with contextlib.suppress(gojson.GoSyntaxError):
        step(ord(" "))  # the end of the input completes a bare number
    return (len(data), None) if scanner.ended() else (None, None)


def checked(data: bytes) -> str | None:
    """Go's scanner fed every byte, as json.Unmarshal's check does: its error."""
    scanner = gojson._Scanner()
    step: gojson.Step = scanner.begin_value
    try:
        for c in data:
            step = step(c)
        if not scanner.ended():
            step(ord(" "))
    except gojson.GoSyntaxError as exc:
        return str(exc)
    return None if scanner.ended() else "unexpected end of JSON input"


# Bytes of JSON text, and a string's own: escapes, quotes, control and UTF-8 bytes.
JSON_BYTES = st.sampled_from([*b'{}[]":,\\ \n0123456789-.eEtrufalsn', 0x01, 0xC3, 0xA9, 0xFF])
STRING_BYTES = st.sampled_from([*b'"\\ubfnrt/0aF9 ', 0x00, 0x1F, 0x7F, 0xC3, 0xA9, 0xFF])


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.lists(JSON_BYTES, max_size=40).map(bytes),
        st.tuples(st.lists(STRING_BYTES, max_size=20), st.lists(JSON_BYTES, max_size=4)).map(
            lambda parts: b'["' + bytes(parts[0]) + b'",1]' + bytes(parts[1])
        ),
    )
)
def test_the_scanner_skips_plain_string_bytes_without_changing_its_reading(data: bytes):
    def outcome(read: Callable[[bytes], Any]) -> tuple[str, Any]:
        try:
            return "value", read(data)
        except gojson.GoSyntaxError as exc:
            return "error", str(exc)

    end, error = scanned(data)
    if end is None:
        assert outcome(gojson.loads_message) == ("error", error or "unexpected EOF")
    else:
        text = data[:end].decode("utf-8", "replace")
        value = json.loads(text, parse_int=gojson.Number, parse_float=gojson.Number)
        assert outcome(gojson.loads_message) == ("value", value)
    error = checked(data)
    assert outcome(gojson.check_syntax) == (("value", None) if error is None else ("error", error))


# -- errors --------------------------------------------------------------------------


MARSHAL = "failed to marshal command into json: "
UNMARSHAL = "json: cannot unmarshal "
PARSE_BOOL = "strconv.ParseBool: parsing "
NOT_BOOL = "tty value is not a boolean: "


@pytest.mark.parametrize(
    ("command", "tty", "text"),
    [
        ("", "false", MARSHAL + "unexpected end of JSON input"),
        ("ls", "false", MARSHAL + "invalid character 'l' looking for beginning of value"),
        ("[1", "false", MARSHAL + "unexpected end of JSON input"),
        ('"ls"', "false", MARSHAL + UNMARSHAL + "string into Go value of type []string"),
        ('["ls", 1]', "false", MARSHAL + UNMARSHAL + "number into Go value of type string"),
        ('["ls"]', "maybe", NOT_BOOL + PARSE_BOOL + '"maybe": invalid syntax'),
    ],
)  # fmt: skip
def test_bad_command_or_tty_is_http_500_before_the_upgrade(
    one: tuple[SimServer, str], command: str, tty: str, text: str
):
    server, alloc_id = one
    with pytest.raises(InvalidStatus) as denied:
        connect(exec_url(server, alloc_id, command, tty), open_timeout=5)
    assert denied.value.response.status_code == 500
    assert denied.value.response.body.decode() == text


def test_without_an_upgrade_the_route_answers_as_gorilla_refuses(one: tuple[SimServer, str]):
    server, alloc_id = one
    url = exec_url(server, alloc_id, ["ls"]).replace("ws://", "http://")
    reply = requests.get(url, timeout=5)
    assert reply.status_code == 400
    assert reply.text.endswith("'upgrade' token not found in 'Connection' header")
    bad = requests.get(url.replace("tty=false", "tty=x"), timeout=5)
    assert bad.status_code == 500 and bad.text.startswith("tty value is not a boolean")


START = "rpc error: code = Unknown desc = failed to start command: "


@pytest.mark.parametrize(
    ("alloc", "task", "command", "code", "reason"),
    [
        ("nope", TASK, ["ls"], 1008, 'Unknown allocation "nope"'),
        (None, "", ["ls"], 1008, "must provide task name"),
        (None, TASK, [], 1008, "command is not present"),
        (None, TASK, "null", 1008, "command is not present"),
        (None, "other", ["ls"], 1011, "task not found"),
        (None, TASK, ["no-such-command"], 1011,
         START + 'exec: "no-such-command": executable file not found in $PATH'),
        (None, TASK, ["/no/such/file"], 1011,
         START + "fork/exec /no/such/file: no such file or directory"),
    ],
)  # fmt: skip
def test_errors_after_the_upgrade_are_close_frames_with_nomads_text(
    one: tuple[SimServer, str],
    alloc: str | None,
    task: str,
    command: list[str] | str,
    code: int,
    reason: str,
):
    server, alloc_id = one
    assert refused(exec_url(server, alloc or alloc_id, command, task=task)) == (code, reason)


def test_a_reason_too_long_for_a_close_frame_drops_the_connection(one: tuple[SimServer, str]):
    server, alloc_id = one
    # The reason would be Nomad's "failed to start command" text, over 123 bytes.
    with (
        connect(exec_url(server, alloc_id, ["x" * 200]), open_timeout=5) as ws,
        pytest.raises(ConnectionClosedError) as closed,
    ):
        ws.recv(timeout=5)
    assert closed.value.rcvd is None


def test_task_not_started_yet(make_sim: Callable[..., SimServer]):
    server = make_sim(startup_delay_ms=60_000)
    http = Http(server.address)
    http.register(runner_job("slow"))
    alloc = wait_until(lambda: [a for a in http.allocs("slow") if a["TaskStates"]])[0]
    url = exec_url(server, alloc["ID"], ["ls"])
    assert refused(url) == (1008, f'task "{TASK}" not started yet.')


def test_task_restarting_is_not_running_and_terminal_allocation_refuses(
    make_sim: Callable[..., SimServer],
):
    server = make_sim(time_scale=0.001)
    http = Http(server.address)
    restart = {"Attempts": 1, "Interval": 3600 * SECOND, "Delay": 60_000 * SECOND, "Mode": "fail"}
    (alloc_id,) = start_job(server, "restarting", restart=restart)
    assert http.request("POST", f"/_sim/allocation/{alloc_id}/crash").ok
    wait_until(lambda: http.alloc(alloc_id)["ClientStatus"] == "pending")
    assert refused(exec_url(server, alloc_id, ["ls"])) == (1008, f'task "{TASK}" is not running.')
    assert http.request("DELETE", "/v1/job/restarting").ok
    wait_until(lambda: http.alloc(alloc_id)["ClientStatus"] == "complete")
    assert refused(exec_url(server, alloc_id, ["ls"])) == (
        1008,
        f"exec not possible, client status of allocation {alloc_id} is complete",
    )


def test_error_rate_fault_closes_with_no_cluster_leader(make_sim: Callable[..., SimServer]):
    server = make_sim()
    (alloc_id,) = start_job(server)
    http = Http(server.address)
    http.request("PUT", "/_sim/faults", json={"http_error_rate": 1})
    assert refused(exec_url(server, alloc_id, ["ls"])) == (1011, "No cluster leader")
    http.request("PUT", "/_sim/faults", json={"http_error_rate": 0})
    assert http.get("/_sim/stats")["Requests"]["GET /v1/client/allocation/{alloc_id}/exec"] == 1


# -- ACLs ----------------------------------------------------------------------------


def test_exec_needs_alloc_exec_and_refuses_without_it(make_sim: Callable[..., SimServer]):
    server = make_sim(
        acl_token="root",
        acl_tokens={"reader": ("read-job", "list-jobs"), "execer": ("alloc-exec",)},
    )
    (alloc_id,) = start_job(server, token="root")
    url = exec_url(server, alloc_id, ["echo", "ok"])
    for headers in (
        {"X-Nomad-Token": "root"},
        {"Authorization": "Bearer root"},
        {"X-Nomad-Token": "execer"},
    ):
        result = Session(url, headers).finish()
        assert (result.data("stdout"), result.exit_code) == (b"ok\n", 0)
    # The other routes take any known token, as before.
    assert requests.get(
        f"{server.address}/v1/jobs", headers={"X-Nomad-Token": "reader"}, timeout=5
    ).ok
    # Nomad ≤ 1.11 refuses in the RPC, after the upgrade, with an error that
    # carries no code: 500, so close 1011 (command/agent toWsCode).
    denied = (1011, "Permission denied")
    assert refused(url, {"X-Nomad-Token": "reader"}) == denied
    assert refused(url) == denied
    assert refused(url, {"X-Nomad-Token": "made-up"}) == denied
    # An unknown token fails authentication before the allocation is looked
    # up; the anonymous token (none) only at the capability check.
    missing = exec_url(server, "nope", ["ls"])
    assert refused(missing, {"X-Nomad-Token": "made-up"}) == denied
    assert refused(missing) == (1008, 'Unknown allocation "nope"')
    # With ws_handshake the first frame's token replaces the header's.
    # (namespace and region are accepted and ignored)
    shake = exec_url(
        server, alloc_id, ["echo", "ok"], ws_handshake="true", namespace="default", region="global"
    )
    with connect(shake, additional_headers={"X-Nomad-Token": "reader"}, open_timeout=5) as ws:
        ws.send(json.dumps({"version": 1, "auth_token": "root"}))
        frames = [json.loads(ws.recv(timeout=5)) for _ in range(4)]
    assert frames[-1] == {"exited": True, "result": {}}
    with connect(shake, open_timeout=5) as ws:
        ws.send(json.dumps({"version": 2}))
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
        1008,
        "unexpected handshake value: 2",
    )


def test_raw_exec_tasks_also_need_alloc_node_exec(make_sim: Callable[..., SimServer]):
    server = make_sim(acl_token="root", acl_tokens={"execer": ("alloc-exec",)})
    http = Http(server.address)
    http.session.headers["X-Nomad-Token"] = "root"
    job = runner_job("raw")
    job["TaskGroups"][0]["Tasks"][0]["Driver"] = "raw_exec"
    http.register(job)
    (alloc,) = http.running("raw")
    url = exec_url(server, alloc["ID"], ["true"])
    assert refused(url, {"X-Nomad-Token": "execer"}) == (1011, "Permission denied")
    assert Session(url, {"X-Nomad-Token": "root"}).finish().exit_code == 0


# -- the driver ----------------------------------------------------------------------


def test_commands_run_in_the_task_directory_with_nomads_variables(
    cluster: tuple[SimServer, list[str]],
):
    server, allocs = cluster
    dirs = []
    for alloc_id in allocs:
        script = (
            'echo "$NOMAD_ALLOC_ID $NOMAD_TASK_NAME $NOMAD_JOB_ID $NOMAD_NAMESPACE"; '
            'pwd; echo "$NOMAD_TASK_DIR"'
        )
        out = run(server, alloc_id, ["sh", "-c", script]).data("stdout").decode().splitlines()
        assert out[0] == f"{alloc_id} {TASK} exec default"
        assert out[1] == out[2] == str(task_dir(server, alloc_id))
        dirs.append(out[1])
    assert len(set(dirs)) == 2  # every allocation has its own


def test_setuser_shim_drops_the_user_and_runs_the_rest(one: tuple[SimServer, str]):
    server, alloc_id = one
    path = server.setuser_path
    assert Path(path).is_absolute()
    result = run(server, alloc_id, [path, "user", "sh", "-c", 'echo "$0 $1"', "a", "b c"])
    assert result.data("stdout") == b"a b c\n"
    assert run(server, alloc_id, [path, "user"]).exit_code == 1


def test_restart_in_place_gives_a_fresh_directory_and_kills_what_ran(
    make_sim: Callable[..., SimServer],
):
    server = make_sim()
    http = Http(server.address)
    restart = {"Attempts": 2, "Interval": 3600 * SECOND, "Delay": 0, "Mode": "fail"}
    (alloc_id,) = start_job(server, restart=restart)
    first = run(server, alloc_id, ["sh", "-c", "touch left-behind; pwd"])
    assert (Path(first.data("stdout").decode().strip()) / "left-behind").exists()
    sleeper = Session(exec_url(server, alloc_id, ["sleep", "60"]))
    wait_until(lambda: processes(server, alloc_id))
    assert http.request("POST", f"/_sim/allocation/{alloc_id}/crash").ok
    assert sleeper.finish().exit_code == 137  # killed with its container
    wait_until(
        lambda: (
            (a := http.alloc(alloc_id))["ClientStatus"] == "running"
            and a["TaskStates"][TASK]["Restarts"] == 1
        )
    )
    again = run(server, alloc_id, ["sh", "-c", "pwd; ls -A"])
    assert again.data("stdout").decode() == first.data("stdout").decode()  # same path, empty
    assert processes(server, alloc_id) == []


def test_migration_gives_the_replacement_its_own_fresh_directory(
    make_sim: Callable[..., SimServer],
):
    server = make_sim()
    http = Http(server.address)
    (old_id,) = start_job(server)
    run(server, old_id, ["touch", "data"])
    old_dir = task_dir(server, old_id)
    assert old_dir is not None and (old_dir / "data").exists()
    node_id = http.alloc(old_id)["NodeID"]
    body = {"DrainSpec": {"Deadline": -1, "IgnoreSystemJobs": False}, "MarkEligible": False}
    assert http.request("POST", f"/v1/node/{node_id}/drain", json=body).ok
    new_id = wait_until(
        lambda: [
            a["ID"]
            for a in http.allocs("exec")
            if a["ID"] != old_id and a["ClientStatus"] == "running"
        ]
    )[0]
    assert run(server, new_id, ["ls", "-A"]).data("stdout") == b""
    new_dir = task_dir(server, new_id)
    assert new_dir is not None and new_dir != old_dir
    wait_until(lambda: http.alloc(old_id)["ClientStatus"] == "complete")
    assert task_dir(server, old_id) is None and not old_dir.exists()


def test_stopping_the_allocation_kills_its_processes_even_those_in_another_session(
    make_sim: Callable[..., SimServer],
):
    server = make_sim()
    http = Http(server.address)
    (alloc_id,) = start_job(server)
    session = Session(
        exec_url(server, alloc_id, ["sh", "-c", "setsid sleep 60 & echo started; exec sleep 60"])
    )
    session.read_until(b"started")
    pids = wait_for_processes(server, alloc_id, 2)
    wait_until(lambda: len({os.getsid(pid) for pid in pids}) == 2)  # one left the session
    assert http.request("POST", f"/v1/allocation/{alloc_id}/stop").ok
    assert session.finish().exit_code == 137
    wait_until(lambda: not any(alive(pid) for pid in pids))
    assert processes(server, alloc_id) == []


def test_node_down_kills_processes_and_the_lost_allocation_refuses(
    make_sim: Callable[..., SimServer],
):
    server = make_sim()
    http = Http(server.address)
    (alloc_id,) = start_job(server)
    session = Session(exec_url(server, alloc_id, ["sleep", "60"]))
    wait_until(lambda: processes(server, alloc_id))
    node_id = http.alloc(alloc_id)["NodeID"]
    assert http.request("POST", f"/_sim/node/{node_id}/down").ok
    assert session.finish().exit_code == 137
    wait_until(lambda: http.alloc(alloc_id)["ClientStatus"] == "lost")
    assert refused(exec_url(server, alloc_id, ["ls"])) == (
        1008,
        f"exec not possible, client status of allocation {alloc_id} is lost",
    )


def test_a_client_that_goes_away_leaves_the_command_running(make_sim: Callable[..., SimServer]):
    server = make_sim()
    (alloc_id,) = start_job(server)
    session = Session(exec_url(server, alloc_id, ["sh", "-c", "echo up; exec sleep 60"]))
    session.read_until(b"up")
    (pid,) = processes(server, alloc_id)
    session.ws.close()

    def detached() -> bool:
        executions = server.call(lambda: server.sim.driver.executions(alloc_id))
        return [e.attached for e in executions] == [False]

    wait_until(detached)
    assert alive(pid) and processes(server, alloc_id) == [pid]


def test_a_background_child_holding_the_output_does_not_hold_the_exec(
    make_sim: Callable[..., SimServer],
):
    server = make_sim()
    (alloc_id,) = start_job(server)
    result = run(server, alloc_id, ["sh", "-c", "sleep 60 & echo done"])
    assert (result.data("stdout"), result.exit_code) == (b"done\n", 0)
    (pid,) = processes(server, alloc_id)  # the child runs on, until its task stops
    assert alive(pid)


def test_no_process_and_no_directory_outlive_the_simulator(make_sim: Callable[..., SimServer]):
    server = make_sim()
    (alloc_id,) = start_job(server)
    tty = Session(exec_url(server, alloc_id, ["sh", "-c", "echo a; exec sleep 60"], tty=True))
    tty.read_until(b"a")
    pipes = Session(
        exec_url(server, alloc_id, ["sh", "-c", "setsid sleep 60 & echo b; exec sleep 60"])
    )
    pipes.read_until(b"b")
    pids = wait_for_processes(server, alloc_id, 3)
    root = Path(server.setuser_path).parent.parent
    assert root.is_dir()
    server.stop()
    assert marked_processes(server.sim.driver.instance) == []
    assert not any(alive(pid) for pid in pids)
    assert not root.exists()
    for session in (tty, pipes):  # their streams ended with the kill
        assert session.finish().exit_code == 137


def test_abandoning_the_driver_off_its_loop_kills_everything(make_sim: Callable[..., SimServer]):
    """What runs when the simulator's thread dies or the interpreter exits."""
    server = make_sim()
    (alloc_id,) = start_job(server)
    session = Session(exec_url(server, alloc_id, ["sh", "-c", "echo up; exec sleep 60"]))
    session.read_until(b"up")
    (pid,) = processes(server, alloc_id)
    root = Path(server.setuser_path).parent.parent
    server.sim.driver.abandon()  # from this thread, without the event loop
    assert not alive(pid) or wait_until(lambda: not alive(pid))
    assert marked_processes(server.sim.driver.instance) == [] and not root.exists()
