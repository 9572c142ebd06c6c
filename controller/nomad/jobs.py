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

import json
import re
from typing import Any

from controller.model import Claim, Environment, LossReason, RunnerJob

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


def environment_from_job(spec: JsonDict, env_id: int) -> Environment:
    """The environment a template (or runner) job describes. Missing fields read
    as defaults, so jobs written by Poseidon or by hand are understood."""
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
    network_access = config.get("network_mode") != "none" and bool(networks)
    return Environment(
        id=env_id,
        image=str(config.get("image", "")),
        cpu_limit=int(resources.get("CPU") or 0),
        memory_limit=int(resources.get("MemoryMB") or 0),
        network_access=network_access,
        exposed_ports=tuple(sorted(set(ports))),
        prewarming_pool_size=max(0, _int(_meta(spec).get(META_POOL_SIZE))),
    )


def template_job(env: Environment) -> JsonDict:
    """The template job for an environment (the runner group never runs here)."""
    config: JsonDict = {"image": env.image, "command": "sleep", "args": ["infinity"]}
    group: JsonDict = {
        "Name": RUNNER_GROUP,
        "Count": 0,
        # A crash restarts the task in place (the claim reports `restarted`);
        # after three, Nomad reschedules it (`rescheduled`).
        "RestartPolicy": {
            "Attempts": 3,
            "Interval": 3_600_000_000_000,
            "Delay": 1_000_000_000,
            "Mode": "fail",
        },
        "Tasks": [
            {
                "Name": RUNNER_TASK,
                "Driver": "docker",
                "Config": config,
                "Resources": {"CPU": env.cpu_limit, "MemoryMB": env.memory_limit},
            }
        ],
    }
    if env.network_access:
        group["Networks"] = [
            {
                "Mode": "bridge",
                "DynamicPorts": [{"Label": str(p), "To": p} for p in env.exposed_ports],
            }
        ]
    else:
        config["network_mode"] = "none"
    return {
        "ID": template_job_id(env.id),
        "Name": template_job_id(env.id),
        "Type": "batch",
        "TaskGroups": [
            group,
            {
                "Name": CONFIG_GROUP,
                "Count": 0,
                "Meta": {META_POOL_SIZE: str(env.prewarming_pool_size)},
                "Tasks": [{"Name": CONFIG_GROUP, "Driver": "exec", "Config": {"command": "true"}}],
            },
        ],
    }


def _clean_copy(spec: JsonDict) -> JsonDict:
    # A spec is JSON: a round trip through the C codec copies it several
    # times faster than copy.deepcopy (which a claim would otherwise spend a
    # fifth of its CPU on).
    out: JsonDict = json.loads(json.dumps(spec))
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
    """A new idle runner job built from the template spec."""
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
        {META_USED: "false", META_TIMEOUT: "0", META_TEMPLATE_HASH: env.template_hash},
        drop=(META_POOL_SIZE,),
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
    return RunnerJob(
        id=job_id(spec),
        env_id=env_id,
        job_modify_index=modify_index(spec),
        create_index=int(spec.get("CreateIndex") or 0),
        submit_time=int(spec.get("SubmitTime") or 0),
        stop=bool(spec.get("Stop")),
        status=str(spec.get("Status") or "pending"),
        claim=claim,
        template_hash=template_hash,
    )


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


def with_lost(spec: JsonDict, reason: LossReason, now_ns: int) -> JsonDict:
    """The runner spec stopped, with the reason its claim ended kept in meta so
    any controller (after a restart too) can tell the client."""
    out = _clean_copy(spec)
    out["Stop"] = True
    _set_meta(out, {META_LOST_REASON: reason.value, META_LOST_AT: str(now_ns)})
    return out
