"""EventStream against the simulator (and, for wire details the simulator
never produces, a scripted NDJSON server): delivery, resume at last Index + 1
without replays, heartbeats as liveness, reconnects on every kind of failure,
connection state, and a prompt stop."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import requests

from controller.nomad.connection import NomadConnection
from controller.nomad.events import EventRef
from controller.nomad.stream import CHUNKED_READ_BYTES, EventStream
from nomadsim import SimServer
from tests.helpers import Http, runner_job, wait_until
from tests.support.http_stub import address_of, serve_in_thread
from tests.support.ports import free_port


class Collector:
    """on_events / on_state: remembers every delivered frame and state change."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, tuple[EventRef, ...]]] = []
        self.states: list[bool] = []

    def on_events(self, index: int, events: tuple[EventRef, ...]) -> None:
        self.frames.append((index, events))

    def on_state(self, connected: bool) -> None:
        self.states.append(connected)

    @property
    def indexes(self) -> list[int]:
        return [i for i, _ in self.frames]

    def keys(self, topic: str) -> list[str]:
        return [e.key for _, events in self.frames for e in events if e.topic == topic]


@pytest.fixture
def streams() -> Iterator[Callable[..., tuple[EventStream, Collector]]]:
    """Start EventStreams with short timings; all are stopped after the test."""
    started: list[EventStream] = []

    def start(address: str, **kwargs: Any) -> tuple[EventStream, Collector]:
        collector = Collector()
        kwargs.setdefault("topics", ["Job"])
        kwargs.setdefault("read_timeout_s", 5.0)
        kwargs.setdefault("backoff_base_s", 0.01)
        kwargs.setdefault("backoff_cap_s", 0.05)
        wheres = {k: kwargs.pop(k) for k in ("token", "namespace", "region") if k in kwargs}
        stream = EventStream(
            NomadConnection(address=address, **wheres),
            on_events=kwargs.pop("on_events", collector.on_events),
            on_state=collector.on_state,
            **kwargs,
        )
        stream.start()
        started.append(stream)
        return stream, collector

    yield start
    for stream in started:
        stream.stop()


def set_faults(sim: SimServer, **faults: Any) -> None:
    assert Http(sim.address).request("PUT", "/_sim/faults", json=faults).ok


def test_delivers_frames_of_the_subscribed_topics(sim: SimServer, streams: Any) -> None:
    stream, seen = streams(sim.address)
    wait_until(lambda: stream.connected)
    http = Http(sim.address)
    first = http.register(runner_job("1-a"))
    second = http.register(runner_job("2-b"))
    wait_until(lambda: {first["Index"], second["Index"]} <= set(seen.indexes))
    assert seen.indexes == sorted(set(seen.indexes))
    assert {"1-a", "2-b"} <= set(seen.keys("Job"))
    assert {e.topic for _, events in seen.frames for e in events} == {"Job"}
    assert stream.last_index == seen.indexes[-1]
    assert stream.frames == len(seen.frames)
    assert (seen.states, stream.reconnects) == ([True], 0)


def test_start_index_skips_what_was_already_observed(sim: SimServer, streams: Any) -> None:
    http = Http(sim.address)
    old = http.register(runner_job("1-a"))
    stream, seen = streams(sim.address, start_index=old["Index"] + 1)
    wait_until(lambda: stream.connected)
    new = http.register(runner_job("2-b"))
    wait_until(lambda: new["Index"] in seen.indexes)
    # 1-a's own registration frame is not delivered again (its later status changes are).
    assert min(seen.indexes) > old["Index"]


