"""The prewarming replay's arithmetic (bench/b8_prewarm.py) and the trace
generator, on traces small enough to check by hand. The full replay runs
with `make bench`, never here."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench import b8_prewarm
from bench.b8_prewarm import (
    Outcome,
    StartupModel,
    peak_concurrency,
    replay_adaptive,
    replay_static,
    smallest_static,
    static_sweep,
)
from bench.traces.generate import DAY, WEEK, TraceClaim, generate, read_csv, write_csv
from controller.prewarm.policy import PolicyParams


def claims_at(*times: float, hold: float = 60.0) -> list[TraceClaim]:
    return [TraceClaim(t, 1, hold) for t in times]


@pytest.mark.parametrize(
    ("name", "times", "size", "hits"),
    [
        ("no pool: every claim misses", (10, 20, 30), 0, 0),
        ("one runner, claims further apart than a refill", (10, 20, 30), 1, 3),
        ("one runner, two claims within a refill", (10, 11, 30), 1, 2),
        ("two runners, two claims within a refill", (10, 11, 30), 2, 3),
    ],
)
def test_a_static_pool_hits_while_it_has_a_ready_runner(
    name: str, times: tuple[float, ...], size: int, hits: int
):
    outcome = replay_static(claims_at(*times), size, latencies=[5.0] * len(times))
    assert outcome.hits == hits
    assert outcome.jobs == size + len(times)  # each claim: a replacement or its own cold start
    assert outcome.idle_runner_s == size * DAY  # the replay spans whole days


def test_the_sweep_stops_replaying_once_nothing_misses_and_finds_the_smallest_as_warm():
    claims = claims_at(10, 10.5, 11, 11.5, 100)
    sweep = static_sweep(claims, peak=4, model=StartupModel(), seed=1)
    assert [o.policy for o in sweep] == [f"static {n}" for n in range(5)]
    assert [o.misses for o in sweep] == [5, 3, 2, 1, 0]
    assert smallest_static(sweep, 100.0) is sweep[4]
    assert smallest_static(sweep, 80.1) is sweep[4]
    assert smallest_static(sweep, 80.0) is sweep[3]  # 4 hits of 5
    assert smallest_static(sweep, 60.0) is sweep[2]
    assert smallest_static([Outcome("static 0", claims=1)], 50.0) is None


def test_peak_concurrency_counts_claims_held_at_once():
    assert peak_concurrency([]) == 0
    assert peak_concurrency(claims_at(0, 10, 100, hold=50)) == 2


def test_the_adaptive_replay_accounts_for_every_claim_and_job():
    burst = [3600 * 10 + i * 0.5 for i in range(60)]
    claims = claims_at(*sorted([600.0 * i for i in range(1, 100)] + burst))
    run = replay_adaptive(claims, PolicyParams(), StartupModel(), seed=3, floor=2, ceiling=40)
    outcome = run.outcome
    assert outcome.claims == len(claims)
    assert 0 < outcome.hits <= outcome.claims
    assert outcome.jobs >= outcome.claims  # every claim used up a runner job
    assert outcome.idle_runner_s >= 2 * DAY * 0.9  # about the floor, all day
    assert 2 < run.max_target <= 40  # the burst raised it; the ceiling held
    assert sum(run.timeline.claims) == len(claims)
    assert sum(run.timeline.misses) == outcome.misses
    assert min(run.timeline.idle) >= 0


def test_the_generator_makes_a_course_per_environment_with_its_bursts():
    claims = generate(seed=5, weeks=2, courses=2)
    assert claims == generate(seed=5, weeks=2, courses=2)
    assert claims != generate(seed=6, weeks=2, courses=2)
    assert [c.t_seconds for c in claims] == sorted(c.t_seconds for c in claims)
    assert {c.environment_id for c in claims} == {1, 2}
    assert all(0 <= c.t_seconds < 2 * WEEK + DAY and c.hold_seconds >= 10 for c in claims)
    for environment in (1, 2):
        per_minute = Counter(
            int(c.t_seconds // 60) for c in claims if c.environment_id == environment
        )
        bursts = [m for m, n in per_minute.items() if n >= 50]
        # Two lectures a week and one unannounced burst, each busiest in a minute or two.
        lectures_and_burst = {m // 10 for m in bursts}
        assert 5 <= len(lectures_and_burst) <= 2 * 5


def test_a_trace_round_trips_through_its_csv(tmp_path: Path):
    claims = generate(seed=2, weeks=1, courses=1)[:50]
    path = tmp_path / "trace.csv"
    write_csv(claims, path)
    assert path.read_text().splitlines()[0] == "t_seconds,environment_id,hold_seconds"
    again = read_csv(path)
    assert [(round(c.t_seconds, 3), c.environment_id) for c in claims] == [
        (c.t_seconds, c.environment_id) for c in again
    ]


def test_a_trace_without_its_columns_is_refused(tmp_path: Path):
    path = tmp_path / "bad.csv"
    path.write_text("t,env\n1,2\n")
    with pytest.raises(ValueError, match="hold_seconds"):
        read_csv(path)


def test_a_replay_of_a_small_trace_reports_and_draws(tmp_path: Path):
    trace = tmp_path / "tiny.csv"
    write_csv(claims_at(*[300.0 * i for i in range(1, 200)], 3600 * 5 + 1, 3600 * 5 + 2), trace)
    result = b8_prewarm.run(traces=[trace], results=tmp_path)
    names = [f.name for f in result.figures]
    assert names[0] == "tiny, environment 1: adaptive warm hits"
    assert any("smallest static pool as warm" in n for n in names)
    assert (tmp_path / "prewarm-tiny.png").stat().st_size > 1000
    assert result.details["pictures"] == ["prewarm-tiny.png"]
    json.dumps(result.details)  # what write_result stores


def test_the_picture_tells_a_recurring_burst_from_an_unannounced_one():
    from bench.prewarm_plot import WEEK_MINUTES, bursts, recurs

    claims = [1] * (3 * WEEK_MINUTES)
    for minute in (600, WEEK_MINUTES + 604, 2 * WEEK_MINUTES + 598, 2 * WEEK_MINUTES + 3000):
        claims[minute] = 120
        claims[minute + 1] = 60  # the same burst's second minute
    found = bursts(claims)
    assert found == [600, WEEK_MINUTES + 604, 2 * WEEK_MINUTES + 598, 2 * WEEK_MINUTES + 3000]
    assert [recurs(m, found) for m in found] == [True, True, True, False]
