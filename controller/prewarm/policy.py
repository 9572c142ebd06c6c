"""policy: an environment's claim history, its runners' start-up latencies and
the clock ⇒ how many idle runners to keep now, the forecast behind it and
when to look again.

Pure, in the shape of `plan`. The model (docs/prewarming.md has the why of
every default):

- Lead time L: a claimed runner is replaced one refill later, so the pool
  must cover the claims of one refill: a high quantile of the observed
  start-ups (placement → running) plus the controller's own margin.
- Demand rate λ, the largest of three readings. *Steady*: the claims of the
  last 10 minutes. *Seasonal*: the busiest minute at the same phase of the
  last three weeks, from now to L plus the pre-warm horizon ahead, so a
  lecture at 10:15 on Mondays has its pool filled before 10:15. *Panic*:
  the claims of the last 6 s, taken only when they run at least twice
  ahead of both (Knative's panic window): a burst nobody announced.
- Base stock: with N ~ Poisson(λ·L) the claims during one refill, the pool
  is the smallest k with P(N > k) ≤ the miss probability, that is the
  expected demand plus a safety stock.
- Hysteresis: a higher target is taken at once; a lower one only once the
  higher was not needed for a hold time. Always within floor and ceiling.

The caller stores `Decision.hold` with the history (history.History) and
calls again at `Decision.wake_at`, after each claim, and on every resync.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from statistics import NormalDist

from controller.model import SECOND
from controller.prewarm.history import (
    HISTORY_WEEKS,
    RECENT_NS,
    ClaimHistory,
    Hold,
    StartupLatencies,
)


class Component(StrEnum):
    """Which reading of the demand rate the target follows."""

    STEADY = "steady"
    SEASONAL = "seasonal"
    PANIC = "panic"


class Reason(StrEnum):
    """Why the target is the number it is."""

    FORECAST = "forecast"  # the forecast's base stock, between floor and ceiling
    FLOOR = "floor"  # the forecast wants no more than prewarmingPoolSize
    CEILING = "ceiling"  # the forecast wants more than the ceiling allows
    HELD = "held"  # the forecast wants fewer, but a higher target was needed within the hold


@dataclass(frozen=True)
class PolicyParams:
    """The model's knobs; docs/prewarming.md gives the reason for each default."""

    miss_probability: float = 0.001
    lead_quantile: float = 0.95
    lead_margin_ns: int = 1 * SECOND
    default_lead_ns: int = 10 * SECOND
    min_startups: int = 5
    stable_window_ns: int = 600 * SECOND
    panic_window_ns: int = 6 * SECOND
    panic_threshold: float = 2.0
    panic_min_claims: int = 4
    season_weeks: int = 3
    prewarm_horizon_ns: int = 600 * SECOND
    hold_ns: int = 600 * SECOND

    def __post_init__(self) -> None:
        if not 0 < self.miss_probability < 1 or not 0 < self.lead_quantile <= 1:
            raise ValueError("miss_probability and lead_quantile are probabilities")
        if not 0 < self.panic_window_ns <= RECENT_NS or not 0 < self.stable_window_ns <= RECENT_NS:
            raise ValueError("the steady and panic windows must fit in the recent claims kept")
        if not 0 <= self.season_weeks < HISTORY_WEEKS:
            raise ValueError(f"season_weeks must be below the {HISTORY_WEEKS} weeks kept")
        if min(self.lead_margin_ns, self.default_lead_ns, self.prewarm_horizon_ns) < 0:
            raise ValueError("durations cannot be negative")


@dataclass(frozen=True)
class PolicyInput:
    claims: ClaimHistory
    startups: StartupLatencies
    now: int  # ns, wall clock
    floor: int  # prewarmingPoolSize
    ceiling: int  # ceiling_for(floor, …); below the floor it is the floor
    hold: Hold = field(default_factory=Hold)  # the previous Decision.hold
    params: PolicyParams = field(default_factory=PolicyParams)


@dataclass(frozen=True)
class Forecast:
    """The demand behind a target (rates in claims per second)."""

    lead_time_ns: int
    steady_rate: float
    seasonal_rate: float
    panic_rate: float
    component: Component
    rate: float  # the rate of `component`
    expected: float  # claims expected during one lead time: rate × lead time
    stock: int  # the base stock for the miss probability, before floor and ceiling

    @property
    def safety(self) -> float:
        return self.stock - self.expected


@dataclass(frozen=True)
class Decision:
    target: int  # idle runners (ready or starting) to keep now
    reason: Reason
    forecast: Forecast
    hold: Hold  # pass it back in the next PolicyInput
    wake_at: int | None  # ns; the earliest time the target may change with no new claim


def ceiling_for(floor: int, multiple: float, cap: int) -> int:
    """The ceiling of an environment: `multiple` × its floor, at most `cap`,
    never below the floor (a floor of 0 keeps the environment without a pool)."""
    return max(floor, min(cap, math.floor(floor * multiple)))


def lead_time(startups: StartupLatencies, params: PolicyParams) -> int:
    """One refill, ns: a high quantile of the start-ups seen, or the default
    until there are enough of them to trust."""
    if len(startups.samples_ms) < params.min_startups:
        return params.default_lead_ns + params.lead_margin_ns
    quantile = startups.quantile(params.lead_quantile)
    assert quantile is not None
    return quantile + params.lead_margin_ns


