"""policy: table-driven cases over claim histories, start-ups, the clock and
the hold; every case also after a restart (its history through JSON)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.model import SECOND
from controller.prewarm.history import (
    BUCKET_NS,
    WEEK_NS,
    ClaimHistory,
    History,
    Hold,
    StartupLatencies,
    Timescale,
    from_json,
    record,
    record_startup,
    to_json,
)
from controller.prewarm.policy import (
    Component,
    Decision,
    PolicyInput,
    PolicyParams,
    Reason,
    base_stock,
    ceiling_for,
    lead_time,
    target,
)

MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
# Monday 2024-04-15 10:05 UTC: ten minutes before a 10:15 lecture.
NOW = (1_713_139_200 + 10 * 3600 + 5 * 60) * SECOND
LECTURE = NOW + 10 * MINUTE


def every(interval_s: float, span_s: float, end: int = NOW) -> list[int]:
    """Claims every `interval_s` for the `span_s` before `end` (end included)."""
    count = int(span_s / interval_s)
    return [end - round(i * interval_s * SECOND) for i in range(count)][::-1]


def poisson(rate: float, span_s: float, seed: int) -> list[int]:
    rng, t, out = random.Random(seed), 0.0, list[float]()
    while True:
        t += rng.expovariate(rate)
        if t > span_s:
            return [NOW - round(span_s * SECOND) + round(x * SECOND) for x in out]
        out.append(t)


def lecture(week: int, claims: int = 150) -> list[int]:
    """A lecture's burst `week` weeks back: evenly over 2 minutes from 10:15."""
    start = LECTURE - week * WEEK_NS
    return [start + round(i * 120 / claims * SECOND) for i in range(claims)]


def claims_of(times: list[int]) -> ClaimHistory:
    history = ClaimHistory()
    for t in sorted(times):
        history = record(history, t)
    return history


def startups(*seconds: float) -> StartupLatencies:
    latencies = StartupLatencies()
    for s in seconds:
        latencies = record_startup(latencies, round(s * SECOND))
    return latencies


FIVE_S = (5.0,) * 10  # lead time 5 s + the 1 s margin


@dataclass(frozen=True)
class Case:
    name: str
    claims: list[int]
    want: int
    reason: Reason
    component: Component = Component.STEADY
    startups: tuple[float, ...] = FIVE_S
    now: int = NOW
    floor: int = 2
    ceiling: int = 50
    hold: Hold = field(default_factory=Hold)


# 20 claims in the last 5 s; with the steady claim at now, 21 in the 6 s panic
# window: 3.5/s, so 21 expected in a 6 s lead time
BURST = every(0.25, 5)

CASES = [
    Case("empty history", [], 2, Reason.FLOOR),
    Case("empty history, no floor", [], 0, Reason.FLOOR, floor=0, ceiling=0),
    # 0.1/s × 6 s = 0.6 expected; P(N > 4) = 0.0004 ≤ 0.001 < P(N > 3) = 0.0034
    Case("steady: a claim every 10 s", every(10, 1800), 4, Reason.FORECAST),
    # 45 claims in the last 10 minutes: 0.075/s × 6 s = 0.45 expected
    Case("steady Poisson, 0.1/s", poisson(0.1, 1800, seed=4), 4, Reason.FORECAST),
    # too few start-ups to trust: the 10 s default + 1 s, so 1.1 expected
    Case("few start-ups: default lead", every(10, 1800), 5, Reason.FORECAST, startups=(5.0,) * 4),
    # slow start-ups: 30 s + 1 s at 0.1/s is 3.1 expected
    Case("slow start-ups", every(10, 1800), 10, Reason.FORECAST, startups=(30.0,) * 10),
    Case("a burst", every(10, 1800) + BURST, 36, Reason.FORECAST, Component.PANIC),
    # 3 claims in 2 s are below the panic minimum of 4: a coincidence, not a burst
    Case("three quick claims are no burst", every(0.5, 1.5), 2, Reason.FLOOR),
    # the busiest minute of each lecture held 75 claims: 1.25/s × 6 s = 7.5 expected
    Case(
        "weekly recurrence: lectures on the last three Mondays",
        lecture(1) + lecture(2) + lecture(3),
        17,
        Reason.FORECAST,
        Component.SEASONAL,
    ),
    Case(
        "weekly recurrence: one past Monday is enough",
        lecture(1),
        17,
        Reason.FORECAST,
        Component.SEASONAL,
    ),
    Case(
        "weekly recurrence: the busiest of the past weeks counts",
        lecture(1, claims=60) + lecture(2, claims=240),  # 120 in its busiest minute
        24,
        Reason.FORECAST,
        Component.SEASONAL,
    ),
    Case(
        "weekly recurrence: too early to pre-warm",
        lecture(1) + lecture(2) + lecture(3),
        2,
        Reason.FLOOR,
        now=NOW - 15 * MINUTE,
    ),
    Case(
        "weekly recurrence: older than three weeks is not read",
        lecture(4) + every(3600, 3 * 86400, end=NOW - 5 * MINUTE),
        2,
        Reason.FLOOR,
    ),
    Case(
        "clock jumped far forwards",
        every(10, 1800) + BURST,
        2,
        Reason.FLOOR,
        now=NOW + 365 * 24 * HOUR,
    ),
    # the claims are an hour ahead of the clock now: none is in any window
    Case("clock jumped backwards", every(10, 1800) + BURST, 2, Reason.FLOOR, now=NOW - HOUR),
    Case("hysteresis: held", [], 30, Reason.HELD, hold=Hold(30, NOW - 5 * MINUTE)),
    Case(
        "hysteresis: lowered after the hold", [], 2, Reason.FLOOR, hold=Hold(30, NOW - 10 * MINUTE)
    ),
    Case(
        "hysteresis: a higher forecast is taken at once",
        every(10, 1800) + BURST,
        36,
        Reason.FORECAST,
        Component.PANIC,
        hold=Hold(8, NOW - MINUTE),
    ),
    Case(
        "hysteresis: a hold from a clock gone back restarts",
        [],
        30,
        Reason.HELD,
        hold=Hold(30, NOW + 24 * HOUR),
    ),
    Case("ceiling", every(10, 1800) + BURST, 10, Reason.CEILING, Component.PANIC, ceiling=10),
    Case("floor above the forecast", every(10, 1800), 8, Reason.FLOOR, floor=8),
    Case("floor above the ceiling wins", [], 8, Reason.FLOOR, floor=8, ceiling=5),
    Case(
        "held, but never above a lowered ceiling",
        [],
        10,
        Reason.HELD,
        ceiling=10,
        hold=Hold(30, NOW - MINUTE),
    ),
]


