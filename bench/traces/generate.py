"""A seeded generator of claim traces: weeks of a course, per environment.

`python -m bench.traces.generate --seed N --out FILE.csv [--weeks 4] [--courses 2]`
writes a CSV `t_seconds,environment_id,hold_seconds` (t = 0 is a Monday,
00:00), one row per claim, sorted by time. The same seed gives the same file.

Each course is one execution environment with its own students and
timetable, and every week of it has:

- a diurnal background: about 1.5 sessions per student a weekday, few at
  night, most in the afternoon and evening; half as many on Saturday;
- two lectures a week (distinct weekdays, a quarter past an even hour), each
  with a burst of 150–250 claims within 2 minutes when the lecturer says
  "run it": the rush starts at once and thins out (two thirds in the first
  30 s, 94 % within the minute); it starts up to 3 minutes either side of the
  timetable;
- a homework deadline on Sunday at 23:59, with claims ramping up over the
  evening before it;

and once in the whole trace, on a random weekday at a random working hour,
an unannounced burst of 100–200 claims within 2 minutes (a tutor's ad-hoc
exercise). A single week replays every lecture as a surprise, so the
default is four: the first weeks of a term.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MINUTE = 60.0
HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY

# Relative activity by hour of a weekday (students work afternoons and evenings).
HOURLY = (
    0.05, 0.02, 0.01, 0.01, 0.01, 0.02, 0.05, 0.2,
    0.6, 0.9, 1.0, 1.0, 0.8, 0.9, 1.0, 1.0,
    0.9, 0.8, 0.7, 0.8, 0.9, 0.8, 0.6, 0.3,
)  # fmt: skip
DAY_FACTOR = (1.0, 1.0, 1.0, 1.0, 0.9, 0.5, 0.7)  # Monday … Sunday
SESSIONS_PER_STUDENT_DAY = 1.5
LECTURE_HOURS = (8, 10, 12, 14, 16)
BURST_S = 120.0


@dataclass(frozen=True)
class TraceClaim:
    t_seconds: float
    environment_id: int
    hold_seconds: float


@dataclass(frozen=True)
class Course:
    environment_id: int
    students: int
    lectures: tuple[tuple[int, float], ...]  # (weekday, seconds into the day)


def poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method; the means here are a few claims a minute."""
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


def hold(rng: random.Random, median_s: float, sigma: float) -> float:
    """How long a student keeps a runner: lognormal, between 10 s and 3 h."""
    return min(max(rng.lognormvariate(math.log(median_s), sigma), 10.0), 3 * HOUR)


def burst(rng: random.Random, start: float, claims: int) -> Iterable[float]:
    """`claims` within BURST_S of `start`, densest at once (a Beta(1, 4) shape)."""
    for _ in range(claims):
        yield start + BURST_S * rng.betavariate(1.0, 4.0)


def course_for(rng: random.Random, environment_id: int) -> Course:
    days = sorted(rng.sample(range(5), 2))
    lectures = tuple((day, rng.choice(LECTURE_HOURS) * HOUR + 15 * MINUTE) for day in days)
    return Course(environment_id, rng.randint(150, 300), lectures)


def background(rng: random.Random, course: Course, weeks: int) -> Iterable[TraceClaim]:
    per_weekday = course.students * SESSIONS_PER_STUDENT_DAY
    for minute in range(int(weeks * WEEK // MINUTE)):
        t = minute * MINUTE
        weekday, hour = int(t // DAY) % 7, int(t % DAY // HOUR)
        mean = per_weekday * DAY_FACTOR[weekday] * HOURLY[hour] / (sum(HOURLY) * 60)
        for _ in range(poisson(rng, mean)):
            yield TraceClaim(t + rng.random() * MINUTE, course.environment_id, hold(rng, 480, 0.8))


def deadline_ramp(rng: random.Random, course: Course, week: int) -> Iterable[TraceClaim]:
    """Sunday evening: claims growing exponentially (a 90-minute time constant)
    up to the deadline at 23:59, about one per student in all."""
    deadline = week * WEEK + 6 * DAY + 23 * HOUR + 59 * MINUTE
    for _ in range(course.students):
        before = rng.expovariate(1 / (1.5 * HOUR))
        if before < 8 * HOUR:
            yield TraceClaim(deadline - before, course.environment_id, hold(rng, 900, 0.6))


def lectures(rng: random.Random, course: Course, week: int) -> Iterable[TraceClaim]:
    for weekday, at in course.lectures:
        start = week * WEEK + weekday * DAY + at + rng.uniform(-3 * MINUTE, 3 * MINUTE)
        for t in burst(rng, start, rng.randint(150, 250)):
            yield TraceClaim(t, course.environment_id, hold(rng, 1500, 0.5))


def unannounced(rng: random.Random, course: Course, weeks: int) -> Iterable[TraceClaim]:
    start = rng.randrange(weeks) * WEEK + rng.randrange(5) * DAY + rng.uniform(9, 18) * HOUR
    for t in burst(rng, start, rng.randint(100, 200)):
        yield TraceClaim(t, course.environment_id, hold(rng, 1200, 0.5))


def generate(seed: int, weeks: int = 4, courses: int = 2) -> list[TraceClaim]:
    rng = random.Random(seed)
    claims: list[TraceClaim] = []
    for environment_id in range(1, courses + 1):
        course = course_for(rng, environment_id)
        claims += background(rng, course, weeks)
        for week in range(weeks):
            claims += lectures(rng, course, week)
            claims += deadline_ramp(rng, course, week)
        claims += unannounced(rng, course, weeks)
    return sorted(claims, key=lambda c: (c.t_seconds, c.environment_id))


def write_csv(claims: Sequence[TraceClaim], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["t_seconds", "environment_id", "hold_seconds"])
        for c in claims:
            out.writerow([f"{c.t_seconds:.3f}", c.environment_id, f"{c.hold_seconds:.1f}"])


def read_csv(path: Path) -> list[TraceClaim]:
    with path.open(newline="") as f:
        rows = csv.DictReader(f)
        missing = {"t_seconds", "environment_id", "hold_seconds"} - set(rows.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: no column {', '.join(sorted(missing))}")
        claims = [
            TraceClaim(float(r["t_seconds"]), int(r["environment_id"]), float(r["hold_seconds"]))
            for r in rows
        ]
    return sorted(claims, key=lambda c: (c.t_seconds, c.environment_id))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.traces.generate", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--weeks", type=int, default=4)
    parser.add_argument("--courses", type=int, default=2, help="environments, one per course")
    args = parser.parse_args(argv)
    claims = generate(args.seed, args.weeks, args.courses)
    write_csv(claims, args.out)
    print(f"{len(claims)} claims over {args.weeks} weeks in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
