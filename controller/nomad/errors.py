"""Nomad's errors, read in one place: one hierarchy, one `classify`, one retry policy.

Every Nomad answer the controller interprets — an HTTP error status with its
text, a refused or failed connection, an exec's close frame — is read here
and nowhere else, for the HTTP client, the exec client and the event stream
alike.

Forwarding. A request that reaches an agent which cannot answer it (any
server RPC through a client agent, a write on a follower) goes on over RPC.
Nomad's connection pool passes an RPC-coded error through untouched and
wraps every other one as `rpc error: <text>`, once per hop. Its HTTP layer
then answers an RPC-coded error with its code; of the rest, "RPC errors get
wrapped, so manually unwrap by only looking at their suffix": a text ending
in `Permission denied` or `ACL token not found` becomes 403, everything else
500 with the whole text, prefixes included (command/agent/http.go, v1.6.2).
So an EnforceIndex conflict through a client agent is `500 rpc error:
Enforcing job modify index 5: …`. `classify` reads a text as Nomad's HTTP
layer does: the wrapped prefixes are stripped before any rule is applied,
and permission is recognised by its suffix.

Statuses. 429 is Nomad's connection limit (`http_max_conns_per_client`,
answered before any handler runs); 5xx and 429 are transient, like a
refused or timed-out connection; every other 4xx is final. A conflict, a
lock that is not ours, a missing object or a task that does not run are
final whatever their status: retrying cannot change the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

import tenacity

RPC_PREFIX = "rpc error: "
# structs.ErrJobModifyIndex… text: "Enforcing job modify index N: job exists
# with conflicting job modify index: M" (and "…: job not found" for a create).
ENFORCE_INDEX_CONFLICT = "Enforcing job modify index"
# The variable lock RPCs' plain errors when the lock (or the variable) is gone.
LOCK_GONE_TEXTS = ("variable doesn't exist", "variable doesn't hold a lock")
# structs.ErrUnknownAllocationPrefix and friends.
NOT_FOUND_PREFIXES = ("Unknown allocation", "Unknown node", "job not found", "alloc not found")
# structs.ErrPermissionDenied, ErrTokenNotFound: recognised by suffix, as
# Nomad's HTTP layer does.
FORBIDDEN_SUFFIXES = ("Permission denied", "ACL token not found")
# The exec endpoint's refusals for a task that does not run (client/alloc_endpoint.go).
TASK_NOT_RUNNING_TEXTS = ("not started yet", "is not running", "exec not possible")


class Kind(StrEnum):
    """What an error from Nomad means to the controller."""

    INDEX_CONFLICT = "index_conflict"  # an EnforceIndex write lost
    LOCK_GONE = "lock_gone"  # the lock is held by somebody else, or no longer ours
    NOT_FOUND = "not_found"
    FORBIDDEN = "forbidden"  # the token lacks a capability (or is unknown)
    TASK_NOT_RUNNING = "task_not_running"  # exec into a task that is not running
    OVERLOADED = "overloaded"  # 429: the agent's connection limit
    UNAVAILABLE = "unavailable"  # no answer: refused, reset, timed out
    SERVER = "server"  # any other 5xx
    CLIENT = "client"  # any other 4xx (a bad request of ours)


TRANSIENT = frozenset({Kind.OVERLOADED, Kind.UNAVAILABLE, Kind.SERVER})
# `status` for an error without an HTTP answer.
NO_STATUS = 0


def unwrap(text: str) -> str:
    """The text without the `rpc error: ` prefixes forwarding added."""
    text = text.strip()
    while text.startswith(RPC_PREFIX):
        text = text[len(RPC_PREFIX) :].lstrip()
    return text


def classify(status: int, text: str) -> Kind:
    """What Nomad's answer `status` (NO_STATUS when there was none) with
    `text` means, direct or forwarded alike (see the module docstring)."""
    core = unwrap(text)
    if status == NO_STATUS:
        return Kind.UNAVAILABLE
    if status == 429:
        return Kind.OVERLOADED
    if core.startswith(ENFORCE_INDEX_CONFLICT):
        return Kind.INDEX_CONFLICT
    if any(core.startswith(t) for t in LOCK_GONE_TEXTS):
        return Kind.LOCK_GONE
    if status == 403 or any(core.endswith(s) for s in FORBIDDEN_SUFFIXES):
        return Kind.FORBIDDEN
    if any(t in core for t in TASK_NOT_RUNNING_TEXTS) and core.startswith(("task ", "exec ")):
        return Kind.TASK_NOT_RUNNING
    if status == 404 or core.startswith(NOT_FOUND_PREFIXES):
        return Kind.NOT_FOUND
    if status == 409:
        return Kind.LOCK_GONE
    if status >= 500:
        return Kind.SERVER
    return Kind.CLIENT


def is_transient(status: int, text: str) -> bool:
    return classify(status, text) in TRANSIENT


# -- the hierarchy -----------------------------------------------------------------------


class NomadError(Exception):
    """Anything Nomad answered (or failed to answer) that the caller must handle."""


class NomadAPIError(NomadError):
    """Nomad answered with an error status (after retries, for transient ones)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Nomad answered {status}: {message}")
        self.status = status
        self.message = message

    @property
    def kind(self) -> Kind:
        return classify(self.status, self.message)


class NomadUnavailable(NomadError):
    """Nomad could not be reached (connection error or timeout, after retries)."""


class IndexConflict(NomadError):
    """A write with EnforceIndex lost: somebody else changed (or created, or
    deleted) the job since the index we sent. Never retried."""


class LockHeld(NomadError):
    """A variable lock is held by somebody else (or our lock is no longer ours)."""


