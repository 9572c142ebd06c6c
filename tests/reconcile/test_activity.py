"""activity: the pure parts (what a replica publishes, how it is split, how
the leader merges and what it deletes) as tables, and `SharedActivity`
over the in-memory Nomad: what it writes, reads and deletes, and when."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pytest

from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.nomad.gateway import NomadUnavailable
from controller.reconcile.activity import (
    ITEM_OVERHEAD,
    MS,
    STALE_NS,
    SharedActivity,
    chunks,
    disposable,
    entries,
    newest,
    parse,
)
from tests.support.fake_nomad import FakeNomad

NOW = 1_700_000_000_000 * MS  # ns
PREFIX = "nrc/leader/activity"


@pytest.mark.parametrize(
    ("name", "activity", "busy", "claimed", "expected"),
    [
        ("nothing touched", {}, (), ("r1",), {}),
        ("a touch, in ms", {"r1": NOW - 2_500 * MS - 7}, (), ("r1",), {"r1": NOW // MS - 2_501}),
        ("no longer claimed: dropped", {"r1": NOW, "r2": NOW}, (), ("r2",), {"r2": NOW // MS}),
        (
            "a use in flight is active now",
            {"r1": NOW - 60_000 * MS},
            ("r1",),
            ("r1",),
            {"r1": NOW // MS},
        ),
        ("in use, never touched", {}, ("r1",), ("r1",), {"r1": NOW // MS}),
        ("in use but not claimed", {}, ("r1",), (), {}),
    ],
)
def test_entries(
    name: str,
    activity: Mapping[str, int],
    busy: Collection[str],
    claimed: Collection[str],
    expected: dict[str, int],
) -> None:
    assert entries(activity, busy, claimed, NOW) == expected, name


def item(runner_id: str, ms: int) -> int:
    return len(runner_id) + len(str(ms)) + ITEM_OVERHEAD


@pytest.mark.parametrize(
    ("name", "published", "limit", "expected"),
    [
        ("nothing: no variable", {}, 100, ()),
        ("one item", {"r1": 5}, 100, ({"r1": "5"},)),
        (
            "in runner id order, split at the limit",
            {"r3": 3, "r1": 1, "r2": 2},
            2 * item("r1", 1),
            ({"r1": "1", "r2": "2"}, {"r3": "3"}),
        ),
        (
            "exactly at the limit: one",
            {"r1": 1, "r2": 2},
            2 * item("r1", 1),
            ({"r1": "1", "r2": "2"},),
        ),
        (
            "an item over the limit stands alone",
            {"long-runner": 1, "r": 2},
            3,
            ({"long-runner": "1"}, {"r": "2"}),
        ),
    ],
)
def test_chunks(
    name: str, published: dict[str, int], limit: int, expected: tuple[dict[str, str], ...]
) -> None:
    assert chunks(published, limit) == expected, name


def test_chunks_of_many_runners_stay_under_nomads_64_kib() -> None:
    runner_id = "17-00000000-0000-4000-8000-{:012d}"
    published = {runner_id.format(n): NOW // MS for n in range(5000)}
    split = chunks(published)
    assert len(split) > 1
    assert {r for c in split for r in c} == set(published)
    for c in split:
        encoded = sum(len(k) + len(v) + ITEM_OVERHEAD for k, v in c.items())
        assert encoded <= 32 * 1024 < 64 * 1024


@pytest.mark.parametrize(
    ("name", "items", "expected"),
    [
        ("times", {"r1": "12", "r2": "0"}, {"r1": 12, "r2": 0}),
        (
            "somebody else's items left out",
            {"r1": "12", "x": "soon", "y": "-3", "z": ""},
            {"r1": 12},
        ),
    ],
)
def test_parse(name: str, items: dict[str, str], expected: dict[str, int]) -> None:
    assert parse(items) == expected, name


@pytest.mark.parametrize(
    ("name", "variables", "expected"),
    [
        ("none", [], {}),
        ("one", [{"r1": 5}], {"r1": 5}),
        (
            "the newest per runner",
            [{"r1": 5, "r2": 9}, {"r1": 7, "r2": 3}, {"r3": 1}],
            {"r1": 7, "r2": 9, "r3": 1},
        ),
    ],
)
def test_newest(name: str, variables: list[dict[str, int]], expected: dict[str, int]) -> None:
    assert newest(variables) == expected, name


STALE_MS = STALE_NS // MS


@pytest.mark.parametrize(
    ("name", "times", "claimed", "expected"),
    [
        ("names a claimed runner, however old", {"r1": 0}, {"r1"}, False),
        ("nothing claimed, old", {"r1": NOW // MS - STALE_MS}, set(), True),
        (
            "nothing claimed, recent (a claim the snapshot lags)",
            {"r1": NOW // MS - STALE_MS + 1},
            set(),
            False,
        ),
        ("empty", {}, set(), True),
    ],
)
def test_disposable(name: str, times: dict[str, int], claimed: set[str], expected: bool) -> None:
    assert disposable(times, claimed, NOW // MS) is expected, name


# -- SharedActivity over the in-memory Nomad ------------------------------------------------


class Replica:
    """One replica's shared activity, its local activity set by the test."""

    def __init__(self, nomad: FakeNomad, name: str, chunk_bytes: int = 32 * 1024) -> None:
        assert isinstance(nomad.clock, ManualClock)
        self.clock = nomad.clock
        self.activity: dict[str, int] = {}
        self.busy: set[str] = set()
        self.claimed: set[str] | None = set()
        self.metrics = Metrics()
        self.shared = SharedActivity(
            store=nomad,
            prefix=PREFIX,
            clock=nomad.clock,
            metrics=self.metrics,
            interval_s=1.0,
            local=lambda: (dict(self.activity), set(self.busy)),
            claimed=lambda: None if self.claimed is None else set(self.claimed),
            replica=name,
            chunk_bytes=chunk_bytes,
        )

    def touch(self, runner_id: str) -> None:
        self.activity[runner_id] = self.clock.now_ns()
        assert self.claimed is not None
        self.claimed.add(runner_id)

    def count(self, operation: str, result: str = "ok") -> float:
        value = self.metrics.registry.get_sample_value(
            "nrc_activity_sync_total", {"operation": operation, "result": result}
        )
        return value or 0.0


