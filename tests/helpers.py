"""Test helpers: waiting on conditions (never sleeping to synchronise),
job builders in Poseidon's runner layout, and a small event-stream reader."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import requests

T = TypeVar("T")
SECOND = 1_000_000_000


def wait_until(fn: Callable[[], T], timeout: float = 5.0, interval: float = 0.005) -> T:
    """Poll `fn` until it returns something truthy; fail with the last value on timeout."""
    deadline = time.monotonic() + timeout
    last: T = fn()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {last!r})")
        threading.Event().wait(interval)
        last = fn()
    return last


def runner_job(
    job_id: str,
    job_type: str = "batch",
    count: int = 1,
    image: str = "python:3.12",
    meta: dict[str, str] | None = None,
    restart: dict[str, Any] | None = None,
    reschedule: dict[str, Any] | None = None,
    cpu: int = 100,
    memory: int = 256,
) -> dict[str, Any]:
    """A job in Poseidon's layout: runner group `default-group` plus the count-0 `config` group."""
    group: dict[str, Any] = {
        "Name": "default-group",
        "Count": count,
        "Networks": [{"Mode": "bridge", "DynamicPorts": [{"Label": "8080", "To": 8080}]}],
        "Tasks": [
            {
                "Name": "default-task",
                "Driver": "docker",
                "Config": {"image": image, "command": "sleep", "args": ["infinity"]},
                "Resources": {"CPU": cpu, "MemoryMB": memory},
            }
        ],
    }
    if restart is not None:
        group["RestartPolicy"] = restart
    if reschedule is not None:
        group["ReschedulePolicy"] = reschedule
    config = {
        "Name": "config",
        "Count": 0,
        "Meta": meta or {"used": "false", "timeout": "0"},
        "Tasks": [{"Name": "config", "Driver": "exec", "Config": {"command": "true"}}],
    }
    return {"ID": job_id, "Type": job_type, "TaskGroups": [group, config]}


class EventReader:
    """Reads /v1/event/stream on a thread and collects frames (heartbeats counted apart)."""

    def __init__(self, address: str, params: dict[str, Any] | None = None) -> None:
        self.frames: list[dict[str, Any]] = []
        self.heartbeats = 0
        self.closed = False
        self._response = requests.get(
            f"{address}/v1/event/stream", params=params or {}, stream=True, timeout=10
        )
        self._response.raise_for_status()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._response.iter_lines():
                if not line:
                    continue
                frame = json.loads(line)
                if frame:
                    self.frames.append(frame)
                else:
                    self.heartbeats += 1
        except (requests.RequestException, AttributeError):
            pass
        self.closed = True

    def events(self, topic: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for f in list(self.frames)
            for e in f["Events"]
            if (topic is None or e["Topic"] == topic) and (key is None or e["Key"] == key)
        ]

    def close(self) -> None:
        # Closing the response from another thread waits for the reader's
        # blocking recv; shutting the socket down ends that recv at once.
        sock = getattr(getattr(self._response.raw, "_connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._response.close()
        self._thread.join(5)


class Http:
    """Minimal raw HTTP access to the simulator, for asserting exact wire behaviour."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.session = requests.Session()

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", 10)
        return self.session.request(method, self.address + path, **kwargs)

    def get(self, path: str, **params: Any) -> Any:
        response = self.request("GET", path, params=params)
        assert response.status_code == 200, (path, response.status_code, response.text)
        return response.json()

    def register(self, job: dict[str, Any], **extra: Any) -> dict[str, Any]:
        response = self.request("PUT", "/v1/jobs", json={"Job": job, **extra})
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def allocs(self, job_id: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get(f"/v1/job/{job_id}/allocations")
        return result

    def alloc(self, alloc_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/v1/allocation/{alloc_id}")
        return result

    def running(self, job_id: str, n: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Wait until the job has n running allocations that should run; return them."""

        def check() -> list[dict[str, Any]]:
            allocs = [
                a
                for a in self.allocs(job_id)
                if a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"
            ]
            return allocs if len(allocs) == n else []

        return wait_until(check, timeout)
