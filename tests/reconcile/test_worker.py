"""worker: the generic half of the loop — results become requeues, backoff
or nothing, and passes of a key are spaced. Driven one key at a time
(`_process`) with a manual clock, so nothing here waits on real time."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controller.clock import ManualClock
from controller.metrics import CONTROLLER, Metrics
from controller.reconcile.queue import WorkQueue
from controller.reconcile.worker import Result, Worker


@dataclass
class Scripted:
    """Answers each pass with the next result (an exception is raised)."""

    results: list[Result | Exception]
    seen: list[int] = field(default_factory=list)

    def reconcile(self, key: int) -> Result:
        self.seen.append(key)
        answer = self.results.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def make(
    results: list[Result | Exception], active: bool = True
) -> tuple[Worker[int], Scripted, ManualClock, Metrics]:
    clock, metrics, reconciler = ManualClock(), Metrics(), Scripted(results)
    worker: Worker[int] = Worker(
        reconciler=reconciler,
        queue=WorkQueue(clock, base_s=1.0, cap_s=8.0),
        clock=clock,
        metrics=metrics,
        name=CONTROLLER,
        threads=1,
        active=lambda: active,
    )
    return worker, reconciler, clock, metrics


def total(metrics: Metrics, result: str) -> float:
    value: float = metrics.reconcile_total.labels(CONTROLLER, result)._value.get()
    return value


@dataclass(frozen=True)
class Case:
    name: str
    result: Result | Exception
    requeues: int  # backoff failures counted for the key afterwards
    delayed: int  # keys waiting for a time
    counted: str  # reconcile_total result label that went up


CASES = [
    Case("success forgets the key", Result(), 0, 0, "success"),
    Case("failed writes back off", Result(failed_writes=2), 1, 1, "error"),
    Case("a raised error backs off", RuntimeError("boom"), 1, 1, "error"),
    Case("requeue after a time", Result(requeue_after_s=5.0), 0, 1, "requeue_after"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_result_decides_what_happens_to_the_key(case: Case) -> None:
    worker, reconciler, _, metrics = make([case.result])
    worker._process(7)
    assert reconciler.seen == [7]
    assert worker.queue.num_requeues(7) == case.requeues
    assert worker.queue.delayed == case.delayed
    assert total(metrics, case.counted) == 1


def test_a_requeue_comes_due_on_the_clock() -> None:
    worker, _, clock, _ = make([Result(requeue_after_s=5.0)])
    worker._process(7)
    worker.queue.done(7)
    clock.advance(4.9)
    assert worker.queue.get(timeout_s=0) is None
    clock.advance(0.2)
    assert worker.queue.get(timeout_s=0) == 7


def test_a_follower_takes_keys_without_reconciling() -> None:
    worker, reconciler, _, metrics = make([], active=False)
    worker._process(7)
    assert reconciler.seen == []
    assert total(metrics, "success") == 0


class Waits(list[float]):
    """Stands in for the stop event's `wait`: records how long a pass would wait."""

    def __call__(self, timeout: float | None = None) -> bool:
        self.append(timeout or 0.0)
        return False


def test_passes_of_a_key_are_spaced_by_four_times_their_cost() -> None:
    worker, _, clock, _ = make([Result(cost_s=1.0), Result()])
    worker._process(7)
    waits = Waits()
    worker._stop.wait = waits  # type: ignore[method-assign]
    clock.advance(3.0)
    worker._process(7)
    assert list(waits) == [pytest.approx(1.0)]
    # Another key is not held back by this one.
    worker2, _, _, _ = make([Result()])
    worker2._stop.wait = waits  # type: ignore[method-assign]
    worker2._process(8)
    assert len(waits) == 1
