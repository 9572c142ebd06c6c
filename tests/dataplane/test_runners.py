"""`ClaimedRunners`, the one adapter executions and file operations ask about
the runner a client claimed, over a real controller and the in-memory Nomad:
who may use it, with which answer, and how long a failure waits for a loss."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Iterator
from dataclasses import replace
from typing import Any, cast

import pytest

from controller.dataplane import answers
from controller.dataplane.answers import Look
from controller.dataplane.runners import (
    ClaimedRunners,
    Ended,
    Unrecorded,
    Unusable,
    believed_at_once,
    nothing_in_flight,
    read_times,
)
from controller.metrics import Metrics
from controller.model import Allocation, Claim, LossReason
from controller.nomad.gateway import AllocListing, NomadUnavailable
from controller.reconcile.facade import Pools
from controller.reconcile.loop import Controller
from tests.support.fake_nomad import FakeNomad
from tests.support.one_runner import ENV, SETTINGS, OneRunner

pytestmark = pytest.mark.anyio


class LosesOnRead(FakeNomad):
    """Nomad whose servers hear of the runner's loss at the `at`-th read of its
    allocations (a client that reports late); `failing` makes reads fail."""

    def __init__(self) -> None:
        super().__init__()
        self.at: int | None = None
        self.alloc_reads = 0
        self.failing = False

    def _read(self) -> None:
        if self.failing:
            raise NomadUnavailable("connection refused")
        self.alloc_reads += 1
        if self.at is not None and self.alloc_reads >= self.at:
            lose(self)

    # A refresh reads the allocations by one of these.
    def list_allocations_of_jobs(self, job_ids: Collection[str]) -> AllocListing:
        self._read()
        return super().list_allocations_of_jobs(job_ids)

    def list_allocation_versions(self) -> AllocListing:
        self._read()
        return super().list_allocation_versions()

    def list_allocations(self, index: int = 0, wait_s: float = 0) -> AllocListing:
        self._read()
        return super().list_allocations(index, wait_s)


class Rereads:
    """The façade, counting the runner's reads again (and noting the thread
    each touch ran on)."""

    def __init__(self, pools: Pools) -> None:
        self.pools = pools
        self.rereads = 0
        self.touched_on: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pools, name)

    def reread(self, runner_ids: Collection[str]) -> None:
        self.rereads += 1
        self.pools.reread(runner_ids)

    def touch(self, runner_id: str) -> bool:
        self.touched_on.append(threading.get_ident())
        return self.pools.touch(runner_id)


def lose(nomad: FakeNomad) -> None:
    alloc = nomad.allocs["alloc-1"]
    if alloc.client_status != "lost":
        nomad.put_alloc(replace(alloc, client_status="lost", desired_status="stop"))


@pytest.fixture
def one() -> Iterator[OneRunner]:
    one = OneRunner(LosesOnRead())
    yield one
    one.close()


def nomad_of(one: OneRunner) -> LosesOnRead:
    assert isinstance(one.nomad, LosesOnRead)
    return one.nomad


def refusal(runners: ClaimedRunners, runner_id: str) -> answers.Answer:
    with pytest.raises(Unusable) as refused:
        runners.claimed(runner_id)
    return refused.value.answer


@pytest.mark.parametrize(
    ("settle_s", "reads"),
    [
        (0.0, (0.0,)),
        (0.1, (0.0, 0.1)),
        (0.85, (0.0, 0.1, 0.25, 0.5, 0.85)),
        (2.0, (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)),
        (20.0, (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 20.0)),
    ],
)
def test_the_settle_schedule_reads_early_then_spreads_out(
    settle_s: float, reads: tuple[float, ...]
) -> None:
    assert read_times(settle_s) == reads


def test_a_claimed_runner_is_touched_and_handed_back(one: OneRunner) -> None:
    runner_id = one.claim(timeout_s=60)
    runners = ClaimedRunners(one.controller.pools)
    one.clock.advance(50)
    assert runners.claimed(runner_id).id == runner_id
    one.clock.advance(50)  # 100 s after the claim, 50 after the touch: not expired
    assert runners.claimed(runner_id).id == runner_id


def test_unknown_and_released_runners_are_gone(one: OneRunner) -> None:
    runner_id = one.claim()
    runners = ClaimedRunners(one.controller.pools)
    assert refusal(runners, "5-nobody") == answers.ended("5-nobody", None)
    assert one.controller.pools.release(runner_id)
    assert refusal(runners, runner_id).message == f"runner {runner_id} is unknown or was released"


def test_a_derived_loss_is_recorded_in_nomad_before_it_is_told(one: OneRunner) -> None:
    runner_id = one.claim()
    runners = ClaimedRunners(one.controller.pools)
    lose(one.nomad)
    one.controller.pools.reread([runner_id])
    assert one.nomad.end_claims(runner_id) == []
    answer = refusal(runners, runner_id)
    assert (answer.status, answer.result) == (410, "lost")
    assert answer.message.startswith(f"runner {runner_id} was lost: ")
    assert len(one.nomad.end_claims(runner_id)) == 1, "written to Nomad first"
    assert refusal(runners, runner_id) == answer, "the same answer, without a second write"
    assert len(one.nomad.end_claims(runner_id)) == 1


def test_a_loss_nomad_does_not_take_is_503_never_a_reason(one: OneRunner) -> None:
    runner_id = one.claim()
    runners = ClaimedRunners(one.controller.pools)
    lose(one.nomad)
    one.controller.pools.reread([runner_id])

    def refuse(job: object, index: int | None) -> None:
        raise NomadUnavailable("connection refused by 10.0.0.7:4646")

    one.nomad.before_register = refuse
    answer = refusal(runners, runner_id)
    assert (answer.status, answer.code) == (503, "NOMAD_UNREACHABLE")
    assert "10.0.0.7" not in answer.message, "Nomad's text is never answered"


def test_an_expired_runner_is_refused_before_and_at_its_use(one: OneRunner) -> None:
    runner_id = one.claim(timeout_s=10)
    runners = ClaimedRunners(one.controller.pools)
    view = runners.claimed(runner_id)
    one.clock.advance(10)
    assert one.controller.claims.begin_expiry(view, one.clock.now_ns())
    assert refusal(runners, runner_id) == answers.expired(runner_id, 10)
    with pytest.raises(Unusable) as refused:
        runners.begin(view, "copy")
    assert refused.value.answer == answers.expired(runner_id, 10)


def test_a_use_is_counted_until_it_ends(one: OneRunner) -> None:
    runner_id = one.claim(timeout_s=10)
    runners = ClaimedRunners(one.controller.pools)
    view = runners.claimed(runner_id)
    with runners.begin(view, "execution"):
        with runners.begin(view, "list") as listing:
            assert runners.uses(runner_id) == 2
            listing.end()
            assert runners.uses(runner_id) == 1
        one.clock.advance(100)
        assert not one.controller.claims.begin_expiry(view, one.clock.now_ns()), "in use"
    assert runners.uses(runner_id) == 0
    assert [u.what for u in one.controller.pools.uses.in_flight()] == []


@pytest.mark.parametrize(
    ("settle_s", "lost_at_read", "found"),
    [
        (0.0, 1, True),  # the loss shows at the first read
        (0.85, 4, True),  # within the settle time
        (0.85, 5, True),  # at its last read
        (0.85, 6, False),  # after it: the failure is believed
        (0.0, 2, False),  # no settle: one read only
    ],
)
async def test_a_failure_waits_the_settle_time_for_a_loss(
    one: OneRunner, settle_s: float, lost_at_read: int, found: bool
) -> None:
    runner_id = one.claim()
    pools = Rereads(one.controller.pools)
    runners = ClaimedRunners(cast(Pools, pools))
    nomad = nomad_of(one)
    nomad.at, nomad.alloc_reads = lost_at_read, 0
    verdict = await runners.verdict(runner_id, settle_s=settle_s)
    if found:
        assert isinstance(verdict, Ended) and verdict.reason is not None
        assert pools.rereads == lost_at_read, "no read after the loss showed"
    else:
        assert verdict is None
        assert pools.rereads == len(read_times(settle_s))


async def test_without_a_read_only_what_is_known_counts(one: OneRunner) -> None:
    runner_id = one.claim()
    runners = ClaimedRunners(one.controller.pools)
    lose(one.nomad)
    assert not runners.ended(runner_id)
    assert await runners.verdict(runner_id, read=False) is None
    one.controller.pools.reread([runner_id])
    assert runners.ended(runner_id)
    verdict = await runners.verdict(runner_id, read=False)
    assert isinstance(verdict, Ended) and verdict.reason is LossReason.LOST


async def test_a_read_that_fails_leaves_what_is_known(one: OneRunner) -> None:
    runner_id = one.claim()
    runners = ClaimedRunners(one.controller.pools)
    nomad_of(one).failing = True
    assert await runners.verdict(runner_id, settle_s=0.85) is None
    lose(one.nomad)
    nomad_of(one).failing = False
    one.controller.pools.reread([runner_id])
    nomad_of(one).failing = True
    verdict = await runners.verdict(runner_id, settle_s=0.85)
    assert isinstance(verdict, Ended)


async def test_a_loss_that_cannot_be_recorded_is_unrecorded(one: OneRunner) -> None:
    runner_id = one.claim()
    runners = ClaimedRunners(one.controller.pools)
    lose(one.nomad)

    def refuse(job: object, index: int | None) -> None:
        raise NomadUnavailable("connection refused")

    one.nomad.before_register = refuse
    verdict = await runners.verdict(runner_id, settle_s=0.1)
    assert isinstance(verdict, Unrecorded)
    assert verdict.answer(runner_id).status == 503


async def test_a_runner_seen_claimed_is_answered_on_the_event_loop(one: OneRunner) -> None:
    """`claimed_async`: no thread and no read of Nomad when the snapshot
    already shows the claim; the runner is touched as by `claimed`."""
    runner_id = one.claim(timeout_s=60)
    pools = Rereads(one.controller.pools)
    runners = ClaimedRunners(cast(Pools, pools))
    one.clock.advance(50)
    assert (await runners.claimed_async(runner_id)).id == runner_id
    assert pools.touched_on == [threading.get_ident()], "on the event loop's thread"
    assert pools.rereads == 0
    one.clock.advance(50)  # 100 s after the claim, 50 after the touch: not expired
    assert (await runners.claimed_async(runner_id)).id == runner_id


@pytest.mark.parametrize("case", ["unknown", "lost", "expired"])
async def test_claimed_async_refuses_as_claimed_does(one: OneRunner, case: str) -> None:
    """Unknown, lost (written to Nomad first, on a thread), expired: the
    answers of `claimed`."""
    runner_id = one.claim(timeout_s=10)
    runners = ClaimedRunners(one.controller.pools)
    if case == "unknown":
        runner_id, expected = "5-nobody", answers.ended("5-nobody", None)
    elif case == "lost":
        lose(one.nomad)
        one.controller.pools.reread([runner_id])
        expected = answers.ended(runner_id, LossReason.LOST)
    else:
        view = runners.claimed(runner_id)
        one.clock.advance(10)
        assert one.controller.claims.begin_expiry(view, one.clock.now_ns())
        expected = answers.expired(runner_id, 10)
    with pytest.raises(Unusable) as refused:
        await runners.claimed_async(runner_id)
    assert refused.value.answer == expected
    if case == "lost":
        assert len(one.nomad.end_claims(runner_id)) == 1, "written to Nomad first"


async def test_a_claim_made_on_another_replica_a_moment_ago_is_served(one: OneRunner) -> None:
    """Every replica serves: the client's next request may reach a replica
    whose snapshot still shows the runner idle (or not at all)."""
    other = Controller(one.nomad, SETTINGS, clock=one.clock, metrics=Metrics())
    try:
        one.controller.pools.put_environment(ENV)
        one.reconcile()
        other.observer.refresh()
        runner_id = one.claim()  # through the first replica; the other has not looked since
        seen = other.pools.lookup(runner_id)
        assert seen is None or not seen.claimed
        runners = ClaimedRunners(other.pools)
        assert runners.claimed(runner_id).id == runner_id
        assert (await runners.claimed_async(runner_id)).id == runner_id
        assert other.pools.release(runner_id)
        assert refusal(runners, "5-00000000-0000-4000-8000-000000000999").status == 410
    finally:
        other.actor.shutdown()


@pytest.mark.parametrize(("look", "reads"), [(Look.NONE, 0), (Look.ONCE, 1), (Look.SETTLE, 2)])
async def test_a_failure_looks_as_hard_as_its_answer_says(
    one: OneRunner, look: Look, reads: int
) -> None:
    runner_id = one.claim()
    pools = Rereads(one.controller.pools)
    runners = ClaimedRunners(cast(Pools, pools), settle_s=0.1)  # reads at 0 and 0.1 s
    assert await runners.looked(runner_id, look) is None
    assert pools.rereads == reads


RUNNING = Allocation(id="alloc-1", job_id="5-x", client_status="running", restarts=1)
CLAIMED = Claim(alloc_id="alloc-1", restarts=1)


@pytest.mark.parametrize(
    ("alloc", "claim", "quiet"),
    [
        (RUNNING, CLAIMED, True),
        (None, CLAIMED, False),  # Nomad does not know it (any more)
        (replace(RUNNING, restarts=2), CLAIMED, False),  # restarted since the claim
        (replace(RUNNING, id="alloc-2"), CLAIMED, False),  # the claim's allocation was replaced
        (replace(RUNNING, client_status="pending"), CLAIMED, False),  # restarting
        (replace(RUNNING, desired_status="stop"), CLAIMED, False),  # being stopped
        (replace(RUNNING, migrate=True), CLAIMED, False),  # being migrated
        (RUNNING, Claim(alloc_id="", restarts=1), False),  # a claim adopted from Poseidon
    ],
)
def test_nothing_in_flight_is_the_claims_allocation_as_it_was_claimed(
    alloc: Allocation | None, claim: Claim, quiet: bool
) -> None:
    assert nothing_in_flight(alloc, claim) is quiet


def claimed(one: OneRunner) -> tuple[str, Claim]:
    """A runner claimed, and its claim as the controller sees it."""
    runner_id = one.claim()
    view = one.controller.pools.lookup(runner_id)
    assert view is not None and view.job.claim is not None
    return runner_id, view.job.claim


async def test_a_missing_path_is_believed_at_once_when_a_restart_gives_notice(
    one: OneRunner,
) -> None:
    """The runner's template restarts a task 15 s after deciding to, and its
    client reports the decision within the sync time: a restart before the
    exec would already show, so one read at once decides."""
    runner_id, claim = claimed(one)
    pools = Rereads(one.controller.pools)
    runners = ClaimedRunners(cast(Pools, pools), settle_s=0.85, client_sync_s=5.0)
    loop = asyncio.get_running_loop()
    since = loop.time()
    assert await runners.looked(runner_id, Look.QUIET, since) is None
    assert loop.time() - since < 1.0, "not the sync time"
    assert pools.rereads == 0, "no settle"
    assert one.nomad.reads.count(f"get_allocation {claim.alloc_id}") == 1


def restart_delay(one: OneRunner, runner_id: str, delay_ns: int) -> None:
    """The runner's job restarts its task `delay_ns` after deciding to."""
    policy = one.nomad.specs[runner_id]["TaskGroups"][0]["RestartPolicy"]
    policy["Delay"] = delay_ns


