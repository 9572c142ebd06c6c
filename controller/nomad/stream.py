"""`EventStream`: reads Nomad's event stream (GET /v1/event/stream) on a
daemon thread and keeps reading until `stop()`.

Nomad writes NDJSON: one `{"Index":N,"Events":[...]}` line per committed
write, a `{}` line when the stream opens and every 30 s as a heartbeat. The
`index` parameter is inclusive, an index older than the server's buffer
silently starts at the oldest frame, and one newer than every frame delivers
the newest frame again. So the reader resumes at the last delivered Index + 1
and drops any frame whose Index it has already passed (which also drops
frames a server sends twice).

python-nomad's `event.stream` helper is not used: it re-sends the original
index on every reconnect (replaying everything), dies silently on a blank
line, a failed reconnect or an error status, and reads without a timeout, so
a silently dead connection hangs it forever. Here every failure (error
status, connection error, no data for `read_timeout_s`, malformed JSON, the
server ending the stream) is logged at WARNING and followed by a reconnect
after a capped, fully jittered exponential backoff (`errors.reconnect_delay`,
the policy every retried call to Nomad uses).

Events are only hints for the controller ("look at this again"), so a frame
whose callback fails is logged and not delivered again, and a frame is
decoded into only the fields the hints are made of (`wire.FRAME`): 5 µs
for a 3.4 KB frame against 21 µs decoded whole by orjson.

Nomad sends each frame as one HTTP chunk, and a Job event carries the whole
job. Read 512 bytes at a time (requests' default), a frame of a few KB took
a read, a yield and a join per 512 bytes: 13 µs a 2.6 KB frame, against 6 µs
read in pieces of up to `CHUNKED_READ_BYTES`. A chunked read hands on each
chunk as it comes and never waits to fill the piece, so a heartbeat is
still seen at once. A response that is not chunked (a proxy that buffers)
would wait for the piece to fill, so it keeps the default.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import requests
import urllib3.exceptions

from controller.nomad import wire
from controller.nomad.connection import NomadConnection
from controller.nomad.errors import reconnect_delay
from controller.nomad.events import EventRef, decode_events, frame_events

log = logging.getLogger(__name__)

CHUNKED_READ_BYTES = 64 * 1024
EventsCallback = Callable[[int, tuple[EventRef, ...]], None]
StateCallback = Callable[[bool], None]


class EventStream:
    """One event-stream subscription that survives disconnects (see the module docstring)."""

    def __init__(
        self,
        connection: NomadConnection | None = None,
        *,
        topics: Sequence[str],
        on_events: EventsCallback,
        on_state: StateCallback | None = None,
        address: str | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 45.0,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 30.0,
        start_index: int = 0,
    ) -> None:
        if connection is None:
            connection = NomadConnection(address=address or "http://127.0.0.1:4646")
        self.address = connection.address
        # `Job` and `Job:*` mean the same to Nomad; send the explicit form.
        self.topics = tuple(t if ":" in t else f"{t}:*" for t in topics)
        self.namespace = connection.namespace
        self._on_events = on_events
        self._on_state = on_state
        self._headers = connection.headers
        self._region = connection.region
        self._verify, self._cert = connection.requests_verify, connection.requests_cert
        self._timeout = (connect_timeout_s, read_timeout_s)
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._start_index = max(0, start_index)
        self._session = requests.Session()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._response: requests.Response | None = None
        self._thread: threading.Thread | None = None
        self._connected = False
        self._last_index = max(0, start_index - 1)
        self._lines_on_connection = 0
        self.reconnects = 0  # reconnect attempts after a failure
        self.frames = 0  # frames delivered to on_events
        self.duplicates = 0  # frames dropped because their Index was already passed
        self.heartbeats = 0
        self.last_seen: float | None = None  # monotonic time of the last line received

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def last_index(self) -> int:
        """Index of the last frame delivered (start_index - 1 before any)."""
        return self._last_index

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("event stream already started")
        self._thread = threading.Thread(target=self._run, name="nomad-event-stream", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop reading; returns promptly even while the thread waits in a read."""
        self._stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            _abort(response)
        thread = self._thread
        if (
            thread is not None
            and thread.ident is not None
            and thread is not threading.current_thread()
        ):
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("event stream thread did not stop within %.1fs", timeout_s)
            else:
                self._session.close()

    # -- the reading thread --------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            self._lines_on_connection = 0
            try:
                reason = self._consume()
            except Exception as exc:
                reason = self._describe(exc)
            finally:
                self._close_response()
                self._set_connected(False)
            if self._stopping.is_set():
                break
            # A connection that carried data was healthy: start the backoff over.
            failures = 1 if self._lines_on_connection else failures + 1
            delay = reconnect_delay(failures, self._backoff_base_s, self._backoff_cap_s)
            log.warning(
                "nomad event stream: %s; reconnecting in %.2fs at index %d",
                reason,
                delay,
                self._next_index(),
            )
            self.reconnects += 1
            self._stopping.wait(delay)

    def _next_index(self) -> int:
        return self._last_index + 1 if self._last_index > 0 else self._start_index

    def _consume(self) -> str:
        """Read one connection until it fails; return why it ended."""
        params: dict[str, Any] = {
            "index": self._next_index(),
            "namespace": self.namespace,
        }
        if self.topics:
            params["topic"] = list(self.topics)
        if self._region:
            params["region"] = self._region
        response = self._session.get(
            f"{self.address}/v1/event/stream",
            params=params,
            headers=self._headers,
            stream=True,
            timeout=self._timeout,
            verify=self._verify,
            cert=self._cert,
        )
        with self._lock:
            self._response = response
        if self._stopping.is_set():
            return "stopped"
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {response.text.strip()[:200]}"
        self._set_connected(True)
        chunked = getattr(response.raw, "chunked", False) is True
        for line in response.iter_lines(chunk_size=CHUNKED_READ_BYTES if chunked else 512):
            if self._stopping.is_set():
                return "stopped"
            self._lines_on_connection += 1
            self.last_seen = time.monotonic()
            if not line.strip():
                continue  # a blank line still proves the connection alive
            try:
                frame = wire.frame(line)
            except ValueError:
                return f"malformed frame {line[:200]!r}"
            if frame == {}:
                self.heartbeats += 1
                continue
            problem = self._deliver(frame)
            if problem:
                return f"{problem} {line[:200]!r}"
        return "stream ended by the server"

    def _deliver(self, frame: Any) -> str | None:
        shaped = frame_events(frame)
        if shaped is None:
            return "unexpected frame"
        index, events = shaped
        if index <= self._last_index:
            self.duplicates += 1
            return None
        self._last_index = index
        self.frames += 1
        try:
            self._on_events(index, decode_events(events))
        except Exception:
            log.exception("nomad event stream: on_events failed for frame %d", index)
        return None

    def _describe(self, exc: Exception) -> str:
        if isinstance(exc, requests.ConnectionError) and any(
            isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args
        ):
            return f"no data for {self._timeout[1]:.1f}s (heartbeats lost)"
        if isinstance(exc, requests.ReadTimeout):
            return f"no answer within {self._timeout[1]:.1f}s"
        return f"{type(exc).__name__}: {exc}"

    def _set_connected(self, connected: bool) -> None:
        if connected == self._connected:
            return
        self._connected = connected
        if self._on_state is None:
            return
        try:
            self._on_state(connected)
        except Exception:
            log.exception("nomad event stream: on_state failed")

    def _close_response(self) -> None:
        with self._lock:
            response, self._response = self._response, None
        if response is not None:
            with contextlib.suppress(Exception):
                response.close()


def _abort(response: requests.Response) -> None:
    """End a blocking read on another thread at once.

    Closing the response from here would wait for the reader's recv; shutting
    the socket down makes that recv return immediately."""
    sock = getattr(getattr(response.raw, "_connection", None), "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        return
    with contextlib.suppress(Exception):
        response.close()
