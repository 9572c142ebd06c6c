"""The controller's configuration: every knob is an environment variable.

The Nomad connection is read from the variables Nomad's own CLI uses
(`NOMAD_ADDR`, `NOMAD_TOKEN`, `NOMAD_NAMESPACE`, ...), so a shell already set
up for `nomad` works unchanged; everything else is `NRC_*`. `load_settings`
turns an environment into a validated, immutable `Settings` or raises
`ConfigError` with one plain line per problem (the variable, what it accepts,
what it got), which is what an operator reading a crash-looping container's
log needs. `describe` and `render_table` show the effective configuration
(or, as Markdown, the documentation table); secrets are never shown.

Durations accept plain seconds (`30`, `0.5`) or Go durations (`30s`, `5m`,
`1h30m`, `250ms`), the form Nomad's own configuration uses.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal, TextIO
from urllib.parse import urlsplit

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from controller.execution.command import ExecSettings, parse_wrapper
from controller.execution.ids import Signer, replica_key
from controller.execution.service import ExecutionSettings
from controller.execution.store import Limits
from controller.files.service import FileSettings
from controller.files.upload import Limits as UploadLimits
from controller.model import SECOND
from controller.nomad.budget import (
    DEFAULT_MAX_CONNS_PER_AGENT,
    DEFAULT_QUEUE,
    MIN_MAX_CONNS,
    BudgetSettings,
)
from controller.nomad.connection import NomadConnection
from controller.nomad.jobs import DEFAULT_CAP_DROP, TemplatePolicy
from controller.reconcile.loop import ControllerSettings
from controller.reconcile.plan import PlanSettings
from controller.reconcile.prewarming import PrewarmSettings

__all__ = [
    "ConfigError",
    "SettingRow",
    "Settings",
    "describe",
    "format_duration",
    "load_settings",
    "parse_duration",
    "render_table",
    "variables",
]

# Variables with this prefix are ours: one we do not know is a typo.
PREFIX = "NRC_"
ENVIRONMENT = "environment"
DEFAULT = "default"
UNSET = "(unset)"
SET = "(set)"


class ConfigError(Exception):
    """The environment does not describe a usable configuration.

    `str()` is one line per problem, each naming the variable, so it can be
    printed as it is; `problems` holds the same lines."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


# --- value parsers -------------------------------------------------------------
#
# Our own parsers instead of pydantic's lax ones: pydantic takes "4.0" and
# "1_000" as integers and "1e3" or "inf" as numbers, none of which an operator
# means in an environment variable, and the allowed forms must match what the
# error messages promise.

