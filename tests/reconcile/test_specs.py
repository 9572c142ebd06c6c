"""specs: the one rule of the spec cache — the newer JobModifyIndex wins."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controller.model import Environment
from controller.nomad import jobs
from controller.reconcile.specs import CachedSpec, SpecCache, compact

ENV = Environment(id=7, image="python:3.12", prewarming_pool_size=1)
RUNNER = jobs.runner_job_id(7, "00000000-0000-0000-0000-000000000001")


def spec(modify_index: int) -> CachedSpec:
    template = {**jobs.template_job(ENV), "JobModifyIndex": 1}
    runner = jobs.runner_job(template, ENV, RUNNER)
    return CachedSpec.of(RUNNER, {**runner, "JobModifyIndex": modify_index})


@dataclass(frozen=True)
class PutCase:
    name: str
    cached: int | None
    offered: int
    kept: bool
    after: int


PUT_CASES = [
    PutCase("empty cache takes it", None, 5, True, 5),
    PutCase("newer replaces", 5, 6, True, 6),
    PutCase("the same version replaces (it is the same spec)", 5, 5, True, 5),
    PutCase("older never replaces", 6, 5, False, 6),
]


@pytest.mark.parametrize("case", PUT_CASES, ids=lambda c: c.name)
def test_put_if_newer(case: PutCase) -> None:
    cache = SpecCache()
    if case.cached is not None:
        cache.put_if_newer(RUNNER, spec(case.cached))
    assert cache.put_if_newer(RUNNER, spec(case.offered)) is case.kept
    cached = cache.get(RUNNER)
    assert cached is not None and cached.modify_index == case.after


@pytest.mark.parametrize(
    ("cached", "listed", "current"),
    [(None, 5, False), (5, 5, True), (6, 5, True), (5, 6, False)],
)
def test_current_for_says_whether_a_listed_version_must_be_read(
    cached: int | None, listed: int, current: bool
) -> None:
    cache = SpecCache()
    if cached is not None:
        cache.put_if_newer(RUNNER, spec(cached))
    assert (cache.current_for(RUNNER, listed) is not None) is current


def test_entries_decode_to_the_spec_and_parse_runners_once() -> None:
    cached = spec(9)
    assert cached.decode()["JobModifyIndex"] == 9
    assert cached.runner is not None and cached.runner.job_modify_index == 9
    template = CachedSpec.of(
        jobs.template_job_id(7), {**jobs.template_job(ENV), "JobModifyIndex": 3}
    )
    assert template.runner is None and template.modify_index == 3


def test_drop_and_keep_only() -> None:
    cache = SpecCache()
    other = jobs.runner_job_id(7, "00000000-0000-0000-0000-000000000002")
    cache.put_if_newer(RUNNER, spec(1))
    cache.put_if_newer(other, spec(1))
    cache.keep_only({other})
    assert cache.get(RUNNER) is None and cache.get(other) is not None
    cache.drop(other)
    assert cache.get(other) is None


def test_a_plain_entry_decodes_alike_and_compresses_to_the_same_spec() -> None:
    template = {**jobs.template_job(ENV), "JobModifyIndex": 1}
    runner = {**jobs.runner_job(template, ENV, RUNNER), "JobModifyIndex": 4}
    plain = CachedSpec.of(RUNNER, runner, compress=False)
    packed = plain.compressed()
    assert plain.plain and not packed.plain
    assert plain.decode() == packed.decode() == runner
    assert len(packed.data) < len(plain.data)
    assert packed.runner == plain.runner and packed.modify_index == 4
    assert packed.compressed() is packed


def test_plain_entries_are_tracked_until_compressed_replaced_or_gone() -> None:
    cache = SpecCache()
    other = jobs.runner_job_id(7, "00000000-0000-0000-0000-000000000002")
    third = jobs.runner_job_id(7, "00000000-0000-0000-0000-000000000003")
    for job_id in (RUNNER, other, third):
        cache.put_if_newer(job_id, spec(1).compressed())
        cache.put_if_newer(job_id, CachedSpec.of(job_id, spec(2).decode(), compress=False))
    assert set(cache.plain_entries()) == {RUNNER, other, third}
    cache.put_if_newer(other, spec(3))  # a read brought a newer, compressed version
    cache.drop(third)
    assert set(cache.plain_entries()) == {RUNNER}
    cache.keep_only({other})
    assert cache.plain_entries() == {}


def test_compaction_never_replaces_an_entry_written_meanwhile() -> None:
    cache = SpecCache()
    cache.put_if_newer(RUNNER, CachedSpec.of(RUNNER, spec(1).decode(), compress=False))
    compacted = compact(cache.plain_entries())
    newer = CachedSpec.of(RUNNER, spec(2).decode(), compress=False)
    cache.put_if_newer(RUNNER, newer)  # a claim wrote while the entries were compressed
    for job_id, (old, new) in compacted.items():
        cache.replace_unchanged(job_id, old, new)
    assert cache.get(RUNNER) is newer and set(cache.plain_entries()) == {RUNNER}
    for job_id, (old, new) in compact(cache.plain_entries()).items():
        cache.replace_unchanged(job_id, old, new)
    kept = cache.get(RUNNER)
    assert kept is not None and not kept.plain and kept.modify_index == 2
    assert cache.plain_entries() == {}