def test_resumes_at_last_index_plus_one_without_replays(
    sim: SimServer, streams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every connection is cut after two frames and every frame is sent twice.
    set_faults(sim, event_stream_cut_every=2, event_duplicate_rate=1.0)
    requested: list[tuple[int, int]] = []  # (index asked for, last index delivered then)
    stream_ref: list[EventStream] = []
    real_get = requests.Session.get

    def spy(self: requests.Session, url: str, **kwargs: Any) -> requests.Response:
        if url.endswith("/v1/event/stream") and stream_ref:
            requested.append((kwargs["params"]["index"], stream_ref[0].last_index))
        return real_get(self, url, **kwargs)

    monkeypatch.setattr(requests.Session, "get", spy)
    stream, seen = streams(sim.address)
    stream_ref.append(stream)
    http = Http(sim.address)
    written = [http.register(runner_job(f"{i}-x"))["Index"] for i in range(6)]
    wait_until(lambda: set(written) <= set(seen.indexes))

    assert seen.indexes == sorted(set(seen.indexes)), "a frame was delivered twice"
    assert stream.duplicates > 0 and stream.reconnects >= 2
    assert len(requested) >= 2
    assert all(index == last + 1 for index, last in requested if last > 0)
    assert seen.states[:4] == [True, False, True, False]


def test_heartbeats_keep_a_quiet_stream_alive(
    make_sim: Callable[..., SimServer], streams: Any
) -> None:
    server = make_sim(heartbeat_interval_ms=20)
    stream, seen = streams(server.address, topics=["Deployment"], read_timeout_s=0.25)
    # Fifteen heartbeats span 0.3 s, longer than the read timeout.
    wait_until(lambda: stream.heartbeats >= 15)
    assert (stream.reconnects, seen.states, seen.frames) == (0, [True], [])


def test_lost_heartbeats_time_out_and_reconnect(
    sim: SimServer, streams: Any, caplog: pytest.LogCaptureFixture
) -> None:
    set_faults(sim, heartbeat_loss=True)
    caplog.set_level(logging.WARNING, logger="controller.nomad.stream")
    stream, seen = streams(sim.address, read_timeout_s=0.1)
    wait_until(lambda: stream.reconnects >= 2)
    assert "no data for 0.1s" in caplog.text
    assert seen.states[:2] == [True, False]
    set_faults(sim, heartbeat_loss=False)
    wait_until(lambda: stream.connected and stream.heartbeats > 0)
    http = Http(sim.address)
    written = http.register(runner_job("1-a"))["Index"]
    wait_until(lambda: written in seen.indexes)


def test_error_status_is_retried_and_logged(
    make_sim: Callable[..., SimServer], streams: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = make_sim(acl_token="s3cret")
    caplog.set_level(logging.WARNING, logger="controller.nomad.stream")
    stream, seen = streams(server.address, token="wrong")
    wait_until(lambda: stream.reconnects >= 3)
    assert "HTTP 403: Permission denied" in caplog.text
    assert seen.states == [] and not stream.connected

    good, good_seen = streams(server.address, token="s3cret")
    wait_until(lambda: good.connected)
    written = Http(server.address).request(
        "PUT", "/v1/jobs", json={"Job": runner_job("1-a")}, headers={"X-Nomad-Token": "s3cret"}
    )
    wait_until(lambda: written.json()["Index"] in good_seen.indexes)


def test_waits_for_nomad_to_come_up(
    scripted: Callable[..., Scripted], streams: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="controller.nomad.stream")
    port = free_port()
    stream, seen = streams(f"http://127.0.0.1:{port}")
    wait_until(lambda: stream.reconnects >= 2)
    assert "ConnectionError" in caplog.text
    assert seen.states == [] and not stream.connected
    scripted([[b"{}\n", frame(7)]], port=port)
    wait_until(lambda: seen.indexes == [7])
    assert seen.states == [True]


def test_a_failing_callback_does_not_stop_the_stream(
    sim: SimServer, streams: Any, caplog: pytest.LogCaptureFixture
) -> None:
    delivered: list[int] = []

    def flaky(index: int, events: list[dict[str, Any]]) -> None:
        delivered.append(index)
        if len(delivered) == 1:
            raise RuntimeError("boom")

    stream, _ = streams(sim.address, on_events=flaky)
    http = Http(sim.address)
    http.register(runner_job("1-a"))
    wait_until(lambda: len(delivered) >= 1)
    second = http.register(runner_job("2-b"))["Index"]
    wait_until(lambda: second in delivered)
    assert "on_events failed" in caplog.text and "boom" in caplog.text
    assert stream.reconnects == 0  # the failure was the callback's, not the connection's


def test_stop_returns_promptly_while_blocked_in_a_read(
    make_sim: Callable[..., SimServer], streams: Any
) -> None:
    server = make_sim(heartbeat_interval_ms=30_000)
    stream, seen = streams(server.address, read_timeout_s=45)
    wait_until(lambda: stream.connected and stream.heartbeats == 1)
    started = time.monotonic()
    stream.stop()
    assert time.monotonic() - started < 1.0
    assert not stream.connected and seen.states == [True, False]
    assert not any(t.name == "nomad-event-stream" and t.is_alive() for t in threading.enumerate())


def test_stop_during_backoff_is_prompt(streams: Any) -> None:
    stream, _ = streams("http://127.0.0.1:9", backoff_base_s=30, backoff_cap_s=30)
    wait_until(lambda: stream.reconnects >= 1)
    started = time.monotonic()
    stream.stop()
    assert time.monotonic() - started < 1.0


# -- wire details, from a scripted server --------------------------------------------


class Scripted:
    """An NDJSON server: connection n answers script[n] chunk by chunk, then
    ends the stream (or, for the last script, holds it open until closed)."""

    def __init__(self, script: list[list[bytes]], port: int = 0) -> None:
        self.script = script
        self.requests: list[dict[str, list[str]]] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                n = len(outer.requests)
                outer.requests.append(parse_qs(urlparse(self.path).query))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                with contextlib.suppress(OSError):
                    for chunk in outer.script[min(n, len(outer.script) - 1)]:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    if n >= len(outer.script) - 1:
                        outer.release.wait(10)
                    self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

        self.server = serve_in_thread(Handler, port)
        self.address = address_of(self.server)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    servers: list[Scripted] = []

    def start(script: list[list[bytes]], port: int = 0) -> Scripted:
        servers.append(Scripted(script, port))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def frame(index: int) -> bytes:
    return b'{"Index":%d,"Events":[{"Topic":"Job","Key":"j%d"}]}\n' % (index, index)


def test_blank_lines_and_split_lines_are_fine_malformed_json_reconnects(
    scripted: Callable[..., Scripted],
    streams: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="controller.nomad.stream")
    server = scripted(
        [
            # A heartbeat, a blank line, a frame split across chunks, then garbage.
            [b"{}\n", b"\n", frame(5)[:10], frame(5)[10:], b"<html>proxy error</html>\n"],
            # After the reconnect the server sends the newest frame again, then a new one.
            [b"{}\n", frame(5), frame(6)],
        ]
    )
    stream, seen = streams(server.address, topics=["Job", "Allocation:1-a"], namespace="team-a")
    wait_until(lambda: seen.indexes == [5, 6])
    assert stream.reconnects == 1 and stream.duplicates == 1 and stream.heartbeats == 2
    assert "malformed frame b'<html>proxy error</html>'" in caplog.text
    first, second = server.requests
    assert first["topic"] == ["Job:*", "Allocation:1-a"]
    assert first["namespace"] == ["team-a"]
    assert (first["index"], second["index"]) == (["0"], ["6"])


def test_a_frame_of_the_wrong_shape_reconnects(
    scripted: Callable[..., Scripted],
    streams: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="controller.nomad.stream")
    server = scripted([[b'{"Error":"subscription closed by server"}\n'], [frame(3)]])
    _, seen = streams(server.address)
    wait_until(lambda: seen.indexes == [3])
    assert "unexpected frame" in caplog.text and "subscription closed" in caplog.text


def test_the_server_ending_the_stream_reconnects(
    scripted: Callable[..., Scripted],
    streams: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="controller.nomad.stream")
    server = scripted([[frame(1)], [frame(2)]])
    _, seen = streams(server.address, start_index=1)
    wait_until(lambda: seen.indexes == [1, 2])
    assert "stream ended by the server" in caplog.text
    assert [r["index"] for r in server.requests] == [["1"], ["2"]]


def test_a_frame_larger_than_a_read_and_a_small_one_after_it_arrive_at_once(
    scripted: Callable[..., Scripted], streams: Any
) -> None:
    # A Job event carries the whole job: one frame may be larger than one read
    # (CHUNKED_READ_BYTES), and the small frame after it must not wait for a
    # read to fill (the server holds the connection open after it).
    big = b'{"Index":5,"Events":[{"Topic":"Job","Key":"j5","Payload":{"Pad":"%s"}}]}\n' % (
        b"x" * (CHUNKED_READ_BYTES * 2 + 17)
    )
    server = scripted([[b"{}\n", big, frame(6)]])
    _, seen = streams(server.address)
    wait_until(lambda: seen.indexes == [5, 6], timeout=3)
    assert seen.keys("Job") == ["j5", "j6"]


def test_a_stalled_stream_times_out_and_the_next_one_delivers_what_it_held(
    sim: SimServer, streams: Any
) -> None:
    """Not a byte and no FIN (its server's host is gone): the read timeout
    ends the connection; once streams flow again the reconnect resumes after
    the last frame delivered, the write made during the stall included."""
    stream, seen = streams(sim.address, read_timeout_s=0.1)
    wait_until(lambda: stream.connected)
    set_faults(sim, event_stream_stall=True)
    written = Http(sim.address).register(runner_job("1-s"))["Index"]
    wait_until(lambda: stream.reconnects >= 1)
    assert written not in seen.indexes
    set_faults(sim, event_stream_stall=False)
    wait_until(lambda: written in seen.indexes)
    assert seen.states[:2] == [True, False]
