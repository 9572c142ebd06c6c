"""The Nomad job layout of environments and runners (Poseidon's, so existing
deployments are adopted as they are).

- environment E ⇒ template job `template-E`: runner group `default-group`
  (task `default-task`) with count 0, and a count-0 group `config` whose meta
  holds `prewarmingPoolSize`;
- runner ⇒ batch job `E-<uuid>`: the template's runner group with count 1 and
  the `config` group whose meta holds the claim (`used`, `timeout`, and our
  `nrc_*` keys). Meta on a count-0 group changes without restarting the task.

Pure functions over job specs (JSON dicts as Nomad reads and writes them).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

from controller.model import SECOND, Claim, Environment, LossReason, RunnerJob

JsonDict = dict[str, Any]

TEMPLATE_PREFIX = "template-"
RUNNER_GROUP = "default-group"
RUNNER_TASK = "default-task"
CONFIG_GROUP = "config"

# Poseidon's meta keys.
META_USED = "used"
META_TIMEOUT = "timeout"
META_POOL_SIZE = "prewarmingPoolSize"
# Ours: the claim's incarnation (allocation and its restart count when claimed),
# when it was claimed, what the runner was built from, and why a claim ended.
META_CLAIM_ALLOC = "nrc_claim_alloc"
META_CLAIM_RESTARTS = "nrc_claim_restarts"
META_CLAIMED_AT = "nrc_claimed_at"
META_TEMPLATE_HASH = "nrc_template_hash"
META_LOST_REASON = "nrc_lost_reason"
META_LOST_AT = "nrc_lost_at"
# On a template: the policy it was written under (`TemplatePolicy.fingerprint`).
META_TEMPLATE_POLICY = "nrc_template_policy"

_RUNNER_ID = re.compile(r"^(\d+)-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")
_TEMPLATE_ID = re.compile(r"^template-(\d+)$")

# Server-maintained fields that a job read back carries and a register must not
# depend on; Nomad ignores them on register, we drop them so a copy is clean.
_SERVER_FIELDS = (
    "Status",
    "StatusDescription",
    "Stable",
    "Version",
    "SubmitTime",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
)


def template_job_id(env_id: int) -> str:
    return f"{TEMPLATE_PREFIX}{env_id}"


def runner_job_id(env_id: int, uid: str) -> str:
    return f"{env_id}-{uid}"


def runner_env_id(job_id: str) -> int | None:
    """The environment of a runner job id `E-<uuid>`, or None if it is not one."""
    match = _RUNNER_ID.match(job_id)
    return int(match.group(1)) if match else None


def template_env_id(job_id: str) -> int | None:
    match = _TEMPLATE_ID.match(job_id)
    return int(match.group(1)) if match else None


def env_id_of(job_id: str) -> int | None:
    """The environment a template or runner job belongs to."""
    env = runner_env_id(job_id)
    return env if env is not None else template_env_id(job_id)


def _group(spec: JsonDict, name: str) -> JsonDict | None:
    for group in spec.get("TaskGroups") or []:
        if isinstance(group, dict) and group.get("Name") == name:
            return group
    return None


def _meta(spec: JsonDict) -> dict[str, str]:
    group = _group(spec, CONFIG_GROUP)
    meta = (group or {}).get("Meta") or {}
    return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def _int(text: str | None, default: int = 0) -> int:
    try:
        return int(text) if text not in (None, "") else default
    except ValueError:
        return default


def _runner_task(spec: JsonDict) -> JsonDict:
    group = _group(spec, RUNNER_GROUP) or {}
    tasks = group.get("Tasks") or []
    for task in tasks:
        if isinstance(task, dict) and task.get("Name") == RUNNER_TASK:
            return task
    return tasks[0] if tasks and isinstance(tasks[0], dict) else {}


def _positive(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def environment_from_job(spec: JsonDict, env_id: int) -> Environment:
    """The environment a template (or runner) job describes, read as Poseidon
    reads it, so jobs written by Poseidon or by hand are understood: the memory
    limit is `MemoryMaxMB` (the reservation `MemoryMB` only when no maximum is
    set, as in templates written before oversubscription), network access is a
    Docker `network_mode` other than `none`, ports are the dynamic ports' `To`."""
    task = _runner_task(spec)
    config = task.get("Config") or {}
    resources = task.get("Resources") or {}
    group = _group(spec, RUNNER_GROUP) or {}
    networks = group.get("Networks") or []
    ports: list[int] = []
    for network in networks:
        for port in (network or {}).get("DynamicPorts") or []:
            to = (port or {}).get("To") or _int(str((port or {}).get("Label", "")), 0)
            if to:
                ports.append(int(to))
    meta = _meta(spec)
    return Environment(
        id=env_id,
        image=str(config.get("image", "")),
        cpu_limit=int(resources.get("CPU") or 0),
        memory_limit=_positive(resources.get("MemoryMaxMB")) or int(resources.get("MemoryMB") or 0),
        network_access=config.get("network_mode") != "none",
        exposed_ports=tuple(sorted(set(ports))),
        prewarming_pool_size=max(0, _int(meta.get(META_POOL_SIZE))),
        template_source=meta.get(META_TEMPLATE_POLICY, ""),
    )


