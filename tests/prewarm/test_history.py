"""history: buckets, peaks, the recent window, start-up latencies, clock jumps
and the JSON that carries it all across a restart."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.model import SECOND
from controller.prewarm.history import (
    BUCKET_NS,
    BUCKETS_PER_WEEK,
    MAX_BUCKETS,
    MAX_COUNT,
    MAX_RECENT,
    MAX_STARTUPS,
    MILLISECOND,
    WEEK_NS,
    ClaimHistory,
    History,
    Hold,
    StartupLatencies,
    Timescale,
    from_json,
    record,
    record_many,
    record_startup,
    to_json,
)

# Monday 2024-04-15 10:00 UTC, at the start of a bucket.
T0 = (1_713_139_200 + 10 * 3600) * SECOND


def recorded(*offsets_s: float, start: ClaimHistory | None = None) -> ClaimHistory:
    history = start or ClaimHistory()
    for offset in offsets_s:
        history = record(history, T0 + round(offset * SECOND))
    return history


def test_an_empty_history_holds_nothing():
    history = ClaimHistory()
    assert history.bucket(T0 // BUCKET_NS) == (0, 0)
    assert history.newest is None and not history.truncated
    assert history.count_between(0, T0) == 0


def test_claims_count_in_their_bucket_and_its_peak_is_the_busiest_minute():
    history = recorded(0, 10, 20, 100, 110, 290, 300)
    first = T0 // BUCKET_NS
    # 0, 10, 20 in one minute; 100, 110 with 20 in the minute before 110: 3
    assert history.bucket(first) == (6, 3)
    assert history.bucket(first + 1) == (1, 2)  # 300 and 290 within a minute
    assert history.bucket(first - 1) == (0, 0)
    assert history.end == first + 2 and len(history.counts) == 2


def test_recording_returns_a_new_history_and_leaves_the_old_one_alone():
    before = recorded(0)
    after = record(before, T0 + SECOND)
    assert before.counts == (1,) and after.counts == (2,)


def test_timestamps_are_kept_to_the_millisecond():
    history = record(ClaimHistory(), T0 + 1_234_567)
    assert history.recent == (T0 + MILLISECOND,)


def test_the_recent_window_keeps_ten_minutes_of_claims():
    history = recorded(0, 100, 101, 599, 700)  # (newest - 10 min, newest]
    assert history.recent == (T0 + 101 * SECOND, T0 + 599 * SECOND, T0 + 700 * SECOND)
    assert history.count_between(T0 + 101 * SECOND, T0 + 700 * SECOND) == 2


def test_the_recent_window_keeps_at_most_its_bound_of_claims():
    history = recorded(*[i * 0.01 for i in range(MAX_RECENT + 10)])
    assert len(history.recent) == MAX_RECENT and history.truncated
    assert history.recent[0] == T0 + 10 * 10 * MILLISECOND
    assert sum(history.counts) == MAX_RECENT + 10  # the buckets still count every claim


def test_buckets_cover_four_weeks_and_no_more():
    history = ClaimHistory()
    for day in range(5 * 7):
        history = record(history, T0 + day * 24 * 3600 * SECOND)
    assert len(history.counts) == len(history.peaks) == MAX_BUCKETS
    newest = history.end - 1
    assert history.bucket(newest) == (1, 1)
    assert history.bucket(newest - BUCKETS_PER_WEEK) == (1, 1)
    assert history.bucket(newest - 4 * BUCKETS_PER_WEEK) == (0, 0)  # dropped
    assert sum(history.counts) == 4 * 7


def test_a_claim_beyond_four_weeks_starts_the_buckets_afresh():
    history = recorded(0, 1, 2)
    later = record(history, T0 + 5 * WEEK_NS)
    assert later.counts == (1,) and later.end == (T0 + 5 * WEEK_NS) // BUCKET_NS + 1


def test_counts_saturate_instead_of_overflowing():
    history = ClaimHistory(end=T0 // BUCKET_NS + 1, counts=(MAX_COUNT,), peaks=(MAX_COUNT,))
    assert record(history, T0).bucket(T0 // BUCKET_NS) == (MAX_COUNT, MAX_COUNT)


def test_an_out_of_order_claim_within_a_minute_is_counted_where_it_belongs():
    history = recorded(400, 350)  # two API threads, the later one first
    assert history.recent == (T0 + 350 * SECOND, T0 + 400 * SECOND)
    # Peaks are read as each claim is recorded: a race may understate one by a claim.
    assert history.bucket(T0 // BUCKET_NS + 1)[0] == 2


def test_a_clock_gone_back_forgets_what_was_recorded_after_it():
    history = recorded(0, 3600, 3601)  # 11:00 and 11:00:01
    back = record(history, T0 + 600 * SECOND)  # the clock is at 10:10 again
    assert back.recent == (T0 + 600 * SECOND,)
    assert back.bucket((T0 + 3600 * SECOND) // BUCKET_NS) == (0, 0)
    assert back.bucket(T0 // BUCKET_NS) == (1, 1)
    assert back.end == (T0 + 600 * SECOND) // BUCKET_NS + 1


def test_a_clock_gone_back_before_every_bucket_starts_afresh():
    history = recorded(0, 1)
    back = record(history, T0 - 30 * 24 * 3600 * SECOND)
    assert back.counts == (1,) and back.recent == (T0 - 30 * 24 * 3600 * SECOND,)


def test_startups_keep_the_last_ones_and_give_nearest_rank_quantiles():
    latencies = StartupLatencies()
    assert latencies.quantile(0.95) is None
    for ms in range(1, MAX_STARTUPS + 11):
        latencies = record_startup(latencies, ms * MILLISECOND)
    assert len(latencies.samples_ms) == MAX_STARTUPS
    assert latencies.samples_ms[0] == 11
    assert latencies.quantile(1.0) == (MAX_STARTUPS + 10) * MILLISECOND
    assert latencies.quantile(0.5) == (10 + MAX_STARTUPS // 2) * MILLISECOND
    few = StartupLatencies((1000, 3000, 2000))
    assert few.quantile(0.95) == 3000 * MILLISECOND  # a high quantile of few is their maximum
    assert few.quantile(0.01) == 1000 * MILLISECOND


def test_a_negative_startup_counts_as_zero():
    assert record_startup(StartupLatencies(), -5 * SECOND).samples_ms == (0,)


claims_strategy = st.lists(
    st.one_of(
        st.integers(0, 3 * 3600 * SECOND),  # mostly close together
        st.integers(-6 * WEEK_NS, 6 * WEEK_NS),  # and jumps either way
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(
    offsets=claims_strategy,
    startups=st.lists(st.integers(-SECOND, 3600 * SECOND), max_size=80),
    hold=st.tuples(st.integers(0, 1000), st.integers(0, 2 * T0)),
)
def test_json_round_trips(offsets: list[int], startups: list[int], hold: tuple[int, int]):
    claims = ClaimHistory()
    for offset in offsets:
        claims = record(claims, T0 + offset)
    latencies = StartupLatencies()
    for duration in startups:
        latencies = record_startup(latencies, duration)
    history = History(claims, latencies, Hold(*hold))
    assert from_json(to_json(history)) == history


def test_the_stored_json_stays_within_its_bound_however_busy():
    rng = random.Random(7)
    counts = tuple(rng.randrange(MAX_COUNT + 1) for _ in range(MAX_BUCKETS))
    recent = tuple(sorted(T0 + rng.randrange(600 * 1000) * MILLISECOND for _ in range(MAX_RECENT)))
    worst = History(
        ClaimHistory(end=T0 // BUCKET_NS, counts=counts, peaks=counts, recent=recent),
        StartupLatencies(tuple(24 * 3600 * 1000 for _ in range(MAX_STARTUPS))),
        Hold(10_000, T0),
    )
    text = to_json(worst)
    assert len(text) <= 50 * 1024  # a Nomad variable holds 64 KiB
    assert from_json(text) == worst


def test_a_month_of_a_course_is_a_few_kilobytes():
    rng = random.Random(3)
    claims = ClaimHistory()
    t = T0
    while t < T0 + 4 * WEEK_NS:
        t += round(rng.expovariate(1 / 120) * SECOND)  # one claim every 2 minutes
        claims = record(claims, t)
    assert len(to_json(History(claims))) < 12 * 1024


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("not json", "{"),
        ("not an object", "[]"),
        ("another version", json.dumps({"v": 2, "bucket_s": 300})),
        ("another bucket size", json.dumps({"v": 1, "bucket_s": 60})),
        (
            "buckets not base64",
            to_json(History()).replace('"buckets":"', '"buckets":"!'),
        ),
        (
            "timestamps out of order",
            to_json(History(recorded(0, 1))).replace('"recent_ms":[', '"recent_ms":[5,-9,'),
        ),
    ],
)
def test_anything_else_is_refused(name: str, text: str):
    with pytest.raises(ValueError, match="prewarm history"):
        from_json(text)


def test_a_compressed_timescale_buckets_and_round_trips_on_its_own_scale() -> None:
    scale = Timescale(bucket_ns=SECOND // 2, week_ns=20 * SECOND, peak_window_ns=SECOND)
    assert (scale.buckets_per_week, scale.max_buckets) == (40, 160)
    history = ClaimHistory(scale=scale)
    for k in range(3):
        history = record(history, T0 + k * SECOND // 10)
    assert history.bucket(T0 // scale.bucket_ns) == (3, 3)
    text = to_json(History(claims=history))
    assert from_json(text, scale).claims == history
    with pytest.raises(ValueError, match="format"):
        from_json(text)  # not on the real timescale
    with pytest.raises(ValueError, match="whole number"):
        Timescale(bucket_ns=3 * SECOND, week_ns=10 * SECOND)


# Claim times around a start: bursts, out of order within the tolerance,
# further back (the clock went back), and far ahead (past four weeks).
_OFFSETS = st.one_of(
    st.integers(0, 5 * SECOND),
    st.integers(0, 20 * 60 * SECOND),
    st.integers(-120 * SECOND, 0),
    st.integers(0, 5 * WEEK_NS),
)


@settings(max_examples=200, deadline=None)
@given(
    before=st.lists(_OFFSETS, max_size=40),
    batch=st.lists(_OFFSETS, max_size=700),
)
def test_recording_many_at_once_is_recording_each_in_turn(
    before: list[int], batch: list[int]
) -> None:
    history = ClaimHistory()
    for offset in before:
        history = record(history, T0 + offset)
    times = [T0 + offset for offset in batch]
    one_by_one = history
    for t in sorted(times):
        one_by_one = record(one_by_one, t)
    assert record_many(history, times) == one_by_one
