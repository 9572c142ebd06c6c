"""observe with an event stream: targeted refreshes of the jobs events name,
full re-lists when they are due, and reads that lag behind the events."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.model import Claim, Environment, Phase
from controller.nomad import jobs
from controller.nomad.events import decode_events
from controller.reconcile import reads
from controller.reconcile.expectations import Expectations
from controller.reconcile.observe import Observer
from controller.reconcile.writes import SpecWriter
from tests.helpers import wait_until
from tests.support.fake_nomad import FakeNomad

ENV = Environment(id=5, image="python:3.12", prewarming_pool_size=3)


def runner_id(n: int) -> str:
    return jobs.runner_job_id(ENV.id, f"00000000-0000-0000-0000-{n:012d}")


def job_event(job_id: str) -> dict[str, Any]:
    return {"Topic": "Job", "Key": job_id, "Payload": {"Job": {"ID": job_id}}}


def alloc_event(job_id: str) -> dict[str, Any]:
    return {"Topic": "Allocation", "Key": "a", "Payload": {"Allocation": {"JobID": job_id}}}


def setup(
    runners: int = 3, full_relist_s: float = 300.0
) -> tuple[FakeNomad, Observer, Expectations, ManualClock]:
    clock = ManualClock()
    nomad = FakeNomad(clock, index=100)
    template = nomad.put(jobs.template_job(ENV))
    for n in range(runners):
        nomad.put(jobs.runner_job(template, ENV, runner_id(n)))
        nomad.run(runner_id(n))
    expectations = Expectations(clock)
    observer = Observer(
        gateway=nomad,
        clock=clock,
        expectations=expectations,
        metrics=Metrics(),
        full_relist_s=full_relist_s,
    )
    observer.set_stream_connected(True)
    observer.refresh()  # the first refresh is full
    nomad.reads.clear()
    return nomad, observer, expectations, clock


def test_nothing_named_means_nothing_read() -> None:
    nomad, observer, _, _ = setup()
    before = observer.snapshot
    observer.note_event_index(nomad.index + 1, decode_events([{"Topic": "Evaluation", "Key": "e"}]))
    snap = observer.current()
    assert nomad.reads == []
    assert snap.runners is before.runners and snap.covers == nomad.index + 1


def test_named_jobs_are_read_again_and_nothing_else() -> None:
    nomad, observer, _, _ = setup()
    before = observer.snapshot
    nomad.run(runner_id(1), status="pending")  # a new allocation of runner 1 (replacing)
    observer.note_event_index(nomad.index, decode_events([alloc_event(runner_id(1))]))
    snap = observer.current()
    assert nomad.reads == [
        f"list_jobs_by_id {[runner_id(1)]}",
        f"list_allocations_of_jobs {[runner_id(1)]}",
    ]
    assert snap.runners[runner_id(1)].phase is Phase.STARTING
    # The others are the very same views: nothing was derived again.
    assert snap.runners[runner_id(0)] is before.runners[runner_id(0)]


def test_a_named_job_that_is_no_longer_listed_is_gone() -> None:
    nomad, observer, expectations, _ = setup()
    expectations.expect_delete(ENV.id, runner_id(2))
    nomad.delete(runner_id(2))
    expectations.deleted(runner_id(2), nomad.index)
    observer.note_event_index(nomad.index, decode_events([job_event(runner_id(2))]))
    snap = observer.current()
    assert runner_id(2) not in snap.runners
    assert runner_id(2) not in snap.ready.get(ENV.id, ())
    assert expectations.pending(ENV.id).deleting == frozenset()


def test_a_read_behind_the_events_keeps_a_creation_pending_and_reads_again() -> None:
    nomad, observer, expectations, _ = setup()
    template = nomad.specs[jobs.template_job_id(ENV.id)]
    new = runner_id(3)
    expectations.expect_create(ENV.id, new)
    nomad.put(jobs.runner_job(template, ENV, new))
    written = nomad.index
    expectations.created(new, written)
    observer.note_event_index(written, decode_events([job_event(new)]))
    # A follower answers from before the new job existed (but after all we saw).
    nomad.lag = (written - 1, {new})
    snap = observer.refresh()
    assert new not in snap.runners
    assert snap.covers < written
    assert expectations.pending(ENV.id).creating == 1, "a lagging read must not settle it"
    # The next read is current: the job shows and the creation is settled.
    snap = observer.current()
    assert new in snap.runners and snap.covers >= written
    assert expectations.pending(ENV.id).creating == 0


def test_allocations_read_behind_their_events_keep_the_whole_job_pending() -> None:
    """The job list is current but the allocation list lags behind the job's
    allocation event: the job is not judged from that read, and its creation
    (whose event is older than the lagging one) is not settled by it."""
    nomad, observer, expectations, _ = setup()
    template = nomad.specs[jobs.template_job_id(ENV.id)]
    new = runner_id(3)
    expectations.expect_create(ENV.id, new)
    nomad.put(jobs.runner_job(template, ENV, new))
    expectations.created(new, nomad.index)
    observer.note_event_index(nomad.index, decode_events([job_event(new)]))
    nomad.run(new)
    observer.note_event_index(nomad.index, decode_events([alloc_event(new)]))
    nomad.lag_allocs = (nomad.index - 1, {new})
    observer.refresh()
    assert expectations.pending(ENV.id).creating == 1
    snap = observer.current()
    assert snap.runners[new].phase is Phase.READY
    assert expectations.pending(ENV.id).creating == 0


def test_a_full_refresh_after_targeted_ones_rebuilds_at_an_unchanged_index() -> None:
    """Targeted refreshes move the snapshot's indexes to the tables' without
    listing everything; a full list at that index must still be merged."""
    nomad, observer, expectations, _ = setup()
    template = nomad.specs[jobs.template_job_id(ENV.id)]
    heard, missed = runner_id(3), runner_id(4)
    for job_id in (heard, missed):
        expectations.expect_create(ENV.id, job_id)
        nomad.put(jobs.runner_job(template, ENV, job_id))
        expectations.created(job_id, nomad.index)
    # the other event was lost
    observer.note_event_index(
        nomad.index, decode_events([job_event(heard)])
    )  # the other event was lost
    assert missed not in observer.current().runners
    snap = observer.refresh(full=True)
    assert {heard, missed} <= set(snap.runners)
    assert expectations.pending(ENV.id).creating == 0


def test_full_re_lists_without_a_stream_after_a_reconnection_and_when_due() -> None:
    nomad, observer, _, clock = setup(full_relist_s=60)
    observer.refresh()
    assert nomad.reads == []  # connected, nothing named: nothing read
    observer.set_stream_connected(False)
    observer.refresh()
    assert "list_jobs" in nomad.reads
    nomad.reads.clear()
    observer.set_stream_connected(True)  # events may have been missed meanwhile
    observer.refresh()
    assert "list_jobs" in nomad.reads
    nomad.reads.clear()
    observer.refresh()
    assert nomad.reads == []
    clock.advance(61)
    observer.refresh()
    assert "list_jobs" in nomad.reads
    # Once observed, a full re-list reads the allocations briefly and re-reads
    # only jobs whose allocations changed.
    assert "list_allocations" not in nomad.reads
    assert "list_allocation_versions" in nomad.reads


def test_a_full_re_list_reads_in_full_only_jobs_whose_allocations_changed() -> None:
    nomad, observer, _, _ = setup()
    nomad.run(runner_id(0), status="failed")
    snap = observer.refresh(full=True)
    assert nomad.reads == [
        "list_jobs",
        "list_allocation_versions",
        f"list_allocations_of_jobs {[runner_id(0)]}",
    ]
    assert snap.runners[runner_id(0)].phase is not Phase.READY


def test_a_full_re_list_with_too_many_changed_jobs_lists_all_allocations_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nomad, observer, _, _ = setup(runners=4)
    monkeypatch.setattr(reads, "TARGETED_MAX_JOBS", 2)
    for n in range(3):
        nomad.run(runner_id(n), status="failed")
    snap = observer.refresh(full=True)
    assert nomad.reads == ["list_jobs", "list_allocation_versions", "list_allocations"]
    assert [snap.runners[runner_id(n)].phase is Phase.READY for n in range(4)] == [
        False,
        False,
        False,
        True,
    ]


def test_an_unreadable_spec_keeps_snapshots_unsafe_until_it_is_read() -> None:
    nomad, observer, _, _ = setup()
    template = nomad.specs[jobs.template_job_id(ENV.id)]
    new = runner_id(3)
    nomad.put(jobs.runner_job(template, ENV, new))
    nomad.unreadable.add(new)
    snap = observer.refresh(full=True)
    assert not snap.safe and not snap.runners[new].known
    # Targeted refreshes read it again (not only the next full re-list,
    # minutes away while events flow): still unreadable, still unsafe.
    nomad.run(runner_id(0), status="failed")
    observer.note_event_index(nomad.index, decode_events([alloc_event(runner_id(0))]))
    snap = observer.current()
    assert not snap.safe and not snap.runners[new].known
    nomad.unreadable.clear()
    nomad.run(runner_id(1), status="failed")
    observer.note_event_index(nomad.index, decode_events([alloc_event(runner_id(1))]))
    snap = observer.current()
    assert snap.safe and snap.runners[new].known


def test_claimable_runners_stay_oldest_first_through_claims_and_changes() -> None:
    nomad, observer, _, _ = setup(runners=4)
    ids = [runner_id(n) for n in range(4)]
    assert [v.id for v in observer.snapshot.claimable(ENV.id)] == ids
    spec = jobs.with_claim(nomad.specs[ids[0]], Claim(alloc_id=f"alloc-{ids[0]}"))
    result = nomad.register_job(spec)
    observer.apply_spec(ids[0], {**spec, "JobModifyIndex": result.job_modify_index})
    observer.forget(ids[2])
    assert [v.id for v in observer.snapshot.claimable(ENV.id)] == [ids[1], ids[3]]
    # Runner 1 stops being ready, then is ready again: back in its place.
    nomad.run(ids[1], status="pending")
    observer.note_event_index(nomad.index, decode_events([alloc_event(ids[1])]))
    assert [v.id for v in observer.current().claimable(ENV.id)] == [ids[3]]
    nomad.allocs[f"alloc-{ids[1]}"] = replace(
        nomad.allocs[f"alloc-{ids[1]}"], client_status="running", modify_index=nomad.index + 1
    )
    nomad.index += 1
    observer.note_event_index(nomad.index, decode_events([alloc_event(ids[1])]))
    assert [v.id for v in observer.current().claimable(ENV.id)] == [ids[1], ids[3]]


def test_follow_refreshes_soon_after_events() -> None:
    nomad, observer, _, _ = setup()
    stop = threading.Event()
    thread = threading.Thread(target=observer.follow, args=(stop,), daemon=True)
    thread.start()
    try:
        nomad.run(runner_id(2), status="pending")
        observer.note_event_index(nomad.index, decode_events([alloc_event(runner_id(2))]))
        wait_until(lambda: observer.snapshot.runners[runner_id(2)].phase is Phase.STARTING)
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def test_our_own_writes_job_event_is_not_read_again_but_a_newer_one_is() -> None:
    """A claim (or any write of ours) shows in the snapshot at once with the
    JobModifyIndex Nomad gave it; the Job event that write causes comes back
    at that index and names nothing new. A later write by anybody else does."""
    nomad, observer, _, clock = setup()
    writer = SpecWriter(gateway=nomad, observer=observer)
    spec = nomad.get_job(runner_id(1))
    assert spec is not None
    claim = Claim(
        timeout=60, alloc_id=f"alloc-{runner_id(1)}", restarts=0, claimed_at=clock.now_ns()
    )
    written = writer.register(jobs.with_claim(spec, claim), enforce_index=jobs.modify_index(spec))
    nomad.reads.clear()
    observer.note_event_index(jobs.modify_index(written), decode_events([job_event(runner_id(1))]))
    snap = observer.current()
    assert nomad.reads == []
    assert snap.runners[runner_id(1)].claimed
    nomad.put(jobs.with_claim(spec, replace(claim, timeout=30)))  # somebody else's write
    observer.note_event_index(nomad.index, decode_events([job_event(runner_id(1))]))
    observer.current()
    assert nomad.reads == [
        f"list_jobs_by_id {[runner_id(1)]}",
        f"list_allocations_of_jobs {[runner_id(1)]}",
        f"get_job {runner_id(1)}",
    ]


def test_a_job_we_created_is_listed_from_its_job_event_but_its_spec_not_read_back() -> None:
    """Our creation's spec is cached with the JobModifyIndex Nomad gave it
    (`remember_created`), but the job is not shown until a list shows it (its
    creation is pending meanwhile): so its Job event still names it, and the
    refresh lists it without reading the spec back. The indexes and times
    Nomad sets come from the list, as the spec we wrote has none."""
    nomad, observer, expectations, _ = setup()
    template = nomad.specs[jobs.template_job_id(ENV.id)]
    created = runner_id(7)
    expectations.expect_create(ENV.id, created)
    result = nomad.register_job(jobs.runner_job(template, ENV, created), enforce_index=0)
    spec = jobs.runner_job(template, ENV, created)  # what we wrote, without Nomad's fields
    observer.remember_created(created, jobs.with_modify_index(spec, result.job_modify_index))
    expectations.created(created, result.index)
    assert created not in observer.snapshot.runners
    nomad.reads.clear()

    observer.note_event_index(result.index, decode_events([job_event(created)]))
    snap = observer.current()

    assert nomad.reads == [
        f"list_jobs_by_id {[created]}",
        f"list_allocations_of_jobs {[created]}",
    ]
    view = snap.runners[created]
    assert view.known and not view.claimed
    assert view.job.create_index == nomad.specs[created]["CreateIndex"] > 0
    assert view.job.submit_time == nomad.specs[created]["SubmitTime"] > 0
    assert observer.snapshot_and_pending(ENV.id)[1].creating == 0


def test_a_runner_deleted_between_a_targeted_list_and_its_spec_read_is_gone() -> None:
    nomad, observer, _, _ = setup()
    observer.refresh(full=True)
    gone = runner_id(1)
    nomad.put(jobs.with_claim(nomad.specs[gone], Claim(alloc_id="a1")))  # a change to read

    def deleted_meanwhile(job_id: str) -> None:
        if job_id == gone:
            nomad.specs.pop(job_id)  # the read answers 404: it is gone

    nomad.before_get = deleted_meanwhile
    observer.note_event_index(nomad.index, decode_events([job_event(gone)]))
    snap = observer.current()
    assert gone not in snap.runners and snap.safe
    assert {v.id for v in snap.views(ENV.id)} == {runner_id(0), runner_id(2)}
