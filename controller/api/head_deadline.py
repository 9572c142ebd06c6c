"""A deadline on request heads (slowloris): uvicorn waits for a request's
headers without limit, so a client that never finishes them holds its
connection for ever, before any authentication could refuse it.

`protocol(timeout_s)` is uvicorn's HTTP protocol (httptools or h11, as it
chooses) with a timer: armed when a connection opens and whenever a response
is complete (the next head is awaited), cancelled once a head is complete (a
new request cycle) or the connection becomes a WebSocket. When it fires while
the connection still waits for a head, the connection is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string


def protocol(timeout_s: float) -> type[asyncio.Protocol]:
    base: Any = import_from_string(HTTP_PROTOCOLS["auto"])

    class HeadDeadline(base):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None
        _waiting_since: Any = None  # the cycle that was current when the timer was armed

        def _arm(self) -> None:
            self._disarm()
            self._waiting_since = self.cycle
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            cycle = self.cycle
            waiting = cycle is self._waiting_since and (cycle is None or cycle.response_complete)
            if waiting and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._deadline is not None and self.cycle is not self._waiting_since:
                self._disarm()  # a head arrived: its request runs

        def handle_websocket_upgrade(self, *args: Any) -> None:
            self._disarm()
            super().handle_websocket_upgrade(*args)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeadDeadline
