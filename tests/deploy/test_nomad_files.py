"""The Nomad job and ACL policy: they parse as HCL2 (python-hcl2), the job
sets only variables the controller reads and a configuration it accepts, and
the policy grants exactly what the controller uses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import hcl2

from controller.config import load_settings, variables
from controller.reconcile.activity import activity_prefix
from controller.reconcile.prewarming import PrewarmSettings
from tests.deploy.support import ACL_POLICY, JOB_FILE, image_env

# Nomad's runtime interpolations a task's env may use (attributes, node and
# job metadata, and Nomad's own NOMAD_* task variables), as opposed to
# settings we set.
RUNTIME = re.compile(r"\$\{(?P<ref>(?:attr|node|meta|NOMAD_)[^}]*)\}")
# HCL2 input variables of the job file.
INPUT = re.compile(r"\$\{var\.(?P<name>\w+)\}")
# KEY=value lines of a template rendered into the task's environment.
ENV_LINE = re.compile(r"(?:^|\}\})\s*(?P<name>[A-Z][A-Z0-9_]*)=", re.M)


def load(path: Path) -> dict[str, Any]:
    """The file as python-hcl2 reads it, in the plain form of its 7.x releases
    (strings without their quotes, no block markers), whichever is installed."""
    options = getattr(hcl2, "SerializationOptions", None)
    with path.open() as f:
        if options is None:
            data: dict[str, Any] = hcl2.load(f)
        else:
            plain = options(
                strip_string_quotes=True,
                explicit_blocks=False,
                with_comments=False,
                preserve_heredocs=False,
            )
            data = hcl2.load(f, serialization_options=plain)
    return data


def blocks(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    found = body.get(kind, [])
    return found if isinstance(found, list) else [found]


def labelled(body: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """`kind "label" { ... }` blocks by label."""
    return {label: inner for block in blocks(body, kind) for label, inner in block.items()}


def one(body: dict[str, Any], kind: str) -> dict[str, Any]:
    found = blocks(body, kind)
    assert len(found) == 1, f"expected one {kind} block, found {len(found)}"
    return found[0]


JOB_DOC = load(JOB_FILE)
INPUTS = labelled(JOB_DOC, "variable")
JOBS = labelled(JOB_DOC, "job")
JOB = JOBS["nomad-runner-controller"]
GROUP = labelled(JOB, "group")["controller"]
TASK = labelled(GROUP, "task")["controller"]


def task_env_names() -> list[str]:
    """Every variable the task's environment gets from the job: its env block
    and templates rendered with env = true."""
    names = [name for env in blocks(TASK, "env") for name in env]
    for template in blocks(TASK, "template"):
        if template.get("env"):
            names += [m.group("name") for m in ENV_LINE.finditer(template["data"])]
    return names


def rendered_env() -> dict[str, str]:
    """The env block as the task would see it: inputs at their defaults and the
    node's address at an example value."""
    env: dict[str, str] = {}
    for block in blocks(TASK, "env"):
        for name, value in block.items():
            value = INPUT.sub(lambda m: str(INPUTS[m.group("name")]["default"]), str(value))
            env[name] = RUNTIME.sub("192.0.2.10", value)
    return env


def test_the_job_file_is_one_service_job_running_the_image() -> None:
    assert list(JOBS) == ["nomad-runner-controller"]
    assert JOB["type"] == "service"
    assert TASK["driver"] == "docker"
    assert one(TASK, "config")["image"] == "${var.image}"
    assert "default" not in INPUTS["image"], "the image must be given: -var image=..."


def test_every_setting_in_the_job_is_one_the_controller_reads() -> None:
    names = task_env_names()
    assert names, "the job sets no variables"
    ours = [n for n in names if n.startswith(("NRC_", "NOMAD_"))]
    assert ours == names, "only controller settings in the task's environment"
    unknown = sorted(set(ours) - set(variables()))
    assert not unknown, f"not read by the controller: {unknown}"
    # NOMAD_* also names Nomad's runtime variables; none is set here by mistake.
    assert len(names) == len(set(names)), "a variable is set twice"


def test_every_interpolation_is_an_input_or_a_nomad_runtime_value() -> None:
    text = JOB_FILE.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for reference in re.findall(r"\$\{([^}]*)\}", code):
        if reference.startswith("var."):
            assert reference[4:] in INPUTS, f"undeclared input {reference}"
        else:
            assert RUNTIME.fullmatch("${" + reference + "}"), f"unknown reference {reference}"
    for name in re.findall(r"\bvar\.(\w+)", code):
        assert name in INPUTS, f"undeclared input var.{name}"


