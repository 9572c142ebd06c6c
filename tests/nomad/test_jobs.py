"""The job layout: environments ⇄ template jobs, runner jobs and their claims."""

from __future__ import annotations

import pytest

from controller.model import Claim, Environment, LossReason
from controller.nomad import jobs
from tests.helpers import runner_job

ENVS = [
    Environment(id=1, image="python:3.12", cpu_limit=100, memory_limit=256, prewarming_pool_size=5),
    Environment(
        id=22,
        image="node:22",
        cpu_limit=500,
        memory_limit=1024,
        network_access=True,
        exposed_ports=(3000, 8080),
        prewarming_pool_size=0,
    ),
]
UID = "0b5c6f3e-1d2a-4c8e-9f00-123456789abc"


@pytest.mark.parametrize("env", ENVS)
def test_environment_round_trips_through_its_template_job(env):
    spec = jobs.template_job(env)
    assert spec["ID"] == f"template-{env.id}"
    assert jobs.environment_from_job(spec, env.id) == env


def test_template_hash_ignores_pool_size_only():
    env = ENVS[0]
    assert (
        env.template_hash
        == Environment(**{**env.__dict__, "prewarming_pool_size": 9}).template_hash
    )
    assert (
        env.template_hash != Environment(**{**env.__dict__, "image": "python:3.13"}).template_hash
    )
    assert env.template_hash != Environment(**{**env.__dict__, "memory_limit": 512}).template_hash


@pytest.mark.parametrize(
    ("job_id", "runner", "template"),
    [
        (f"7-{UID}", 7, None),
        ("template-7", None, 7),
        ("7-foo", None, None),
        ("template-x", None, None),
        (f"x-{UID}", None, None),
        ("redis", None, None),
    ],
)
def test_job_ids(job_id, runner, template):
    assert jobs.runner_env_id(job_id) == runner
    assert jobs.template_env_id(job_id) == template
    assert jobs.env_id_of(job_id) == (runner if runner is not None else template)


def test_runner_job_is_an_idle_copy_of_the_template():
    env = ENVS[1]
    template = {**jobs.template_job(env), "JobModifyIndex": 5, "Status": "dead", "Version": 3}
    spec = jobs.runner_job(template, env, jobs.runner_job_id(env.id, UID))
    assert spec["ID"] == spec["Name"] == f"22-{UID}"
    assert "JobModifyIndex" not in spec and "Version" not in spec
    groups = {g["Name"]: g for g in spec["TaskGroups"]}
    assert groups["default-group"]["Count"] == 1
    assert groups["config"]["Count"] == 0
    assert groups["config"]["Meta"] == {
        "used": "false",
        "timeout": "0",
        "nrc_template_hash": env.template_hash,
    }
    assert template["TaskGroups"][0]["Count"] == 0  # the template itself is untouched
    runner = jobs.runner_from_job({**spec, "JobModifyIndex": 9}, env.id)
    assert runner.claim is None and runner.template_hash == env.template_hash
    assert runner.job_modify_index == 9


def test_claim_and_loss_round_trip_through_meta():
    env = ENVS[0]
    spec = jobs.runner_job(jobs.template_job(env), env, f"1-{UID}")
    claim = Claim(timeout=90, alloc_id="a1", restarts=2, claimed_at=123)
    claimed = jobs.with_claim(spec, claim)
    assert jobs.runner_from_job(claimed, 1).claim == claim
    lost = jobs.with_lost(claimed, LossReason.OOM_KILLED, 456)
    assert lost["Stop"] is True
    assert jobs.runner_from_job(lost, 1).claim == Claim(
        timeout=90,
        alloc_id="a1",
        restarts=2,
        claimed_at=123,
        lost_reason=LossReason.OOM_KILLED,
        lost_at=456,
    )
    # a new claim clears an old loss
    assert jobs.runner_from_job(jobs.with_claim(lost, claim), 1).claim == claim


def test_poseidon_runner_jobs_are_adopted_as_they_are():
    # Poseidon's layout, no nrc_* keys: the hash comes from the spec itself.
    spec = runner_job(f"3-{UID}", image="python:3.12", cpu=100, memory=256)
    spec["TaskGroups"][1]["Meta"] = {"used": "true", "timeout": "60"}
    env = Environment(
        id=3,
        image="python:3.12",
        cpu_limit=100,
        memory_limit=256,
        network_access=True,
        exposed_ports=(8080,),
    )
    runner = jobs.runner_from_job(spec, 3)
    assert runner.claim == Claim(timeout=60)
    assert runner.template_hash == env.template_hash
    idle = runner_job(f"3-{UID}", meta={"used": "false", "timeout": "0"})
    assert jobs.runner_from_job(idle, 3).claim is None


def test_unreadable_meta_reads_as_defaults():
    spec = runner_job(f"3-{UID}", meta={"used": "true", "timeout": "soon", "nrc_lost_reason": "x"})
    claim = jobs.runner_from_job(spec, 3).claim
    assert claim == Claim(timeout=0)