@pytest.fixture
def nomad() -> FakeNomad:
    return FakeNomad(ManualClock())


def test_a_publish_writes_only_what_changed(nomad: FakeNomad) -> None:
    b = Replica(nomad, "b")
    b.shared.publish()
    assert nomad.variable_writes == []  # nothing touched: nothing written
    b.touch("r1")
    b.shared.publish()
    assert nomad.variables == {f"{PREFIX}/b/0": {"r1": str(b.clock.now_ns() // MS)}}
    b.shared.publish()
    assert nomad.variable_writes == [f"{PREFIX}/b/0"]  # unchanged: not written again
    b.clock.advance(3)
    b.touch("r1")
    b.shared.publish()
    assert len(nomad.variable_writes) == 2
    assert b.count("publish") == 2  # publishes that wrote


def test_a_use_in_flight_is_written_every_publish(nomad: FakeNomad) -> None:
    b = Replica(nomad, "b")
    b.touch("r1")
    b.busy.add("r1")
    for _ in range(3):
        b.shared.publish()
        assert nomad.variables[f"{PREFIX}/b/0"] == {"r1": str(b.clock.now_ns() // MS)}
        b.clock.advance(1)
    assert len(nomad.variable_writes) == 3


def test_a_released_runner_leaves_the_variable_and_an_empty_one_is_deleted(
    nomad: FakeNomad,
) -> None:
    b = Replica(nomad, "b")
    b.touch("r1")
    b.touch("r2")
    b.shared.publish()
    assert b.claimed is not None
    b.claimed.discard("r1")
    b.shared.publish()
    assert nomad.variables == {f"{PREFIX}/b/0": {"r2": str(b.clock.now_ns() // MS)}}
    b.claimed.clear()
    b.shared.publish()
    assert nomad.variables == {}
    assert nomad.variable_writes[-1] == f"delete {PREFIX}/b/0"


def test_nothing_is_published_before_nomad_was_observed(nomad: FakeNomad) -> None:
    b = Replica(nomad, "b")
    b.activity["r1"] = b.clock.now_ns()
    b.claimed = None
    b.shared.publish()
    assert nomad.variable_writes == []


def test_many_runners_are_split_over_variables_and_merged_back(nomad: FakeNomad) -> None:
    b = Replica(nomad, "b", chunk_bytes=64)
    ids = [f"runner-{n:02d}" for n in range(10)]
    for n, runner_id in enumerate(ids):
        b.touch(runner_id)
        b.activity[runner_id] += n * MS
    b.shared.publish()
    assert len(nomad.variables) > 2
    a = Replica(nomad, "a")
    assert a.shared.read() == {r: b.activity[r] for r in ids}
    # fewer runners: fewer variables
    assert b.claimed is not None
    b.claimed -= set(ids[1:])
    b.shared.publish()
    assert list(nomad.variables) == [f"{PREFIX}/b/0"]


def test_the_leader_reads_at_most_once_per_interval_and_fetches_only_what_changed(
    nomad: FakeNomad,
) -> None:
    a, b, c = Replica(nomad, "a"), Replica(nomad, "b"), Replica(nomad, "c")
    b.touch("r1")
    c.touch("r2")
    a.touch("r3")  # the reader's own activity is in its memory, not read back
    for r in (a, b, c):
        r.shared.publish()
    t0 = a.clock.now_ns()
    assert a.shared.read() == {"r1": t0, "r2": t0}
    assert nomad.variable_reads == [
        f"list {PREFIX}/",
        f"get {PREFIX}/b/0",
        f"get {PREFIX}/c/0",
    ]
    nomad.variable_reads.clear()
    a.clock.advance(0.5)
    b.touch("r1")
    b.shared.publish()
    assert a.shared.read() == {"r1": t0, "r2": t0}  # within the interval: the last read's
    assert nomad.variable_reads == []
    a.clock.advance(0.5)
    assert a.shared.read() == {"r1": t0 + 500 * MS, "r2": t0}
    assert nomad.variable_reads == [f"list {PREFIX}/", f"get {PREFIX}/b/0"]
    assert a.count("read") == 2


def test_a_failed_read_knows_nothing_until_one_succeeds(nomad: FakeNomad) -> None:
    a, b = Replica(nomad, "a"), Replica(nomad, "b")
    b.touch("r1")
    b.shared.publish()
    assert a.shared.read() == {"r1": b.clock.now_ns()}
    a.clock.advance(1)

    def unavailable(prefix: str) -> tuple[()]:
        raise NomadUnavailable("list_variables: connection refused")

    listing = nomad.list_variables
    nomad.list_variables = unavailable  # type: ignore[method-assign]
    assert a.shared.read() is None
    assert a.shared.known() is None
    assert a.count("read", "error") == 1
    nomad.list_variables = listing  # type: ignore[method-assign]
    assert a.shared.read() is None  # tried again one interval later, not at every pass
    a.clock.advance(1)
    assert a.shared.read() == {"r1": b.clock.now_ns() - 2_000 * MS}


def test_a_stopping_replica_deletes_its_variables(nomad: FakeNomad) -> None:
    b = Replica(nomad, "b", chunk_bytes=16)
    b.touch("r1")
    b.touch("r2")
    b.shared.publish()
    assert len(nomad.variables) == 2
    b.shared.withdraw()
    assert nomad.variables == {}


def test_the_leader_deletes_what_a_crashed_replica_left_once_stale(nomad: FakeNomad) -> None:
    a, b = Replica(nomad, "a"), Replica(nomad, "b")
    b.touch("r1")
    b.shared.publish()  # and b crashes
    assert a.claimed is not None
    a.claimed.add("r1")
    a.clock.advance(STALE_NS / 1e9 + 1)
    a.shared.read()
    assert f"{PREFIX}/b/0" in nomad.variables  # r1 is still claimed: kept, however old
    a.claimed.clear()  # r1 released
    a.clock.advance(1)
    a.shared.read()
    assert nomad.variables == {}
    assert a.count("delete") == 1


def test_a_stale_variable_written_meanwhile_is_kept(nomad: FakeNomad) -> None:
    """The deletion is a check-and-set on the index the leader read."""
    a, b = Replica(nomad, "a"), Replica(nomad, "b")
    b.touch("r1")
    b.shared.publish()
    a.clock.advance(STALE_NS / 1e9 + 1)

    def write_first(path: str) -> None:
        nomad.variable_indexes[path] += 1  # b writes between the leader's read and delete

    deleting = nomad.delete_variable

    def racing(path: str, modify_index: int | None = None) -> bool:
        write_first(path)
        return deleting(path, modify_index)

    nomad.delete_variable = racing  # type: ignore[method-assign]
    a.shared.read()
    assert f"{PREFIX}/b/0" in nomad.variables
