"""A served simulator: answers kept-alive requests at once; stopping it, long
requests end and reconnects cannot hold it up."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import requests

from nomadsim import SimServer
from tests.helpers import EventReader, wait_until

# A blocking query at this index waits for its whole `wait`.
FAR = {"index": str(10**9), "wait": "60s"}


def timed_stop(server: SimServer) -> float:
    started = time.monotonic()
    server.stop()
    return time.monotonic() - started


def test_stream_and_blocking_query_opened_after_stop_began_end_at_once(
    make_sim: Callable[..., SimServer],
) -> None:
    server = make_sim()
    reader = EventReader(server.address)
    wait_until(lambda: reader.heartbeats)
    # The first step of a stop: the simulator closes while uvicorn still listens
    # (SimServer.stop does this before uvicorn's tick notices should_exit).
    server.call(server.sim.stop)
    wait_until(lambda: reader.closed)
    # A client that reconnects in that window gets a stream that ends at once...
    late = EventReader(server.address, {"index": 1})
    wait_until(lambda: late.closed, timeout=1)
    assert late.frames == []
    assert late.heartbeats == 1  # just the opening {}
    # ...and a blocking query answers with what it has instead of waiting.
    started = time.monotonic()
    reply = requests.get(f"{server.address}/v1/jobs", params=FAR, timeout=5)
    assert time.monotonic() - started < 1
    assert reply.status_code == 200 and reply.json() == []
    assert reply.headers["Connection"] == "close"
    assert int(reply.headers["X-Nomad-Index"]) >= 1
    assert timed_stop(server) < 1


def test_event_stream_client_reconnecting_during_stop_does_not_delay_it(
    make_sim: Callable[..., SimServer],
) -> None:
    server = make_sim()
    url = f"{server.address}/v1/event/stream"
    outcomes: list[str] = []

    def reconnect_forever() -> None:
        # A consumer that reconnects as soon as its stream ends, as the
        # controller's watcher does, until the server refuses connections.
        while True:
            try:
                with requests.get(url, stream=True, timeout=5) as response:
                    for _ in response.iter_lines():
                        pass
            except requests.RequestException:
                outcomes.append("refused")
                return
            outcomes.append("ended")

    client = threading.Thread(target=reconnect_forever, daemon=True)
    client.start()
    wait_until(lambda: server.sim.broker.subscribers)
    assert timed_stop(server) < 1
    client.join(5)
    assert not client.is_alive()
    # The streams open at the stop ended; the client reconnected until refused.
    assert outcomes[0] == "ended" and outcomes[-1] == "refused"


def test_blocked_query_in_flight_ends_at_stop(make_sim: Callable[..., SimServer]) -> None:
    server = make_sim()
    url = f"{server.address}/v1/nodes"
    replies: list[Any] = []

    def blocked() -> None:
        replies.append(requests.get(url, params=FAR, timeout=10))

    client = threading.Thread(target=blocked, daemon=True)
    client.start()
    wait_until(lambda: server.sim.requests.get("GET /v1/nodes"))
    assert timed_stop(server) < 1
    client.join(5)
    (reply,) = replies
    assert reply.status_code == 200 and len(reply.json()) == server.sim.config.nodes


def test_kept_alive_requests_do_not_wait_for_delayed_acks(sim: SimServer) -> None:
    """Nomad answers with Nagle's algorithm off. With it on, an answer written
    in two parts on a kept-alive connection waits for the client's delayed
    ACK: 40 ms a request (20 requests took 880 ms; now a few ms)."""
    address = urlsplit(sim.address)
    conn = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port)
    try:
        started = time.monotonic()
        for _ in range(20):
            conn.request("GET", "/v1/agent/self")
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 200
        assert time.monotonic() - started < 0.4
    finally:
        conn.close()
