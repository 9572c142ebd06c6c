"""The JSON bodies of the HTTP API, with Poseidon's field names.

Request bodies are validated strictly: unknown fields, missing required
fields and wrong JSON types are errors (a number is never read from a string,
nor a boolean from a number). The one leniency is JSON Schema's own: an
integer field takes a number with a zero fractional part (`5.0`), since the
published schema allows it.

Where Poseidon's own clients send less than its schema asks, we take what
Poseidon takes: an environment without `id` (the path has it; Poseidon's
request type has none), `exposedPorts` left out, and `null` for
`exposedPorts` and for `environment` (Go decodes `null` into an empty list
or map).

Bounds beyond Poseidon's schema guard the cluster and keep every value
representable where it ends up (Nomad's int64 fields, nanosecond deadlines).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from controller.execution.command import ENV_NAME, refused_env_name
from controller.model import Phase

MAX_ID = 2**63 - 1  # ids are Go int64 in Poseidon and in clients
# A deadline in nanoseconds (claim time + timeout) must stay within int64.
MAX_INACTIVITY_TIMEOUT_S = (2**63 - 1) // 1_000_000_000
MAX_RESOURCE = 2**31 - 1  # MHz / MB; far above any node, and an int everywhere
MAX_PORT = 65535


class ErrorCode(StrEnum):
    """Machine-readable error codes: Poseidon's, plus NOT_LEADER and SHUTTING_DOWN."""

    NOMAD_UNREACHABLE = "NOMAD_UNREACHABLE"
    NOMAD_OVERLOAD = "NOMAD_OVERLOAD"
    NOMAD_INTERNAL_SERVER_ERROR = "NOMAD_INTERNAL_SERVER_ERROR"
    PREWARMING_POOL_DEPLETING = "PREWARMING_POOL_DEPLETING"
    UNKNOWN = "UNKNOWN"
    NOT_LEADER = "NOT_LEADER"
    SHUTTING_DOWN = "SHUTTING_DOWN"


