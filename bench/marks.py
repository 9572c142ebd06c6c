"""Where a claim's time goes: each claim's way through the client, the
controller and the simulator, timestamped in each process on the machine's
monotonic clock (CLOCK_MONOTONIC is one clock for every process of a Linux
machine), then taken apart per claim.

- `ApiMarks` (in the controller's process, `bench.ctlproc`): when a
  middleware added to the API saw each claim and when the API began to
  answer, by the runner id it answered;
- `WriteMarks` (in the simulator's process, `bench.simproc`): when the
  simulator's app saw each EnforceIndex register of a job and when it began
  to answer, by job id (a claimed runner's job id is its runner id; the
  refill's creations, EnforceIndex 0, are marked too and match no claim);
- the controller's probe adds when it sent each claim's write and when its
  answer came back, the client when each claim was due, sent and answered.

Only the claims benchmark installs them (`BENCH_MARKS=1`, `simproc
--marks`), and they record only while switched on, so its other runs pay
one pass-through per request and other benchmarks nothing. `segments` puts
the marks of one claim together:

| segment | from | to |
|---|---|---|
| late | due | the client sends (the client's own delay) |
| to_api | sent | the API's middleware runs (kernel, uvicorn's read and parse) |
| before_write | the middleware | the write is sent (routing, the claim) |
| to_nomad | the write is sent | the simulator's app sees it |
| in_nomad | the simulator's app sees it | the simulator answers |
| from_nomad | the simulator answers | the controller has the answer |
| after_write | the controller has the answer | the API answers |
| back | the API answers | the client has the answer |
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# segment → (the mark it starts at, the one it ends at)
_BOUNDS = {
    "late": ("due", "sent"),
    "to_api": ("sent", "api_in"),
    "before_write": ("api_in", "write_sent"),
    "to_nomad": ("write_sent", "nomad_in"),
    "in_nomad": ("nomad_in", "nomad_out"),
    "from_nomad": ("nomad_out", "write_back"),
    "after_write": ("write_back", "api_out"),
    "back": ("api_out", "done"),
}
SEGMENTS = tuple(_BOUNDS)
_JOB_ID = re.compile(rb'"ID"\s*:\s*"([^"]+)"')


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class Recorder:
    """Marks by key, recorded only while switched on (`take`)."""

    def __init__(self) -> None:
        self.on = False
        self._lock = threading.Lock()
        self._marks: dict[str, tuple[float, float]] = {}

    def note(self, key: str, seen: float, answered: float) -> None:
        with self._lock:
            self._marks[key] = (seen, answered)

    def take(self, on: bool) -> dict[str, tuple[float, float]]:
        """What was recorded (then forgotten); recording on or off from now."""
        with self._lock:
            marks, self._marks = self._marks, {}
            self.on = on
        return marks


class _Marking:
    """ASGI middleware over one route: only its requests, while recording."""

    methods: tuple[str, ...] = ()
    path = ""

    def __init__(self, app: App, recorder: Recorder) -> None:
        self.app = app
        self.recorder = recorder

    def _marks(self, scope: Scope) -> bool:
        return (
            self.recorder.on
            and scope["type"] == "http"
            and scope["method"] in self.methods
            and scope["path"] == self.path
        )


class ApiMarks(_Marking):
    """`POST /api/v1/runners` seen and answered, by runner id."""

    methods = ("POST",)
    path = "/api/v1/runners"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._marks(scope):
            return await self.app(scope, receive, send)
        seen = now()
        answered = [0.0]

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered[0] = now()
            elif message["type"] == "http.response.body" and answered[0]:
                try:
                    runner = json.loads(message.get("body") or b"{}").get("runnerId")
                except ValueError:
                    runner = None
                if isinstance(runner, str):
                    self.recorder.note(runner, seen, answered[0])
            await send(message)

        await self.app(scope, receive, marked)


class WriteMarks(_Marking):
    """An EnforceIndex register (`PUT /v1/jobs`) seen and answered, by job id."""

    methods = ("PUT", "POST")
    path = "/v1/jobs"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._marks(scope):
            return await self.app(scope, receive, send)
        seen = now()
        body = bytearray()

        async def read() -> Message:
            message = await receive()
            body.extend(message.get("body", b""))
            return message

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start" and b'"EnforceIndex"' in body:
                found = _JOB_ID.search(body)
                if found is not None:
                    self.recorder.note(found.group(1).decode(), seen, now())
            await send(message)

        await self.app(scope, read, marked)


def segments(
    client: Mapping[str, tuple[float, float, float]],
    api: Mapping[str, tuple[float, float]],
    writes: Mapping[str, tuple[float, float]],
    nomad: Mapping[str, tuple[float, float]],
) -> list[dict[str, float]]:
    """Per claim with every mark (by runner id: `client` due, sent and done;
    `api` seen and answered; `writes` the controller's write sent and
    answered; `nomad` the simulator's seen and answered), its total and
    each segment, in seconds. Claims missing a mark are left out."""
    out = []
    for runner, (due, sent, done) in client.items():
        if runner not in api or runner not in writes or runner not in nomad:
            continue
        marks = {"due": due, "sent": sent, "done": done}
        marks["api_in"], marks["api_out"] = api[runner]
        marks["write_sent"], marks["write_back"] = writes[runner]
        marks["nomad_in"], marks["nomad_out"] = nomad[runner]
        row = {"total": done - due}
        for name, (start, end) in _BOUNDS.items():
            row[name] = marks[end] - marks[start]
        out.append(row)
    return out


def breakdown(rows: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Mean ms of each segment over the faster half of the claims, and over
    the slowest 1 % (at least one claim), by total."""
    ranked = sorted(rows, key=lambda r: r["total"])
    n = len(ranked)
    if not n:
        return {}
    groups = {"faster half": ranked[: max(1, n // 2)], "slowest 1 %": ranked[-max(1, n // 100) :]}
    return {
        name: {key: sum(r[key] for r in group) / len(group) * 1000 for key in ("total", *SEGMENTS)}
        | {"claims": float(len(group))}
        for name, group in groups.items()
    }
