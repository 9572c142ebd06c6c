"""`Streamed`: a response whose body is sent as it is produced, and cut off
(the connection closed early, so the client sees an incomplete body) when the
body breaks off after the answer started — the only way to end a response
early under ASGI. `CutResponses` keeps uvicorn from logging each such cut as
an error; `create_app` installs it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Mapping

import anyio
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from controller.files.errors import Interrupted

log = logging.getLogger(__name__)


class CutResponses(logging.Filter):
    """Drops uvicorn's ERROR "ASGI callable returned without completing
    response." once for each response `Streamed` cut off on purpose: under
    ASGI, returning without completing is the only way to end a connection
    early, and our own warning already says why. Any other such error still
    shows."""

    MESSAGE = "ASGI callable returned without completing response."

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._expected = 0

    def expect(self) -> None:
        with self._lock:
            self._expected += 1

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != self.MESSAGE:
            return True
        with self._lock:
            if self._expected == 0:
                return True
            self._expected -= 1
            return False


CUT_RESPONSES = CutResponses()


def install_log_filter() -> None:
    """Put `CUT_RESPONSES` on uvicorn's error logger (`create_app` does; once
    is enough, as logging is process-wide, and a second time does nothing)."""
    logging.getLogger("uvicorn.error").addFilter(CUT_RESPONSES)


class Streamed(StreamingResponse):
    """A response whose body comes from `body` as it is produced. If the body
    breaks off (Interrupted) the response ends without completing, and the
    server closes the connection: the client sees an incomplete body. A client
    that leaves stops the stream. `done` gets the result either way."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        done: Callable[[str], None],
        *,
        status_code: int = 200,
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(body, status_code=status_code, media_type=media_type, headers=headers)
        self._body = body
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        result = "interrupted"
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                result = await self._stream(send)
                group.cancel_scope.cancel()
        finally:
            self._done(result)
            with contextlib.suppress(Exception):
                await self._body.aclose()

    async def _stream(self, send: Send) -> str:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self._body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except Interrupted as exc:
            log.warning("cut off a response: %s", exc.message)
            CUT_RESPONSES.expect()
            return "interrupted"
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "ok"