def _integral(value: Any) -> Any:
    """`5.0` → `5` (JSON Schema counts it as an integer); anything else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _no_list(value: Any) -> Any:
    """JSON `null` for a list: an empty one, as Go decodes it."""
    return [] if value is None else value


def _no_map(value: Any) -> Any:
    """JSON `null` for an object: an empty one, as Go decodes it."""
    return {} if value is None else value


Integer = Annotated[int, BeforeValidator(_integral)]
# Constraints before the validator, or pydantic leaves them out of the JSON schema.
Port = Annotated[int, Field(ge=1, le=MAX_PORT), BeforeValidator(_integral)]
Id = Annotated[int, Field(ge=0, le=MAX_ID), BeforeValidator(_integral)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class RunnerRequest(_Request):
    """Body of `POST /runners`."""

    executionEnvironmentId: Integer = Field(
        ge=0, le=MAX_ID, description="The execution environment of the runner."
    )
    inactivityTimeout: Integer = Field(
        default=0,
        ge=0,
        le=MAX_INACTIVITY_TIMEOUT_S,
        description=(
            "Seconds without activity after which the runner is released; 0 means no "
            "timeout. Every request that touches the runner restarts the timer."
        ),
    )


class EnvironmentRequest(_Request):
    """Body of `PUT /execution-environments/{id}`."""

    id: Id | None = Field(
        default=None,
        description="The id in the path; may be left out (Poseidon ignores it), but if "
        "given must equal it.",
    )
    image: str = Field(min_length=1, description="The OCI image runners are started from.")
    prewarmingPoolSize: Integer = Field(
        ge=0, description="Idle runners to keep ready (at most the configured maximum)."
    )
    cpuLimit: float = Field(
        gt=0,
        le=MAX_RESOURCE,
        allow_inf_nan=False,
        description="CPU limit of one runner in MHz; a fraction is rounded up to a whole MHz.",
    )
    memoryLimit: Integer = Field(gt=0, le=MAX_RESOURCE, description="Memory of one runner in MB.")
    networkAccess: bool = Field(description="Whether runners may reach the network.")
    exposedPorts: Annotated[list[Port], BeforeValidator(_no_list)] = Field(
        default_factory=list,
        description=(
            "Left out or `null`: none. "
            "Ports inside the runner to publish, without duplicates. Published only with "
            "networkAccess; without it the environment is stored with none."
        ),
        json_schema_extra={"uniqueItems": True, "type": ["array", "null"]},
    )

    @field_validator("exposedPorts")
    @classmethod
    def _no_duplicates(cls, ports: list[int]) -> list[int]:
        if len(set(ports)) != len(ports):
            raise ValueError("ports must not repeat")
        return ports


# A time limit in seconds that any clock can add to "now" (Poseidon's is uint64).
MAX_TIME_LIMIT_S = 10 * 365 * 24 * 3600
_NO_NUL = "^[^\\x00]*$"


def _no_nul(text: str) -> str:
    # The command and the values become process arguments, which cannot hold NUL.
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    return text


class ExecutionRequest(_Request):
    """Body of `POST /runners/{id}/execute`."""

    command: str = Field(
        description="The command, run with `/bin/bash -c` in the runner.",
        json_schema_extra={"pattern": _NO_NUL},
    )
    timeLimit: Integer = Field(
        default=0,
        ge=0,
        le=MAX_TIME_LIMIT_S,
        description="Seconds the execution may run, counted from the WebSocket connect; "
        "0 means no limit.",
    )
    privilegedExecution: bool = Field(
        default=False, description="Run as root instead of the image's unprivileged user."
    )
    environment: Annotated[dict[str, str], BeforeValidator(_no_map)] = Field(
        default_factory=dict,
        description="Environment variables for the command (`null`: none; names: letters, "
        "digits, `_`, not starting with a digit; not BASH_ENV, ENV, SHELLOPTS, BASHOPTS, "
        "PROMPT_COMMAND, PS4, IFS, BASH_XTRACEFD, GLOBIGNORE, EXECIGNORE, CDPATH, GCONV_PATH, "
        "LD_*, BASH_FUNC_*, NRC_* or NOMAD_*). Values are passed as they are, quotes and spaces "
        "included.",
        json_schema_extra={
            "type": ["object", "null"],
            "propertyNames": {"pattern": f"^{ENV_NAME.pattern}$"},
            "additionalProperties": {"type": "string", "pattern": _NO_NUL},
        },
    )

    @field_validator("command")
    @classmethod
    def _command(cls, command: str) -> str:
        return _no_nul(command)

    @field_validator("environment")
    @classmethod
    def _environment(cls, environment: dict[str, str]) -> dict[str, str]:
        for name, value in environment.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if refused_env_name(name):
                raise ValueError(
                    f"{name!r} may not be set: it changes how the shell or the loader "
                    "runs the command, or it is the controller's or Nomad's"
                )
            _no_nul(value)
        return environment


class ExecutionCreated(BaseModel):
    """Answer of `POST /runners/{id}/execute`."""

    websocketUrl: str = Field(
        description="Connect here (once, with the API token) to run the command and "
        "receive its output."
    )


class Error(BaseModel):
    """Every error answer: a message for people, and a code for some."""

    model_config = ConfigDict(extra="forbid")

    message: str
    errorCode: ErrorCode | SkipJsonSchema[None] = None


class MappedPort(BaseModel):
    exposedPort: int = Field(ge=0, le=MAX_PORT, description="The port inside the runner.")
    hostAddress: str = Field(description="Where it is reachable: `ip:port`.")


class RunnerCreated(BaseModel):
    runnerId: str
    mappedPorts: list[MappedPort]


class RunnerStatus(BaseModel):
    """A claimed runner as the controller sees it (not part of Poseidon's API)."""

    runnerId: str
    executionEnvironmentId: int
    status: Phase = Field(description="The runner's phase, derived from all its allocations.")
    allocationId: str | None = Field(description="Its current allocation, if any.")
    nodeName: str | None = Field(description="The node of its current allocation, if any.")
    claimedAt: datetime | None = Field(
        description="When it was claimed (UTC); null for claims adopted from Poseidon."
    )
    inactivityTimeout: int = Field(description="Seconds; 0 means no timeout.")


class ExecutionEnvironment(BaseModel):
    """An execution environment as stored in its Nomad template job."""

    model_config = ConfigDict(extra="forbid")

    id: int
    image: str
    prewarmingPoolSize: int
    cpuLimit: int
    memoryLimit: int
    networkAccess: bool
    exposedPorts: list[int]


class EnvironmentList(BaseModel):
    executionEnvironments: list[ExecutionEnvironment]


class EnvironmentStatistics(BaseModel):
    id: int
    prewarmingPoolSize: int
    idleRunners: int = Field(description="Idle runners that are ready to be handed out.")
    usedRunners: int = Field(description="Runners claimed by clients (lost ones not counted).")


PrewarmReason = Literal["static", "forecast", "floor", "ceiling", "held"]
PREWARM_REASONS: dict[str, PrewarmReason] = {
    "forecast": "forecast",
    "floor": "floor",
    "ceiling": "ceiling",
    "held": "held",
}


class PrewarmingForecast(BaseModel):
    claimsPerSecond: float = Field(description="The demand rate the pool is sized for.")
    component: Literal["steady", "seasonal", "panic"] = Field(
        description="Which reading of the demand that rate is: the last 10 minutes (steady), "
        "the same time of the last weeks (seasonal) or the last seconds (panic)."
    )
    steadyClaimsPerSecond: float
    seasonalClaimsPerSecond: float
    panicClaimsPerSecond: float
    leadTimeSeconds: float = Field(description="How long a new runner takes to be ready.")
    expectedClaims: float = Field(description="Claims expected during one lead time.")
    safetyStock: float = Field(description="Runners kept beyond the expected claims.")


class Prewarming(BaseModel):
    id: int
    policy: Literal["static", "adaptive"] = Field(description="NRC_PREWARM_POLICY.")
    prewarmingPoolSize: int = Field(description="The floor: never fewer idle runners wanted.")
    ceiling: int = Field(description="The most idle runners an adaptive pool keeps.")
    target: int = Field(description="Idle runners (ready or starting) kept now.")
    reason: PrewarmReason = Field(
        description="Why the target is what it is (held: a higher target needed within "
        "the last 10 minutes is kept)."
    )
    forecast: PrewarmingForecast | None = Field(
        description="The demand behind an adaptive target; null when static or before "
        "the environment's first pass."
    )


class Status(BaseModel):
    status: str = Field(examples=["ok"])


class Readiness(Status):
    role: Literal["leader", "follower"] = Field(
        description="Every replica that serves answers claims, executions and files; the "
        "leader alone keeps the pools up (creates, deletes, expires runners).",
        examples=["leader"],
    )


class FileCopy(BaseModel):
    path: str = Field(
        description="Where the file goes: relative to the working directory, or absolute. "
        "Ending in `/`: a directory (mode 1777; content ignored). Missing parents are created."
    )
    content: str | None = Field(
        default=None,
        description="The file's bytes in standard base64 (mode 0744, owned by root); "
        "missing or null: an empty file.",
    )


class FileUpdate(BaseModel):
    """Documents `PATCH /files` (its body is parsed as a stream, not by this model)."""

    delete: list[str] | None = Field(
        default=None,
        description="Paths deleted recursively before anything is copied; `./*` keeps its "
        "glob meaning.",
    )
    copy_: list[FileCopy] | None = Field(default=None, alias="copy")


class FileHeader(BaseModel):
    name: str = Field(
        description="`./a.txt` when `./` is listed recursively; bytes that are not UTF-8 as "
        "lone surrogates `\\udc80`–`\\udcff`."
    )
    entryType: str = Field(description="`-` file, `d` directory, `l` link, `p`, `s`, `b`, `c`.")
    linkTarget: str | None = Field(default=None, description="Only for links it could read.")
    size: int
    modificationTime: int = Field(description="Seconds since the epoch.")
    permissions: str = Field(examples=["rwxr--r--"])
    owner: str
    group: str


class FileListing(BaseModel):
    files: list[FileHeader]