# Poseidon's production template (template-environment-job.hcl in
# openHPI/poseidon), as Nomad's API reads it. Durations are nanoseconds.
_MINUTE = 60 * SECOND
_HOUR = 60 * _MINUTE
RESTART_POLICY: JsonDict = {
    # A crash restarts the task in place (the claim reports `restarted`);
    # after three in an hour the allocation fails and is rescheduled.
    "Attempts": 3,
    "Interval": _HOUR,
    "Delay": 15 * SECOND,
    "Mode": "fail",
}
RESCHEDULE_POLICY: JsonDict = {
    # Poseidon: "we cannot guarantee an error-free job definition", so a
    # broken image is not rescheduled for ever.
    "Attempts": 3,
    "Interval": 6 * _HOUR,
    "Delay": _MINUTE,
    "DelayFunction": "exponential",
    "MaxDelay": 4 * _MINUTE,
    "Unlimited": False,
}
# Every runner lands on the node with the fewest runners of its job.
SPREAD: JsonDict = {"Attribute": "${node.unique.name}", "Weight": 100}
# One 1 MB log file: runners' output goes to the exec streams, not to logs.
LOGS: JsonDict = {"MaxFiles": 1, "MaxFileSizeMB": 1}
# Capabilities Docker grants by default that no runner needs. Kept: KILL (the
# timeout kill), SETUID/SETGID (setuser), CHOWN/FOWNER/DAC_OVERRIDE (file
# copies as root), FSETID (tar keeps modes as root), NET_BIND_SERVICE.
DEFAULT_CAP_DROP = ("audit_write", "mknod", "net_raw", "setfcap", "setpcap", "sys_chroot")


@dataclass(frozen=True)
class TemplatePolicy:
    """The site policy every template job is written with (the settings
    `NRC_TEMPLATE_*`). The defaults are Poseidon's production template, plus
    the runner hardening Poseidon lacks. `base` is an operator's own template
    (`NRC_TEMPLATE_JOB_FILE`, as Nomad's API JSON): when set it replaces the
    built-in one and only the environment's fields, the network mode, force
    pull and the hardening are applied to it, as Poseidon applies them."""

    memory_reservation_mb: int = 50
    ephemeral_disk_mb: int = 10
    network_mode: str = "bridge"
    datacenters: tuple[str, ...] = ("*",)
    force_pull: bool = True
    pids_limit: int = 1024  # 0: no limit
    cap_drop: tuple[str, ...] = DEFAULT_CAP_DROP
    no_new_privileges: bool = True
    base: JsonDict | None = None

    @property
    def fingerprint(self) -> str:
        """Identifies the policy: kept in the template's meta, so a template
        written under another policy is rewritten and its idle runners rolled."""
        shape = json.dumps(asdict(self), sort_keys=True, default=list)
        return hashlib.sha256(shape.encode()).hexdigest()[:16]


def _builtin_template() -> JsonDict:
    return {
        "Type": "batch",
        "TaskGroups": [
            {
                "Name": RUNNER_GROUP,
                "Count": 0,
                "Tasks": [{"Name": RUNNER_TASK, "Driver": "docker", "Config": {}}],
            },
            {
                "Name": CONFIG_GROUP,
                "Count": 0,
                "Tasks": [
                    {
                        "Name": CONFIG_GROUP,
                        "Driver": "exec",
                        "Config": {"command": "true"},
                        "LogConfig": dict(LOGS),
                        "Resources": {"CPU": 1, "MemoryMB": 10},
                    }
                ],
            },
        ],
    }


def base_template_problem(spec: JsonDict) -> str | None:
    """Why an operator's template cannot carry runners, or None: it needs the
    runner group with the Docker task commands are run in."""
    group = _group(spec, RUNNER_GROUP)
    if group is None:
        return f"no task group {RUNNER_GROUP!r}"
    task = next(
        (
            t
            for t in group.get("Tasks") or []
            if isinstance(t, dict) and t.get("Name") == RUNNER_TASK
        ),
        None,
    )
    if task is None:
        return f"no task {RUNNER_TASK!r} in group {RUNNER_GROUP!r}"
    if task.get("Driver") != "docker":
        return f"task {RUNNER_TASK!r} uses driver {task.get('Driver')!r}, not 'docker'"
    return None


