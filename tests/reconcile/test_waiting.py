"""Claims that wait for a runner (NRC_CLAIM_WAIT): served first come, first
served, bounded in number, answered at once when waiting is off."""

from __future__ import annotations

import threading
import time

import pytest

from controller.clock import SystemClock
from controller.reconcile.waiting import WaitingClaims


class Runners:
    """Runners that start one by one: `start()` makes one claimable."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready: list[str] = []
        self.tries = 0

    def start(self, name: str) -> None:
        with self.lock:
            self.ready.append(name)

    def attempt(self) -> str | None:
        with self.lock:
            self.tries += 1
            return self.ready.pop(0) if self.ready else None


def test_off_or_full_answers_at_once() -> None:
    runners = Runners()
    runners.start("r1")
    assert WaitingClaims(SystemClock(), 0.0, 10).serve(1, runners.attempt) is None
    assert WaitingClaims(SystemClock(), 5.0, 0).serve(1, runners.attempt) is None
    assert runners.tries == 0, "nothing tried: the caller has tried once already"


def test_a_runner_that_starts_within_the_wait_is_served() -> None:
    runners = Runners()
    waiting = WaitingClaims(SystemClock(), 5.0, 10)
    threading.Timer(0.2, runners.start, ["r1"]).start()
    began = time.monotonic()
    assert waiting.serve(1, runners.attempt) == "r1"
    assert 0.15 < time.monotonic() - began < 2.0
    assert waiting.waiting == 0


def test_the_wait_runs_out() -> None:
    runners = Runners()
    began = time.monotonic()
    assert WaitingClaims(SystemClock(), 0.3, 10).serve(1, runners.attempt) is None
    assert 0.3 <= time.monotonic() - began < 2.0


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
def test_first_come_first_served(order: list[int]) -> None:
    """Three claims wait in turn; runners start one at a time: each goes to
    the longest waiting claim, whatever order the threads wake in."""
    runners = Runners()
    waiting = WaitingClaims(SystemClock(), 10.0, 10)
    served: dict[int, str | None] = {}
    threads = []
    for n in range(3):
        thread = threading.Thread(
            target=lambda n=n: served.__setitem__(n, waiting.serve(1, runners.attempt))
        )
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 5
        while waiting.waiting < n + 1 and time.monotonic() < deadline:
            time.sleep(0.005)
    for index in order:
        runners.start(f"r{index}")
    for thread in threads:
        thread.join(10)
    assert [served[n] for n in range(3)] == [f"r{i}" for i in order]


def test_at_most_max_waiting_wait_and_other_environments_are_not_held_up() -> None:
    runners, other = Runners(), Runners()
    waiting = WaitingClaims(SystemClock(), 10.0, 2)
    results: list[str | None] = []
    threads = [
        threading.Thread(target=lambda: results.append(waiting.serve(1, runners.attempt)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while waiting.waiting < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert waiting.serve(1, runners.attempt) is None, "a third is answered at once"
    other.start("o1")
    assert WaitingClaims(SystemClock(), 10.0, 2).serve(2, other.attempt) == "o1"
    runners.start("r1")
    runners.start("r2")
    for thread in threads:
        thread.join(10)
    assert sorted(r for r in results if r) == ["r1", "r2"]