async def test_a_missing_path_waits_for_the_client_when_a_restart_gives_less_notice(
    one: OneRunner,
) -> None:
    runner_id, claim = claimed(one)
    restart_delay(one, runner_id, 10_000_000)  # 10 ms: shorter than the sync
    pools = Rereads(one.controller.pools)
    runners = ClaimedRunners(cast(Pools, pools), settle_s=0.85, client_sync_s=0.05)
    loop = asyncio.get_running_loop()
    since = loop.time()
    assert await runners.looked(runner_id, Look.QUIET, since) is None
    # Not before the client could have reported what happened before the exec.
    assert loop.time() - since >= 0.05
    assert pools.rereads == 0, "no settle"
    assert one.nomad.reads.count(f"get_allocation {claim.alloc_id}") == 2


async def test_a_restart_the_client_reports_during_the_wait_is_the_runners_loss(
    one: OneRunner,
) -> None:
    runner_id, claim = claimed(one)
    restart_delay(one, runner_id, 0)
    pools = Rereads(one.controller.pools)
    runners = ClaimedRunners(cast(Pools, pools), settle_s=0.1, client_sync_s=0.2)
    loop = asyncio.get_running_loop()
    alloc = one.nomad.allocs[claim.alloc_id]
    # The client reports the restart 0.1 s in: after the first read, before the second.
    loop.call_later(0.1, lambda: one.nomad.put_alloc(replace(alloc, restarts=alloc.restarts + 1)))
    verdict = await runners.looked(runner_id, Look.QUIET, loop.time())
    assert isinstance(verdict, Ended) and verdict.reason is LossReason.RESTARTED
    assert one.nomad.reads.count(f"get_allocation {claim.alloc_id}") == 2


