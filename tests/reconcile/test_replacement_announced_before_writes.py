"""Regression (chaos seed 36, a false over-creation): a replacement whose
outdated runner was never deleted looked like a runner created too many.

What happened: after a template update a pass planned the `outdated`
deletion of every idle runner and created their replacements; one deletion
was still being retried through a burst of `No cluster leader` when the
scenario SIGKILLed the controller, the environment was deleted meanwhile,
and the next controller deleted the old runner as an `orphan`. The chaos
suite counts replacements from the controller's log, and no line said that
this runner had been replaced, so its replacement counted as over-created.

A pass now says `replacing runner … (reason)` before any of its writes, so
whatever cuts the deletion, the replacement is on record before it exists.

The same holds for a pass that may not delete at all (chaos seed 82: one
runner's spec unreadable, so the snapshot is unsafe): it still creates the
replacements of the runners it no longer counts, and must say so, although
their deletion waits for a pass that read every spec.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from controller.model import Allocation
from controller.nomad import jobs
from controller.nomad.gateway import NomadUnavailable
from controller.reconcile.reconciler import DEFERRED_RETRY_S
from tests.support.one_runner import ENV, OneRunner

ANNOUNCED = "replacing runner {} (outdated)"


def running_runner(one_runner: OneRunner) -> str:
    """The environment's pool of one, its runner running."""
    one_runner.controller.pools.put_environment(ENV)
    one_runner.reconcile()
    (old,) = one_runner.nomad.created()
    now = one_runner.clock.now_ns()
    one_runner.nomad.put_alloc(
        Allocation(
            id="alloc-1",
            job_id=old,
            client_status="running",
            create_index=one_runner.nomad.index + 1,
            create_time=now,
            started_at=now,
        )
    )
    one_runner.reconcile()
    return old


def test_a_replacement_is_announced_before_it_is_created(
    one_runner: OneRunner, caplog: pytest.LogCaptureFixture
) -> None:
    old = running_runner(one_runner)
    one_runner.controller.pools.put_environment(replace(ENV, image="python:3.13"))
    announced_at_write: list[bool] = []

    def creating(job: dict[str, object], enforce_index: int | None) -> None:
        logged = [r.getMessage() for r in caplog.records]
        announced_at_write.append(ANNOUNCED.format(old) in logged)

    def deletion_cut(job_id: str) -> None:
        raise NomadUnavailable("No cluster leader")  # as if the process died here

    one_runner.nomad.before_register = creating
    one_runner.nomad.before_deregister = deletion_cut
    with caplog.at_level(logging.INFO, logger="controller.reconcile.act"):
        one_runner.controller.observer.refresh()
        one_runner.controller.reconciler.reconcile(ENV.id)

    assert len(one_runner.nomad.created()) == 2, "the outdated runner was replaced"
    assert old not in one_runner.nomad.deregistered()
    assert announced_at_write == [True], "the replacement was created before it was announced"


def test_a_pass_that_may_not_delete_announces_the_replacements_it_creates(
    one_runner: OneRunner, caplog: pytest.LogCaptureFixture
) -> None:
    old = running_runner(one_runner)
    # A runner of another environment whose spec cannot be read: no pass may
    # delete anything until it is read.
    other = replace(ENV, id=ENV.id + 1)
    stranger = jobs.runner_job_id(other.id, "00000000-0000-0000-0000-000000000001")
    one_runner.nomad.put(jobs.runner_job(jobs.template_job(other), other, stranger))
    one_runner.nomad.unreadable.add(stranger)
    one_runner.controller.pools.put_environment(replace(ENV, image="python:3.13"))
    announced_at_write: list[bool] = []

    def creating(job: dict[str, object], enforce_index: int | None) -> None:
        logged = [r.getMessage() for r in caplog.records]
        announced_at_write.append(any(m.startswith(ANNOUNCED.format(old)) for m in logged))

    one_runner.nomad.before_register = creating
    with caplog.at_level(logging.INFO, logger="controller.reconcile.act"):
        assert not one_runner.controller.observer.refresh(full=True).safe
        result = one_runner.controller.reconciler.reconcile(ENV.id)

    mine = [j for j in one_runner.nomad.created() if jobs.runner_env_id(j) == ENV.id]
    assert len(mine) == 2, "the outdated runner was replaced"
    assert old not in one_runner.nomad.deregistered(), "an unsafe pass deletes nothing"
    assert announced_at_write == [True], "the replacement was created before it was announced"
    # The deletion is looked at again soon, not at the next resync.
    assert result.requeue_after_s == DEFERRED_RETRY_S
    one_runner.nomad.unreadable.clear()
    one_runner.reconcile()
    assert old in one_runner.nomad.deregistered()
