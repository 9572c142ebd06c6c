"""8. Adaptive prewarming, replayed: a claim trace through the real policy
function (controller.prewarm.policy.target) in simulated time, against every
static pool size.

`python -m bench prewarm --trace FILE.csv` replays a trace (CSV
`t_seconds,environment_id,hold_seconds`); without `--trace` it replays the
traces of seeds 1 and 2 of bench/traces/generate.py (four weeks of two courses
each), generated on the fly and also written to bench/results/traces/.

The model of the pool, per environment (docs/prewarming.md):

- A claim takes an idle *ready* runner if there is one (a warm hit); else it
  is a miss: the student waits for a cold start, a runner job of its own.
- A claimed runner is released after `hold_seconds` and deleted, as the
  controller does, so it never returns to the pool; the pool refills by
  creating runners.
- A created runner is ready after a refill latency drawn from a lognormal
  (median 2 s, σ 0.6: p95 5.4 s, p99 8.1 s): a docker task whose image is on
  the node, plus Nomad's evaluation and the controller's pass. Seeded.
- Static pool of size S: every claimed runner is replaced at once, so S
  runners are idle (ready or starting) at all times.
- Adaptive: the policy runs after every claim, when a runner becomes ready,
  at its `wake_at` and on every 30 s resync (the controller's default),
  seeing only the claims and start-ups that have happened; the pool is then
  filled to its target or trimmed, oldest ready runners first and never a
  starting one. Once a simulated day its history goes through JSON and
  back, as a controller restart would.

Reported per environment: warm-hit rate, idle runner-hours (runners that
exist and nobody holds, starting or ready), runner jobs created, for the
adaptive policy and each static size from 0 to the trace's peak concurrent
demand; the smallest static size that reaches the adaptive hit rate is the
one the adaptive policy is judged against. A PNG per trace draws it.
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import RESULTS, Result
from bench.traces.generate import TraceClaim, generate, read_csv, write_csv
from controller.model import SECOND
from controller.prewarm.history import History, from_json, record, record_startup, to_json
from controller.prewarm.policy import PolicyInput, PolicyParams, ceiling_for, target

# t_seconds 0 of a trace: Monday 2024-04-15 00:00 UTC (only weekly phases matter).
TRACE_EPOCH_NS = 1_713_139_200 * SECOND
DEFAULT_SEEDS = (1, 2)
RESYNC_S = 30.0
DAY_S = 24 * 3600.0
WEEK_S = 7 * DAY_S
# The environment's prewarmingPoolSize and ceiling in the replay.
FLOOR = 5
CEILING_MULTIPLE = 10.0
CEILING_CAP = 100
CEILING = ceiling_for(FLOOR, CEILING_MULTIPLE, CEILING_CAP)
HIT_TARGET = 99.5  # %
IDLE_RATIO_TARGET = 50.0  # % of the smallest static pool with the same hit rate
JOBS_RATIO_TARGET = 1.2


@dataclass(frozen=True)
class StartupModel:
    """Refill latency: lognormal around `median_s`."""

    median_s: float = 2.0
    sigma: float = 0.6

    def draw(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.median_s), self.sigma)


@dataclass
class Outcome:
    policy: str
    claims: int = 0
    hits: int = 0
    idle_runner_s: float = 0.0
    jobs: int = 0

    @property
    def misses(self) -> int:
        return self.claims - self.hits

    @property
    def hit_rate(self) -> float:
        return 100.0 * self.hits / self.claims if self.claims else 100.0

    @property
    def idle_runner_hours(self) -> float:
        return self.idle_runner_s / 3600

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "hit_rate_pct": round(self.hit_rate, 3),
            "misses": self.misses,
            "idle_runner_hours": round(self.idle_runner_hours, 1),
            "jobs": self.jobs,
            "jobs_per_claim": round(self.jobs / self.claims, 3) if self.claims else None,
        }


@dataclass
class Timeline:
    """Per minute of the trace, what the picture draws."""

    claims: list[int]
    misses: list[int]
    target: list[int]
    idle: list[int]

    @classmethod
    def sized(cls, minutes: int) -> Timeline:
        return cls([0] * minutes, [0] * minutes, [0] * minutes, [-1] * minutes)


@dataclass
class AdaptiveRun:
    outcome: Outcome
    timeline: Timeline
    weekly_hit_rate: list[float]
    max_target: int
    max_payload_bytes: int
    passes: int


def horizon_s(claims: Sequence[TraceClaim]) -> float:
    """The replayed span: whole days up to the last claim, at least one."""
    last = claims[-1].t_seconds if claims else 0.0
    return max(1, math.ceil((last + 1) / DAY_S)) * DAY_S


def peak_concurrency(claims: Iterable[TraceClaim]) -> int:
    """The most claims held at once."""
    events = sorted(
        [(c.t_seconds, 1) for c in claims] + [(c.t_seconds + c.hold_seconds, -1) for c in claims]
    )
    held = peak = 0
    for _, step in events:
        held += step
        peak = max(peak, held)
    return peak


def replay_static(claims: Sequence[TraceClaim], size: int, latencies: Sequence[float]) -> Outcome:
    """A pool of `size` that replaces each claimed runner at once; the
    replacement for claim i is ready `latencies[i]` later."""
    outcome = Outcome(f"static {size}", claims=len(claims), jobs=size + len(claims))
    outcome.idle_runner_s = size * horizon_s(claims)
    refilling: list[float] = []  # ready times of the replacements under way
    for i, claim in enumerate(claims):
        while refilling and refilling[0] <= claim.t_seconds:
            heapq.heappop(refilling)
        if len(refilling) < size:
            outcome.hits += 1
            heapq.heappush(refilling, claim.t_seconds + latencies[i])
    return outcome


@dataclass
class _Pool:
    """The adaptive replay's idle runners."""

    ready: list[tuple[float, int]] = field(default_factory=list)  # (created at, id), oldest first
    starting: dict[int, tuple[float, float]] = field(default_factory=dict)  # id → created, ready
    refills: list[tuple[float, int]] = field(default_factory=list)  # heap (ready at, id)
    next_id: int = 0

    @property
    def idle(self) -> int:
        return len(self.ready) + len(self.starting)


