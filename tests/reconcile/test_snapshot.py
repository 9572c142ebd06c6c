"""snapshot: table-driven cases over the pure snapshot operations and their
indexes (`by_env`, `ready` oldest first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.model import Claim, Environment, Phase, RunnerJob, RunnerView, Template
from controller.reconcile import snapshot as snapshots
from controller.reconcile.snapshot import EMPTY, Read, Snapshot, index_by_env, index_ready

ENV7 = Environment(id=7, image="python:3.12", prewarming_pool_size=3)
ENV8 = Environment(id=8, image="python:3.12", prewarming_pool_size=1)


def view(
    env_id: int, n: int, phase: Phase = Phase.READY, *, claimed: bool = False, known: bool = True
) -> RunnerView:
    job = RunnerJob(
        id=f"{env_id}-{n}",
        env_id=env_id,
        job_modify_index=100 + n,
        create_index=n,
        claim=Claim(alloc_id="a") if claimed else None,
    )
    return RunnerView(job=job, phase=phase, known=known)


def template(env: Environment) -> Template:
    return Template(env, 1, {})


def snap_of(*views: RunnerView) -> Snapshot:
    runners = {v.id: v for v in views}
    return snapshots.rebuilt(
        Read({7: template(ENV7)}, runners, {}),
        jobs_index=10,
        allocs_index=10,
        covers=10,
        taken_at=1.0,
        safe=True,
    )


def test_index_by_env_groups_runners_by_environment() -> None:
    runners = {v.id: v for v in (view(7, 1), view(8, 2), view(7, 3))}
    assert index_by_env(runners) == {7: ("7-1", "7-3"), 8: ("8-2",)}


@pytest.mark.parametrize(
    ("added", "removed", "after"),
    [
        ({}, {}, {7: ("7-1", "7-3"), 8: ("8-2",)}),
        ({"7-4": 7}, {}, {7: ("7-1", "7-3", "7-4"), 8: ("8-2",)}),
        ({}, {"7-1": 7}, {7: ("7-3",), 8: ("8-2",)}),
        ({}, {"8-2": 8}, {7: ("7-1", "7-3")}),  # an environment left empty goes
        ({"9-5": 9}, {"7-3": 7}, {7: ("7-1",), 8: ("8-2",), 9: ("9-5",)}),
        ({"7-1": 7}, {"7-1": 7}, {7: ("7-3", "7-1"), 8: ("8-2",)}),  # gone and back: last
    ],
)
def test_update_by_env_walks_only_what_changed(
    added: dict[str, int], removed: dict[str, int], after: dict[int, tuple[str, ...]]
) -> None:
    before = {7: ("7-1", "7-3"), 8: ("8-2",)}
    assert snapshots.update_by_env(before, added, removed) == after


@dataclass(frozen=True)
class ReadyCase:
    name: str
    views: tuple[RunnerView, ...]
    ready: dict[int, tuple[str, ...]]


READY_CASES = [
    ReadyCase("empty", (), {}),
    ReadyCase("oldest first", (view(7, 3), view(7, 1), view(7, 2)), {7: ("7-1", "7-2", "7-3")}),
    ReadyCase("starting is not ready", (view(7, 1, Phase.STARTING), view(7, 2)), {7: ("7-2",)}),
    ReadyCase("claimed is not ready", (view(7, 1, claimed=True), view(7, 2)), {7: ("7-2",)}),
    ReadyCase("unknown is not ready", (view(7, 1, known=False), view(7, 2)), {7: ("7-2",)}),
    ReadyCase("no ready runner, no entry", (view(7, 1, Phase.DEAD),), {}),
    ReadyCase("per environment", (view(8, 2), view(7, 1)), {7: ("7-1",), 8: ("8-2",)}),
]


@pytest.mark.parametrize("case", READY_CASES, ids=lambda c: c.name)
def test_index_ready(case: ReadyCase) -> None:
    assert index_ready({v.id: v for v in case.views}) == case.ready


@dataclass(frozen=True)
class ChangeCase:
    name: str
    before: tuple[RunnerView, ...]
    change: Callable[[Snapshot], Snapshot]
    runners: tuple[str, ...]  # in the new snapshot, sorted
    ready: dict[int, tuple[str, ...]]
    by_env: dict[int, tuple[str, ...]]


CHANGE_CASES = [
    ChangeCase(
        "a claim leaves the ready list",
        (view(7, 1), view(7, 2)),
        lambda s: snapshots.with_runner(s, view(7, 1, claimed=True)),
        ("7-1", "7-2"),
        {7: ("7-2",)},
        {7: ("7-1", "7-2")},
    ),
    ChangeCase(
        "a runner becoming ready takes its place by age",
        (view(7, 1), view(7, 2, Phase.STARTING), view(7, 3)),
        lambda s: snapshots.with_runner(s, view(7, 2)),
        ("7-1", "7-2", "7-3"),
        {7: ("7-1", "7-2", "7-3")},
        {7: ("7-1", "7-2", "7-3")},
    ),
    ChangeCase(
        "a ready runner read again as it was stays where it is",
        (view(7, 1), view(7, 2)),
        lambda s: snapshots.with_runner(s, view(7, 1)),
        ("7-1", "7-2"),
        {7: ("7-1", "7-2")},
        {7: ("7-1", "7-2")},
    ),
    ChangeCase(
        "a ready runner whose CreateIndex changed moves to its new place",
        (view(7, 1), view(7, 2), view(7, 3)),
        lambda s: snapshots.with_runner(
            s, replace(view(7, 1), job=replace(view(7, 1).job, create_index=5))
        ),
        ("7-1", "7-2", "7-3"),
        {7: ("7-2", "7-3", "7-1")},
        {7: ("7-1", "7-2", "7-3")},
    ),
    ChangeCase(
        "a runner not in the snapshot is not added by a write",
        (view(7, 1),),
        lambda s: snapshots.with_runner(s, view(7, 9)),
        ("7-1",),
        {7: ("7-1",)},
        {7: ("7-1",)},
    ),
    ChangeCase(
        "a deleted runner leaves every index",
        (view(7, 1), view(7, 2)),
        lambda s: snapshots.without_runner(s, "7-1"),
        ("7-2",),
        {7: ("7-2",)},
        {7: ("7-2",)},
    ),
    ChangeCase(
        "the last runner of an environment leaves no empty entry",
        (view(7, 1), view(8, 1)),
        lambda s: snapshots.without_runner(s, "8-1"),
        ("7-1",),
        {7: ("7-1",)},
        {7: ("7-1",)},
    ),
    ChangeCase(
        "deleting an unknown runner changes nothing",
        (view(7, 1),),
        lambda s: snapshots.without_runner(s, "7-5"),
        ("7-1",),
        {7: ("7-1",)},
        {7: ("7-1",)},
    ),
    ChangeCase(
        "a merge adds, replaces and removes only what it read",
        (view(7, 1), view(7, 2), view(8, 3)),
        lambda s: snapshots.merged(
            s,
            Read({}, {"7-4": view(7, 4), "7-2": view(7, 2, Phase.STOPPING)}, {}, (), ("8-3",)),
            jobs_index=12,
            allocs_index=11,
            covers=12,
            taken_at=2.0,
            safe=True,
        ),
        ("7-1", "7-2", "7-4"),
        {7: ("7-1", "7-4")},
        {7: ("7-1", "7-2", "7-4")},
    ),
]


@pytest.mark.parametrize("case", CHANGE_CASES, ids=lambda c: c.name)
def test_changes_keep_the_indexes(case: ChangeCase) -> None:
    before = snap_of(*case.before)
    after = case.change(before)
    assert tuple(sorted(after.runners)) == case.runners
    assert dict(after.ready) == case.ready
    assert {e: tuple(sorted(ids)) for e, ids in after.by_env.items()} == case.by_env
    # The old snapshot is never changed.
    assert before == snap_of(*case.before)


def test_merge_never_moves_list_indexes_back_and_keeps_templates_it_did_not_read() -> None:
    base = snap_of(view(7, 1))
    merged = snapshots.merged(
        base,
        Read({8: template(ENV8)}, {}, {}),
        jobs_index=5,
        allocs_index=20,
        covers=9,
        taken_at=3.0,
        safe=False,
    )
    assert (merged.jobs_index, merged.allocs_index, merged.covers) == (10, 20, 9)
    assert set(merged.templates) == {7, 8}
    assert not merged.safe
    gone = snapshots.merged(
        merged,
        Read({}, {}, {}, (7,)),
        jobs_index=21,
        allocs_index=21,
        covers=21,
        taken_at=4.0,
        safe=True,
    )
    assert set(gone.templates) == {8}
    assert gone.env_ids() == {7, 8}  # environment 7 still has a runner


def test_templates_are_written_and_deleted() -> None:
    snap = snapshots.with_template(EMPTY, template(ENV7))
    assert snap.templates[7].env == ENV7
    assert snapshots.without_template(snap, 7).templates == {}
    assert snapshots.without_template(snap, 8) is snap


def test_views_and_claimable_read_the_indexes() -> None:
    snap = snap_of(view(7, 2), view(7, 1, claimed=True), view(7, 3, Phase.STARTING))
    assert [v.id for v in snap.views(7)] == ["7-2", "7-1", "7-3"]
    assert [v.id for v in snap.claimable(7)] == ["7-2"]
    assert list(snap.claimable(8)) == []


def test_a_claimed_runner_leaves_a_ready_list_out_of_order() -> None:
    """Bisection finds a runner only in a list kept in order: one that is
    not (whatever broke it) is searched, never left claimable."""
    snap = snap_of(view(7, 1), view(7, 2), view(7, 3))
    broken = replace(snap, ready={7: ("7-2", "7-1", "7-3")})
    after = snapshots.with_runner(broken, view(7, 2, claimed=True))
    assert after.ready == {7: ("7-1", "7-3")}


STATES = st.sampled_from(
    [
        (Phase.READY, False, True),
        (Phase.READY, True, True),
        (Phase.STARTING, False, True),
        (Phase.READY, False, False),
        (Phase.DEAD, False, True),
    ]
)


@given(
    start=st.dictionaries(st.integers(0, 15), STATES, max_size=12),
    steps=st.lists(st.tuples(st.integers(0, 15), st.none() | STATES), max_size=20),
)
def test_incremental_updates_equal_a_rebuild(
    start: dict[int, tuple[Phase, bool, bool]],
    steps: list[tuple[int, tuple[Phase, bool, bool] | None]],
) -> None:
    """However runners change, appear and go away one merge at a time, the
    indexes kept up to date equal those built from scratch."""
    env_of = {n: 7 if n % 3 else 8 for n in range(16)}

    def make(n: int, state: tuple[Phase, bool, bool]) -> RunnerView:
        phase, claimed, known = state
        return view(env_of[n], n, phase, claimed=claimed, known=known)

    views = [make(n, s) for n, s in start.items()]
    snap = snap_of(*views)
    # The runners as a dict holds them (in the order they came), which is the
    # order a rebuild from a list gives.
    model = {v.id: v for v in views}
    for n, state in steps:
        runner_id = f"{env_of[n]}-{n}"
        if state is None:
            read = Read({}, {}, {}, (), (runner_id,))
            model.pop(runner_id, None)
        else:
            read = Read({}, {runner_id: make(n, state)}, {})
            model[runner_id] = make(n, state)
        snap = snapshots.merged(
            snap, read, jobs_index=0, allocs_index=0, covers=0, taken_at=0.0, safe=True
        )
        assert dict(snap.runners) == model
        assert dict(snap.ready) == index_ready(model)
        # Kept up to date, not rebuilt: in the very order a rebuild gives.
        assert dict(snap.by_env) == index_by_env(model)
