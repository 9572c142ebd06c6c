"""Expectations: issued writes count until a list at their index shows them."""

from __future__ import annotations

from controller.clock import ManualClock
from controller.reconcile.expectations import Expectations


def test_creation_counts_until_a_list_at_its_index_is_seen():
    exp = Expectations(ManualClock(), timeout_s=60)
    exp.expect_create(7, "7-a")
    assert exp.pending(7).creating == 1
    exp.observe(set(), 10**9)  # the write has not answered: no list can settle it
    assert exp.pending(7).creating == 1
    exp.created("7-a", 50)
    exp.observe(set(), 49)  # a lagging list
    assert exp.pending(7).creating == 1
    exp.observe({"7-a"}, 49)  # seen (e.g. a list that started after the write)
    assert exp.pending(7).creating == 0


def test_creation_settled_by_index_even_if_the_job_is_gone():
    exp = Expectations(ManualClock())
    exp.expect_create(7, "7-a")
    exp.created("7-a", 50)
    exp.observe(set(), 50)
    assert exp.pending(7).creating == 0


def test_deletion_counts_until_a_list_at_its_index_lacks_the_job():
    exp = Expectations(ManualClock())
    exp.expect_delete(7, "7-a")
    exp.deleted("7-a", 60)
    exp.observe({"7-a"}, 59)
    assert exp.pending(7).deleting == {"7-a"}
    assert exp.is_deleting("7-a")
    exp.observe(set(), 60)
    assert exp.pending(7).deleting == frozenset()


def test_failed_writes_and_timeouts_are_forgotten():
    clock = ManualClock()
    exp = Expectations(clock, timeout_s=5)
    exp.expect_create(7, "7-a")
    exp.expect_create(7, "7-b")
    exp.expect_delete(8, "8-c")
    exp.create_failed("7-a")
    assert exp.pending(7).creating == 1
    clock.advance(5.1)
    exp.observe(set(), 1)
    assert exp.pending(7).creating == 0 and exp.pending(8).deleting == frozenset()


def test_environments_are_counted_apart():
    exp = Expectations(ManualClock())
    exp.expect_create(7, "7-a")
    exp.expect_create(8, "8-a")
    exp.expect_create(8, "8-b")
    assert (exp.pending(7).creating, exp.pending(8).creating) == (1, 2)
