"""Serving the simulator: a Starlette app on uvicorn, either in the
foreground (the `sim` command, until SIGINT/SIGTERM) or on a background
thread (tests and the `dev` command), with a clean stop either way.

Open event streams and blocked queries would hold uvicorn's graceful shutdown
for their full duration, so stopping first closes them from the simulator's
side, then lets uvicorn exit. Closing also marks the simulator stopped: uvicorn
keeps accepting connections until its next tick (0.1 s) notices it should
exit, and a client that reconnects in that window gets a stream (or blocking
query) that ends at once instead of one that holds the shutdown until the
graceful-shutdown timeout cancels it; its answer carries `Connection: close`,
so the connection does not idle either.

Allocation exec runs commands on this host without isolation (driver.py), so
the simulator listens on 127.0.0.1 unless told otherwise, and says so loudly
when it is told otherwise. Whatever ends the simulator's thread, the processes
it started are killed and its directory removed."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType
from typing import TypeVar

import uvicorn
from starlette.applications import Starlette

from nomadsim.config import SimConfig
from nomadsim.core import Simulator
from nomadsim.http import routes

log = logging.getLogger(__name__)
T = TypeVar("T")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(sim: Simulator) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sim.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            sim.stop()

    return Starlette(routes=routes(sim), lifespan=lifespan)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, sim: Simulator) -> None:
        super().__init__(config)
        self.sim = sim

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM stop the server and the process then exits 0
        (uvicorn's own handler re-raises the signal after shutting down)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {
            sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler may interrupt the loop anywhere: close the
        # simulator's streams from the loop itself.
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_soon_threadsafe(self.sim.stop)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


class SimServer:
    """A simulator listening on host:port (port 0 picks a free port)."""

    def __init__(self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.sim = Simulator(config)
        uv_config = uvicorn.Config(
            create_app(self.sim),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self._server = _Server(uv_config, self.sim)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.host = host
        if not _loopback(host):
            log.warning(
                "the Nomad simulator listens on %s: anyone who reaches it can run commands "
                "on this host as this user through allocation exec (docs/simulator.md)",
                host,
            )

    @property
    def setuser_path(self) -> str:
        """Absolute path of the simulator's stand-in for `/sbin/setuser`
        (callable from any thread)."""
        return self.sim.setuser_path

    @property
    def port(self) -> int:
        for server in self._server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        raise RuntimeError("simulator is not listening")

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serve_forever(self) -> None:
        """Run in the foreground until SIGINT or SIGTERM."""
        try:
            self._server.run()
        finally:
            self.sim.driver.abandon()

    def start(self, timeout: float = 10.0) -> str:
        """Start on a background thread; return the base address once it listens."""
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            task = loop.create_task(self._server.serve())
            loop.call_soon(started.set)
            try:
                loop.run_until_complete(task)
            finally:
                # A normal stop has closed the driver already; a crash has not.
                self.sim.driver.abandon()
                loop.close()

        self._thread = threading.Thread(target=run, name="nomad-sim", daemon=True)
        # uvicorn captures signals only on the main thread, so none are touched here.
        self._thread.start()
        started.wait(timeout)
        deadline = threading.Event()
        waited = 0.0
        while not self._server.started:
            if not self._thread.is_alive() or waited > timeout:
                raise RuntimeError("simulator failed to start")
            deadline.wait(0.01)
            waited += 0.01
        return self.address

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None or self._loop is None:
            return
        # Close the simulator's streams and blocking queries on its loop, and
        # wait for that, before uvicorn is told to exit: every request it
        # still accepts from then on sees a stopped simulator.
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                done = asyncio.run_coroutine_threadsafe(self._close_sim(), self._loop)
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    done.result(timeout)
        self._server.should_exit = True
        self._thread.join(timeout)
        self._thread = None
        # Should the thread be stuck or dead, no process outlives the stop.
        self.sim.driver.abandon()

    async def _close_sim(self) -> None:
        self.sim.stop()

    def call(self, fn: Callable[[], T]) -> T:
        """Run a zero-argument callable on the simulator's loop and return its
        result (e.g. `call(lambda: server.sim.exec_processes(alloc_id))`)."""
        assert self._loop is not None
        assert callable(fn)

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)
