"""controller.nomad.errors: every Nomad error the controller interprets, direct
and forwarded (`rpc error: …`, as a client agent or a follower answers it)."""

from __future__ import annotations

import pytest

from controller.nomad.errors import (
    NO_STATUS,
    ExecBroken,
    ExecForbidden,
    ExecOverloaded,
    ExecRejected,
    ExecServerError,
    ExecUnreachable,
    IndexConflict,
    Kind,
    NomadAPIError,
    NomadUnavailable,
    TaskNotRunning,
    UnknownAllocation,
    classify,
    exec_error,
    exec_refusal,
    is_transient_error,
    reconnect_delay,
    unwrap,
)

# (status, Nomad's text as the server that decided it says it, what it means).
DIRECT: list[tuple[int, str, Kind]] = [
    (
        500,
        "Enforcing job modify index 5: job exists with conflicting job modify index: 6",
        Kind.INDEX_CONFLICT,
    ),
    (500, "Enforcing job modify index 0: job already exists", Kind.INDEX_CONFLICT),
    (500, "variable doesn't exist", Kind.LOCK_GONE),
    (500, "variable doesn't hold a lock", Kind.LOCK_GONE),
    (409, "lock is already held", Kind.LOCK_GONE),
    (404, "job not found", Kind.NOT_FOUND),
    (404, 'Unknown allocation "a1"', Kind.NOT_FOUND),
    (403, "Permission denied", Kind.FORBIDDEN),
    (403, "ACL token not found", Kind.FORBIDDEN),
    (404, 'task "default-task" not started yet.', Kind.TASK_NOT_RUNNING),
    (404, 'task "default-task" is not running.', Kind.TASK_NOT_RUNNING),
    (
        500,
        "exec not possible, client status of allocation a1 is complete",
        Kind.TASK_NOT_RUNNING,
    ),
    (429, "Your IP is issuing too many concurrent connections", Kind.OVERLOADED),
    (NO_STATUS, "connection refused", Kind.UNAVAILABLE),
    (500, "raft: leadership lost while committing log", Kind.SERVER),
    (503, "No cluster leader", Kind.SERVER),
    (400, "must provide task name", Kind.CLIENT),
]


def forwarded(status: int, text: str) -> tuple[int, str]:
    """How a client agent answers the same error when it came back over RPC
    (command/agent/http.go: RPC-coded errors keep their code; of the rest,
    a permission text is found by its suffix and becomes 403 alone, every
    other one 500 with the `rpc error: ` prefix)."""
    if status in (NO_STATUS, 429, 409, 404, 400):
        # The agent's own answer (connection limit, HTTP handler) or an
        # RPC-coded error: untouched.
        return status, text
    wrapped = "rpc error: " + text
    if wrapped.endswith(("Permission denied", "ACL token not found")):
        return 403, text
    return 500, wrapped


@pytest.mark.parametrize(("status", "text", "kind"), DIRECT, ids=[k for _, _, k in DIRECT])
def test_classify_direct_and_forwarded(status: int, text: str, kind: Kind) -> None:
    assert classify(status, text) is kind
    f_status, f_text = forwarded(status, text)
    assert classify(f_status, f_text) is kind, f_text
    # Two hops (agent → follower → leader) wrap twice.
    assert classify(500, "rpc error: rpc error: " + text) is kind or kind in (
        Kind.OVERLOADED,
        Kind.UNAVAILABLE,
        Kind.CLIENT,
        Kind.NOT_FOUND,
        Kind.LOCK_GONE,
    )


def test_permission_by_suffix_inside_a_longer_text() -> None:
    assert classify(500, "rpc error: rpc error: Permission denied") is Kind.FORBIDDEN
    assert classify(500, "rpc error: something broke") is Kind.SERVER
    assert unwrap(" rpc error: rpc error: x ") == "x"


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (1008, 'Unknown allocation "alloc-1"', UnknownAllocation),
        (1011, 'rpc error: Unknown allocation "alloc-1"', UnknownAllocation),
        (1008, 'task "default-task" not started yet.', TaskNotRunning),
        (1011, 'rpc error: task "default-task" is not running.', TaskNotRunning),
        (1011, "Permission denied", ExecForbidden),
        (1011, "rpc error: Permission denied", ExecForbidden),
        (1008, "exec not possible, client status of allocation a1 is complete", TaskNotRunning),
        (1011, "rpc error: exec not possible, client status of a1 is lost", TaskNotRunning),
        (1008, "must provide task name", ExecRejected),
        (1011, "rpc error: something broke", ExecRejected),
        (1006, "", ExecBroken),
        (1000, "", ExecBroken),
    ],
)
def test_exec_close_frames(code: int, reason: str, expected: type) -> None:
    error = exec_error(code, reason)
    assert type(error) is expected
    assert error.code == code


@pytest.mark.parametrize(
    ("status", "body", "expected", "transient"),
    [
        (429, "Your IP is issuing too many concurrent connections", ExecOverloaded, True),
        (429, "", ExecOverloaded, True),
        (500, "rpc error: Permission denied", ExecForbidden, False),
        (403, "Permission denied", ExecForbidden, False),
        (404, 'Unknown allocation "a1"', UnknownAllocation, False),
        (500, "rpc error: No cluster leader", ExecServerError, True),
        (503, "", ExecServerError, True),
        (400, "must provide task name", ExecRejected, False),
    ],
)
def test_exec_refusals(status: int, body: str, expected: type, transient: bool) -> None:
    error = exec_refusal(status, body)
    assert type(error) is expected
    assert is_transient_error(error) is transient


def test_transient_errors() -> None:
    assert is_transient_error(NomadUnavailable("refused"))
    assert is_transient_error(ExecUnreachable("refused"))
    assert is_transient_error(NomadAPIError(429, "too many"))
    assert is_transient_error(NomadAPIError(503, "No cluster leader"))
    assert not is_transient_error(NomadAPIError(500, "rpc error: Enforcing job modify index 1"))
    assert not is_transient_error(NomadAPIError(400, "bad"))
    assert not is_transient_error(IndexConflict("x"))
    assert not is_transient_error(ExecBroken("gone"))


def test_reconnect_delay_is_capped_full_jitter() -> None:
    for failures in range(1, 12):
        bound = min(4.0, 0.5 * 2 ** (failures - 1))
        assert all(0 <= reconnect_delay(failures, 0.5, 4.0) <= bound for _ in range(50))
