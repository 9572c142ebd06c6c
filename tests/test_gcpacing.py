"""The garbage collector's pacing (controller/gcpacing.py)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from controller.gcpacing import CollectorPacer, Pacing, Step, next_step


class FakeCollector:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.changed = threading.Condition()

    def collect(self) -> int:
        self._call("collect")
        return 0

    def freeze(self) -> None:
        self._call("freeze")

    def unfreeze(self) -> None:
        self._call("unfreeze")

    def _call(self, name: str) -> None:
        with self.changed:
            self.calls.append(name)
            self.changed.notify_all()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def no_frozen_objects_left() -> Iterator[None]:
    yield
    assert gc.get_freeze_count() == 0


@pytest.fixture
def no_automatic_collections() -> Iterator[None]:
    """Only the test's own gc.collect() calls run (and are timed)."""
    was_enabled = gc.isenabled()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()


PACING = Pacing(freeze_interval_s=30.0, full_interval_s=600.0)


@pytest.mark.parametrize(
    ("now", "last_full", "step"),
    [
        (100.0, None, Step.FULL),  # the first step walks everything once
        (130.0, 100.0, Step.FREEZE),
        (699.9, 100.0, Step.FREEZE),
        (700.0, 100.0, Step.FULL),  # one full interval since the last full collection
        (5000.0, 100.0, Step.FULL),
    ],
)
def test_next_step(now: float, last_full: float | None, step: Step) -> None:
    assert next_step(PACING, now, last_full) is step


def test_a_full_step_unfreezes_first_and_a_freeze_step_collects_only_what_is_not_frozen() -> None:
    collector, clock = FakeCollector(), Clock()
    pacer = CollectorPacer(PACING, monotonic=clock, collector=collector)
    assert pacer.step() is Step.FULL
    clock.now += 30
    assert pacer.step() is Step.FREEZE
    clock.now += 600
    assert pacer.step() is Step.FULL
    assert collector.calls == [
        *("unfreeze", "collect", "freeze"),
        *("collect", "freeze"),
        *("unfreeze", "collect", "freeze"),
    ]
    pacer.stop()
    assert collector.calls[-1] == "unfreeze"  # every object goes back to the collector


def test_the_pacer_steps_on_its_own_thread_until_stopped() -> None:
    collector = FakeCollector()
    pacer = CollectorPacer(Pacing(0.01, 600.0), collector=collector)
    pacer.start()
    with collector.changed:
        assert collector.changed.wait_for(lambda: collector.calls.count("freeze") >= 3, timeout=10)
    pacer.stop()
    assert not [t for t in threading.enumerate() if t.name == "nrc-gc"]
    assert collector.calls[:3] == ["unfreeze", "collect", "freeze"]
    assert collector.calls[3:5] == ["collect", "freeze"]


def test_the_first_step_waits_until_the_snapshot_is_filled() -> None:
    collector = FakeCollector()
    filled = threading.Event()
    pacer = CollectorPacer(Pacing(600.0, 3600.0), collector=collector, ready=filled.is_set)
    pacer.start()
    try:
        assert collector.calls == []  # neither ready nor an interval passed
        filled.set()
        with collector.changed:
            assert collector.changed.wait_for(lambda: "freeze" in collector.calls, timeout=10)
        assert collector.calls == ["unfreeze", "collect", "freeze"]
    finally:
        pacer.stop()


def test_a_pacer_stopped_before_the_snapshot_is_filled_never_steps() -> None:
    collector = FakeCollector()
    pacer = CollectorPacer(Pacing(600.0, 3600.0), collector=collector, ready=lambda: False)
    pacer.start()
    pacer.stop()
    assert collector.calls == []
    assert not [t for t in threading.enumerate() if t.name == "nrc-gc"]


def test_off_never_freezes_but_still_times_full_collections(
    no_frozen_objects_left: None, no_automatic_collections: None
) -> None:
    pauses: list[float] = []
    pacer = CollectorPacer(Pacing(0.0, 600.0), on_pause=pauses.append)
    pacer.start()
    assert not [t for t in threading.enumerate() if t.name == "nrc-gc"]
    gc.collect(1)
    assert pauses == []  # only full collections are timed
    gc.collect()
    assert len(pauses) == 1 and pauses[0] > 0
    pacer.stop()
    gc.collect()
    assert len(pauses) == 1  # stopped: no longer timed


def test_frozen_objects_are_left_out_of_collections_until_stopped(
    no_frozen_objects_left: None,
) -> None:
    pacer = CollectorPacer(PACING)
    pacer.step()
    assert gc.get_freeze_count() > 0
    # A cycle made after the freeze is still collected by the collector's own runs.
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1
    pacer.stop()
