"""activity: how a touch through any replica reaches the replica that expires
claims (docs/inactivity.md argues each choice and states the bound).

Only with leader election, and only through Nomad variables, the
controller's one shared state:

- Publish. Every replica owns the variables `<lock path>/activity/<replica
  id>/<n>`, whose items map runner id → its last activity on this replica,
  in unix milliseconds: every runner claimed now that this replica touched,
  a runner with a use in flight counting as active at each publish. Every
  publish interval the replica writes the variables whose items changed and
  deletes those left empty; nothing is written when nothing changed. The
  items are split over as many variables as needed to keep each under
  CHUNK_BYTES (a Nomad variable holds 64 KiB).
- Read. The leader, before a pass decides expiries, lists the variables
  under `<lock path>/activity/` and fetches those whose ModifyIndex moved
  since it last read them, at most once per publish interval; the newest
  time per runner, over every replica, is the runner's remote activity. A
  read that fails decides no expiry until one succeeds (tried again one
  interval later).
- Leave. A replica that stops deletes its variables. The leader deletes a
  variable that names no runner claimed now and whose newest time is older
  than STALE: what a crashed replica left behind.

A new leader needs no hand-over: its first pass reads every variable (it
never read, or its last read is older than the interval) before it decides.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

from controller.clock import Clock
from controller.metrics import Metrics
from controller.nomad.gateway import NomadAPIError, NomadUnavailable, VariableStub

log = logging.getLogger(__name__)

MS = 1_000_000  # ns
# Items per variable: half of Nomad's 64 KiB, leaving room for the JSON
# around each item and the encryption Nomad adds.
CHUNK_BYTES = 32 * 1024
ITEM_OVERHEAD = 6  # two quotes around the key and the value, a colon, a comma
# A variable naming no claimed runner is left alone this long: the leader's
# snapshot may lag a claim that another replica made and touched.
STALE_NS = 3600 * 1_000_000_000


# -- pure ---------------------------------------------------------------------------


def entries(
    activity: Mapping[str, int], busy: Collection[str], claimed: Collection[str], now_ns: int
) -> dict[str, int]:
    """What a replica publishes: for each claimed runner it touched or uses
    now, its last activity in unix ms (a use in flight: now)."""
    out: dict[str, int] = {}
    for runner_id in claimed:
        at = now_ns if runner_id in busy else activity.get(runner_id)
        if at is not None:
            out[runner_id] = at // MS
    return out


def chunks(published: Mapping[str, int], limit: int = CHUNK_BYTES) -> tuple[dict[str, str], ...]:
    """The items of each variable, in runner id order, none over `limit` bytes
    (one item alone may be, as no split can help it)."""
    out: list[dict[str, str]] = []
    current: dict[str, str] = {}
    size = 0
    for runner_id in sorted(published):
        value = str(published[runner_id])
        item = len(runner_id.encode()) + len(value) + ITEM_OVERHEAD
        if current and size + item > limit:
            out.append(current)
            current, size = {}, 0
        current[runner_id] = value
        size += item
    if current:
        out.append(current)
    return tuple(out)


def parse(items: Mapping[str, str]) -> dict[str, int]:
    """A variable's items as runner id → unix ms; an item that is not a
    count of milliseconds (somebody else's writing) is left out."""
    out: dict[str, int] = {}
    for runner_id, value in items.items():
        if value.isdigit():
            out[runner_id] = int(value)
    return out


def newest(variables: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Per runner, the newest time any variable holds."""
    out: dict[str, int] = {}
    for times in variables:
        for runner_id, at in times.items():
            if at > out.get(runner_id, -1):
                out[runner_id] = at
    return out


def disposable(
    times: Mapping[str, int], claimed: Collection[str], now_ms: int, stale_ns: int = STALE_NS
) -> bool:
    """A variable nobody needs: it names no claimed runner, and its newest
    time is older than `stale_ns`."""
    if any(runner_id in claimed for runner_id in times):
        return False
    return max(times.values(), default=0) <= now_ms - stale_ns // MS


# -- the wiring ---------------------------------------------------------------------------


class ActivityStore(Protocol):
    """The part of `NomadGateway` shared activity uses; any NomadGateway is one."""

    def list_variables(self, prefix: str) -> tuple[VariableStub, ...]: ...

    def get_variable(self, path: str) -> dict[str, str] | None: ...

    def put_variable(self, path: str, items: dict[str, str]) -> None: ...

    def delete_variable(self, path: str, modify_index: int | None = None) -> bool: ...


# (activity: runner id → ns, runners with a use in flight)
LocalActivity = Callable[[], tuple[Mapping[str, int], Collection[str]]]
# The runners claimed now, or None before Nomad was observed.
ClaimedRunners = Callable[[], Collection[str] | None]


def activity_prefix(lock_path: str) -> str:
    """Where the replicas of the deployment electing at `lock_path` publish."""
    return f"{lock_path}/activity"


class SharedActivity:
    """This replica's side of the protocol in the module docstring."""

    def __init__(
        self,
        *,
        store: ActivityStore,
        prefix: str,
        clock: Clock,
        metrics: Metrics,
        interval_s: float,
        local: LocalActivity,
        claimed: ClaimedRunners,
        replica: str | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.replica = replica or uuid.uuid4().hex[:12]
        self._store = store
        self._prefix = prefix
        self._own = f"{prefix}/{self.replica}/"
        self._clock = clock
        self._metrics = metrics
        self.interval_s = interval_s
        self._local = local
        self._claimed = claimed
        self._chunk_bytes = chunk_bytes
        self._publish_mu = threading.Lock()  # one publish at a time; held across writes
        self._published: list[dict[str, str]] = []  # what our variables hold, by number
        self._read_mu = threading.Lock()  # one read at a time; held across reads
        self._mu = threading.Lock()  # the read state below; never held across a request
        self._read_at: float | None = None  # monotonic start of the last read
        self._seen: dict[str, tuple[int, dict[str, int]]] = {}  # path → (index, times)
        self._remote: dict[str, int] | None = None  # runner id → ns; None: unknown

    def path(self, n: int) -> str:
        return f"{self._own}{n}"

    # -- publishing (every replica) ----------------------------------------------------

    def publish(self) -> None:
        """Write what changed since the last publish (nothing when nothing did)."""
        claimed = self._claimed()
        if claimed is None:
            return  # Nomad not observed yet: we know no claim to publish for
        activity, busy = self._local()
        published = entries(activity, busy, claimed, self._clock.now_ns())
        wanted = chunks(published, self._chunk_bytes)
        wrote = False
        with self._publish_mu:
            try:
                for n, items in enumerate(wanted):
                    if n < len(self._published) and self._published[n] == items:
                        continue
                    wrote = True
                    self._store.put_variable(self.path(n), items)
                    if n < len(self._published):
                        self._published[n] = items
                    else:
                        self._published.append(items)
                while len(self._published) > len(wanted):
                    wrote = True
                    self._store.delete_variable(self.path(len(self._published) - 1))
                    self._published.pop()
            except (NomadUnavailable, NomadAPIError) as exc:
                # What was not written is still different: the next publish tries again.
                self._count("publish", "error")
                log.warning("publishing runner activity: %s", exc)
                return
        if wrote:
            self._count("publish", "ok")

    def withdraw(self) -> None:
        """This replica stops: its variables go (best effort)."""
        with self._publish_mu:
            if not self._published:
                return
            try:
                while self._published:
                    self._store.delete_variable(self.path(len(self._published) - 1))
                    self._published.pop()
            except (NomadUnavailable, NomadAPIError) as exc:
                # Left for the leader to delete once it is stale.
                self._count("delete", "error")
                log.warning("deleting this replica's runner activity: %s", exc)
                return
        self._count("delete", "ok")

    def run(self, stop: threading.Event) -> None:
        """Publish every interval until `stop` is set, then withdraw."""
        while not stop.wait(self.interval_s):
            try:
                self.publish()
            except Exception:
                log.exception("publishing runner activity failed")
        self.withdraw()

    # -- reading (the leader) ----------------------------------------------------------------

    def read(self) -> dict[str, int] | None:
        """Every other replica's activity (runner id → ns, the newest of
        all), read from Nomad if the last read is older than the interval;
        None when it cannot be read (decide no expiry)."""
        with self._read_mu:
            started = self._clock.monotonic()
            with self._mu:
                if self._read_at is not None and started - self._read_at < self.interval_s:
                    return self._remote
                seen = dict(self._seen)
            try:
                current = self._fetch(seen)
            except (NomadUnavailable, NomadAPIError) as exc:
                self._count("read", "error")
                log.warning("reading runner activity: %s", exc)
                with self._mu:
                    # Unknown until the next read, tried one interval later.
                    self._read_at = started
                    self._remote = None
                return None
            remote = {r: ms * MS for r, ms in newest(t for _, t in current.values()).items()}
            with self._mu:
                self._seen = current
                self._remote = remote
                self._read_at = started
            self._count("read", "ok")
            self._collect(current)
            return remote

    def known(self) -> dict[str, int] | None:
        """What the last read found, without reading (None: it failed, or none yet)."""
        with self._mu:
            return self._remote

    def _fetch(
        self, seen: Mapping[str, tuple[int, dict[str, int]]]
    ) -> dict[str, tuple[int, dict[str, int]]]:
        current: dict[str, tuple[int, dict[str, int]]] = {}
        for stub in self._store.list_variables(f"{self._prefix}/"):
            if stub.path.startswith(self._own):
                continue  # our own activity is in memory, and newer
            known = seen.get(stub.path)
            if known is not None and known[0] == stub.modify_index:
                current[stub.path] = known
                continue
            items = self._store.get_variable(stub.path)
            if items is not None:  # None: deleted since the list
                current[stub.path] = (stub.modify_index, parse(items))
        return current

    def _collect(self, current: Mapping[str, tuple[int, dict[str, int]]]) -> None:
        """Delete what crashed replicas left (see `disposable`)."""
        claimed = self._claimed()
        if claimed is None:
            return
        now_ms = self._clock.now_ns() // MS
        for path, (index, times) in current.items():
            if not disposable(times, claimed, now_ms):
                continue
            try:
                # Check-and-set: a replica that wrote meanwhile is alive.
                if self._store.delete_variable(path, index):
                    log.info("deleted stale runner activity %s", path)
                    self._count("delete", "ok")
            except (NomadUnavailable, NomadAPIError) as exc:
                self._count("delete", "error")
                log.warning("deleting stale runner activity %s: %s", path, exc)

    def _count(self, operation: str, result: str) -> None:
        self._metrics.activity_sync.labels(operation, result).inc()
