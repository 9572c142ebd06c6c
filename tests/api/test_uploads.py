"""Uploads beyond their size (issue 24, finding 6): concurrent uploads are
bounded (503 at once), a stalled body ends (408), and an upload's items and
paths are bounded whatever its bytes (400)."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import MutableMapping
from typing import Any

import pytest

from controller.api.uploads import BodyIdle, UploadGate, UploadSettings
from controller.files.upload import BadUpload, Limits, parse

pytestmark = pytest.mark.anyio
PATH = re.compile(r"/api/v1/runners/[^/]+/files")


def scope(method: str = "PATCH", path: str = "/api/v1/runners/r/files") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": []}


class Sent:
    def __init__(self) -> None:
        self.messages: list[MutableMapping[str, Any]] = []

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])


async def test_uploads_beyond_the_limit_are_503_at_once() -> None:
    release, two_in = asyncio.Event(), asyncio.Event()
    entered = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal entered
        entered += 1
        if entered == 2:
            two_in.set()
        await release.wait()

    gate = UploadGate(app, "PATCH", PATH, UploadSettings(max_concurrent=2))

    async def never() -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError

    running = [asyncio.ensure_future(gate(scope(), never, Sent())) for _ in range(2)]
    await two_in.wait()
    refused = Sent()
    await gate(scope(), never, refused)  # answered without reading its body
    assert refused.status == 503
    assert b"NRC_FILES_MAX_CONCURRENT_UPLOADS" in refused.messages[1]["body"]
    # a listing is not an upload
    running.append(asyncio.ensure_future(gate(scope("GET"), never, Sent())))
    release.set()
    await asyncio.gather(*running)
    assert entered == 3
    assert gate.active == 0
    await gate(scope(), never, Sent())  # room again (the app returns at once now)
    assert entered == 4


async def test_a_stalled_body_raises_body_idle_and_a_complete_one_does_not() -> None:
    async def reader(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass

    gate = UploadGate(reader, "PATCH", PATH, UploadSettings(idle_timeout_s=0.05))
    parts = [{"type": "http.request", "body": b"{", "more_body": True}]

    async def stalls() -> dict[str, Any]:
        if parts:
            return parts.pop()
        await asyncio.Event().wait()
        raise AssertionError

    with pytest.raises(BodyIdle, match=r"sent nothing for 0\.05 s"):
        await gate(scope(), stalls, Sent())
    assert gate.active == 0

    async def whole() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    await gate(scope(), whole, Sent())


def parsed(body: dict[str, Any], limits: Limits) -> None:
    with tempfile.TemporaryFile() as spool:
        spool.write(json.dumps(body).encode())
        spool.flush()
        parse(spool.fileno(), limits)


def test_items_and_path_bytes_are_bounded() -> None:
    limits = Limits(max_items=3, max_path_bytes=4096)
    parsed({"delete": ["a"], "copy": [{"path": "b"}, {"path": "c/"}]}, limits)
    with pytest.raises(
        BadUpload, match=r"more than 3 delete and copy items \(NRC_FILES_MAX_ITEMS\)"
    ):
        parsed({"delete": ["a", "b"], "copy": [{"path": "b"}, {"path": "c/"}]}, limits)
    with pytest.raises(BadUpload, match=r"copy\[1\]: the paths take more than 4096 bytes"):
        parsed({"copy": [{"path": "x" * 4000}, {"path": "y" * 100}]}, limits)
