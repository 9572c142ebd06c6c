"""Regression (chaos seeds 10, 26, 36, 112, …): runner jobs created twice
after the event stream was cut, and deleted again as `surplus` a moment later.

What happened (seed 10, environment 12, pool 4): the stream had just been
cut, so every refresh was a full one and no event marked the snapshot stale.
A full refresh listed Nomad at index 262, which showed the four runners a pass
had created at indexes 245–255, and settled their creation expectations at
once; it then read the new jobs' specs (through a burst of `No cluster
leader` retries) and installed the snapshot showing them 66 ms later. In
between, a pass planned: the snapshot it was handed was still the previous
one (index 214, without the four runners) — fresh, as no event said otherwise
— and it asked the expectations afterwards, which no longer counted them. It
created four runners more; 240 ms later a pass saw them all and deleted the
extra as `surplus` (invariant 5: 22 jobs created where 20 were needed).

The rule now: a refresh settles expectations in the same step (under the
observer's lock) as it installs the snapshot that shows what settled them,
and a pass reads its snapshot and the pending expectations together
(`Observer.snapshot_and_pending`), so every creation is counted exactly once:
by the snapshot, or as pending.

The timing is reproduced exactly: the in-memory Nomad calls back while the
refresh lists allocations, after its job list showed the new runner and
before it installed anything. (In seed 10 the gap was the read of the new
specs; the spec of a runner we created is now cached from its creation, so
the gap is the lists alone, and the rule is the same.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from controller.reconcile.snapshot import Snapshot
from tests.support.one_runner import ENV, OneRunner


def once_listed(one_runner: OneRunner, then: Callable[[], object]) -> list[int]:
    """Make the next refresh call `then` once its job list is in, before it
    lists allocations; returns how often it did."""
    calls: list[int] = []

    def before_list_allocations() -> None:
        if not calls:
            calls.append(1)
            then()

    one_runner.nomad.before_list_allocations = before_list_allocations
    return calls


def test_a_pass_while_a_refresh_reads_new_runners_creates_nothing_more(
    one_runner: OneRunner,
) -> None:
    """No event stream: every refresh is full and the snapshot counts as fresh
    (the state after a cut). A pass that plans while a refresh has listed the
    runners just created, but not yet installed its snapshot, creates none."""
    one_runner.controller.pools.put_environment(ENV)
    one_runner.reconcile()
    (created,) = one_runner.nomad.created()
    passes: list[bool] = []
    calls = once_listed(
        one_runner, lambda: passes.append(one_runner.controller.reconciler.reconcile(ENV.id).ok)
    )

    one_runner.controller.observer.refresh()  # lists the runner; the pass runs before it installs

    assert calls == [1]
    assert passes == [True]
    assert one_runner.nomad.created() == [created], "the pass created the runner again"
    one_runner.nomad.before_list_allocations = None
    one_runner.reconcile()
    assert one_runner.nomad.created() == [created]
    assert one_runner.nomad.deregistered() == [], "an over-created runner was deleted as surplus"


def test_a_creation_stays_pending_until_the_snapshot_that_shows_it(
    one_runner: OneRunner,
) -> None:
    """Between a list that shows a new runner and the snapshot built from it,
    the pair a pass reads still counts the runner as pending; afterwards the
    snapshot shows it and it is pending no more: never neither, never both."""
    observer = one_runner.controller.observer
    one_runner.controller.pools.put_environment(ENV)
    one_runner.reconcile()
    (created,) = one_runner.nomad.created()
    seen: list[tuple[bool, int]] = []

    def look() -> None:
        snap, pending = observer.snapshot_and_pending(ENV.id)
        seen.append((created in snap.runners, pending.creating))

    once_listed(one_runner, look)
    observer.refresh()
    look()

    assert seen == [(False, 1), (True, 0)]


def test_a_refresh_that_ends_just_after_the_pass_took_its_snapshot(
    one_runner: OneRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The narrower form of the same race: another thread's refresh installs
    its snapshot and settles the creation right after the pass was handed the
    previous snapshot. The pass plans from the pair it reads afterwards, which
    shows the runner, and creates none."""
    observer = one_runner.controller.observer
    one_runner.controller.pools.put_environment(ENV)
    one_runner.reconcile()
    (created,) = one_runner.nomad.created()
    handed = observer.current

    def current_then_a_refresh_ends(max_age_s: float | None = None) -> Snapshot:
        snap = handed(max_age_s)
        monkeypatch.setattr(observer, "current", handed)
        observer.refresh()
        return snap

    monkeypatch.setattr(observer, "current", current_then_a_refresh_ends)
    assert one_runner.controller.reconciler.reconcile(ENV.id).ok

    assert one_runner.nomad.created() == [created], "the pass created the runner again"
