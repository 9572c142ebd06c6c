"""The job layout: environments ⇄ template jobs, runner jobs and their claims."""

from __future__ import annotations

import orjson
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
    # The hash of what the template says, with the policy it was written
    # under, though `env` (as a caller may build it) carries none.
    observed = jobs.environment_from_job(template, env.id)
    assert env.template_source == "" and observed.template_source != ""
    assert groups["config"]["Meta"] == {
        "used": "false",
        "timeout": "0",
        "nrc_template_hash": observed.template_hash,
    }
    assert template["TaskGroups"][0]["Count"] == 0  # the template itself is untouched
    runner = jobs.runner_from_job({**spec, "JobModifyIndex": 9}, env.id)
    assert runner.claim is None and runner.template_hash == observed.template_hash
    assert runner.job_modify_index == 9
    # Every runner of the template holds one hash string, decoded apart or not.
    again = jobs.runner_from_job(orjson.loads(orjson.dumps(spec)), env.id)
    assert again.template_hash is runner.template_hash and again.id is runner.id


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


# --- the template as Poseidon runs it in production ---------------------------------

S = 1_000_000_000


def _runner_group(spec: jobs.JsonDict) -> jobs.JsonDict:
    group: jobs.JsonDict = next(g for g in spec["TaskGroups"] if g["Name"] == "default-group")
    return group


def _runner_task(spec: jobs.JsonDict) -> jobs.JsonDict:
    task: jobs.JsonDict = _runner_group(spec)["Tasks"][0]
    return task


def test_the_template_is_poseidons_production_template():
    spec = jobs.template_job(ENVS[0])
    group, task = _runner_group(spec), _runner_task(spec)
    assert group["EphemeralDisk"] == {"Migrate": False, "SizeMB": 10, "Sticky": False}
    assert group["Spreads"] == [{"Attribute": "${node.unique.name}", "Weight": 100}]
    assert group["RestartPolicy"] == {
        "Attempts": 3,
        "Interval": 3600 * S,
        "Delay": 15 * S,
        "Mode": "fail",
    }
    assert group["ReschedulePolicy"] == {
        "Attempts": 3,
        "Interval": 6 * 3600 * S,
        "Delay": 60 * S,
        "DelayFunction": "exponential",
        "MaxDelay": 240 * S,
        "Unlimited": False,
    }
    assert (task["KillTimeout"], task["KillSignal"]) == (0, "SIGKILL")
    assert task["LogConfig"] == {"MaxFiles": 1, "MaxFileSizeMB": 1}
    assert task["Resources"] == {"MemoryMB": 50, "CPU": 100, "MemoryMaxMB": 256}
    assert task["Config"]["force_pull"] is True
    assert (task["Config"]["command"], task["Config"]["args"]) == ("sleep", ["infinity"])
    assert spec["Datacenters"] == ["*"]


NETWORKS = [
    # name, environment, policy's network mode, group networks, docker network_mode
    (
        "no network access: Docker's none and no group network",
        Environment(id=5, image="i", network_access=False),
        "cni/secure-bridge",
        [],
        "none",
    ),
    (
        "network access: the operator's mode, ports as dynamic ports with To, mode cleared",
        Environment(id=5, image="i", network_access=True, exposed_ports=(3000, 8080)),
        "cni/secure-bridge",
        [
            {
                "Mode": "cni/secure-bridge",
                "DynamicPorts": [{"Label": "3000", "To": 3000}, {"Label": "8080", "To": 8080}],
            }
        ],
        "",
    ),
    (
        "network access without ports: Poseidon's default bridge",
        Environment(id=5, image="i", network_access=True),
        "bridge",
        [{"Mode": "bridge", "DynamicPorts": []}],
        "",
    ),
]


@pytest.mark.parametrize(
    ("name", "env", "mode", "networks", "docker_mode"), NETWORKS, ids=[n[0] for n in NETWORKS]
)
def test_network_as_poseidon_sets_it(name, env, mode, networks, docker_mode):
    spec = jobs.template_job(env, jobs.TemplatePolicy(network_mode=mode))
    assert _runner_group(spec)["Networks"] == networks, name
    assert _runner_task(spec)["Config"]["network_mode"] == docker_mode, name
    assert jobs.environment_from_job(spec, env.id) == env, "round trip"


def test_a_memory_limit_below_the_reservation_is_reserved_whole():
    # Nomad refuses a MemoryMaxMB below MemoryMB.
    env = Environment(id=1, image="i", memory_limit=32)
    resources = _runner_task(jobs.template_job(env))["Resources"]
    assert (resources["MemoryMB"], resources["MemoryMaxMB"]) == (32, 32)
    assert jobs.environment_from_job(jobs.template_job(env), 1) == env


def test_site_policy_reaches_the_template():
    policy = jobs.TemplatePolicy(
        memory_reservation_mb=64,
        ephemeral_disk_mb=25,
        datacenters=("dc1", "dc2"),
        force_pull=False,
        pids_limit=0,
        cap_drop=(),
        no_new_privileges=False,
    )
    spec = jobs.template_job(ENVS[0], policy)
    task = _runner_task(spec)
    assert spec["Datacenters"] == ["dc1", "dc2"]
    assert _runner_group(spec)["EphemeralDisk"]["SizeMB"] == 25
    assert task["Resources"]["MemoryMB"] == 64
    assert task["Config"]["force_pull"] is False
    assert not {"pids_limit", "cap_drop", "security_opt"} & set(task["Config"])