def steady_rate(claims: ClaimHistory, now: int, window: int) -> float:
    """Claims per second over the window ending now."""
    count = claims.count_between(now - window, now)
    if claims.truncated and claims.recent[0] > now - window:
        # More claims than are kept: the kept ones span less than the window.
        window = max(now - claims.recent[0], claims.scale.peak_window_ns)
    return count / (window / SECOND)


def seasonal_rate(claims: ClaimHistory, now: int, ahead: int, weeks: int) -> float:
    """The busiest minute, in claims per second, at the phase from now to
    `ahead` later in any of the last `weeks` weeks."""
    scale = claims.scale
    first, last = now // scale.bucket_ns, (now + ahead) // scale.bucket_ns
    peak = 0
    for week in range(1, weeks + 1):
        back = week * scale.buckets_per_week
        for index in range(first - back, last - back + 1):
            peak = max(peak, claims.bucket(index)[1])
    return peak / (scale.peak_window_ns / SECOND)


def base_stock(expected: float, miss_probability: float) -> int:
    """The smallest k with P(N > k) ≤ miss_probability for N ~ Poisson(expected)."""
    if expected <= 0:
        return 0
    if expected > 500:
        # The exact sum would take a while and underflow beyond ~700: the normal
        # quantile with Cornish-Fisher's skew term and a continuity correction
        # matches it within one runner there.
        z = NormalDist().inv_cdf(1 - miss_probability)
        return math.ceil(expected + z * math.sqrt(expected) + (z * z - 1) / 6 - 0.5)
    cdf, k = 0.0, 0
    limit = expected + 50 * math.sqrt(expected) + 50  # rounding cannot stall the loop
    while k < limit:
        cdf += math.exp(-expected + k * math.log(expected) - math.lgamma(k + 1))
        if 1 - cdf <= miss_probability:
            return k
        k += 1
    return k


def forecast_demand(
    claims: ClaimHistory, startups: StartupLatencies, now: int, params: PolicyParams
) -> Forecast:
    lead = lead_time(startups, params)
    steady = steady_rate(claims, now, params.stable_window_ns)
    seasonal = seasonal_rate(claims, now, lead + params.prewarm_horizon_ns, params.season_weeks)
    in_panic_window = claims.count_between(now - params.panic_window_ns, now)
    panic = in_panic_window / (params.panic_window_ns / SECOND)
    forecast = max(steady, seasonal)
    if in_panic_window >= params.panic_min_claims and panic >= params.panic_threshold * forecast:
        # The last seconds run well ahead of every forecast: a burst is on.
        component, rate = Component.PANIC, panic
    elif seasonal > steady:
        # The same phase of the previous weeks was busier than the last minutes.
        component, rate = Component.SEASONAL, seasonal
    else:
        component, rate = Component.STEADY, steady
    expected = rate * lead / SECOND
    return Forecast(
        lead_time_ns=lead,
        steady_rate=steady,
        seasonal_rate=seasonal,
        panic_rate=panic,
        component=component,
        rate=rate,
        expected=expected,
        stock=base_stock(expected, params.miss_probability),
    )


def target(inp: PolicyInput) -> Decision:
    p = inp.params
    ceiling = max(inp.ceiling, inp.floor)
    forecast = forecast_demand(inp.claims, inp.startups, inp.now, p)
    wanted = min(max(forecast.stock, inp.floor), ceiling)
    if forecast.stock > ceiling:
        reason = Reason.CEILING
    elif forecast.stock <= inp.floor:
        reason = Reason.FLOOR
    else:
        reason = Reason.FORECAST
    held = min(max(inp.hold.target, inp.floor), ceiling)
    # A clock gone back restarts the hold: it never blocks a decrease for longer.
    needed_at = min(inp.hold.needed_at, inp.now)
    if wanted >= held:
        # As many or more wanted: taken at once, and needed as of now.
        hold = Hold(wanted, inp.now)
    elif inp.now - needed_at < p.hold_ns:
        # Fewer wanted, but the higher target was needed within the hold: keep it.
        hold, reason = Hold(held, needed_at), Reason.HELD
    else:
        # The higher target went unneeded for a whole hold: step down.
        hold = Hold(wanted, inp.now)
    return Decision(
        target=hold.target,
        reason=reason,
        forecast=forecast,
        hold=hold,
        wake_at=_wake_at(inp, forecast, hold),
    )


def _wake_at(inp: PolicyInput, forecast: Forecast, hold: Hold) -> int | None:
    p = inp.params
    wakes: list[int] = []
    if hold.target > inp.floor:
        wakes.append(hold.needed_at + p.hold_ns)  # the earliest step down
    if inp.claims.counts and p.season_weeks:
        # The look-ahead reaches its next bucket: a recurring burst may come into view.
        ahead = forecast.lead_time_ns + p.prewarm_horizon_ns
        bucket = inp.claims.scale.bucket_ns
        wakes.append(((inp.now + ahead) // bucket + 1) * bucket - ahead)
    return min((w for w in wakes if w > inp.now), default=None)
