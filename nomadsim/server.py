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

Every agent of the cluster (topology.py: servers and one client agent per
node) gets a listener of its own, bound before the simulator starts so that
each node's `HTTPAddr` is its agent's address; one uvicorn server serves them
all, its HTTP protocol counting connections per listener and client IP
(connlimit.py). The entry (`SimConfig.entry`) gets the port asked for, the
others free ports.

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
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType
from typing import TypeVar

import uvicorn
from starlette.applications import Starlette

from nomadsim.config import SimConfig
from nomadsim.connlimit import limited_http
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


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    # Nomad (Go) answers with Nagle's algorithm off. asyncio turns it off only
    # on sockets it made itself (it checks the protocol number, which
    # create_server leaves 0), and a keep-alive answer written in two parts
    # would then wait for the client's delayed ACK: 40 ms a request. Accepted
    # connections inherit the option from the listener.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


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


class _Listeners:
    """The agents' listening sockets as restarts close and reopen them
    (restarts.py), on the simulator's loop: a closed listener refuses
    connects, and the connections it accepted are reset, as when the agent's
    process exits."""

    def __init__(self, owner: SimServer) -> None:
        self._owner = owner

    def _port(self, agent: str) -> int:
        return int(self._owner.addresses[agent].rsplit(":", 1)[1])

    def close(self, agent: str) -> None:
        port = self._port(agent)
        uv = self._owner._server
        for served in getattr(uv, "servers", []):
            if any(int(sock.getsockname()[1]) == port for sock in served.sockets or ()):
                served.close()
        for connection in list(uv.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is None:
                continue
            local = transport.get_extra_info("sockname")
            if isinstance(local, tuple) and int(local[1]) == port:
                transport.abort()

    async def open(self, agent: str) -> None:
        port = self._port(agent)
        owner = self._owner
        uv = owner._server
        sock = _listen(owner.host, port)
        owner._sockets.append(sock)
        config = uv.config

        def protocol() -> asyncio.Protocol:
            made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=uv.server_state, app_state=uv.lifespan.state
            )
            return made

        served = await asyncio.get_running_loop().create_server(protocol, sock=sock)
        uv.servers.append(served)


class SimServer:
    """A simulated cluster whose agents listen on `host`: the entry agent on
    `port` (0 picks a free port), every other agent on a free port."""

    def __init__(self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.sim = Simulator(config)
        frontends = self.sim.frontends
        entry = frontends.entry.name
        names = [entry, *(a.name for a in frontends.agents if a.name != entry)]
        self._sockets: list[socket.socket] = []
        try:
            for name in names:
                sock = _listen(host, port if name == entry else 0)
                self._sockets.append(sock)
                bound = int(sock.getsockname()[1])
                frontends.bind(name, _url(host, bound), bound)
        except OSError:
            self._close_sockets()
            raise
        # The app, for a harness to add routes to before it starts (bench).
        self.app = create_app(self.sim)
        uv_config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            http=limited_http(frontends.http),
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self._server = _Server(uv_config, self.sim)
        self.sim.restarts.listeners = _Listeners(self)
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
        """The entry's port."""
        return int(self.address.rsplit(":", 1)[1])

    @property
    def address(self) -> str:
        """The entry's base address (the agent `SimConfig.entry` names)."""
        return self.sim.frontends.addresses[self.sim.frontends.entry.name]

    @property
    def addresses(self) -> dict[str, str]:
        """Every agent's base address by agent name (server-N, agent-N)."""
        return dict(self.sim.frontends.addresses)

    @property
    def agent_addresses(self) -> dict[str, str]:
        """Each client agent's base address by its node's name."""
        return {
            a.node: self.sim.frontends.addresses[a.name]
            for a in self.sim.frontends.agents
            if a.node is not None
        }

    @property
    def server_addresses(self) -> dict[str, str]:
        """Each server's base address by name; server-1 is the leader."""
        return {
            a.name: self.sim.frontends.addresses[a.name]
            for a in self.sim.frontends.agents
            if a.node is None
        }

    def address_of(self, role: str) -> str:
        """The first agent's address with this role: client, leader or follower."""
        for agent in self.sim.frontends.agents:
            if agent.role.value == role:
                return self.sim.frontends.addresses[agent.name]
        raise ValueError(f"no {role} in this cluster")

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            sock.close()

    def serve_forever(self) -> None:
        """Run in the foreground until SIGINT or SIGTERM."""
        try:
            self._server.run(sockets=self._sockets)
        finally:
            self._close_sockets()
            self.sim.driver.abandon()

    def start(self, timeout: float = 10.0) -> str:
        """Start on a background thread; return the base address once it listens."""
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            task = loop.create_task(self._server.serve(sockets=self._sockets))
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
        self._close_sockets()
        # Should the thread be stuck or dead, no process outlives the stop.
        self.sim.driver.abandon()

    async def _close_sim(self) -> None:
        self.sim.stop()
        # The killed executions' exit frames are sent before uvicorn closes
        # their WebSockets (1012) on its way out.
        streams = set(self.sim.exec_streams)
        if streams:
            await asyncio.wait(streams, timeout=2.0)

    def call(self, fn: Callable[[], T]) -> T:
        """Run a zero-argument callable on the simulator's loop and return its
        result (e.g. `call(lambda: server.sim.exec_processes(alloc_id))`)."""
        assert self._loop is not None
        assert callable(fn)

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)