def template_job(env: Environment, policy: TemplatePolicy | None = None) -> JsonDict:
    """The template job for an environment (the runner group never runs here):
    the policy's template with the environment's fields applied."""
    policy = policy or TemplatePolicy()
    custom = policy.base is not None
    spec = json.loads(json.dumps(policy.base)) if custom else _builtin_template()
    for key in (*_SERVER_FIELDS, "Namespace", "Region"):
        spec.pop(key, None)
    spec["ID"] = spec["Name"] = template_job_id(env.id)
    spec["Type"] = "batch"
    group = _group(spec, RUNNER_GROUP)
    if group is None:
        raise ValueError(base_template_problem(spec))
    group["Count"] = 0
    task = _runner_task(spec)
    if not custom:
        spec["Datacenters"] = list(policy.datacenters)
        group["EphemeralDisk"] = {
            "Migrate": False,
            "SizeMB": policy.ephemeral_disk_mb,
            "Sticky": False,
        }
        group["Spreads"] = [dict(SPREAD)]
        group["RestartPolicy"] = dict(RESTART_POLICY)
        group["ReschedulePolicy"] = dict(RESCHEDULE_POLICY)
        task["KillTimeout"] = 0  # SIGKILL at once: nothing in a runner is worth waiting for
        task["KillSignal"] = "SIGKILL"
        task["LogConfig"] = dict(LOGS)
        task["Resources"] = {"MemoryMB": policy.memory_reservation_mb}
    # A parsed template has null for what it does not set.
    config: JsonDict = task.get("Config") or {}
    resources: JsonDict = task.get("Resources") or {}
    task["Config"], task["Resources"] = config, resources
    config["image"] = env.image
    config["command"] = "sleep"
    config["args"] = ["infinity"]
    resources["CPU"] = env.cpu_limit
    # The limit is the most a runner may use (Nomad's memory oversubscription);
    # only the reservation counts for placement. Nomad refuses a maximum below
    # the reservation, so a smaller limit is reserved whole.
    reserved = int(resources.get("MemoryMB") or policy.memory_reservation_mb)
    resources["MemoryMB"] = min(reserved, env.memory_limit)
    resources["MemoryMaxMB"] = env.memory_limit
    if env.network_access:
        group["Networks"] = [
            {
                "Mode": policy.network_mode,
                "DynamicPorts": [{"Label": str(p), "To": p} for p in sorted(env.exposed_ports)],
            }
        ]
        # Cleared, not "bridge": Docker's bridge would attach the runner to
        # docker0 beside every other container on the node.
        config["network_mode"] = ""
    else:
        # Nomad has no group network mode "none"; Docker's is the isolation.
        config["network_mode"] = "none"
        group["Networks"] = []
    config["force_pull"] = policy.force_pull
    if policy.pids_limit:
        config["pids_limit"] = policy.pids_limit
    if policy.cap_drop:
        config["cap_drop"] = list(policy.cap_drop)
    if policy.no_new_privileges:
        options = [o for o in config.get("security_opt") or [] if o != "no-new-privileges"]
        config["security_opt"] = [*options, "no-new-privileges"]
    _set_meta(
        spec,
        {
            META_USED: "false",
            META_POOL_SIZE: str(env.prewarming_pool_size),
            META_TEMPLATE_POLICY: policy.fingerprint,
        },
    )
    return spec


def _clean_copy(spec: JsonDict) -> JsonDict:
    # A spec is JSON: a round trip through orjson copies it about 20 times
    # faster than copy.deepcopy and 5 times faster than the json module
    # (a claim copies one spec, a creation the template).
    out: JsonDict = orjson.loads(orjson.dumps(spec))
    for key in _SERVER_FIELDS:
        out.pop(key, None)
    return out


def _set_meta(spec: JsonDict, values: dict[str, str], drop: tuple[str, ...] = ()) -> None:
    group = _group(spec, CONFIG_GROUP)
    if group is None:
        group = {
            "Name": CONFIG_GROUP,
            "Count": 0,
            "Tasks": [{"Name": CONFIG_GROUP, "Driver": "exec", "Config": {"command": "true"}}],
        }
        spec.setdefault("TaskGroups", []).append(group)
    meta = dict(group.get("Meta") or {})
    for key in drop:
        meta.pop(key, None)
    meta.update(values)
    group["Meta"] = meta


