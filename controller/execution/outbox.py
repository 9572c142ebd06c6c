"""The frames of one execution waiting for its client's writer, bounded by
the output text they hold rather than by their number.

Output reaches the relay in pieces of very different sizes (a Nomad frame
of 1 KiB, or dozens of them joined when they arrived in one read), so a
bound in frames bounds nothing in bytes. A `put` waits while the queue holds
`limit` characters of output or more; the frames without output (start, the
terminal frame, the end marker None) count as none. A slow client thus holds
the relay's reads back, and through them Nomad, with at most about `limit`
characters (plus one piece per producer) held here.
"""

from __future__ import annotations

import asyncio
from collections import deque

from controller.execution.frames import Frame


def output_size(frame: Frame | None) -> int:
    """Characters of output a frame holds (none but stdout's and stderr's)."""
    if frame is None or frame["type"] not in ("stdout", "stderr"):
        return 0
    return len(frame["data"])


class Outbox:
    def __init__(self, limit: int) -> None:
        self._frames: deque[Frame | None] = deque()
        self._held = 0
        self._limit = limit
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    @property
    def held(self) -> int:
        return self._held

    def empty(self) -> bool:
        return not self._frames

    async def put(self, frame: Frame | None) -> None:
        while self._held >= self._limit:
            self._writable.clear()
            await self._writable.wait()
        self._frames.append(frame)
        self._held += output_size(frame)
        self._readable.set()

    def get_nowait(self) -> Frame | None:
        """The oldest frame; raises IndexError when there is none."""
        frame = self._frames.popleft()
        self._held -= output_size(frame)
        if self._held < self._limit:
            self._writable.set()
        if not self._frames:
            self._readable.clear()
        return frame

    async def get(self) -> Frame | None:
        while not self._frames:
            await self._readable.wait()
        return self.get_nowait()