def decide(case: Case, restarted: bool = False) -> Decision:
    history = History(claims_of(case.claims), startups(*case.startups), case.hold)
    if restarted:
        history = from_json(to_json(history))
    return target(
        PolicyInput(
            claims=history.claims,
            startups=history.startups,
            now=case.now,
            floor=case.floor,
            ceiling=case.ceiling,
            hold=history.hold,
        )
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_policy(case: Case):
    decision = decide(case)
    assert (decision.target, decision.reason, decision.forecast.component) == (
        case.want,
        case.reason,
        case.component,
    )
    assert decision.hold.target == decision.target
    assert decision.hold.needed_at <= case.now


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_restart_with_the_stored_history_decides_the_same(case: Case):
    assert decide(case, restarted=True) == decide(case)


def test_the_forecast_names_its_parts():
    forecast = decide(CASES[2]).forecast
    assert forecast.lead_time_ns == 6 * SECOND
    assert forecast.steady_rate == pytest.approx(0.1)
    assert forecast.expected == pytest.approx(0.6)
    assert forecast.stock == 4 and forecast.safety == pytest.approx(3.4)
    assert forecast.seasonal_rate == 0 and forecast.panic_rate == pytest.approx(1 / 6)


def test_a_lecture_is_pre_warmed_from_the_horizon_until_a_hold_after_it():
    lectures = lecture(1) + lecture(2) + lecture(3)
    base = Case("", lectures, 0, Reason.FORECAST)
    # The look-ahead (6 s lead + 10 min) reaches the 10:15 bucket at 10:04:54.
    assert decide(replace(base, now=LECTURE - 10 * MINUTE - 7 * SECOND)).target == 2
    assert decide(replace(base, now=LECTURE - 10 * MINUTE - 6 * SECOND)).target == 17
    # The bucket leaves the look-ahead at 10:20; the hold keeps the pool till 10:30.
    after = decide(replace(base, now=LECTURE + 5 * MINUTE))
    assert after.forecast.seasonal_rate == 0 and after.reason is Reason.FLOOR
    needed = Hold(17, LECTURE + 5 * MINUTE - 1)  # the last pass that still saw the lecture
    held = decide(replace(base, now=LECTURE + 15 * MINUTE - 2, hold=needed))
    assert (held.target, held.reason, held.wake_at) == (17, Reason.HELD, LECTURE + 15 * MINUTE - 1)
    lowered = decide(replace(base, now=LECTURE + 15 * MINUTE - 1, hold=needed))
    assert (lowered.target, lowered.reason) == (2, Reason.FLOOR)


def test_wake_at_is_the_next_look_ahead_bucket_or_the_end_of_the_hold():
    quiet = decide(Case("", [], 0, Reason.FLOOR))
    assert quiet.wake_at is None  # no history, at the floor: nothing will change by itself
    steady = decide(Case("", every(10, 1800), 0, Reason.FORECAST))
    ahead = 6 * SECOND + 10 * MINUTE
    boundary = ((NOW + ahead) // BUCKET_NS + 1) * BUCKET_NS - ahead
    assert steady.wake_at == min(boundary, NOW + 10 * MINUTE)
    held = decide(Case("", [], 0, Reason.HELD, hold=Hold(30, NOW - 9 * MINUTE)))
    assert held.wake_at == NOW + MINUTE


def test_a_hold_from_the_future_is_needed_as_of_now():
    decision = decide(Case("", [], 0, Reason.HELD, hold=Hold(30, NOW + 24 * HOUR)))
    assert decision.hold == Hold(30, NOW)
    assert decision.wake_at == NOW + 10 * MINUTE


@pytest.mark.parametrize(
    ("name", "expected", "p", "stock"),
    [
        ("nothing expected", 0.0, 0.001, 0),
        ("one expected, 5 %", 1.0, 0.05, 3),  # P(N > 3) = 0.019 ≤ 0.05 < P(N > 2) = 0.080
        ("one expected, 0.1 %", 1.0, 0.001, 5),
        ("twelve expected", 12.0, 0.001, 24),
        ("exact sum at 500", 500.0, 0.001, 571),
        ("normal approximation above", 500.001, 0.001, 571),
        ("normal approximation far above", 700.0, 0.001, 783),
    ],
)
def test_base_stock(name: str, expected: float, p: float, stock: int):
    assert base_stock(expected, p) == stock


@pytest.mark.parametrize(
    ("name", "floor", "multiple", "cap", "ceiling"),
    [
        ("a multiple of the floor", 5, 10.0, 100, 50),
        ("capped", 20, 10.0, 100, 100),
        ("never below the floor", 20, 10.0, 10, 20),
        ("no floor, no pool", 0, 10.0, 100, 0),
    ],
)
def test_ceiling_for(name: str, floor: int, multiple: float, cap: int, ceiling: int):
    assert ceiling_for(floor, multiple, cap) == ceiling


def test_lead_time_is_a_high_quantile_plus_the_margin():
    params = PolicyParams()
    assert lead_time(StartupLatencies(), params) == 11 * SECOND
    assert lead_time(startups(*range(1, 21)), params) == 20 * SECOND  # p95 of 1…20 s is 19 s
    # only the last 64 are kept (37…100 s): their p95 is 97 s
    assert lead_time(startups(*range(1, 101)), params) == 98 * SECOND


@pytest.mark.parametrize(
    "bad",
    [
        {"miss_probability": 0.0},
        {"lead_quantile": 1.5},
        {"panic_window_ns": 0},
        {"stable_window_ns": 3600 * SECOND},
        {"season_weeks": 4},
        {"hold_ns": -1, "prewarm_horizon_ns": -1},
    ],
)
def test_nonsense_parameters_are_refused(bad: dict[str, float]):
    with pytest.raises(ValueError, match=r"probabilit|windows|season_weeks|negative"):
        PolicyParams(**bad)  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(
    offsets=st.lists(st.integers(-5 * WEEK_NS, HOUR), max_size=40),
    burst=st.integers(0, 30),
    now=st.one_of(st.integers(-HOUR, HOUR), st.integers(-60 * WEEK_NS, 60 * WEEK_NS)),
    floor=st.integers(0, 20),
    ceiling=st.integers(0, 200),
    hold=st.tuples(st.integers(0, 300), st.integers(-10 * WEEK_NS, 10 * WEEK_NS)),
)
def test_any_history_and_any_clock_give_a_target_within_bounds(
    offsets: list[int],
    burst: int,
    now: int,
    floor: int,
    ceiling: int,
    hold: tuple[int, int],
):
    claims = claims_of([NOW + o for o in offsets] + every(0.1, burst * 0.1))
    decision = target(
        PolicyInput(
            claims=claims,
            startups=startups(2.0, 3.0, 4.0, 5.0, 6.0),
            now=NOW + now,
            floor=floor,
            ceiling=ceiling,
            hold=Hold(hold[0], NOW + hold[1]),
        )
    )
    assert floor <= decision.target <= max(floor, ceiling)
    assert decision.hold.target == decision.target
    assert decision.hold.needed_at <= NOW + now
    assert decision.wake_at is None or decision.wake_at > NOW + now


def test_a_compressed_week_pre_warms_the_same_phase_of_the_next_one():
    scale = Timescale(bucket_ns=SECOND, week_ns=30 * SECOND, peak_window_ns=2 * SECOND)
    params = PolicyParams(
        default_lead_ns=SECOND,
        stable_window_ns=3 * SECOND,
        prewarm_horizon_ns=3 * SECOND,
        hold_ns=2 * SECOND,
    )
    burst = NOW - NOW % (30 * SECOND)  # phase 0 of a compressed week
    claims = ClaimHistory(scale=scale)
    for k in range(8):
        claims = record(claims, burst + k * SECOND // 10)

    def at(now: int) -> Decision:
        return target(
            PolicyInput(claims, StartupLatencies(), now, floor=4, ceiling=40, params=params)
        )

    assert at(burst + 15 * SECOND).target == 4  # mid-week: the floor
    ahead = at(burst + 28 * SECOND)  # the burst's phase comes into the look-ahead
    assert ahead.forecast.component is Component.SEASONAL and ahead.target >= 8