def replay_adaptive(
    claims: Sequence[TraceClaim],
    params: PolicyParams,
    model: StartupModel,
    seed: int,
    floor: int = FLOOR,
    ceiling: int = CEILING,
) -> AdaptiveRun:
    rng = random.Random(seed)
    end = horizon_s(claims)
    timeline = Timeline.sized(int(end // 60) + 1)
    outcome = Outcome("adaptive", claims=len(claims))
    weeks = max(1, math.ceil(end / WEEK_S))
    week_claims, week_hits = [0] * weeks, [0] * weeks
    pool = _Pool()
    history = History()
    run = AdaptiveRun(outcome, timeline, [], 0, 0, 0)
    clock = 0.0
    wake: float | None = None
    next_resync = RESYNC_S
    next_restart = DAY_S

    def advance(t: float) -> None:
        nonlocal clock
        outcome.idle_runner_s += pool.idle * (t - clock)
        clock = t

    def create(count: int) -> None:
        for _ in range(count):
            ready_at = clock + model.draw(rng)
            pool.starting[pool.next_id] = (clock, ready_at)
            heapq.heappush(pool.refills, (ready_at, pool.next_id))
            pool.next_id += 1
        outcome.jobs += count

    def trim(count: int) -> None:
        # Only ready runners, oldest first (the issue: never delete a starting
        # runner to scale down); a starting surplus goes once it is ready.
        del pool.ready[:count]

    def reconcile() -> None:
        nonlocal history, wake
        decision = target(
            PolicyInput(
                claims=history.claims,
                startups=history.startups,
                now=TRACE_EPOCH_NS + round(clock * SECOND),
                floor=floor,
                ceiling=ceiling,
                hold=history.hold,
                params=params,
            )
        )
        history = History(history.claims, history.startups, decision.hold)
        wake = None if decision.wake_at is None else (decision.wake_at - TRACE_EPOCH_NS) / SECOND
        if decision.target > pool.idle:
            create(decision.target - pool.idle)
        elif decision.target < pool.idle:
            trim(pool.idle - decision.target)
        minute = int(clock // 60)
        timeline.target[minute] = max(timeline.target[minute], decision.target)
        run.max_target = max(run.max_target, decision.target)
        run.passes += 1

    # The pool is full when the trace starts.
    pool.ready = [(0.0, runner) for runner in range(floor)]
    pool.next_id = outcome.jobs = floor
    reconcile()
    i = 0
    while i < len(claims) or clock < end:
        upcoming = [
            claims[i].t_seconds if i < len(claims) else math.inf,
            pool.refills[0][0] if pool.refills else math.inf,
            wake if wake is not None else math.inf,
            next_resync,
        ]
        t = min(upcoming)
        if t >= end and i >= len(claims):
            advance(end)
            break
        advance(t)
        if clock >= next_restart:
            # A restart: the history comes back from its stored JSON.
            payload = to_json(history)
            run.max_payload_bytes = max(run.max_payload_bytes, len(payload))
            history = from_json(payload)
            next_restart += DAY_S
        minute = int(clock // 60)
        if t == upcoming[1]:
            ready_at, runner = heapq.heappop(pool.refills)
            created, _ = pool.starting.pop(runner)
            pool.ready.append((created, runner))
            startups = record_startup(history.startups, round((ready_at - created) * SECOND))
            history = History(history.claims, startups, history.hold)
            reconcile()  # the allocation's event names the environment
        elif t == upcoming[0]:
            claim = claims[i]
            i += 1
            week = min(weeks - 1, int(clock // WEEK_S))
            week_claims[week] += 1
            timeline.claims[minute] += 1
            if pool.ready:
                pool.ready.pop()  # any ready runner will do
                outcome.hits += 1
                week_hits[week] += 1
            else:
                outcome.jobs += 1  # its own cold start
                timeline.misses[minute] += 1
            now_ns = TRACE_EPOCH_NS + round(claim.t_seconds * SECOND)
            history = History(record(history.claims, now_ns), history.startups, history.hold)
            reconcile()
        elif t == upcoming[2]:
            reconcile()
        else:
            next_resync += RESYNC_S
            reconcile()
        timeline.idle[minute] = pool.idle
    _fill_forward(timeline.idle)
    run.weekly_hit_rate = [
        round(100.0 * h / c, 3) if c else 100.0 for h, c in zip(week_hits, week_claims, strict=True)
    ]
    return run


def _fill_forward(values: list[int]) -> None:
    """Minutes with no event (-1) keep the count of the last one: runners stay put."""
    last = 0
    for i, value in enumerate(values):
        if value < 0:
            values[i] = last
        else:
            last = value


def static_sweep(
    claims: Sequence[TraceClaim], peak: int, model: StartupModel, seed: int
) -> list[Outcome]:
    """Every static size from 0 to `peak`; once a size misses nothing, every
    larger one is the same but idler (computed, not replayed)."""
    rng = random.Random(seed)
    latencies = [model.draw(rng) for _ in claims]
    span = horizon_s(claims)
    out: list[Outcome] = []
    for size in range(peak + 1):
        if out and out[-1].misses == 0:
            out.append(
                Outcome(f"static {size}", len(claims), len(claims), size * span, size + len(claims))
            )
            continue
        out.append(replay_static(claims, size, latencies))
    return out


def smallest_static(sweep: Sequence[Outcome], hit_rate: float) -> Outcome | None:
    """The smallest static pool at least as warm (None: even the largest is not)."""
    return next((o for o in sweep if o.hits / o.claims >= hit_rate / 100 - 1e-12), None)


@dataclass
class EnvironmentReplay:
    label: str
    environment_id: int
    claims: list[TraceClaim]
    peak: int
    adaptive: AdaptiveRun
    sweep: list[Outcome]
    best: Outcome | None


def replay_environment(
    label: str,
    environment_id: int,
    claims: list[TraceClaim],
    seed: int,
    params: PolicyParams,
    model: StartupModel = StartupModel(),
    floor: int = FLOOR,
    ceiling: int = CEILING,
) -> EnvironmentReplay:
    peak = peak_concurrency(claims)
    adaptive = replay_adaptive(claims, params, model, seed, floor, ceiling)
    sweep = static_sweep(claims, peak, model, seed)
    best = smallest_static(sweep, adaptive.outcome.hit_rate)
    return EnvironmentReplay(label, environment_id, claims, peak, adaptive, sweep, best)


def by_environment(claims: Iterable[TraceClaim]) -> dict[int, list[TraceClaim]]:
    out: dict[int, list[TraceClaim]] = defaultdict(list)
    for c in claims:
        out[c.environment_id].append(c)
    return dict(sorted(out.items()))


def shipped_traces(seeds: Sequence[int], results: Path) -> list[tuple[str, list[TraceClaim]]]:
    traces = []
    for seed in seeds:
        claims = generate(seed)
        write_csv(claims, results / "traces" / f"seed-{seed}.csv")
        traces.append((f"seed {seed}", claims))
    return traces


def run(quick: bool = False, traces: Sequence[str | Path] = (), results: Path = RESULTS) -> Result:
    from bench.prewarm_plot import draw  # matplotlib only when this benchmark runs

    result = Result("prewarm", "Adaptive prewarming replayed against static pools")
    params = PolicyParams()
    if traces:
        loaded = [(Path(p).stem, read_csv(Path(p))) for p in traces]
    else:
        loaded = shipped_traces(DEFAULT_SEEDS[:1] if quick else DEFAULT_SEEDS, results)
    for label, claims in loaded:
        per_trace = []
        for environment_id, env_claims in by_environment(claims).items():
            seed = zlib.crc32(label.encode()) + environment_id
            replayed = replay_environment(label, environment_id, env_claims, seed, params)
            per_trace.append(replayed)
            _report(result, replayed)
        path = results / f"prewarm-{label.replace(' ', '-')}.png"
        draw(per_trace, path)
        result.details.setdefault("pictures", []).append(path.name)
    result.details["model"] = {
        "startup": {"distribution": "lognormal", **asdict(StartupModel())},
        "floor": FLOOR,
        "ceiling": CEILING,
        "resync_s": RESYNC_S,
        "params": asdict(params),
    }
    return result


def _report(result: Result, r: EnvironmentReplay) -> None:
    a = r.adaptive.outcome
    name = f"{r.label}, environment {r.environment_id}"
    result.add(f"{name}: adaptive warm hits", a.hit_rate, "%", f">= {HIT_TARGET}")
    result.add(f"{name}: adaptive misses (cold starts)", a.misses, f"of {a.claims} claims")
    if r.best is not None:
        ratio = 100.0 * a.idle_runner_s / r.best.idle_runner_s if r.best.idle_runner_s else None
        result.add(
            f"{name}: adaptive idle runner-hours / smallest static pool as warm ({r.best.policy})",
            ratio,
            "%",
            f"<= {IDLE_RATIO_TARGET}",
            note=f"{a.idle_runner_hours:.0f} h vs {r.best.idle_runner_hours:.0f} h",
        )
    result.add(
        f"{name}: adaptive runner jobs per claim", a.jobs / a.claims, "", f"<= {JOBS_RATIO_TARGET}"
    )
    result.details.setdefault("environments", []).append(
        {
            "trace": r.label,
            "environment_id": r.environment_id,
            "claims": len(r.claims),
            "peak_concurrent_claims": r.peak,
            "adaptive": {
                **a.summary(),
                "weekly_hit_rate_pct": r.adaptive.weekly_hit_rate,
                "max_target": r.adaptive.max_target,
                "policy_passes": r.adaptive.passes,
                "max_history_json_bytes": r.adaptive.max_payload_bytes,
            },
            "smallest_static_as_warm": r.best.summary() if r.best else None,
            "static": [o.summary() for o in r.sweep],
        }
    )
