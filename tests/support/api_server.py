"""The whole service — controller, exec client and HTTP API on uvicorn — in a
background thread against a simulator, reached over real sockets as a client
would (WebSockets included)."""

from __future__ import annotations

import threading
from typing import Any

import uvicorn

from controller.config import Settings, load_settings
from controller.service import Service, build
from nomadsim import SimServer
from tests.helpers import wait_until

TOKEN = "e2e-token-0123456789"


def sim_settings(sim: SimServer, **environ: str) -> Settings:
    """Settings for a service against `sim`: its setuser stand-in as the
    unprivileged wrapper, an API token, short timings."""
    setuser = sim.call(lambda: sim.sim.setuser_path)
    base = {
        "NOMAD_ADDR": sim.address,
        "NRC_API_TOKEN": TOKEN,
        "NRC_API_PORT": "1",  # replaced: uvicorn listens on a free port
        "NRC_EXEC_UNPRIVILEGED_WRAPPER": f"{setuser} user",
        "NRC_LOG_LEVEL": "WARNING",
        # short timings: resyncs, retries, no write rate limit
        "NRC_RESYNC_INTERVAL": "1",
        "NRC_MAX_BACKOFF": "0.5",
        "NRC_NOMAD_WRITE_RATE": "0",
        "NRC_NOMAD_TIMEOUT": "5",
        "NRC_LOG_FORMAT": "text",
    }
    return load_settings({**base, **environ})


class ApiServer:
    """`build(settings)` served on 127.0.0.1 with a free port (or `port`,
    when the URL must be known before it listens)."""

    def __init__(self, settings: Settings, port: int = 0) -> None:
        self.service: Service = build(settings)
        config = uvicorn.Config(
            self.service.app, host="127.0.0.1", port=port, log_level="warning", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="api", daemon=True)

    @property
    def controller(self) -> Any:
        return self.service.controller

    @property
    def port(self) -> int:
        for server in self._server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        raise RuntimeError("not listening")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiServer:
        self.service.controller.start()
        self._thread.start()
        wait_until(lambda: self._server.started, timeout=10)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self.service.controller.stop()
