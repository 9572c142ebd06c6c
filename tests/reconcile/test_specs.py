"""specs: the one rule of the spec cache — the newer JobModifyIndex wins."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controller.model import Environment
from controller.nomad import jobs
from controller.reconcile.specs import CachedSpec, Dictionaries, SpecCache, compact

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


def runner_spec(env: Environment, n: int, modify_index: int = 1) -> tuple[str, dict[str, object]]:
    job_id = jobs.runner_job_id(env.id, f"00000000-0000-0000-0000-{n:012d}")
    template = {**jobs.template_job(env), "JobModifyIndex": 1}
    return job_id, {**jobs.runner_job(template, env, job_id), "JobModifyIndex": modify_index}


def test_runners_of_an_environment_are_compressed_against_its_first_spec() -> None:
    dictionaries = Dictionaries()
    entries = []
    for n in range(1, 4):
        job_id, runner = runner_spec(ENV, n, modify_index=n)
        entry = CachedSpec.of(job_id, runner, dictionaries=dictionaries)
        assert entry.decode() == runner and entry.modify_index == n
        alone = CachedSpec.of(job_id, runner)  # without a dictionary
        assert alone.decode() == runner and not alone.zdict
        entries.append((entry, alone))
    first = entries[0][0]
    for entry, alone in entries[1:]:
        assert entry.zdict is first.zdict  # one dictionary, shared
        assert len(entry.data) * 4 < len(alone.data), (len(entry.data), len(alone.data))


def test_each_environment_has_a_dictionary_of_its_own_and_templates_none() -> None:
    dictionaries = Dictionaries()
    other_env = Environment(id=8, image="node:20", prewarming_pool_size=1)
    ours = CachedSpec.of(*runner_spec(ENV, 1), dictionaries=dictionaries)
    theirs_id, theirs_spec = runner_spec(other_env, 1)
    theirs = CachedSpec.of(theirs_id, theirs_spec, dictionaries=dictionaries)
    assert ours.zdict and theirs.zdict and ours.zdict != theirs.zdict
    assert theirs.decode() == theirs_spec
    template_spec = {**jobs.template_job(ENV), "JobModifyIndex": 3}
    template = CachedSpec.of(jobs.template_job_id(7), template_spec, dictionaries=dictionaries)
    assert not template.zdict and template.decode() == template_spec


def test_compaction_compresses_against_the_environments_dictionary() -> None:
    dictionaries = Dictionaries()
    first = CachedSpec.of(*runner_spec(ENV, 1), dictionaries=dictionaries)
    job_id, claimed = runner_spec(ENV, 2, modify_index=5)
    plain = CachedSpec.of(job_id, claimed, compress=False)  # a claim's write, cached plain
    ((old, new),) = compact({job_id: plain}, dictionaries).values()
    assert old is plain and not new.plain and new.zdict is first.zdict
    assert new.decode() == claimed and new.runner == plain.runner


def test_a_forgotten_environment_keeps_its_entries_readable_and_starts_anew() -> None:
    dictionaries = Dictionaries()
    job_id, runner = runner_spec(ENV, 1)
    before = CachedSpec.of(job_id, runner, dictionaries=dictionaries)
    dictionaries.keep_only(set())
    assert before.decode() == runner
    later_id, later = runner_spec(ENV, 2)
    after = CachedSpec.of(later_id, later, dictionaries=dictionaries)
    assert after.zdict is not before.zdict and after.decode() == later
