"""specs: the one rule of the spec cache — the newer JobModifyIndex wins."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controller.model import Environment
from controller.nomad import jobs
from controller.reconcile.specs import CachedSpec, SpecCache

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
