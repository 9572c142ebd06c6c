"""`Balancer`: a plain round-robin TCP load balancer in front of controller
replicas, as an operator puts one (HAProxy, Traefik in TCP mode): each new
connection goes to the next backend in rotation that passes its health check
(`GET /readyz` every `check_s`) and accepts the connection; a backend that
refuses is skipped for that connection (HAProxy's redispatch). It knows
nothing of HTTP beyond the check, so WebSockets pass through as any stream.

`remove` takes a backend out of rotation before it is stopped, as Nomad's
`shutdown_delay` deregisters a service before the task gets its signal;
connections already open stay open. Runs its own event loop on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from urllib.parse import urlsplit

import requests


class Balancer:
    def __init__(self, backends: list[str], check_s: float = 0.2) -> None:
        self._backends: list[str] = list(backends)
        self._healthy: set[str] = set(backends)
        self._turn = itertools.count()
        self._check_s = check_s
        self._lock = threading.Lock()
        self.connections: dict[str, int] = {}  # backend → connections sent to it
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = threading.Event()
        self._checker = threading.Thread(target=self._check, daemon=True)

    @property
    def address(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> Balancer:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result(5)
        self._checker.start()
        return self

    def add(self, backend: str) -> None:
        with self._lock:
            self._backends.append(backend)

    def healthy(self) -> list[str]:
        """The backends in rotation now."""
        with self._lock:
            return [b for b in self._backends if b in self._healthy]

    def remove(self, backend: str) -> None:
        with self._lock:
            if backend in self._backends:
                self._backends.remove(backend)
            self._healthy.discard(backend)

    def stop(self) -> None:
        self._stop.set()
        self._checker.join(5)

        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> Balancer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- health checks ----------------------------------------------------------------

    def _check(self) -> None:
        while not self._stop.wait(self._check_s):
            with self._lock:
                backends = list(self._backends)
            for backend in backends:
                try:
                    ok = requests.get(f"{backend}/readyz", timeout=1).status_code == 200
                except requests.RequestException:
                    ok = False
                with self._lock:
                    if ok and backend in self._backends:
                        self._healthy.add(backend)
                    else:
                        self._healthy.discard(backend)

    def _rotation(self) -> list[str]:
        healthy = self.healthy()
        if not healthy:
            return []
        start = next(self._turn) % len(healthy)
        return healthy[start:] + healthy[:start]

    # -- forwarding -------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            for backend in self._rotation():
                parts = urlsplit(backend)
                try:
                    up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port)
                except OSError:
                    continue  # refused: the next one (redispatch)
                with self._lock:
                    self.connections[backend] = self.connections.get(backend, 0) + 1
                await self._pipe(reader, writer, up_reader, up_writer)
                return
        except asyncio.CancelledError:
            pass  # stopping: the connection just closes
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self._tasks.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.write_eof()

        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        finally:
            with contextlib.suppress(Exception):
                up_writer.close()
