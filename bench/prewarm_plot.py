"""The prewarming replay's picture: per environment, the whole trace and two
close-ups, the last burst that recurs at the same time of week (a lecture)
and the last that does not (an unannounced one), with claims per minute, the
adaptive target, idle runners, misses and the smallest static pool as warm.

matplotlib with the Agg backend (no display); imported only when drawing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

if TYPE_CHECKING:
    from bench.b8_prewarm import EnvironmentReplay

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
COARSE = 10  # minutes per point in the whole-trace panel
CLOSE_BEFORE, CLOSE_AFTER = 30, 40  # minutes around a close-up's busiest minute
WEEK_MINUTES = 7 * 1440
BURST_CLAIMS = 50  # claims in a minute that make a burst
SAME_TIME = 10  # minutes: bursts this close in time of week are the same one


def bursts(claims: Sequence[int]) -> list[int]:
    """Minutes with a burst: BURST_CLAIMS or more, the busiest within SAME_TIME."""
    out: list[int] = []
    for m, n in enumerate(claims):
        around = claims[max(0, m - SAME_TIME) : m + SAME_TIME + 1]
        if n >= BURST_CLAIMS and n == max(around) and not (out and m - out[-1] <= SAME_TIME):
            out.append(m)
    return out


def recurs(minute: int, found: Sequence[int]) -> bool:
    """Whether another week has a burst at about the same time of week."""
    for other in found:
        phase = (other - minute) % WEEK_MINUTES
        if abs(other - minute) > SAME_TIME and min(phase, WEEK_MINUTES - phase) <= SAME_TIME:
            return True
    return False


def _coarse(values: Sequence[int], step: int, how: str = "max") -> list[int]:
    chunks = [values[i : i + step] for i in range(0, len(values), step)]
    return [sum(c) if how == "sum" else max(c) for c in chunks]


def _whole(ax: Axes, r: EnvironmentReplay) -> None:
    t = r.adaptive.timeline
    days = [i * COARSE / 1440 for i in range(len(_coarse(t.claims, COARSE)))]
    ax.plot(days, _coarse(t.claims, COARSE), color="0.6", lw=0.6, label="claims per minute (max)")
    ax.plot(days, _coarse(t.target, COARSE), color="tab:blue", lw=0.8, label="adaptive target")
    ax.plot(days, _coarse(t.idle, COARSE), color="tab:green", lw=0.6, label="idle runners")
    if r.best is not None:
        ax.axhline(int(r.best.policy.split()[-1]), color="tab:orange", ls="--", lw=1,
                   label=f"smallest static as warm ({r.best.policy})")  # fmt: skip
    misses = _coarse(t.misses, COARSE, "sum")
    missed = [(d, m) for d, m in zip(days, misses, strict=True) if m]
    if missed:
        ax.scatter([d for d, _ in missed], [0] * len(missed), marker="x", color="tab:red",
                   s=[12 + 6 * m for _, m in missed], zorder=3, label="misses")  # fmt: skip
    weeks = int(days[-1] // 7) + 1 if days else 1
    ticks = [(w, d) for w in range(weeks) for d in (0, 2, 4) if 7 * w + d <= days[-1]]
    ax.set_xticks([7 * w + d for w, d in ticks])
    ax.set_xticklabels([f"{WEEKDAYS[d]}" + (f"\nweek {w + 1}" if d == 0 else "") for w, d in ticks])
    ax.set_xlim(0, days[-1] if days else 1)
    a = r.adaptive.outcome
    ax.set_title(
        f"{r.label}, environment {r.environment_id}: {a.claims} claims, "
        f"adaptive {a.hit_rate:.2f} % warm, {a.idle_runner_hours:.0f} idle runner-hours"
        + (f" vs {r.best.policy}: {r.best.idle_runner_hours:.0f}" if r.best else ""),
        fontsize=9,
    )
    ax.legend(loc="upper left", fontsize=7, ncol=5)
    ax.set_ylabel("runners / claims")


def _close_up(ax: Axes, r: EnvironmentReplay, busiest: int | None, what: str) -> None:
    t = r.adaptive.timeline
    if busiest is None:
        ax.set_title(f"no {what} burst in this trace", fontsize=9)
        ax.set_axis_off()
        return
    lo, hi = max(0, busiest - CLOSE_BEFORE), min(len(t.claims), busiest + CLOSE_AFTER)
    minutes = list(range(lo, hi))
    x = [m - busiest for m in minutes]
    ax.bar(x, [t.claims[m] for m in minutes], width=0.9, color="0.8", label="claims per minute")
    ax.step(x, [t.target[m] for m in minutes], where="post", color="tab:blue", label="target")
    ax.step(x, [t.idle[m] for m in minutes], where="post", color="tab:green", label="idle")
    if r.best is not None:
        ax.axhline(int(r.best.policy.split()[-1]), color="tab:orange", ls="--", lw=1)
    missed = [(m - busiest, t.misses[m]) for m in minutes if t.misses[m]]
    if missed:
        ax.scatter([m for m, _ in missed], [0] * len(missed), marker="x", color="tab:red",
                   s=[12 + 6 * n for _, n in missed], zorder=3, label="misses")  # fmt: skip
    day, minute_of_day = divmod(busiest, 1440)
    ax.set_title(
        f"{what}: week {day // 7 + 1}, {WEEKDAYS[day % 7]} "
        f"{minute_of_day // 60:02d}:{minute_of_day % 60:02d} (± min)",
        fontsize=9,
    )
    ax.legend(loc="upper left", fontsize=7)


def draw(replays: Sequence[EnvironmentReplay], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(
        len(replays), 3, figsize=(16, 3.4 * len(replays)), squeeze=False,
        gridspec_kw={"width_ratios": [3, 1, 1]},
    )  # fmt: skip
    for row, replay in zip(axes, replays, strict=True):
        _whole(row[0], replay)
        found = bursts(replay.adaptive.timeline.claims)
        recurring = [m for m in found if recurs(m, found)]
        once = [m for m in found if not recurs(m, found)]
        _close_up(row[1], replay, recurring[-1] if recurring else None, "recurring")
        _close_up(row[2], replay, once[-1] if once else None, "unannounced")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
