"""`RefusingAgent`: a TCP proxy in front of a Nomad agent that refuses exec
handshakes as an agent over its `http_max_conns_per_client` does — `429 Too
Many Requests` and a close, before any handler runs (nomadsim.connlimit's
answer) — and forwards every other connection untouched.

`refuse` execs are refused (None: all of them); `cut` instead closes the
connection without an answer (a refusal websockets' client once turned into
a bare AssertionError); `hold_s` delays the execs it forwards (a slow
handshake). Runs its own event loop on a thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit

from nomadsim.connlimit import TOO_MANY_RESPONSE


class RefusingAgent:
    def __init__(
        self, target: str, refuse: int | None = None, cut: bool = False, hold_s: float = 0.0
    ) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.to_refuse = refuse
        self.cut = cut
        self.hold_s = hold_s  # forwarded exec handshakes wait this long first
        self.refused = 0
        self.forwarded = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> RefusingAgent:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result(5)
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _refusing(self) -> bool:
        return self.to_refuse is None or self.refused < self.to_refuse

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line = head.split(b"\r\n", 1)[0]
            if b"/exec?" in request_line and self._refusing():
                self.refused += 1
                if not self.cut:
                    writer.write(TOO_MANY_RESPONSE)
                    await writer.drain()
                return
            self.forwarded += 1
            if b"/exec?" in request_line and self.hold_s:
                await asyncio.sleep(self.hold_s)
            up_reader, up_writer = await asyncio.open_connection(*self._target)
            up_writer.write(head)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # stopping: asyncio's server callback would log a cancelled task
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