def test_runners_are_hardened_by_default():
    config = _runner_task(jobs.template_job(ENVS[0]))["Config"]
    assert config["pids_limit"] == 1024
    assert config["security_opt"] == ["no-new-privileges"]
    # Root in a runner keeps what the timeout kill, setuser and file copies need.
    kept = {"kill", "setuid", "setgid", "chown", "fowner", "dac_override"}
    assert config["cap_drop"] and not kept & set(config["cap_drop"])


def test_the_policy_is_kept_in_the_template_and_changes_the_runners_hash():
    env = ENVS[0]
    ours = jobs.environment_from_job(jobs.template_job(env), env.id)
    other = jobs.environment_from_job(
        jobs.template_job(env, jobs.TemplatePolicy(memory_reservation_mb=64)), env.id
    )
    assert ours == other == env, "the policy is no environment field"
    assert ours.template_source == jobs.TemplatePolicy().fingerprint
    assert ours.template_hash != other.template_hash, "a new policy rolls idle runners"
    assert ours.template_hash != env.template_hash


def test_a_poseidon_template_reads_back_its_environment():
    # As Poseidon registers it: reservation 50, memoryLimit as MemoryMaxMB, a
    # CNI network with the exposed ports, Docker's network_mode cleared.
    spec = {
        "ID": "template-9",
        "TaskGroups": [
            {
                "Name": "default-group",
                "Count": 1,
                "Networks": [
                    {
                        "Mode": "cni/secure-bridge",
                        "DynamicPorts": [{"Label": "8080", "To": 8080, "Value": 0}],
                    }
                ],
                "Tasks": [
                    {
                        "Name": "default-task",
                        "Driver": "docker",
                        "Config": {"image": "img", "network_mode": "", "force_pull": True},
                        "Resources": {"CPU": 20, "MemoryMB": 50, "MemoryMaxMB": 256},
                    }
                ],
            },
            {"Name": "config", "Meta": {"used": "false", "prewarmingPoolSize": "3"}},
        ],
    }
    assert jobs.environment_from_job(spec, 9) == Environment(
        id=9,
        image="img",
        cpu_limit=20,
        memory_limit=256,
        network_access=True,
        exposed_ports=(8080,),
        prewarming_pool_size=3,
    )


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"TaskGroups": []}, "no task group 'default-group'"),
        (
            {"TaskGroups": [{"Name": "default-group", "Tasks": [{"Name": "x"}]}]},
            "no task 'default-task' in group 'default-group'",
        ),
        (
            {
                "TaskGroups": [
                    {"Name": "default-group", "Tasks": [{"Name": "default-task", "Driver": "exec"}]}
                ]
            },
            "task 'default-task' uses driver 'exec', not 'docker'",
        ),
    ],
)
def test_a_base_template_that_cannot_carry_runners_says_why(spec, problem):
    assert jobs.base_template_problem(spec) == problem


def test_an_operators_template_gets_the_environments_fields_as_poseidon_applies_them():
    base: jobs.JsonDict = {
        "ID": "whatever",
        "Datacenters": ["eu"],
        "TaskGroups": [
            {
                "Name": "default-group",
                "Count": 1,
                "Constraints": [{"LTarget": "${node.class}", "RTarget": "runner", "Operand": "="}],
                "Tasks": [
                    {
                        "Name": "default-task",
                        "Driver": "docker",
                        "Config": {"image": "old", "runtime": "runsc"},
                        "Resources": {"CPU": 1, "MemoryMB": 128},
                        "KillTimeout": 2 * S,
                    }
                ],
            }
        ],
    }
    env = ENVS[1]
    spec = jobs.template_job(env, jobs.TemplatePolicy(base=base))
    task = _runner_task(spec)
    assert spec["ID"] == "template-22" and spec["Datacenters"] == ["eu"], "the file's, not ours"
    assert _runner_group(spec)["Count"] == 0
    assert _runner_group(spec)["Constraints"] == base["TaskGroups"][0]["Constraints"]
    assert task["Config"]["runtime"] == "runsc" and task["KillTimeout"] == 2 * S
    assert task["Resources"] == {"CPU": 500, "MemoryMB": 128, "MemoryMaxMB": 1024}
    assert jobs.environment_from_job(spec, env.id) == env
    assert base["TaskGroups"][0]["Count"] == 1, "the base is not changed"


def test_every_part_of_the_policy_is_in_its_fingerprint():
    base = jobs.TemplatePolicy()
    changes = [
        jobs.TemplatePolicy(memory_reservation_mb=64),
        jobs.TemplatePolicy(ephemeral_disk_mb=20),
        jobs.TemplatePolicy(network_mode="cni/secure-bridge"),
        jobs.TemplatePolicy(datacenters=("dc1",)),
        jobs.TemplatePolicy(force_pull=False),
        jobs.TemplatePolicy(pids_limit=0),
        jobs.TemplatePolicy(cap_drop=()),
        jobs.TemplatePolicy(no_new_privileges=False),
        jobs.TemplatePolicy(base=jobs.template_job(ENVS[0])),
    ]
    prints = {p.fingerprint for p in changes}
    assert len(prints) == len(changes) and base.fingerprint not in prints
    assert jobs.TemplatePolicy().fingerprint == base.fingerprint, "stable across instances"