def runner_job(template: JsonDict, env: Environment, job_id: str) -> JsonDict:
    """A new idle runner job built from the template spec. Its hash is the
    environment's under the policy the template was written with (from the
    template's meta), whatever policy `env` carries."""
    source = _meta(template).get(META_TEMPLATE_POLICY, "")
    built_from = env if env.template_source == source else replace(env, template_source=source)
    spec = _clean_copy(template)
    spec["ID"] = job_id
    spec["Name"] = job_id
    spec["Type"] = "batch"
    spec["Stop"] = False
    group = _group(spec, RUNNER_GROUP)
    if group is not None:
        group["Count"] = 1
    _set_meta(
        spec,
        {META_USED: "false", META_TIMEOUT: "0", META_TEMPLATE_HASH: built_from.template_hash},
        drop=(META_POOL_SIZE, META_TEMPLATE_POLICY),
    )
    return spec


def job_id(spec: JsonDict) -> str:
    return str(spec.get("ID", ""))


def modify_index(spec: JsonDict) -> int:
    """The spec's JobModifyIndex: the version a register with EnforceIndex compares."""
    return int(spec.get("JobModifyIndex") or 0)


def with_modify_index(spec: JsonDict, index: int) -> JsonDict:
    """The spec as Nomad now holds it after a register answered `index`."""
    spec["JobModifyIndex"] = index
    return spec


def runner_from_job(spec: JsonDict, env_id: int) -> RunnerJob:
    """A runner job's state from its spec: idle or claimed (and how the claim ended)."""
    meta = _meta(spec)
    claim: Claim | None = None
    if meta.get(META_USED) == "true":
        lost = meta.get(META_LOST_REASON, "")
        reasons = {r.value: r for r in LossReason}
        claim = Claim(
            timeout=max(0, _int(meta.get(META_TIMEOUT))),
            alloc_id=meta.get(META_CLAIM_ALLOC, ""),
            restarts=_int(meta.get(META_CLAIM_RESTARTS)),
            claimed_at=_int(meta.get(META_CLAIMED_AT)),
            lost_reason=reasons.get(lost),
            lost_at=_int(meta.get(META_LOST_AT)),
        )
    template_hash = meta.get(META_TEMPLATE_HASH) or environment_from_job(spec, env_id).template_hash
    # The hash, the status and the id are held by every runner's view (the id
    # by the job's list and its allocations too): one string each (`sys.intern`).
    return RunnerJob(
        id=sys.intern(job_id(spec)),
        env_id=env_id,
        job_modify_index=modify_index(spec),
        create_index=int(spec.get("CreateIndex") or 0),
        submit_time=int(spec.get("SubmitTime") or 0),
        stop=bool(spec.get("Stop")),
        status=sys.intern(str(spec.get("Status") or "pending")),
        claim=claim,
        template_hash=sys.intern(template_hash),
    )


def landed(sent: JsonDict, current: JsonDict | None) -> bool:
    """Whether the job Nomad holds now (`current`, read back) is the register
    `sent`: the same meta on the job and on every group. An EnforceIndex
    register retried after an answer of unknown outcome (`rpc error: EOF`, a
    timeout) conflicts with itself when the first try was committed; what
    the meta holds (a claim's time in ns among it) tells that apart from
    another writer's change."""
    if current is None or current.get("ID") != sent.get("ID"):
        return False
    if (current.get("Meta") or {}) != (sent.get("Meta") or {}):
        return False
    groups = {g.get("Name"): g for g in current.get("TaskGroups") or []}
    for group in sent.get("TaskGroups") or []:
        held = groups.get(group.get("Name"))
        if held is None or (held.get("Meta") or {}) != (group.get("Meta") or {}):
            return False
    return True


def with_claim(spec: JsonDict, claim: Claim) -> JsonDict:
    """The runner spec with the claim written into its config meta."""
    out = _clean_copy(spec)
    _set_meta(
        out,
        {
            META_USED: "true",
            META_TIMEOUT: str(claim.timeout),
            META_CLAIM_ALLOC: claim.alloc_id,
            META_CLAIM_RESTARTS: str(claim.restarts),
            META_CLAIMED_AT: str(claim.claimed_at),
        },
        drop=(META_LOST_REASON, META_LOST_AT),
    )
    return out


def with_stop(spec: JsonDict) -> JsonDict:
    """The runner spec stopped, and nothing else changed: an idle runner about
    to be deleted (`Claims.retire`)."""
    out = _clean_copy(spec)
    out["Stop"] = True
    return out


def with_lost(spec: JsonDict, reason: LossReason, now_ns: int) -> JsonDict:
    """The runner spec stopped, with the reason its claim ended kept in meta so
    any controller (after a restart too) can tell the client."""
    out = with_stop(spec)
    _set_meta(out, {META_LOST_REASON: reason.value, META_LOST_AT: str(now_ns)})
    return out