@pytest.mark.parametrize(
    ("alloc", "sync_s", "at_once"),
    [
        (replace(RUNNING, restart_notice_ns=15 * 10**9), 0.25, True),
        (replace(RUNNING, restart_notice_ns=250_000_000), 0.25, True),  # exactly the sync
        (replace(RUNNING, restart_notice_ns=100_000_000), 0.25, False),  # less notice
        (replace(RUNNING, restart_notice_ns=0), 0.0, True),  # a client that reports at once
        (RUNNING, 0.25, False),  # read without its job: the notice is unknown
        (replace(RUNNING, restarts=2, restart_notice_ns=15 * 10**9), 0.25, False),  # restarted
        (None, 0.25, False),
    ],
)
def test_believed_at_once_needs_nothing_in_flight_and_enough_notice(
    alloc: Allocation | None, sync_s: float, at_once: bool
) -> None:
    assert believed_at_once(alloc, CLAIMED, sync_s) is at_once


async def test_a_missing_path_after_a_restart_nomad_shows_is_the_runners_loss(
    one: OneRunner,
) -> None:
    runner_id, claim = claimed(one)
    alloc = one.nomad.allocs[claim.alloc_id]
    one.nomad.put_alloc(replace(alloc, restarts=alloc.restarts + 1))  # the snapshot lags
    pools = Rereads(one.controller.pools)
    runners = ClaimedRunners(cast(Pools, pools), settle_s=0.1, client_sync_s=0.0)
    verdict = await runners.looked(runner_id, Look.QUIET, asyncio.get_running_loop().time())
    assert isinstance(verdict, Ended) and verdict.reason is LossReason.RESTARTED
    assert pools.rereads >= 1, "the settle read what the allocation showed"


async def test_a_missing_path_without_its_exec_time_waits_the_settle(one: OneRunner) -> None:
    runner_id = one.claim()
    pools = Rereads(one.controller.pools)
    runners = ClaimedRunners(cast(Pools, pools), settle_s=0.1, client_sync_s=0.05)
    assert await runners.looked(runner_id, Look.QUIET) is None
    assert pools.rereads == 2