class ExecError(NomadError):
    """The exec did not run to its exit frame. `code` is the WebSocket close
    code or, for a refusal before the upgrade, the HTTP status (0 when there
    was none) and `reason` Nomad's text."""

    def __init__(self, reason: str, code: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class UnknownAllocation(ExecError):
    """Nomad does not know the allocation (it was garbage-collected)."""


class TaskNotRunning(ExecError):
    """The task has not started yet, or is no longer running."""


class ExecForbidden(ExecError):
    """The token lacks the `alloc-exec` capability (or remote exec is off)."""


class ExecRejected(ExecError):
    """Any other refusal: an HTTP error before the upgrade or a close frame."""


class ExecOverloaded(ExecRejected):
    """The agent refused the handshake (429, or the connection was refused or
    reset before the upgrade) and kept refusing it through every retry."""


class ExecServerError(ExecRejected):
    """A 5xx answer to the handshake that is none of the final kinds (no
    leader, a forwarding failure): transient, retried like a 5xx on a list."""


class ConnectionsExhausted(ExecOverloaded):
    """The controller's own budget of connections to the agent is spent and
    its queue is full (controller.nomad.budget): the exec was not attempted,
    and is not retried, which would only lengthen the queue."""

    retry_after_s = 1


class ExecBroken(ExecError):
    """The connection ended before the exit frame: the outcome is unknown."""


class ExecUnreachable(ExecBroken):
    """No exec connection could be made (refused, reset or timed out before
    the upgrade): nothing ran."""


def exec_error(code: int, reason: str) -> ExecError:
    """An exec's close frame (`code` its WebSocket close code; 1006 when the
    connection dropped without one) as a typed error."""
    if code in (1000, 1005, 1006) and not reason:
        return ExecBroken("the connection to Nomad ended before the command's exit code", code)
    text = reason or f"closed with code {code}"
    # A close frame carries no HTTP status: 1008 is Nomad's "client error",
    # 1011 its "server error"; the text decides.
    return _CLOSED.get(classify(500, reason), ExecRejected)(text, code)


def exec_refusal(status: int, body: str) -> ExecError:
    """An HTTP answer other than 101 to an exec handshake as a typed error."""
    text = body or f"Nomad answered {status}"
    return _REFUSED.get(classify(status, body), ExecRejected)(text, status)


# What an exec ended by each kind of error is: closed after the upgrade (a
# close frame), or refused before it (an HTTP answer, which can also say
# "too many" or "server error"); any other kind is ExecRejected.
_CLOSED: dict[Kind, type[ExecError]] = {
    Kind.NOT_FOUND: UnknownAllocation,
    Kind.TASK_NOT_RUNNING: TaskNotRunning,
    Kind.FORBIDDEN: ExecForbidden,
}
_REFUSED: dict[Kind, type[ExecError]] = {
    **_CLOSED,
    Kind.OVERLOADED: ExecOverloaded,
    Kind.SERVER: ExecServerError,
}


def is_transient_error(exc: BaseException) -> bool:
    """Whether the same request may succeed when sent again."""
    if isinstance(exc, ConnectionsExhausted):
        return False
    if isinstance(exc, NomadUnavailable | ExecOverloaded | ExecUnreachable | ExecServerError):
        return True
    return isinstance(exc, NomadAPIError) and exc.kind in TRANSIENT


# -- the one retry policy ------------------------------------------------------------------

FIRST_RETRY_WAIT_S = 0.1


def backoff(first_s: float, cap_s: float) -> tenacity.wait.wait_base:
    """Capped, fully jittered exponential backoff: attempt n waits a random
    time in [0, min(cap, first·2^(n-1))]."""
    return tenacity.wait_random_exponential(multiplier=min(first_s, cap_s), max=cap_s)


# How long a claim's write rides through transient errors before the claim
# fails. A leader election takes 2-5 s (Raft's election timeout and Nomad's
# defaults), during which every server first holds a request up to 5 s for a
# leader and then answers 500 `No cluster leader` (nomad/rpc.go, v1.6.2);
# Nomad's own agents retry that for 5 s. A claim waits a little longer than
# the hold so that an election of up to 5 s fails no claim; CodeOcean sets no
# read timeout on the claim, and an answer after 6 s beats a failed run.
CLAIM_RIDE_THROUGH_S = 6.0


def retry_kwargs(
    attempts: int,
    max_wait_s: float,
    before_sleep: Callable[[tenacity.RetryCallState], Any] | None = None,
    ride_through_s: float = 0.0,
) -> dict[str, Any]:
    """tenacity's arguments for a call to Nomad: `attempts` tries, backoff
    up to `max_wait_s`, transient errors only, the last error re-raised.
    With `ride_through_s`, transient errors are retried until that long has
    passed too (whichever of the two ends later): an outage as long as an
    election outlasts any number of quick attempts."""
    stop: tenacity.stop.stop_base = tenacity.stop_after_attempt(max(1, attempts))
    if ride_through_s > 0:
        stop = tenacity.stop_all(stop, tenacity.stop_after_delay(ride_through_s))
    return {
        "stop": stop,
        "wait": backoff(FIRST_RETRY_WAIT_S, max_wait_s),
        "retry": tenacity.retry_if_exception(is_transient_error),
        "before_sleep": before_sleep,
        "reraise": True,
    }


def reconnect_delay(failures: int, base_s: float, cap_s: float) -> float:
    """How long a long-lived reader (the event stream) waits before its
    `failures`-th reconnect: the same backoff as every retried call."""
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = max(1, failures)
    return float(backoff(base_s, cap_s)(state))