_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
# Go's time.ParseDuration: an optional sign, then one or more number+unit
# pairs. Longer units first, so that "5ms" is not read as "5m" followed by "s".
_GO_DURATION = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|h|m|s))+")
_GO_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|h|m|s)")
_UNIT_SECONDS = {
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "µs": Decimal("1e-6"),  # U+00B5 MICRO SIGN
    "μs": Decimal("1e-6"),  # U+03BC GREEK SMALL LETTER MU; Go accepts both
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def parse_duration(value: str | float) -> float:
    """Seconds from plain seconds (`30`, `0.5`) or a Go duration (`1h30m`, `250ms`).

    Raises ValueError for anything else, including NaN and infinity."""
    if isinstance(value, bool):  # bool is an int; True seconds is a mistake
        raise ValueError("not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip()
        if _NUMBER.fullmatch(text):
            seconds = float(Decimal(text))
        elif _GO_DURATION.fullmatch(text):
            # Decimal so that "0.1s" + "0.2s" is exactly what was written.
            total = sum(
                (Decimal(n) * _UNIT_SECONDS[u] for n, u in _GO_PART.findall(text)),
                Decimal(0),
            )
            seconds = float(-total if text.startswith("-") else total)
        else:
            raise ValueError("not a duration")
    if not math.isfinite(seconds):
        raise ValueError("not a duration")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest Go duration for `seconds`: `30s`, `5m`, `1h30m`, `250ms`.

    Unlike Go's `Duration.String()` (`1h0m0s`), zero parts are left out; the
    result parses back with `parse_duration` and with Go."""
    ns = round(seconds * SECOND)
    if ns == 0:
        return "0s"
    sign, ns = ("-" if ns < 0 else ""), abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_decimal(ns, 1_000)}us"
    if ns < SECOND:
        return f"{sign}{_decimal(ns, 1_000_000)}ms"
    hours, ns = divmod(ns, 3600 * SECOND)
    minutes, ns = divmod(ns, 60 * SECOND)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    if ns:
        parts.append(f"{_decimal(ns, SECOND)}s")
    return sign + "".join(parts)


def _decimal(n: int, unit: int) -> str:
    """n/unit written exactly, without trailing zeros (unit is a power of ten)."""
    whole, frac = divmod(n, unit)
    digits = str(frac).zfill(len(str(unit)) - 1).rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def _duration(value: Any) -> Any:
    if isinstance(value, str | int | float):
        return parse_duration(value)
    return value  # pydantic rejects it with the field's message


def _integer(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if not _INTEGER.fullmatch(text):
            raise ValueError("not an integer")
        return int(text)
    if isinstance(value, bool):
        raise ValueError("not an integer")
    return value


def _number(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if not _NUMBER.fullmatch(text):
            raise ValueError("not a number")
        return float(Decimal(text))
    if isinstance(value, bool):
        raise ValueError("not a number")
    return value


def _boolean(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("not a boolean")
    return value


def _upper(value: Any) -> Any:
    return value.strip().upper() if isinstance(value, str) else value


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


# Poseidon's (logrus') level and formatter names, as its configuration gives them.
_POSEIDON_LEVELS = {"TRACE": "DEBUG", "WARN": "WARNING", "FATAL": "ERROR", "PANIC": "ERROR"}
_POSEIDON_FORMATTERS = {"textformatter": "text", "jsonformatter": "json"}


def _log_level(value: Any) -> Any:
    value = _upper(value)
    return _POSEIDON_LEVELS.get(value, value) if isinstance(value, str) else value


def _log_format(value: Any) -> Any:
    value = _lower(value)
    return _POSEIDON_FORMATTERS.get(value, value) if isinstance(value, str) else value


Duration = Annotated[float, BeforeValidator(_duration)]
Integer = Annotated[int, BeforeValidator(_integer)]
Number = Annotated[float, BeforeValidator(_number)]
Boolean = Annotated[bool, BeforeValidator(_boolean)]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["json", "text", "auto"]
PrewarmPolicy = Literal["static", "adaptive"]
BrokenEnd = Literal["error", "exit0"]

# Nomad's own rules (nomad/structs): namespace names and variable paths.
_NAMESPACE = re.compile(r"[a-zA-Z0-9-]{1,128}")
_VARIABLE_PATH = re.compile(r"[a-zA-Z0-9\-_~/]{1,128}")
# Nomad's 128 characters, less what the replicas' activity variables add
# under the lock's path (`/activity/<replica id>/<n>`, reconcile/activity.py).
MAX_LOCK_PATH = 100
_NO_SPACE = re.compile(r"[^\s\x00-\x1f\x7f]+")

_CNI_MODE = re.compile(r"cni/[A-Za-z0-9_.-]+")
_CAPABILITY = re.compile(r"[a-z_]+")
# What root in a runner uses: the timeout kill, setuser, file copies as root.
RUNNER_CAPABILITIES = ("kill", "setuid", "setgid", "chown", "fowner", "dac_override")


def _holds_private_key(path: str) -> bool:
    """Whether a PEM file holds a private key besides its certificate."""
    try:
        with open(path, encoding="ascii", errors="replace") as pem:
            return "PRIVATE KEY-----" in pem.read(1 << 20)
    except OSError:
        return False


def _capabilities(value: str) -> list[str]:
    """`NET_RAW, cap_mknod` → ["net_raw", "mknod"]; `none` or empty → []."""
    if value.strip().lower() in ("", "none"):
        return []
    names = [n.strip().lower() for n in value.split(",")]
    return [n.removeprefix("cap_") for n in names]


_BOOLEAN = "true or false (also 1/0, yes/no)"
_DURATION_FORMS = "as seconds (30, 0.5) or a Go duration (30s, 5m, 1h30m, 250ms)"
_FILE = "the path of an existing, readable file"
_TOKEN = "a token without whitespace or control characters"


def _allowed(text: str, *, duration: bool = False, secret: bool = False) -> dict[str, Any]:
    """Field metadata: what the variable accepts (said in every error about
    it), whether it is a duration (shown as one) or a secret (never shown)."""
    return {"allowed": text, "duration": duration, "secret": secret}


MIN_API_TOKEN_LENGTH = 16
MIN_REPLICA_SECRET_LENGTH = 32


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach an API bound to `host`: `localhost`
    or a loopback address; any other name may resolve to anything."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Every setting of the controller, read from environment variables.

    Build it with `load_settings`, which also catches misspelt `NRC_*`
    variables and turns validation errors into one line per variable."""

    model_config = SettingsConfigDict(
        case_sensitive=True,  # NOMAD_ADDR, not nomad_addr: as Nomad's CLI reads them
        env_ignore_empty=True,  # `NRC_API_PORT= cmd` means unset, as for Nomad's CLI
        extra="ignore",
        frozen=True,
        # A ValidationError printed by someone else must not show a token.
        hide_input_in_errors=True,
    )

    # --- Nomad connection: the variables Nomad's CLI reads ---
    nomad_addr: str = Field(
        default="http://127.0.0.1:4646",
        alias="NOMAD_ADDR",
        description="Address of the Nomad HTTP API.",
        json_schema_extra=_allowed("an http:// or https:// URL such as http://127.0.0.1:4646"),
    )
    nomad_token: SecretStr | None = Field(
        default=None,
        alias="NOMAD_TOKEN",
        description="Nomad ACL token (secret); unset when Nomad runs without ACLs.",
        json_schema_extra=_allowed(_TOKEN, secret=True),
    )
    nomad_namespace: str = Field(
        default="default",
        alias="NOMAD_NAMESPACE",
        description="Nomad namespace holding the template and runner jobs.",
        json_schema_extra=_allowed("a Nomad namespace name: 1 to 128 letters, digits and '-'"),
    )
    nomad_region: str | None = Field(
        default=None,
        alias="NOMAD_REGION",
        description="Nomad region to send requests to; unset uses the agent's own region.",
        json_schema_extra=_allowed("a region name without whitespace"),
    )
    nomad_cacert: str | None = Field(
        default=None,
        alias="NOMAD_CACERT",
        description="PEM file of the CA that signed Nomad's TLS certificate.",
        json_schema_extra=_allowed(_FILE),
    )
    nomad_client_cert: str | None = Field(
        default=None,
        alias="NOMAD_CLIENT_CERT",
        description=(
            "PEM client certificate for mutual TLS, with NOMAD_CLIENT_KEY or holding its key."
        ),
        json_schema_extra=_allowed(_FILE),
    )
    nomad_client_key: str | None = Field(
        default=None,
        alias="NOMAD_CLIENT_KEY",
        description="PEM private key of NOMAD_CLIENT_CERT.",
        json_schema_extra=_allowed(_FILE),
    )
    nomad_skip_verify: Boolean = Field(
        default=False,
        alias="NOMAD_SKIP_VERIFY",
        description="Skip verifying Nomad's TLS certificate (testing only).",
        json_schema_extra=_allowed(_BOOLEAN),
    )

    # --- the HTTP API ---
    api_host: str = Field(
        default="127.0.0.1",
        alias="NRC_API_HOST",
        description="Address the HTTP API listens on.",
        json_schema_extra=_allowed("a host name or IP address without whitespace"),
    )
    api_port: Integer = Field(
        default=7200,
        alias="NRC_API_PORT",
        ge=1,
        le=65535,
        description="Port the HTTP API listens on (1–65535).",
        json_schema_extra=_allowed("an integer between 1 and 65535"),
    )
    api_token: SecretStr | None = Field(
        default=None,
        alias="NRC_API_TOKEN",
        description="Bearer token API clients must send (secret, 16 characters or more); "
        "unset, `run` only serves on loopback (see NRC_API_ALLOW_UNAUTHENTICATED).",
        json_schema_extra=_allowed(
            "a token of 16 or more characters without whitespace or control characters",
            secret=True,
        ),
    )

    api_websocket_scheme: Annotated[Literal["ws", "wss"], BeforeValidator(_lower)] = Field(
        default="ws",
        alias="NRC_API_WEBSOCKET_SCHEME",
        description="Scheme of the websocketUrl answered by /execute: wss when clients reach "
        "the API through TLS.",
        json_schema_extra=_allowed("ws or wss"),
    )
    api_trust_proxy_headers: Boolean = Field(
        default=False,
        alias="NRC_API_TRUST_PROXY_HEADERS",
        description="Build websocketUrl from X-Forwarded-Proto and X-Forwarded-Host (only "
        "behind a proxy that sets them).",
        json_schema_extra=_allowed(_BOOLEAN),
    )
    api_advertise_url: str | None = Field(
        default=None,
        alias="NRC_API_ADVERTISE_URL",
        description="URL at which the other replicas reach this one's API (in a Nomad job "
        "http://${NOMAD_ADDR_http}): a websocketUrl it answers then works on every replica "
        "sharing the key (NRC_REPLICA_SECRET); unset, only on this one.",
        json_schema_extra=_allowed(
            "an http:// or https:// URL without path, such as http://10.0.0.5:7200"
        ),
    )
    replica_secret: SecretStr | None = Field(
        default=None,
        alias="NRC_REPLICA_SECRET",
        description="Key the replicas share to sign execution ids and the takes between "
        "them (secret, 32 characters or more); unset: derived from NRC_API_TOKEN "
        '(docs/architecture.md, "Execution ids across replicas").',
        json_schema_extra=_allowed(
            f"a secret of {MIN_REPLICA_SECRET_LENGTH} or more characters without whitespace "
            "or control characters",
            secret=True,
        ),
    )
    shutdown_grace_s: Duration = Field(
        default=20.0,
        alias="NRC_SHUTDOWN_GRACE",
        ge=0,
        description="On SIGTERM, how long running executions and file operations may go on "
        "before each still running is ended with an error frame (docs/operations.md). Keep "
        "the controller job's kill_timeout above it.",
        json_schema_extra=_allowed(f"a duration of 0 or more, {_DURATION_FORMS}", duration=True),
    )

    # --- executions ---
    exec_task: str = Field(
        default="default-task",
        alias="NRC_EXEC_TASK",
        description="Task of the runner job that commands run in.",
        json_schema_extra=_allowed("a Nomad task name without whitespace"),
    )
    exec_unprivileged_wrapper: str = Field(
        default="/sbin/setuser user",
        alias="NRC_EXEC_UNPRIVILEGED_WRAPPER",
        description="Command prefix that runs an unprivileged execution as the image's "
        "user (Poseidon's images: phusion's setuser); none runs it as the task's user.",
        json_schema_extra=_allowed("shell words, or none"),
    )
    exec_separate_stderr: Boolean = Field(
        default=True,
        alias="NRC_EXEC_SEPARATE_STDERR",
        description="Deliver stderr of interactive executions as stderr frames (a second "
        "exec reads it); false merges it into stdout.",
        json_schema_extra=_allowed(_BOOLEAN),
    )
    # Where a client sees us differ from Poseidon (README, "Migrating from Poseidon").
    exec_broken_end: Annotated[BrokenEnd, BeforeValidator(_lower)] = Field(
        default="error",
        alias="NRC_EXEC_BROKEN_END",
        description="How an execution ends whose Nomad exec broke off without an exit code "
        "(runner not lost): error sends an error frame saying so; exit0 sends exit 0, as "
        "Poseidon does.",
        json_schema_extra=_allowed("error or exit0 (any case)"),
    )
    exec_signal_loss_window_s: Duration = Field(
        default=0.5,
        alias="NRC_EXEC_SIGNAL_LOSS_WINDOW",
        ge=0,
        description="After an exit code of 128 or more, how long Nomad is read again for a "
        "loss of the runner (an OOM kill) before the exit code is sent; Poseidon waits 1s.",
        json_schema_extra=_allowed(f"a duration of 0 or more, {_DURATION_FORMS}", duration=True),
    )
    loss_settle_s: Duration = Field(
        default=0.85,
        alias="NRC_LOSS_SETTLE",
        ge=0,
        le=60,
        description="After an exec or file operation failed in a way a reset of the runner "
        "could explain (a broken exec, a missing path), how long Nomad is read again for "
        "the runner's loss before the failure is answered (reads at 0, 0.1, 0.25, 0.5 s, "
        "then doubling, and at the end); Nomad's servers hear of a restart a little late.",
        json_schema_extra=_allowed(f"a duration from 0 to 60s, {_DURATION_FORMS}", duration=True),
    )
    nomad_client_sync_s: Duration = Field(
        default=0.25,
        alias="NRC_NOMAD_CLIENT_SYNC",
        ge=0,
        le=10,
        description="How long a Nomad client takes to report what happened to an allocation "
        "(its 200 ms update batch, then the server's 50 ms one). A missing path is answered "
        "424 when the allocation, read from Nomad, shows no restart, kill or migration: at "
        "once when its job restarts a task no sooner than this after deciding to (Poseidon's "
        "template: 15 s), else once this long has passed since its read started; anything in "
        "flight, after NRC_LOSS_SETTLE.",
        json_schema_extra=_allowed(f"a duration from 0 to 10s, {_DURATION_FORMS}", duration=True),
    )
    execution_id_ttl_s: Duration = Field(
        default=300.0,
        alias="NRC_EXECUTION_ID_TTL",
        gt=0,
        description="How long a websocketUrl from /execute stays valid if nobody connects.",
        json_schema_extra=_allowed(f"a duration above 0, {_DURATION_FORMS}", duration=True),
    )
    files_max_upload_bytes: Integer = Field(
        default=100 * 1024 * 1024,
        alias="NRC_FILES_MAX_UPLOAD",
        gt=0,
        description="Largest PATCH /files body in bytes (larger is 413). Bodies are spooled "
        "to a temporary file (TMPDIR), never held in memory.",
        json_schema_extra=_allowed("an integer above 0 (bytes)"),
    )

    # --- runner templates: site policy (Poseidon's production template by default) ---
    template_memory_reservation_mb: Integer = Field(
        default=50,
        alias="NRC_TEMPLATE_MEMORY_RESERVATION",
        ge=10,
        description="Memory in MB each runner reserves for placement (Nomad's MemoryMB); "
        "the environment's memoryLimit is its MemoryMaxMB, which needs memory "
        "oversubscription on the cluster. Poseidon's value.",
        json_schema_extra=_allowed("an integer of at least 10 (MB, Nomad's minimum)"),
    )
    template_ephemeral_disk_mb: Integer = Field(
        default=10,
        alias="NRC_TEMPLATE_EPHEMERAL_DISK",
        ge=10,
        description="Ephemeral disk in MB each runner reserves (Nomad's default is 300).",
        json_schema_extra=_allowed("an integer of at least 10 (MB, Nomad's minimum)"),
    )
    template_network_mode: str = Field(
        default="bridge",
        alias="NRC_TEMPLATE_NETWORK_MODE",
        description="Nomad network mode of runners with networkAccess, e.g. "
        "cni/secure-bridge (Poseidon's example); runners without it get Docker's "
        "network_mode none.",
        json_schema_extra=_allowed("none, bridge, host or cni/<name>"),
    )
    template_datacenters: str = Field(
        default="*",
        alias="NRC_TEMPLATE_DATACENTERS",
        description="Datacenters runners may be placed in, comma-separated (* is every one).",
        json_schema_extra=_allowed("datacenter names or globs, comma-separated"),
    )
    template_force_pull: Boolean = Field(
        default=True,
        alias="NRC_TEMPLATE_FORCE_PULL",
        description="Pull the image whenever a runner starts, so the runners of one "
        "environment never run different images (Poseidon's disableforcepull inverted).",
        json_schema_extra=_allowed(_BOOLEAN),
    )
    template_pids_limit: Integer = Field(
        default=1024,
        alias="NRC_TEMPLATE_PIDS_LIMIT",
        ge=0,
        description="Most processes and threads in one runner (Docker pids_limit), so a "
        "fork bomb stays inside its runner; 0 sets no limit.",
        json_schema_extra=_allowed("an integer, 0 or above"),
    )
    template_cap_drop: str = Field(
        default=",".join(DEFAULT_CAP_DROP),
        alias="NRC_TEMPLATE_CAP_DROP",
        description="Linux capabilities taken from runners (Docker cap_drop), comma-separated; "
        "none drops nothing. Root in a runner needs KILL, SETUID, SETGID, CHOWN, FOWNER "
        "and DAC_OVERRIDE: they cannot be dropped.",
        json_schema_extra=_allowed("capability names without CAP_, comma-separated, or none"),
    )
    template_no_new_privileges: Boolean = Field(
        default=True,
        alias="NRC_TEMPLATE_NO_NEW_PRIVILEGES",
        description="Start runners with Docker's no-new-privileges: setuid binaries "
        "(sudo, su) cannot raise a student's privileges.",
        json_schema_extra=_allowed(_BOOLEAN),
    )
    template_job_file: str | None = Field(
        default=None,
        alias="NRC_TEMPLATE_JOB_FILE",
        description="An operator's own runner template, a Nomad job in HCL (parsed by "
        "Nomad) or JSON, replacing the built-in one (Poseidon's templatejobfile). It "
        "needs group default-group with Docker task default-task.",
        json_schema_extra=_allowed(_FILE),
    )

    # --- the reconcile loop ---
    claim_wait_s: Duration = Field(
        default=2.0,
        alias="NRC_CLAIM_WAIT",
        ge=0,
        le=30,
        description="How long a claim that finds no ready runner waits for one of its "
        "environment (first come, first served) before it answers 500 NOMAD_OVERLOAD; 0 "
        'answers at once, as Poseidon does (docs/operations.md, "Claims that wait").',
        json_schema_extra=_allowed(f"a duration from 0 to 30s, {_DURATION_FORMS}", duration=True),
    )
    claim_max_waiting: Integer = Field(
        default=32,
        alias="NRC_CLAIM_MAX_WAITING",
        ge=0,
        le=1000,
        description="How many claims may wait at once (NRC_CLAIM_WAIT); one more is answered "
        "at once. Each waiting claim holds one of the API's 40 worker threads.",
        json_schema_extra=_allowed("an integer from 0 to 1000"),
    )
    resync_interval_s: Duration = Field(
        default=30.0,
        alias="NRC_RESYNC_INTERVAL",
        gt=0,
        description=(
            "How often every environment is reconciled without an event; each resync re-reads "
            "what events named, and re-lists every job and allocation when no event stream is "
            "connected and on every 10th resync."
        ),
        json_schema_extra=_allowed(f"a duration above 0, {_DURATION_FORMS}", duration=True),
    )
    gc_freeze_interval_s: Duration = Field(
        default=30.0,
        alias="NRC_GC_FREEZE_INTERVAL",
        ge=0,
        le=3600,
        description="How often Python's garbage collector collects what is new and freezes the "
        "rest, so that its own collections no longer walk the whole heap (a pause of 76–97 ms for "
        "every request in flight with 1,500 runners; 4–17 ms frozen). 0: Python's collector as "
        "is.",
        json_schema_extra=_allowed(f"a duration from 0 to 1h, {_DURATION_FORMS}", duration=True),
    )
    gc_full_interval_s: Duration = Field(
        default=600.0,
        alias="NRC_GC_FULL_INTERVAL",
        ge=1,
        le=86400,
        description="How often the whole heap is collected once (unfrozen, collected, frozen "
        "again) while NRC_GC_FREEZE_INTERVAL is on: garbage cycles among frozen objects wait "
        "this long at most.",
        json_schema_extra=_allowed(f"a duration from 1s to 24h, {_DURATION_FORMS}", duration=True),
    )
    gil_switch_interval_s: Duration = Field(
        default=0.0005,
        alias="NRC_GIL_SWITCH_INTERVAL",
        gt=0,
        le=0.1,
        description="How long one of the controller's threads may keep Python's interpreter "
        "lock while another waits for it (sys.setswitchinterval; Python's default is 5ms). The "
        "API's event loop waits up to this long each time it wakes while a pass, a refresh or "
        "the event stream computes, which is what a claim's slowest answers are made of.",
        json_schema_extra=_allowed(
            f"a duration above 0 up to 100ms, {_DURATION_FORMS}", duration=True
        ),
    )
    orphan_grace_s: Duration = Field(
        default=60.0,
        alias="NRC_ORPHAN_GRACE",
        ge=0,
        description="How long runners whose template job is gone are kept before deletion.",
        json_schema_extra=_allowed(f"a duration of at least 0, {_DURATION_FORMS}", duration=True),
    )
    startup_timeout_s: Duration = Field(
        default=300.0,
        alias="NRC_STARTUP_TIMEOUT",
        gt=0,
        description="How long an idle runner may take to start before it is replaced.",
        json_schema_extra=_allowed(f"a duration above 0, {_DURATION_FORMS}", duration=True),
    )
    lost_runner_retention_s: Duration = Field(
        default=3600.0,
        alias="NRC_LOST_RUNNER_RETENTION",
        ge=0,
        description="How long a claimed runner whose file system was reset is kept "
        "so that its client can be told.",
        json_schema_extra=_allowed(f"a duration of at least 0, {_DURATION_FORMS}", duration=True),
    )
    nomad_write_rate_per_s: Number = Field(
        default=50.0,
        alias="NRC_NOMAD_WRITE_RATE",
        ge=0,
        allow_inf_nan=False,
        description="Writes per second sent to Nomad at most; 0 means unlimited.",
        json_schema_extra=_allowed("a number of writes per second, at least 0 (0 = unlimited)"),
    )
    nomad_write_concurrency: Integer = Field(
        default=8,
        alias="NRC_NOMAD_WRITE_CONCURRENCY",
        ge=1,
        le=256,
        description="Writes to Nomad in flight at once (1–256).",
        json_schema_extra=_allowed("an integer between 1 and 256"),
    )
    nomad_exec_on_node: Boolean = Field(
        default=True,
        alias="NRC_NOMAD_EXEC_ON_NODE",
        description=(
            "Open execs on the client agent of the allocation's node first (its HTTPAddr), "
            "falling back to NOMAD_ADDR; false: always through NOMAD_ADDR."
        ),
        json_schema_extra=_allowed(_BOOLEAN),
    )
    nomad_max_conns_per_agent: Integer = Field(
        default=DEFAULT_MAX_CONNS_PER_AGENT,
        alias="NRC_NOMAD_MAX_CONNS_PER_AGENT",
        ge=MIN_MAX_CONNS,
        le=10_000,
        description=(
            "Connections opened or held at once to one Nomad agent (HTTP pool, event stream, "
            "exec handshakes); keep it under the agents' http_max_conns_per_client (100)."
        ),
        json_schema_extra=_allowed(f"an integer between {MIN_MAX_CONNS} and 10000"),
    )
    nomad_conn_queue: Integer = Field(
        default=DEFAULT_QUEUE,
        alias="NRC_NOMAD_CONN_QUEUE",
        ge=0,
        le=100_000,
        description=(
            "Exec handshakes that may wait per Nomad agent for a connection; beyond it "
            "file operations answer 503 NOMAD_OVERLOAD and executions an error frame."
        ),
        json_schema_extra=_allowed("an integer between 0 and 100000"),
    )
    nomad_timeout_s: Duration = Field(
        default=10.0,
        alias="NRC_NOMAD_TIMEOUT",
        gt=0,
        description="Timeout of one request to Nomad.",
        json_schema_extra=_allowed(f"a duration above 0, {_DURATION_FORMS}", duration=True),
    )
    workers: Integer = Field(
        default=4,
        alias="NRC_WORKERS",
        ge=1,
        le=64,
        description="Environments reconciled in parallel (1–64).",
        json_schema_extra=_allowed("an integer between 1 and 64"),
    )
    max_backoff_s: Duration = Field(
        default=30.0,
        alias="NRC_MAX_BACKOFF",
        gt=0,
        description="Longest wait before retrying an environment whose reconcile failed.",
        json_schema_extra=_allowed(f"a duration above 0, {_DURATION_FORMS}", duration=True),
    )
    event_stream: Boolean = Field(
        default=True,
        alias="NRC_EVENT_STREAM",
        description="Subscribe to Nomad's event stream; false reconciles on resyncs only.",
        json_schema_extra=_allowed(_BOOLEAN),
    )
    pool_alert_threshold: Number = Field(
        default=0.5,
        alias="NRC_POOL_ALERT_THRESHOLD",
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="/health reports PREWARMING_POOL_DEPLETING when an environment's "
        "idle runners fall below this fraction of its pool size (0–1).",
        json_schema_extra=_allowed("a number between 0 and 1"),
    )
    max_pool_size: Integer = Field(
        default=10000,
        alias="NRC_MAX_POOL_SIZE",
        ge=0,
        description="Largest prewarmingPoolSize the API accepts for an environment.",
        json_schema_extra=_allowed("an integer, at least 0"),
    )
    failure_budget: Integer = Field(
        default=3,
        alias="NRC_FAILURE_BUDGET",
        ge=1,
        description="Consecutive runner start failures before an environment is degraded.",
        json_schema_extra=_allowed("an integer, at least 1"),
    )
    prewarm_policy: Annotated[PrewarmPolicy, BeforeValidator(_lower)] = Field(
        default="static",
        alias="NRC_PREWARM_POLICY",
        description="How large each environment's pool is: static keeps prewarmingPoolSize "
        "idle runners; adaptive sizes it from the claims seen (docs/prewarming.md), "
        "never below prewarmingPoolSize.",
        json_schema_extra=_allowed("static or adaptive (any case)"),
    )
    prewarm_ceiling_multiple: Number = Field(
        default=10.0,
        alias="NRC_PREWARM_CEILING_MULTIPLE",
        ge=1,
        le=1000,
        allow_inf_nan=False,
        description="Adaptive prewarming: the largest pool as a multiple of prewarmingPoolSize.",
        json_schema_extra=_allowed("a number between 1 and 1000"),
    )
    prewarm_ceiling_cap: Integer = Field(
        default=100,
        alias="NRC_PREWARM_CEILING_CAP",
        ge=0,
        description="Adaptive prewarming: the largest pool of any environment, whatever its "
        "multiple (never below its prewarmingPoolSize).",
        json_schema_extra=_allowed("an integer, at least 0"),
    )

    # --- leader election ---
    leader_election: Boolean = Field(
        default=False,
        alias="NRC_LEADER_ELECTION",
        description="Elect one active replica through a Nomad variable lock.",
        json_schema_extra=_allowed(_BOOLEAN),
    )
    leader_lock_path: str = Field(
        default="nomad-runner-controller/leader",
        alias="NRC_LEADER_LOCK_PATH",
        description="Path of the Nomad variable whose lock elects the leader.",
        json_schema_extra=_allowed(
            f"a Nomad variable path: up to {MAX_LOCK_PATH} letters, digits, '-', '_', '~' and "
            "'/', without a leading, trailing or doubled '/', and under nomad/ only "
            "in nomad/jobs/"
        ),
    )
    leader_ttl_s: Duration = Field(
        default=15.0,
        alias="NRC_LEADER_TTL",
        ge=10,
        le=24 * 3600,
        description="Lease of the leader lock; another replica takes over within about "
        "twice this after the leader dies.",
        # Nomad refuses lock TTLs outside 10 s … 24 h.
        json_schema_extra=_allowed(
            f"a duration between 10s and 24h, {_DURATION_FORMS}", duration=True
        ),
    )

    activity_publish_interval_s: Duration = Field(
        default=1.0,
        alias="NRC_ACTIVITY_PUBLISH_INTERVAL",
        gt=0,
        le=60,
        description="With leader election: how often each replica writes the runners touched "
        "through it to a Nomad variable, and at most how often the leader reads them before "
        "it releases a claim for inactivity (docs/inactivity.md). A runner is kept while it "
        "is touched through any replica more often than its inactivity timeout minus twice "
        "this.",
        json_schema_extra=_allowed(
            f"a duration above 0 and at most 60s, {_DURATION_FORMS}", duration=True
        ),
    )

    # --- logging ---
    log_level: Annotated[LogLevel, BeforeValidator(_log_level)] = Field(
        default="INFO",
        alias="NRC_LOG_LEVEL",
        description="Least severe log level written: DEBUG, INFO, WARNING or ERROR; "
        "Poseidon's TRACE is DEBUG, WARN WARNING, FATAL and PANIC ERROR.",
        json_schema_extra=_allowed(
            "one of DEBUG, INFO, WARNING, ERROR, or Poseidon's TRACE, WARN, FATAL, PANIC (any case)"
        ),
    )
    log_format: Annotated[LogFormat, BeforeValidator(_log_format)] = Field(
        default="auto",
        alias="NRC_LOG_FORMAT",
        description="Log line format: json, text, or auto (text on a terminal, json "
        "otherwise); Poseidon's TextFormatter and JSONFormatter are text and json.",
        json_schema_extra=_allowed(
            "one of json, text, auto, TextFormatter, JSONFormatter (any case)"
        ),
    )

    # --- security: authentication that cannot fail open, browser defences, bounds ---
    api_allow_unauthenticated: Boolean = Field(
        default=False,
        alias="NRC_API_ALLOW_UNAUTHENTICATED",
        description="Let `run` serve without NRC_API_TOKEN on an address other than "
        "loopback (anyone who reaches it drives the runners); without it, it refuses to start.",
        json_schema_extra=_allowed(_BOOLEAN),
    )
    api_allowed_hosts: str | None = Field(
        default=None,
        alias="NRC_API_ALLOWED_HOSTS",
        description="Host header values the API answers (others: 400; DNS rebinding), "
        "comma-separated, * for any; unset: NRC_API_HOST, localhost, 127.0.0.1 and ::1, "
        "or any when NRC_API_HOST is 0.0.0.0 or ::.",
        json_schema_extra=_allowed("host names or addresses without port, comma-separated, or *"),
    )
    api_allowed_origins: str | None = Field(
        default=None,
        alias="NRC_API_ALLOWED_ORIGINS",
        description="Browser origins (scheme://host[:port]) the API and the execution "
        "WebSocket accept, comma-separated; unset: none. A request without Origin (not a "
        "browser) is accepted.",
        json_schema_extra=_allowed("origins such as https://lms.example, comma-separated"),
    )

    execution_max_pending_per_runner: Integer = Field(
        default=16,
        alias="NRC_EXECUTION_MAX_PENDING_PER_RUNNER",
        ge=1,
        description="Execution ids of one runner that may wait for their WebSocket connect; "
        "another /execute is 429.",
        json_schema_extra=_allowed("a positive integer"),
    )
    execution_max_pending: Integer = Field(
        default=256,
        alias="NRC_EXECUTION_MAX_PENDING",
        ge=1,
        description="Execution ids that may wait for their WebSocket connect in all; "
        "another /execute is 429.",
        json_schema_extra=_allowed("a positive integer"),
    )
    execution_max_command_bytes: Integer = Field(
        default=64 * 1024,
        alias="NRC_EXECUTION_MAX_COMMAND_SIZE",
        ge=1024,
        le=128 * 1024 - 1,
        description="Largest command with its environment in bytes, as the runner's shell "
        "gets it (quoted); larger is 400. Linux runs no argument of 128 KiB or more.",
        json_schema_extra=_allowed("an integer between 1024 and 131071 (bytes)"),
    )

    files_max_items: Integer = Field(
        default=10_000,
        alias="NRC_FILES_MAX_ITEMS",
        ge=1,
        description="Most delete and copy items in one PATCH /files (more is 400): each "
        "costs memory and time far beyond its bytes.",
        json_schema_extra=_allowed("a positive integer"),
    )
    files_max_path_bytes: Integer = Field(
        default=4 * 1024 * 1024,
        alias="NRC_FILES_MAX_PATH_BYTES",
        ge=4096,
        description="Most bytes of all paths of one PATCH /files together (more is 400).",
        json_schema_extra=_allowed("an integer of 4096 or more (bytes)"),
    )
    files_max_range_header: Integer = Field(
        default=200,
        alias="NRC_FILES_MAX_RANGE_HEADER",
        ge=32,
        description="Longest Range header of a download, in characters; longer is 400 before "
        "it is parsed (one `bytes=first-last` needs under 50).",
        json_schema_extra=_allowed("an integer of 32 or more"),
    )
    files_max_concurrent_uploads: Integer = Field(
        default=8,
        alias="NRC_FILES_MAX_CONCURRENT_UPLOADS",
        ge=1,
        description="PATCH /files requests at once; one more is 503 at once (Retry-After).",
        json_schema_extra=_allowed("a positive integer"),
    )
    files_upload_idle_timeout_s: Duration = Field(
        default=30.0,
        alias="NRC_FILES_UPLOAD_IDLE_TIMEOUT",
        gt=0,
        description="How long a PATCH /files body may send nothing before it is 408 (a "
        "stalled client would keep its runner in use).",
        json_schema_extra=_allowed(f"a duration above 0, {_DURATION_FORMS}", duration=True),
    )

    api_request_head_timeout_s: Duration = Field(
        default=10.0,
        alias="NRC_API_REQUEST_HEAD_TIMEOUT",
        gt=0,
        description="How long a connection may take to send a request's headers before it "
        "is closed (slowloris: before any token could be checked).",
        json_schema_extra=_allowed(f"a duration above 0, {_DURATION_FORMS}", duration=True),
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only the environment: no .env file or secrets directory that could
        # change the configuration without showing up in `env`.
        environ = _ENVIRON.get()
        if environ is not None:
            env_settings = _MappingSource(settings_cls, environ)
        return init_settings, env_settings

    # --- validators ---

    @field_validator("nomad_addr")
    @classmethod
    def _check_addr(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        # Reading .port raises ValueError for a port that is not 0–65535.
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0:
            raise ValueError("not an http(s) URL")
        if parts.username is not None or parts.query or parts.fragment:
            raise ValueError("credentials, query or fragment")
        return value.strip().rstrip("/")

    @field_validator("api_advertise_url")
    @classmethod
    def _check_advertise_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0:
            raise ValueError("not an http(s) URL")
        if parts.username is not None or parts.query or parts.fragment:
            raise ValueError("credentials, query or fragment")
        if parts.path not in ("", "/"):
            raise ValueError("a path (the API's own paths are added to it)")
        return value.strip().rstrip("/")

    @field_validator("replica_secret")
    @classmethod
    def _check_replica_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        secret = value.get_secret_value()
        if not _NO_SPACE.fullmatch(secret):
            raise ValueError("whitespace in secret")
        if len(secret) < MIN_REPLICA_SECRET_LENGTH:
            raise ValueError(f"shorter than {MIN_REPLICA_SECRET_LENGTH} characters")
        return value

    @field_validator("nomad_token", "api_token")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        # requests refuses header values with line breaks anyway; say so at
        # startup rather than on every request.
        if value is not None and not _NO_SPACE.fullmatch(value.get_secret_value()):
            raise ValueError("whitespace in token")
        return value

    @field_validator("api_token")
    @classmethod
    def _check_api_token(cls, value: SecretStr | None) -> SecretStr | None:
        # A short token can be guessed; the platform stores it, nobody types it.
        if value is not None and len(value.get_secret_value()) < MIN_API_TOKEN_LENGTH:
            raise ValueError(f"shorter than {MIN_API_TOKEN_LENGTH} characters")
        return value

    @field_validator("nomad_namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        if not _NAMESPACE.fullmatch(value):
            raise ValueError("invalid namespace")
        return value

    @field_validator("exec_unprivileged_wrapper")
    @classmethod
    def _check_wrapper(cls, value: str) -> str:
        try:
            shlex.split(value)
        except ValueError:
            raise ValueError("not shell words (an unclosed quote?)") from None
        return value.strip()

    @field_validator("nomad_region", "api_host", "exec_task")
    @classmethod
    def _check_word(cls, value: str | None) -> str | None:
        if value is not None and not _NO_SPACE.fullmatch(value):
            raise ValueError("whitespace")
        return value

    @field_validator("template_network_mode")
    @classmethod
    def _check_network_mode(cls, value: str) -> str:
        value = value.strip()
        if value not in ("none", "bridge", "host") and not _CNI_MODE.fullmatch(value):
            raise ValueError("not a network mode")
        return value

    @field_validator("api_allowed_hosts", "api_allowed_origins")
    @classmethod
    def _check_list(cls, value: str | None) -> str | None:
        if value is None:
            return None
        names = [n.strip() for n in value.split(",")]
        if not all(_NO_SPACE.fullmatch(n) for n in names):
            raise ValueError("an empty or blank entry")
        return ",".join(names)

    @field_validator("template_datacenters")
    @classmethod
    def _check_datacenters(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",")]
        if not all(_NO_SPACE.fullmatch(n) for n in names):
            raise ValueError("an empty or blank datacenter name")
        return ",".join(names)

    @field_validator("template_cap_drop")
    @classmethod
    def _check_cap_drop(cls, value: str) -> str:
        caps = _capabilities(value)
        needed = sorted(set(caps) & set(RUNNER_CAPABILITIES))
        if needed:
            raise ValueError(f"runners need {', '.join(c.upper() for c in needed)}")
        if not all(_CAPABILITY.fullmatch(c) for c in caps):
            raise ValueError("not capability names")
        return ",".join(caps) if caps else "none"

    @field_validator("nomad_cacert", "nomad_client_cert", "nomad_client_key", "template_job_file")
    @classmethod
    def _check_file(cls, value: str | None) -> str | None:
        # requests would only fail at the first request, with a bare OSError.
        if value is not None and not (os.path.isfile(value) and os.access(value, os.R_OK)):
            raise ValueError("no such file")
        return value

    @field_validator("leader_lock_path")
    @classmethod
    def _check_lock_path(cls, value: str) -> str:
        # Nomad's validatePath: its character set (no '.', which templates
        # use as a separator) and the reserved top-level "nomad/" tree. Empty
        # segments would address a different variable than the operator meant.
        parts = value.split("/")
        if not _VARIABLE_PATH.fullmatch(value) or "" in parts or len(value) > MAX_LOCK_PATH:
            raise ValueError("invalid variable path")
        if parts[0] == "nomad" and not (len(parts) > 2 and parts[1] == "jobs"):
            raise ValueError("reserved variable path")
        return value

    @model_validator(mode="after")
    def _check_client_pair(self) -> Settings:
        # A certificate without its key (or the reverse) cannot authenticate;
        # Nomad's CLI silently ignores the half it got.
        if self.nomad_client_cert is not None and self.nomad_client_key is None:
            if _holds_private_key(self.nomad_client_cert):
                return self  # one PEM holding certificate and key
            raise ValueError(
                "NOMAD_CLIENT_KEY: must be set together with NOMAD_CLIENT_CERT (only "
                "NOMAD_CLIENT_CERT is set, and its file holds no private key)"
            )
        if (self.nomad_client_cert is None) != (self.nomad_client_key is None):
            have, missing = (
                ("NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY")
                if self.nomad_client_cert is not None
                else ("NOMAD_CLIENT_KEY", "NOMAD_CLIENT_CERT")
            )
            raise ValueError(f"{missing}: must be set together with {have} (only {have} is set)")
        return self

    # --- what the rest of the controller needs ---

    def open_api_problem(self) -> str | None:
        """Why `run` must not start: the API would take requests without a
        token on an address other than loopback, and nobody said so."""
        if self.api_token is not None or self.api_allow_unauthenticated:
            return None
        if is_loopback(self.api_host):
            return None
        return (
            f"NRC_API_TOKEN is not set and the API would listen on {self.api_host}, open to "
            "anyone who reaches it: set NRC_API_TOKEN (16 characters or more), listen on "
            "127.0.0.1, or set NRC_API_ALLOW_UNAUTHENTICATED=true"
        )

    @property
    def api_auth_token(self) -> str | None:
        """The token API clients must present; None disables authentication."""
        return self.api_token.get_secret_value() if self.api_token is not None else None

    @property
    def effective_log_format(self) -> Literal["json", "text"]:
        """`log_format` with `auto` resolved against the process's stderr."""
        return self.resolve_log_format(sys.stderr)

    def resolve_log_format(self, stream: TextIO | None) -> Literal["json", "text"]:
        """`log_format` with `auto` resolved: text when `stream` is a terminal."""
        if self.log_format != "auto":
            return self.log_format
        try:
            tty = stream is not None and stream.isatty()
        except ValueError:  # a closed stream
            tty = False
        return "text" if tty else "json"

    def controller_settings(self) -> ControllerSettings:
        """The reconcile loop's settings; knobs without a variable keep their defaults."""
        return ControllerSettings(
            resync_interval_s=self.resync_interval_s,
            workers=self.workers,
            write_concurrency=self.nomad_write_concurrency,
            write_rate_per_s=self.nomad_write_rate_per_s,
            max_backoff_s=self.max_backoff_s,
            leader_election=self.leader_election,
            leader_lock_path=self.leader_lock_path,
            leader_ttl_s=self.leader_ttl_s,
            activity_publish_interval_s=self.activity_publish_interval_s,
            claim_wait_s=self.claim_wait_s,
            claim_max_waiting=self.claim_max_waiting,
            prewarm=PrewarmSettings(
                adaptive=self.prewarm_policy == "adaptive",
                ceiling_multiple=self.prewarm_ceiling_multiple,
                ceiling_cap=self.prewarm_ceiling_cap,
            ),
            plan=PlanSettings(
                orphan_grace_ns=round(self.orphan_grace_s * SECOND),
                startup_timeout_ns=round(self.startup_timeout_s * SECOND),
                lost_retention_ns=round(self.lost_runner_retention_s * SECOND),
                degraded_after=self.failure_budget,
            ),
        )

    def template_policy(self, base: dict[str, Any] | None = None) -> TemplatePolicy:
        """What template jobs are written with; `base` is the operator's
        template file as Nomad's JSON (read by the service, which may need
        Nomad to parse it)."""
        return TemplatePolicy(
            memory_reservation_mb=self.template_memory_reservation_mb,
            ephemeral_disk_mb=self.template_ephemeral_disk_mb,
            network_mode=self.template_network_mode,
            datacenters=tuple(self.template_datacenters.split(",")),
            force_pull=self.template_force_pull,
            pids_limit=self.template_pids_limit,
            cap_drop=tuple(_capabilities(self.template_cap_drop)),
            no_new_privileges=self.template_no_new_privileges,
            base=base,
        )

    def execution_settings(self) -> ExecutionSettings:
        wrapper = self.exec_unprivileged_wrapper
        return ExecutionSettings(
            exec=ExecSettings(
                task=self.exec_task,
                unprivileged_wrapper=() if wrapper.lower() == "none" else parse_wrapper(wrapper),
                separate_stderr=self.exec_separate_stderr,
            ),
            id_ttl_s=self.execution_id_ttl_s,
            limits=Limits(
                max_pending_per_runner=self.execution_max_pending_per_runner,
                max_pending=self.execution_max_pending,
                max_command_bytes=self.execution_max_command_bytes,
            ),
            broken_as_exit_zero=self.exec_broken_end == "exit0",
            signal_loss_window_s=self.exec_signal_loss_window_s,
            loss_settle_s=self.loss_settle_s,
            client_sync_s=self.nomad_client_sync_s,
            ids=self.id_signer(),
        )

    def id_signer(self) -> Signer | None:
        """How execution ids name this replica; None (ids stay local) without
        NRC_API_ADVERTISE_URL or without a key (NRC_REPLICA_SECRET, NRC_API_TOKEN)."""
        secret = self.replica_secret.get_secret_value() if self.replica_secret else None
        key = replica_key(secret, self.api_auth_token)
        if self.api_advertise_url is None or key is None:
            return None
        return Signer(self.api_advertise_url, key)

    def replicas_problem(self) -> str | None:
        """The startup warning when ids cannot leave this replica although
        NRC_API_ADVERTISE_URL says replicas share them."""
        if self.api_advertise_url is None or self.id_signer() is not None:
            return None
        return (
            "NRC_API_ADVERTISE_URL is set but neither NRC_REPLICA_SECRET nor NRC_API_TOKEN "
            "is: execution ids are not signed, so a websocketUrl works only on the replica "
            "that answered it"
        )

    def file_settings(self) -> FileSettings:
        return FileSettings(
            exec=self.execution_settings().exec,
            max_upload_bytes=self.files_max_upload_bytes,
            upload_limits=UploadLimits(
                max_items=self.files_max_items, max_path_bytes=self.files_max_path_bytes
            ),
            max_range_header=self.files_max_range_header,
        )

    def budget_settings(self) -> BudgetSettings:
        return BudgetSettings(
            max_conns_per_agent=self.nomad_max_conns_per_agent, queue=self.nomad_conn_queue
        )

    def nomad_connection(self, address: str | None = None) -> NomadConnection:
        """Where and how to reach Nomad (at `address` instead of NOMAD_ADDR
        when given), TLS built once: the one value the HTTP client, the event
        stream and the exec client share. Holds the token: never log it."""
        token = self.nomad_token.get_secret_value() if self.nomad_token is not None else None
        return NomadConnection(
            address=address if address is not None else self.nomad_addr,
            token=token,
            namespace=self.nomad_namespace,
            region=self.nomad_region,
            ca_cert=self.nomad_cacert,
            client_cert=self.nomad_client_cert,
            client_key=self.nomad_client_key,
            verify=not self.nomad_skip_verify,
        )


# --- loading -----------------------------------------------------------------

# The environment `load_settings` was given, for `settings_customise_sources`
# (a classmethod, so it cannot be handed the mapping directly). A ContextVar
# keeps concurrent loads in threads or tasks apart.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("nrc_environ", default=None)


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source reading a given mapping instead
    of os.environ, so that tests and `load_settings(environ)` are hermetic."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        # Before super(), which loads the variables. Our _load_env_vars
        # replaces the one that drops empty values, so drop them here.
        self._environ = {name: value for name, value in environ.items() if value}
        super().__init__(settings_cls, case_sensitive=True, env_ignore_empty=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return self._environ


def _fields() -> Iterator[tuple[str, str, FieldInfo]]:
    """(field name, variable, field info) in declaration order."""
    for name, info in Settings.model_fields.items():
        assert info.alias is not None  # every field has its variable
        yield name, info.alias, info


def variables() -> tuple[str, ...]:
    """Every variable the controller reads, in documentation order."""
    return tuple(var for _, var, _ in _fields())


def _extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    assert isinstance(extra, dict)
    return extra


def _is_secret(info: FieldInfo) -> bool:
    return bool(_extra(info)["secret"])


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from `environ` (default: os.environ).

    Raises ConfigError listing every problem, one line each: values that are
    not allowed and `NRC_*` variables that are not ours (most likely typos)."""
    env = dict(os.environ if environ is None else environ)
    problems = _unknown_variables(env)
    token = _ENVIRON.set(env)
    try:
        settings = Settings()
    except ValidationError as exc:
        # `from None`: the pydantic error would repeat the values (tokens too)
        # and add documentation links; our lines already say everything.
        raise ConfigError([*problems, *_problems(exc, env)]) from None
    finally:
        _ENVIRON.reset(token)
    if problems:
        raise ConfigError(problems)
    return settings


def _unknown_variables(environ: Mapping[str, str]) -> list[str]:
    known = variables()
    ours = [v for v in known if v.startswith(PREFIX)]
    problems = []
    for name in sorted(environ):
        # Lower-case spellings count too: the variables are case-sensitive,
        # so `nrc_api_port` would otherwise be ignored without a word.
        if not name.upper().startswith(PREFIX) or name in known:
            continue
        if name.upper() in known:
            hint = f"did you mean {name.upper()}? variable names are case-sensitive"
        else:
            close = difflib.get_close_matches(name.upper(), ours, n=3, cutoff=0.75)
            hint = (
                f"did you mean {' or '.join(close)}?" if close else "no NRC_ setting is spelt alike"
            )
        problems.append(f"{name}: unknown variable ({hint})")
    return problems


def _problems(exc: ValidationError, environ: Mapping[str, str]) -> list[str]:
    fields = {var: info for _, var, info in _fields()}
    problems = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        if not loc:
            # A model validator's message already names its variables.
            problems.append(str(error.get("ctx", {}).get("error", error["msg"])))
            continue
        var = str(loc[0])
        info = fields.get(var)
        if info is None:  # not through load_settings' aliases; say what pydantic said
            problems.append(f"{var}: {error['msg']}")
            continue
        line = f"{var}: must be {_extra(info)['allowed']}"
        # The operator's own text: pydantic's input may already be converted
        # ("0" → 0, "verbose" → "VERBOSE").
        shown = _shown_input(info, var, environ.get(var))
        problems.append(line if shown is None else f"{line} (got {shown})")
    return problems


def _shown_input(info: FieldInfo, var: str, value: str | None) -> str | None:
    """The rejected value quoted for an error line, or None if it must not be shown."""
    if _is_secret(info) or value is None:
        return None
    if var in ("NOMAD_ADDR", "NRC_API_ADVERTISE_URL") and "@" in value:
        return None  # may hold user:password
    if len(value) > 80:
        value = value[:77] + "..."
    # json.dumps quotes and escapes line breaks, keeping the message one line.
    return json.dumps(value, ensure_ascii=False)


# --- describing --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SettingRow:
    """One variable as `describe` shows it. Secrets show as `(set)`/`(unset)`."""

    variable: str
    value: str
    source: str  # "environment" or "default"
    description: str
    default: str


def _show(info: FieldInfo, value: Any) -> str:
    if value is None:
        return UNSET
    if isinstance(value, SecretStr):
        return SET  # never the value, not even its length
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if _extra(info)["duration"]:
            return format_duration(value)
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def describe(settings: Settings, environ: Mapping[str, str] | None = None) -> list[SettingRow]:
    """Every variable with its effective value and where it came from.

    `source` is "environment" when `environ` sets the variable (non-empty);
    without `environ`, when the settings were loaded with it set."""
    rows = []
    for name, var, info in _fields():
        if environ is not None:
            from_env = bool(environ.get(var))
        else:
            from_env = name in settings.model_fields_set
        rows.append(
            SettingRow(
                variable=var,
                value=_show(info, getattr(settings, name)),
                source=ENVIRONMENT if from_env else DEFAULT,
                description=info.description or "",
                default=_show(info, info.default),
            )
        )
    return rows


def render_table(rows: Sequence[SettingRow], markdown: bool = False) -> str:
    """A table of `rows`: aligned plain text (variable, value, source,
    description) for a terminal, or Markdown (variable, default, description)
    for the README; the Markdown table shows defaults, not this machine's values."""
    if markdown:
        lines = ["| variable | default | description |", "|---|---|---|"]
        for row in rows:
            default = row.default if row.default == UNSET else f"`{row.default}`"
            cells = (f"`{row.variable}`", default, row.description)
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(lines) + "\n"
    table = [("VARIABLE", "VALUE", "SOURCE", "DESCRIPTION")]
    table += [(r.variable, r.value, r.source, r.description) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    lines = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)), row[3]])
        for row in table
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n"
