"""Graceful drain: what a replica does between SIGTERM and its exit.

The protocol, stated before the code (docs/operations.md, "Deploying without
cutting a student off"):

1. The drain begins (the first SIGTERM or SIGINT): `/readyz` answers 503 at
   once, so a load balancer stops routing new requests here; new claims, new
   executions (`POST /execute`) and new file operations answer 503
   `SHUTTING_DOWN` with `Retry-After`, which a client retries on another
   replica. Everything else (reads, releases, environments, the WebSocket of
   an execution already asked for) is still served — but when replicas
   share execution ids, a WebSocket is taken only for an execution whose
   time limit ends before the grace does (`Drain.finishes`): any other is
   refused with 503 `SHUTTING_DOWN` before the upgrade, and the balancer's
   retry reaches a replica that takes the id from this one.
2. The replica steps down: the prewarm history is saved and the leader lock
   released, so a follower takes over pool upkeep within about a second
   instead of a lock TTL.
3. Running executions and file operations go on until they end, and, when
   replicas share execution ids (NRC_API_ADVERTISE_URL), the ids this replica
   issued wait to be taken (another replica takes them over the internal
   route, which the gate never refuses), or until the grace
   (`NRC_SHUTDOWN_GRACE`) runs out; then every execution still running
   is ended with an `error` frame saying the controller is shutting down (and
   its command killed as on a timeout) — never a silent cut.
4. Then uvicorn is told to exit, and the process exits 0. A second signal
   ends at once.

`Drain` is the state the middleware and `/readyz` read; `DrainGate` is the
middleware that refuses new work and counts the work in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from controller.api.errors import error_response
from controller.api.models import ErrorCode
from controller.reconcile.uses import InFlight

# A client retries after this many seconds (on another replica, through its
# load balancer, which has stopped routing here by then).
RETRY_AFTER_S = 1
SHUTTING_DOWN_MESSAGE = (
    "this replica of the controller is shutting down; retry the request (another replica serves it)"
)


class Drain:
    """Whether this replica drains, and how much gated work is in flight.
    Used on the API's event loop only."""

    def __init__(self) -> None:
        self.draining = False
        # When the grace ends (the event loop's time), once the drain began.
        self.deadline: float | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def begin(self, deadline: float | None = None) -> None:
        self.draining = True
        self.deadline = deadline

    def finishes(self, time_limit_s: float, now: float) -> bool:
        """Whether an execution with this time limit (0: none), started now,
        ends before the grace does."""
        if not self.draining:
            return True
        if self.deadline is None or time_limit_s <= 0:
            return False
        return now + time_limit_s <= self.deadline

    def enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing is in flight, False when `timeout_s` ran out first."""
        if self._idle.is_set():  # even with no time left
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


def _pattern(prefix: str) -> re.Pattern[str]:
    runner = f"{re.escape(prefix)}/runners"
    return re.compile(
        rf"^(?:(?P<claim>POST {runner})"
        rf"|(?P<execute>POST {runner}/[^/]+/execute)"
        rf"|(?P<files>(?:GET|PATCH|HEAD) {runner}/[^/]+/files(?:/raw)?)"
        rf"|(?P<websocket>WS {runner}/[^/]+/websocket))$"
    )


class DrainGate:
    """ASGI middleware: while draining, new claims, executions and file
    operations answer 503 `SHUTTING_DOWN`; executions (their WebSockets) and
    file operations are counted while they run, whenever they began."""

    def __init__(self, app: ASGIApp, drain: Drain, prefix: str) -> None:
        self.app = app
        self.drain = drain
        self.routes = _pattern(prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        method = "WS" if scope["type"] == "websocket" else scope["method"]
        match = self.routes.match(f"{method} {scope['path']}")
        if match is None:
            await self.app(scope, receive, send)
            return
        # An execution asked for before the drain is still served: its id
        # lives on this replica only. (Another replica's take of it, on
        # /internal/v1/executions, is not matched here: always served.)
        if self.drain.draining and match.lastgroup != "websocket":
            response = error_response(503, SHUTTING_DOWN_MESSAGE, ErrorCode.SHUTTING_DOWN)
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            await response(scope, receive, send)
            return
        counted = match.lastgroup in ("files", "websocket")
        if counted:
            self.drain.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            if counted:
                self.drain.leave()


def describe_uses(in_flight: Iterable[InFlight]) -> str:
    """What is in flight, for the drain's log: "2 execution, 1 download"."""
    counts = Counter(use.what for use in in_flight)
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) or "nothing"


async def run_drain(
    drain: Drain,
    *,
    step_down: Callable[[], Awaitable[None]],
    end_executions: Callable[[], None],
    executions_ended: Callable[[], Awaitable[None]],
    grace_s: float,
    last_frames_s: float = 5.0,
    ids_waiting: Callable[[], int] | None = None,
    poll_s: float = 0.1,
) -> bool:
    """Steps 1-3 of the protocol; True when everything ended within the grace.
    `ids_waiting`: how many execution ids issued here still wait to be taken
    (the store is another thread's, so it is read every `poll_s`)."""
    loop = asyncio.get_running_loop()
    # WebSockets are admitted against the grace counted from the signal (the
    # earlier end: never one that cannot finish); the wait below counts it
    # from the step-down, as it always has.
    drain.begin(loop.time() + grace_s)
    await step_down()
    deadline = loop.time() + grace_s
    if ids_waiting is not None:
        # Ids leave by takes on worker threads and by expiring, which nothing
        # signals: a poll of the store's count is the honest wait here.
        while ids_waiting() and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(poll_s)
    ended = await drain.wait_idle(max(0.0, deadline - loop.time()))
    if not ended:
        end_executions()

    async def last_frames() -> None:
        # The error frames go out and the killed commands' clean-ups run.
        await drain.wait_idle(last_frames_s)
        await executions_ended()

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(last_frames(), last_frames_s)
    return ended
