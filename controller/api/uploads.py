"""Bounds on `PATCH /files` uploads that their size alone does not give.

`UploadGate` (ASGI middleware on the upload route): at most `max_concurrent`
uploads at once (each spools to disk and holds its runner in use); one
beyond is answered 503 at once, its body unread. A body that sends nothing
for `idle_timeout_s` raises `BodyIdle` (408): a stalled client must not hold
its runner "in use", and so unexpirable, for ever.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.api.errors import error_response


@dataclass(frozen=True)
class UploadSettings:
    max_concurrent: int = 8
    idle_timeout_s: float = 30.0


class BodyIdle(Exception):
    """The request body sent nothing for the idle timeout."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the request body sent nothing for {timeout_s:g} s")
        self.timeout_s = timeout_s


class UploadGate:
    def __init__(
        self, app: ASGIApp, method: str, path: re.Pattern[str], settings: UploadSettings
    ) -> None:
        self.app = app
        self.method = method
        self.path = path
        self.settings = settings
        self.active = 0  # one event loop: no lock needed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != self.method
            or not self.path.fullmatch(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        limit = self.settings.max_concurrent
        if self.active >= limit:
            message = f"{limit} uploads are under way (NRC_FILES_MAX_CONCURRENT_UPLOADS): retry"
            await error_response(503, message, headers={"Retry-After": "1"})(scope, receive, send)
            return
        idle_s = self.settings.idle_timeout_s

        complete = False

        async def watched() -> Message:
            nonlocal complete
            if complete:  # later reads wait for a disconnect: not the body's
                return await receive()
            try:
                async with asyncio.timeout(idle_s):
                    message = await receive()
            except TimeoutError:
                raise BodyIdle(idle_s) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        self.active += 1
        try:
            await self.app(scope, watched, send)
        finally:
            self.active -= 1
