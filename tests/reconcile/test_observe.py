"""observe: the shared snapshot over an in-memory gateway."""

from __future__ import annotations

from typing import Any

from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.model import Allocation, Claim, Environment, Phase
from controller.nomad import jobs
from controller.reconcile.expectations import Expectations
from controller.reconcile.observe import Observer
from tests.support.fake_nomad import FakeNomad

ENV = Environment(id=7, image="python:3.12", prewarming_pool_size=2)
UIDS = [f"00000000-0000-0000-0000-{n:012d}" for n in range(10)]


def setup(runners: int = 2) -> tuple[FakeNomad, Observer, list[str]]:
    clock = ManualClock()
    gw = FakeNomad(clock)
    template = gw.put(jobs.template_job(ENV))
    ids = []
    for n in range(runners):
        job_id = jobs.runner_job_id(ENV.id, UIDS[n])
        gw.put(jobs.runner_job(template, ENV, job_id))
        gw.put_alloc(Allocation(id=f"a{n}", job_id=job_id, client_status="running"))
        ids.append(job_id)
    observer = Observer(
        gateway=gw, clock=clock, expectations=Expectations(clock), metrics=Metrics()
    )
    return gw, observer, ids


def test_first_refresh_reads_everything_then_only_what_changed() -> None:
    gw, obs, ids = setup()
    snap = obs.refresh()
    assert snap.templates[ENV.id].env == ENV
    assert {v.id for v in snap.views(ENV.id)} == set(ids)
    assert all(v.phase is Phase.READY and not v.claimed for v in snap.views(ENV.id))
    assert sorted(gw.gets) == sorted([jobs.template_job_id(ENV.id), *ids])
    gw.reads.clear()
    gw.put(jobs.with_claim(gw.specs[ids[0]], Claim(alloc_id="a0")))  # someone claims
    snap = obs.refresh()
    assert gw.gets == [ids[0]]
    assert snap.runners[ids[0]].claimed


def test_unchanged_indexes_keep_the_snapshot_without_reading_specs() -> None:
    gw, obs, _ = setup()
    first = obs.refresh()
    gw.reads.clear()
    obs.note_event_index(99)
    again = obs.current()
    assert again.runners == first.runners and again.covers == 99
    assert gw.gets == []


def test_a_stale_list_never_moves_the_snapshot_backwards() -> None:
    gw, obs, ids = setup()
    good = obs.refresh()
    gw.specs.pop(ids[0])  # a follower that has not seen ...
    gw.list_index = good.jobs_index - 1  # ... everything we already saw
    assert obs.refresh() is good
    assert set(obs.snapshot.runners) == set(good.runners)


def test_an_unreadable_spec_makes_the_pass_unsafe_and_the_runner_unknown() -> None:
    gw, obs, ids = setup()
    gw.unreadable.add(ids[1])
    snap = obs.refresh()
    assert not snap.safe
    assert not snap.runners[ids[1]].known and snap.runners[ids[0]].known


def test_our_writes_during_a_refresh_are_laid_over_its_result() -> None:
    gw, obs, ids = setup(3)
    obs.refresh()
    claimed: dict[str, Any] = {}

    def claim_meanwhile(job_id: str) -> None:
        gw.before_get = None  # once
        # A claim lands while the refresh reads specs (after it chose which
        # cached specs to reuse): its result must still show the claim.
        spec = jobs.with_claim(gw.specs[ids[0]], Claim(alloc_id="a0"))
        stale = dict(gw.specs[ids[0]])
        result = gw.register_job(spec)
        gw.specs[ids[0]] = stale  # the list already read shows the old job
        spec["JobModifyIndex"] = result.job_modify_index
        claimed.update(spec)
        obs.apply_spec(ids[0], spec)
        obs.forget(ids[1])

    gw.put(gw.specs[ids[2]])  # a change elsewhere makes the refresh read a spec
    gw.before_get = claim_meanwhile
    snap = obs.refresh()
    assert snap.runners[ids[0]].claimed, "a claim must never vanish under a refresh"
    assert ids[1] not in snap.runners
    assert obs.spec(ids[0]) == claimed


def test_a_written_spec_is_cached_plain_until_the_next_refresh_compresses_it() -> None:
    # A claim writes on the event loop, where zlib's letting go of the GIL
    # would cost the loop a wait for it: the refresh's thread compresses.
    gw, obs, ids = setup()
    obs.refresh()
    spec = jobs.with_claim(gw.specs[ids[0]], Claim(alloc_id="a0"))
    spec["JobModifyIndex"] = gw.register_job(spec).job_modify_index
    obs.apply_spec(ids[0], spec)
    assert set(obs._specs.plain_entries()) == {ids[0]}
    assert obs.spec(ids[0]) == spec
    obs.refresh()
    assert obs._specs.plain_entries() == {}
    assert obs.spec(ids[0]) == spec and obs.snapshot.runners[ids[0]].claimed


def test_a_runner_deleted_between_the_list_and_its_spec_read_is_gone_not_unknown() -> None:
    gw, obs, ids = setup()

    def deleted_meanwhile(job_id: str) -> None:
        if job_id == ids[1]:
            gw.specs.pop(job_id)  # the read answers 404: it is gone

    gw.before_get = deleted_meanwhile
    snap = obs.refresh()
    # Not counted in its pool as unknown, and no reason to hold deletions back.
    assert ids[1] not in snap.runners and snap.safe
    assert {v.id for v in snap.views(ENV.id)} == {ids[0]}
