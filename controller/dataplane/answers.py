"""Pure: what a client is told when its runner cannot be used or Nomad's exec
failed — one table for file operations (an HTTP answer) and executions (the
same message in an `error` frame).

Each failure also says how hard to look for a loss of the runner before the
answer is believed (`Look`): a refusal before anything ran says nothing about
the runner; a missing path or a broken exec may be the first sign of a reset
file system, which Nomad's servers hear of a little later.

Messages are ours. Nomad's own text (which can name internal addresses or
tokens' policies) is logged by the caller with the runner's id, never
answered: a client learns what failed and whether retrying helps.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from controller.files.errors import (
    Conflict,
    CopyFailed,
    ExecFailed,
    FileError,
    RangeNotSatisfiable,
    Unreadable,
)
from controller.model import LossReason
from controller.nomad.errors import (
    ConnectionsExhausted,
    ExecBroken,
    ExecError,
    ExecForbidden,
    ExecOverloaded,
    ExecUnreachable,
    TaskNotRunning,
    UnknownAllocation,
)

# Poseidon's error codes this table uses (controller.api.models.ErrorCode).
Code = Literal["NOMAD_UNREACHABLE", "NOMAD_OVERLOAD", "NOMAD_INTERNAL_SERVER_ERROR", "UNKNOWN"]
# Seconds a client waits before retrying what Nomad was too busy for.
RETRY_AFTER_S = 2


class Look(Enum):
    """How hard to look for a loss of the runner before a failure is believed."""

    NONE = "none"  # nothing ran, or the answer does not depend on the file system
    ONCE = "once"  # read the runner again now
    SETTLE = "settle"  # read it again over the settle time
    # Read its allocation once its client has reported what happened before
    # the failure; the settle only if that read shows a restart, kill or
    # migration in flight (a missing path: the file system may have been reset).
    QUIET = "quiet"


@dataclass(frozen=True)
class Answer:
    """What the client is told: an HTTP status (files; an execution sends
    `message` in its error frame), Poseidon's code, headers, and the
    `nrc_file_operations_total` result it counts as."""

    status: int
    message: str
    code: Code | None = None
    headers: tuple[tuple[str, str], ...] = ()
    result: str = "failed"
    look: Look = Look.NONE


# -- the runner itself ------------------------------------------------------------------


def lost_message(runner_id: str, reason: LossReason) -> str:
    return f"runner {runner_id} was lost: {reason.value} ({reason.description})"


def gone_message(runner_id: str) -> str:
    return f"runner {runner_id} is unknown or was released"


def expired_message(runner_id: str, timeout_s: int) -> str:
    return (
        f"runner {runner_id} was released: it was inactive for its whole inactivity "
        f"timeout ({timeout_s} s)"
    )


def ended(runner_id: str, reason: LossReason | None) -> Answer:
    """The claim is over: lost (`reason`) or released (None)."""
    message = gone_message(runner_id) if reason is None else lost_message(runner_id, reason)
    return Answer(410, message, result="lost")


def expired(runner_id: str, timeout_s: int) -> Answer:
    return Answer(410, expired_message(runner_id, timeout_s), result="lost")


def loss_unrecorded(runner_id: str) -> Answer:
    """A reset was seen, but Nomad did not take the write that records it:
    the client must not hear a reason Nomad does not hold, so it retries."""
    return Answer(
        503,
        f"runner {runner_id} was reset; recording its loss in Nomad failed: retry",
        "NOMAD_UNREACHABLE",
        result="nomad_error",
    )


# -- Nomad's exec -----------------------------------------------------------------------


def exec_failure(error: ExecError, operation: str) -> Answer:
    """The answer for an exec that Nomad (or our connection budget) refused or
    broke off, when the runner was not lost. `operation` names what did not
    run: "command", "file operation"."""
    if isinstance(error, ExecOverloaded):
        retry_after = getattr(error, "retry_after_s", RETRY_AFTER_S)
        busy = (
            "the controller's connections to Nomad are all in use "
            "(NRC_NOMAD_MAX_CONNS_PER_AGENT, NRC_NOMAD_CONN_QUEUE)"
            if isinstance(error, ConnectionsExhausted)
            else "Nomad is overloaded"
        )
        return Answer(
            503,
            f"{busy}, the {operation} was not started; retry later",
            "NOMAD_OVERLOAD",
            (("Retry-After", str(retry_after)),),
            "nomad_error",
        )
    if isinstance(error, ExecForbidden):
        return Answer(
            500,
            f"Nomad refused to run the {operation}: the controller's Nomad token needs "
            "the alloc-exec capability",
            "NOMAD_INTERNAL_SERVER_ERROR",
            result="nomad_error",
        )
    if isinstance(error, ExecUnreachable):
        message = f"the controller could not reach Nomad to run the {operation}"
        return Answer(500, message, "NOMAD_UNREACHABLE", result="nomad_error", look=Look.SETTLE)
    if isinstance(error, ExecBroken):
        message = f"Nomad cut the connection before the {operation}'s exit code"
        return Answer(500, message, "NOMAD_UNREACHABLE", result="nomad_error", look=Look.SETTLE)
    if isinstance(error, UnknownAllocation):
        message = f"Nomad no longer knows the runner's allocation; the {operation} did not run"
    elif isinstance(error, TaskNotRunning):
        message = f"the runner's task is not running; the {operation} did not run"
    else:
        message = f"Nomad refused the exec; the {operation} did not run"
    return Answer(
        500, message, "NOMAD_INTERNAL_SERVER_ERROR", result="nomad_error", look=Look.SETTLE
    )


# -- file operations --------------------------------------------------------------------


# Poseidon's text for a file it cannot list or read (runner.ErrFileNotFound),
# which its e2e suite looks for in a 424's body; ours says what the runner saw after it.
FILE_NOT_FOUND = "file not found or insufficient permissions"


def file_failure(error: FileError) -> Answer:
    """The answer for a file operation that failed, when the runner was not
    lost. A file error's message is the runner's own (what the script saw),
    never Nomad's."""
    if isinstance(error, ExecFailed):
        return exec_failure(error.error, "file operation")
    if isinstance(error, Unreadable):
        message = f"{FILE_NOT_FOUND}: {error.message}"
        return Answer(424, message, result="not_found", look=Look.QUIET)
    if isinstance(error, Conflict):
        return Answer(409, error.message, result="conflict", look=Look.ONCE)
    if isinstance(error, CopyFailed):
        return Answer(500, error.message, "UNKNOWN", look=Look.SETTLE)
    if isinstance(error, RangeNotSatisfiable):
        headers = (("Content-Range", f"bytes */{error.size}"),)
        return Answer(416, error.message, headers=headers, result="bad_request")
    return Answer(500, error.message, "UNKNOWN")
