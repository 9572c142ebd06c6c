"""history: an environment's prewarming memory, compact and bounded, so it
survives a controller restart as one small JSON value kept in Nomad.

Pure: frozen dataclasses, and `record`, `record_startup` return new values.
What is kept, and its bound:

- claims per 5-minute bucket for the last four weeks (8,064 buckets), and
  per bucket its *peak*: the most claims in any one minute ending in it.
  Weekly seasonality reads these; a burst of 200 claims in two minutes
  shows as a peak of ~150 where the bucket's count alone would average it
  over five minutes.
- the claim timestamps of the last 10 minutes (at most 512, to the
  millisecond), which the steady and panic windows read.
- the last 64 start-up latencies (placement → running), to the millisecond.
- the hold: the target the policy holds and when it was last needed.

`to_json` writes the buckets as zlib-compressed big-endian uint16 in base64:
at most 44 KB whatever the counts (a Nomad variable holds 64 KiB), a few KB
for a month of a course. The other parts add at most 6 KB.

Time is wall-clock nanoseconds, like the controller's clock. Buckets are
keyed by absolute time, so the same phase of an earlier week is 2,016
buckets back (`Timescale`: the bucket, the week and the peak window are
parameters, real time by default, compressed in tests; a history's JSON
names its bucket and is read back on the same timescale only). The
history never holds the future: a claim more than a minute earlier than the
newest one recorded (the clock went back) discards what was recorded from
its bucket on; a claim four weeks past the newest starts the buckets afresh.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import json
import math
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Any

from controller.model import SECOND

MILLISECOND = 1_000_000
BUCKET_NS = 300 * SECOND
WEEK_NS = 7 * 24 * 3600 * SECOND
BUCKETS_PER_WEEK = WEEK_NS // BUCKET_NS  # 2,016
HISTORY_WEEKS = 4
MAX_BUCKETS = HISTORY_WEEKS * BUCKETS_PER_WEEK  # 8,064
PEAK_WINDOW_NS = 60 * SECOND
RECENT_NS = 600 * SECOND
MAX_RECENT = 512
MAX_STARTUPS = 64
# An out-of-order claim within this is a race between two API threads, not a clock jump.
CLOCK_TOLERANCE_NS = 60 * SECOND
MAX_COUNT = 0xFFFF  # a bucket's count and peak saturate here (uint16 when stored)
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Timescale:
    """The grain and the season of a history. The defaults are the real ones;
    a test compresses the week (and the bucket and peak window with it) to
    see seasonality within seconds."""

    bucket_ns: int = BUCKET_NS
    week_ns: int = WEEK_NS  # a whole number of buckets
    peak_window_ns: int = PEAK_WINDOW_NS

    def __post_init__(self) -> None:
        if self.bucket_ns <= 0 or self.week_ns % self.bucket_ns or self.peak_window_ns <= 0:
            raise ValueError(f"a week must be a whole number of buckets: {self}")

    @property
    def buckets_per_week(self) -> int:
        return self.week_ns // self.bucket_ns

    @property
    def max_buckets(self) -> int:
        return HISTORY_WEEKS * self.buckets_per_week


REAL_TIME = Timescale()


@dataclass(frozen=True)
class ClaimHistory:
    """Claims per bucket for buckets `end - len(counts)` … `end - 1`, and the
    timestamps of the recent ones (sorted)."""

    end: int = 0  # one past the newest bucket's index (t // BUCKET_NS)
    counts: tuple[int, ...] = ()
    peaks: tuple[int, ...] = ()  # most claims in any PEAK_WINDOW_NS ending in the bucket
    recent: tuple[int, ...] = ()  # ns, whole milliseconds, within RECENT_NS of the newest
    scale: Timescale = REAL_TIME

    def bucket(self, index: int) -> tuple[int, int]:
        """(count, peak) of the bucket with this absolute index; (0, 0) when not held."""
        pos = len(self.counts) - (self.end - index)
        if 0 <= pos < len(self.counts):
            return self.counts[pos], self.peaks[pos]
        return 0, 0

    def count_between(self, start: int, stop: int) -> int:
        """Recent claims at `start` < t ≤ `stop`."""
        return bisect.bisect_right(self.recent, stop) - bisect.bisect_right(self.recent, start)

    @property
    def newest(self) -> int | None:
        return self.recent[-1] if self.recent else None

    @property
    def truncated(self) -> bool:
        """Whether more claims fell within RECENT_NS than are kept."""
        return len(self.recent) >= MAX_RECENT


def record(history: ClaimHistory, t: int) -> ClaimHistory:
    """The history with one more claim at `t` (ns)."""
    return record_many(history, [t])


def record_many(history: ClaimHistory, times: list[int]) -> ClaimHistory:
    """The history with a claim at each of `times` (ns), recorded oldest first,
    the buckets copied once rather than once a claim: a pass folds in the
    claims made since the last one (controller/reconcile/prewarming.py)."""
    scale = history.scale
    max_buckets = scale.max_buckets
    counts, peaks, end = list(history.counts), list(history.peaks), history.end
    recent, lo = list(history.recent), 0  # recent[lo:] is what `record` would keep
    for t in sorted(times):
        t -= t % MILLISECOND
        newest = recent[-1] if len(recent) > lo else None
        if newest is not None and t < newest - CLOCK_TOLERANCE_NS:
            # The clock went back: what was recorded after `t` is forgotten.
            frozen = ClaimHistory(end, tuple(counts), tuple(peaks), tuple(recent[lo:]), scale)
            history = _forget_after(frozen, t)
            counts, peaks, end = list(history.counts), list(history.peaks), history.end
            recent, lo = list(history.recent), 0
            newest = recent[-1] if recent else None
        index = t // scale.bucket_ns
        if not counts or index >= end + max_buckets:
            counts, peaks, end = [], [], index
        if index >= end:
            grow = index - end + 1
            counts += [0] * grow
            peaks += [0] * grow
            end = index + 1
            del counts[:-max_buckets], peaks[:-max_buckets]
        if newest is None or t >= newest:
            recent.append(t)
        else:
            bisect.insort(recent, t, lo)
        lo = max(lo, bisect.bisect_right(recent, recent[-1] - RECENT_NS, lo))
        lo = max(lo, len(recent) - MAX_RECENT)
        pos = len(counts) - (end - index)
        if pos >= 0:
            in_peak_window = bisect.bisect_right(recent, t, lo) - bisect.bisect_right(
                recent, t - scale.peak_window_ns, lo
            )
            counts[pos] = min(counts[pos] + 1, MAX_COUNT)
            peaks[pos] = min(max(peaks[pos], in_peak_window), MAX_COUNT)
    return ClaimHistory(end, tuple(counts), tuple(peaks), tuple(recent[lo:]), scale)


def _forget_after(history: ClaimHistory, t: int) -> ClaimHistory:
    """The history as it was at `t`: the clock went back, so what was recorded
    later belongs to a clock we no longer believe."""
    keep_end = min(history.end, t // history.scale.bucket_ns)
    drop = history.end - keep_end
    counts = history.counts[: len(history.counts) - drop] if drop else history.counts
    peaks = history.peaks[: len(history.peaks) - drop] if drop else history.peaks
    recent = history.recent[: bisect.bisect_right(history.recent, t)]
    return ClaimHistory(keep_end if counts else 0, counts, peaks, recent, history.scale)


@dataclass(frozen=True)
class StartupLatencies:
    """The last MAX_STARTUPS start-up latencies (placement → running), oldest first."""

    samples_ms: tuple[int, ...] = ()

    def quantile(self, q: float) -> int | None:
        """The q-quantile in ns (nearest rank, rounding up: a high quantile of
        few samples is their maximum); None without samples."""
        if not self.samples_ms:
            return None
        ordered = sorted(self.samples_ms)
        rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        return ordered[rank] * MILLISECOND


def record_startup(latencies: StartupLatencies, duration_ns: int) -> StartupLatencies:
    """The latencies with one more start-up that took `duration_ns`."""
    sample = min(max(0, duration_ns // MILLISECOND), 24 * 3600 * 1000)
    return StartupLatencies((*latencies.samples_ms, sample)[-MAX_STARTUPS:])


@dataclass(frozen=True)
class Hold:
    """The target the policy holds, and when it was last needed (hysteresis)."""

    target: int = 0
    needed_at: int = 0  # ns


@dataclass(frozen=True)
class History:
    """Everything the policy needs of an environment across a restart."""

    claims: ClaimHistory = field(default_factory=ClaimHistory)
    startups: StartupLatencies = field(default_factory=StartupLatencies)
    hold: Hold = field(default_factory=Hold)


def to_json(history: History) -> str:
    claims = history.claims
    values = array("H", claims.counts + claims.peaks)
    if sys.byteorder == "little":
        values.byteswap()
    recent_ms = [t // MILLISECOND for t in claims.recent]
    body: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "bucket_s": _bucket_s(claims.scale),
        "end": claims.end,
        "buckets": base64.b64encode(zlib.compress(values.tobytes(), 9)).decode("ascii"),
        # the first timestamp, then the gaps: a few digits each
        "recent_ms": recent_ms[:1] + [b - a for a, b in itertools.pairwise(recent_ms)],
        "startups_ms": list(history.startups.samples_ms),
        "hold": [history.hold.target, history.hold.needed_at],
    }
    return json.dumps(body, separators=(",", ":"))


def _bucket_s(scale: Timescale) -> int | float:
    whole, part = divmod(scale.bucket_ns, SECOND)
    return whole if not part else scale.bucket_ns / SECOND


def from_json(text: str, scale: Timescale = REAL_TIME) -> History:
    """The history `to_json` wrote (on this timescale); ValueError for
    anything else (the caller then starts from an empty history: the floor
    still holds)."""
    try:
        body = json.loads(text)
        if body["v"] != FORMAT_VERSION or body["bucket_s"] != _bucket_s(scale):
            raise ValueError(f"unknown prewarm history format {body['v']}/{body['bucket_s']}")
        values = array("H")
        values.frombytes(zlib.decompress(base64.b64decode(body["buckets"], validate=True)))
        if sys.byteorder == "little":
            values.byteswap()
        half = len(values) // 2
        if len(values) % 2 or half > scale.max_buckets:
            raise ValueError("prewarm history buckets are malformed")
        recent: list[int] = []
        for gap in body["recent_ms"]:
            if recent and int(gap) < 0:
                raise ValueError("prewarm history timestamps are not in order")
            recent.append((recent[-1] if recent else 0) + int(gap))
        target, needed_at = (int(v) for v in body["hold"])
        return History(
            claims=ClaimHistory(
                end=int(body["end"]),
                counts=tuple(values[:half]),
                peaks=tuple(values[half:]),
                recent=tuple(t * MILLISECOND for t in recent[-MAX_RECENT:]),
                scale=scale,
            ),
            startups=StartupLatencies(tuple(int(v) for v in body["startups_ms"][-MAX_STARTUPS:])),
            hold=Hold(target, needed_at),
        )
    except (KeyError, TypeError, ValueError, zlib.error) as e:
        raise ValueError(f"not a prewarm history: {e}") from e
