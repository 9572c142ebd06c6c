"""A client of the whole service, as a learning platform is: it claims runners
over HTTP, runs executions over the WebSocket with the token header (as
CodeOcean does), and moves files — against the simulator, whose exec runs the
commands for real. Every WebSocket frame is checked against Poseidon's schema."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_from_bytes

import requests
from jsonschema import Draft7Validator
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from controller.model import Environment
from nomadsim import SimServer
from tests.helpers import Http, wait_until
from tests.reference import document
from tests.support.api_server import TOKEN, ApiServer, sim_settings

ENV = Environment(id=21, image="python:3.12", prewarming_pool_size=2)
AUTH = {"Poseidon-Token": TOKEN}
SCHEMA = Draft7Validator(json.loads(document("poseidon-websocket.schema.json").read_text()))


@dataclass
class Run:
    """What a client saw of one execution."""

    frames: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    seconds: float = 0.0

    @property
    def stdout(self) -> str:
        return "".join(f["data"] for f in self.frames if f["type"] == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(f["data"] for f in self.frames if f["type"] == "stderr")

    @property
    def last(self) -> dict[str, Any]:
        return self.frames[-1]


@dataclass
class World:
    sim: SimServer
    api: ApiServer

    def url(self, path: str) -> str:
        return f"{self.api.url}/api/v1{path}"

    def claim(self, timeout_s: int = 0) -> str:
        body = {"executionEnvironmentId": ENV.id, "inactivityTimeout": timeout_s}

        def claimed() -> str | None:
            r = requests.post(self.url("/runners"), json=body, headers=AUTH, timeout=10)
            return str(r.json()["runnerId"]) if r.status_code == 200 else None

        runner = wait_until(claimed, timeout=10, interval=0.05)
        assert runner is not None
        return runner

    def execute(self, runner: str, command: str, **extra: Any) -> str:
        r = requests.post(
            self.url(f"/runners/{runner}/execute"),
            json={"command": command, **extra},
            headers=AUTH,
            timeout=10,
        )
        assert r.status_code == 200, r.text
        return str(r.json()["websocketUrl"])

    def connect(self, ws_url: str, headers: dict[str, str] | None = None) -> ClientConnection:
        return connect(ws_url, additional_headers=AUTH if headers is None else headers)

    def run(self, runner: str, command: str, stdin: tuple[str, ...] = (), **extra: Any) -> Run:
        ws_url = self.execute(runner, command, **extra)
        started = time.monotonic()
        with self.connect(ws_url) as ws:
            for text in stdin:
                ws.send(text)
            return read_all(ws, started)

    def alloc_of(self, runner: str) -> dict[str, Any]:
        (alloc,) = Http(self.sim.address).running(runner)
        return alloc

    def processes(self, alloc_id: str) -> list[int]:
        return self.sim.call(lambda: self.sim.sim.exec_processes(alloc_id))

    def runner_status(self, runner: str) -> tuple[int, str]:
        r = requests.get(self.url(f"/runners/{runner}"), headers=AUTH, timeout=10)
        return r.status_code, r.json().get("message", "")

    # -- files ------------------------------------------------------------------------

    def patch_files(
        self,
        runner: str,
        copy: dict[str, bytes | None] | None = None,
        delete: list[str] | None = None,
    ) -> requests.Response:
        """PATCH /files with `copy` as path → bytes (None: a directory or no content)."""
        body: dict[str, Any] = {}
        if delete is not None:
            body["delete"] = delete
        if copy is not None:
            body["copy"] = [
                {"path": path}
                if data is None
                else {"path": path, "content": base64.b64encode(data).decode("ascii")}
                for path, data in copy.items()
            ]
        return self.patch_raw(runner, json.dumps(body).encode())

    def patch_raw(self, runner: str, body: bytes, **headers: str) -> requests.Response:
        return requests.patch(
            self.url(f"/runners/{runner}/files"),
            data=body,
            headers={**AUTH, "Content-Type": "application/json", **headers},
            timeout=30,
        )

    def list_files(self, runner: str, **params: Any) -> requests.Response:
        return requests.get(
            self.url(f"/runners/{runner}/files"), params=params, headers=AUTH, timeout=30
        )

    def files(self, runner: str, **params: Any) -> dict[str, dict[str, Any]]:
        """The listing as name → entry; fails unless it is 200."""
        r = self.list_files(runner, **params)
        assert r.status_code == 200, r.text
        return {entry["name"]: entry for entry in r.json()["files"]}

    def download(self, runner: str, path: str, **headers: str) -> requests.Response:
        """GET /files/raw; a path's bytes that are not UTF-8 (lone surrogates, as
        listings name them) go percent-encoded as those bytes."""
        raw = path.encode("utf-8", "surrogateescape")
        return requests.get(
            self.url(f"/runners/{runner}/files/raw") + "?path=" + quote_from_bytes(raw, safe=""),
            headers={**AUTH, **headers},
            timeout=30,
        )


def read_all(
    ws: ClientConnection, started: float, timeout: float = 20.0, start_read: bool = False
) -> Run:
    """Frames until the server closes; `start_read`: the caller took `start` already."""
    run = Run(frames=[{"type": "start"}] if start_read else [])
    try:
        while True:
            raw = ws.recv(timeout=timeout)
            frame = json.loads(raw)
            errors = [e.message for e in SCHEMA.iter_errors(frame)]
            assert not errors, (frame, errors)
            run.frames.append(frame)
    except ConnectionClosed as closed:
        run.close_code = closed.rcvd.code if closed.rcvd else None
    run.seconds = time.monotonic() - started
    assert run.frames and run.frames[0] == {"type": "start"}
    return run


@contextlib.contextmanager
def world_with(
    make_sim: Any, sim_config: dict[str, Any] | None = None, **environ: str
) -> Iterator[World]:
    """A simulator of two nodes (`sim_config` overriding the test timings) and
    the service against it, with `environ` set."""
    sim = make_sim(**{"nodes": 2, **(sim_config or {})})
    api = ApiServer(sim_settings(sim, **environ)).start()
    try:
        api.controller.pools.put_environment(ENV)
        yield World(sim, api)
    finally:
        api.stop()