def test_the_job_and_the_image_make_a_valid_configuration() -> None:
    env = {**image_env(), **rendered_env(), "NRC_API_TOKEN": "from-the-variable-0123"}
    settings = load_settings({k: v for k, v in env.items() if k.startswith(("NRC_", "NOMAD_"))})
    assert settings.leader_election
    assert settings.nomad_addr == "http://192.0.2.10:4646"
    assert settings.nomad_namespace == INPUTS["runner_namespace"]["default"]
    port = labelled(one(GROUP, "network"), "port")["http"]
    assert port["to"] == settings.api_port


def test_without_its_variable_the_job_fails_to_start_rather_than_start_open() -> None:
    """Issue 24, finding 3: the template renders no token when the variable
    is missing; the image listens on every address, so `run` refuses."""
    env = {**image_env(), **rendered_env()}
    assert "NRC_API_TOKEN" not in env and "NRC_API_ALLOW_UNAUTHENTICATED" not in env
    settings = load_settings({k: v for k, v in env.items() if k.startswith(("NRC_", "NOMAD_"))})
    assert settings.open_api_problem() is not None


def test_two_replicas_on_distinct_nodes_elect_a_leader() -> None:
    assert GROUP["count"] == 2
    assert rendered_env()["NRC_LEADER_ELECTION"] == "true"
    assert {"operator": "distinct_hosts", "value": "true"} in blocks(GROUP, "constraint")


def test_the_token_comes_from_the_workload_identity_and_no_secret_is_written() -> None:
    assert one(TASK, "identity")["env"] is True
    assert "NOMAD_TOKEN" not in task_env_names()
    template = one(TASK, "template")
    assert 'nomadVar "nomad/jobs/nomad-runner-controller"' in template["data"].replace("\\", "")
    assert template["destination"].startswith("secrets/")


def test_the_service_is_checked_on_healthz_and_tagged_for_prometheus() -> None:
    service = one(GROUP, "service")
    assert service["port"] == "http"
    assert "prometheus" in service["tags"]
    checks = {check["path"]: check for check in blocks(service, "check")}
    alive = checks["/healthz"]
    assert alive["type"] == "http" and blocks(alive, "check_restart")
    # Every replica that serves passes /readyz: a rolling update waits for it
    # (the default on_update), and a failing readiness never restarts one.
    ready = checks["/readyz"]
    assert "on_update" not in ready and not blocks(ready, "check_restart")
    update = one(GROUP, "update")
    assert (update["max_parallel"], update["health_check"]) == (1, "checks")


def test_the_acl_policy_grants_exactly_what_the_controller_uses() -> None:
    policy = load(ACL_POLICY)
    assert set(policy) == {"namespace", "node"}, "no agent, operator, quota, plugin... rules"
    namespaces = labelled(policy, "namespace")
    assert list(namespaces) == [INPUTS["runner_namespace"]["default"]]
    namespace = namespaces[INPUTS["runner_namespace"]["default"]]
    assert "policy" not in namespace, "capabilities, not a coarse read/write policy"
    assert sorted(namespace["capabilities"]) == [
        "alloc-exec",
        "list-jobs",
        "read-job",
        "submit-job",
    ]
    paths = labelled(one(namespace, "variables"), "path")
    lock_path = rendered_env()["NRC_LEADER_LOCK_PATH"]
    assert lock_path == load_settings({}).leader_lock_path
    # Adaptive prewarming's histories: one variable per environment.
    prewarm_paths = PrewarmSettings().variable_prefix + "/*"
    # Runner activity shared between replicas (reconcile/activity.py).
    activity_paths = activity_prefix(lock_path) + "/*"
    assert list(paths) == [lock_path, activity_paths, prewarm_paths]
    assert sorted(paths[lock_path]["capabilities"]) == ["read", "write"]
    assert sorted(paths[activity_paths]["capabilities"]) == ["destroy", "list", "read", "write"]
    assert sorted(paths[prewarm_paths]["capabilities"]) == ["read", "write"]
    assert one(policy, "node") == {"policy": "read"}


def test_a_stop_drains_within_the_kill_timeout() -> None:
    """shutdown_delay (the service is deregistered first), the drain's grace
    and 10 s for the rest (the last frames: 5 s at most; uvicorn and the loop
    stopping) fit in kill_timeout, which Nomad caps at its client's
    max_kill_timeout (30 s by default)."""
    service = one(GROUP, "service")
    grace = go_seconds(rendered_env()["NRC_SHUTDOWN_GRACE"])
    kill = go_seconds(TASK["kill_timeout"])
    assert TASK["kill_signal"] == "SIGTERM"
    assert kill <= 30
    assert go_seconds(service["shutdown_delay"]) + grace + 10 <= kill


def go_seconds(duration: str) -> float:
    assert duration.endswith("s") and not duration.endswith("ms"), duration
    return float(duration[:-1])
