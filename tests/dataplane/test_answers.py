"""The one table from a failure to what a client is told (status, code,
metric result, how hard to look for a loss first), for file operations and
executions alike; and its rule that Nomad's own text is never answered."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.api.models import ErrorCode
from controller.dataplane import answers
from controller.dataplane.answers import Look
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
    ExecRejected,
    ExecServerError,
    ExecUnreachable,
    TaskNotRunning,
    UnknownAllocation,
)

# Text as Nomad (or a proxy in front of it) might write it: never answered.
NOMAD_TEXT = "rpc error: dial tcp 10.1.2.3:4647: Permission denied"

FILES: list[tuple[FileError, int, str | None, str, Look]] = [
    (Unreadable("'a.txt' cannot be read: no such file"), 424, None, "not_found", Look.QUIET),
    (Conflict("'a' is a directory"), 409, None, "conflict", Look.ONCE),
    (CopyFailed("tar: a: Cannot open"), 500, "UNKNOWN", "failed", Look.SETTLE),
    (RangeNotSatisfiable(10), 416, None, "bad_request", Look.NONE),
    (ExecFailed(ExecOverloaded(NOMAD_TEXT)), 503, "NOMAD_OVERLOAD", "nomad_error", Look.NONE),
    (
        ExecFailed(ExecForbidden(NOMAD_TEXT)),
        500,
        "NOMAD_INTERNAL_SERVER_ERROR",
        "nomad_error",
        Look.NONE,
    ),
    (ExecFailed(ExecBroken(NOMAD_TEXT)), 500, "NOMAD_UNREACHABLE", "nomad_error", Look.SETTLE),
    (
        ExecFailed(ExecUnreachable(NOMAD_TEXT)),
        500,
        "NOMAD_UNREACHABLE",
        "nomad_error",
        Look.SETTLE,
    ),
    *[
        (ExecFailed(error), 500, "NOMAD_INTERNAL_SERVER_ERROR", "nomad_error", Look.SETTLE)
        for error in (
            TaskNotRunning(NOMAD_TEXT),
            UnknownAllocation(NOMAD_TEXT),
            ExecRejected(NOMAD_TEXT),
            ExecServerError(NOMAD_TEXT),
            ExecError(NOMAD_TEXT),
        )
    ],
]


@pytest.mark.parametrize(
    ("error", "status", "code", "result", "look"),
    FILES,
    ids=[f"{type(e).__name__}-{getattr(e, 'error', e).__class__.__name__}" for e, *_ in FILES],
)
def test_each_file_failure_has_one_answer(
    error: FileError, status: int, code: str | None, result: str, look: Look
) -> None:
    answer = answers.file_failure(error)
    assert (answer.status, answer.code, answer.result, answer.look) == (status, code, result, look)
    assert code is None or ErrorCode(code), "one of the API's codes"
    assert NOMAD_TEXT not in answer.message
    if isinstance(error, Unreadable):
        # Poseidon's text first (its e2e suite looks for it), then the runner's own words
        assert answer.message == f"file not found or insufficient permissions: {error.message}"
    elif not isinstance(error, ExecFailed):
        assert answer.message == error.message, "the runner's own words"


def test_a_range_beyond_the_end_names_the_size() -> None:
    answer = answers.file_failure(RangeNotSatisfiable(10))
    assert dict(answer.headers) == {"Content-Range": "bytes */10"}


@pytest.mark.parametrize(
    ("error", "retry_after", "says"),
    [
        (ExecOverloaded(NOMAD_TEXT), "2", "Nomad is overloaded"),
        (ConnectionsExhausted(NOMAD_TEXT), "1", "NRC_NOMAD_MAX_CONNS_PER_AGENT"),
    ],
)
def test_an_overload_says_when_to_retry(error: ExecError, retry_after: str, says: str) -> None:
    answer = answers.exec_failure(error, "command")
    assert dict(answer.headers) == {"Retry-After": retry_after}
    assert says in answer.message and "the command was not started" in answer.message


def test_executions_and_files_say_the_same_in_their_own_words() -> None:
    for error in (ExecBroken(NOMAD_TEXT), ExecForbidden(NOMAD_TEXT), TaskNotRunning(NOMAD_TEXT)):
        command = answers.exec_failure(error, "command")
        files = answers.exec_failure(error, "file operation")
        assert command.message.replace("command", "file operation") == files.message
        assert replace(command, message="") == replace(files, message="")


def test_the_runners_own_answers() -> None:
    lost = answers.ended("7-r", LossReason.OOM_KILLED)
    assert (lost.status, lost.result) == (410, "lost")
    assert lost.message == (
        "runner 7-r was lost: oom_killed (" + LossReason.OOM_KILLED.description + ")"
    )
    assert answers.ended("7-r", None).message == "runner 7-r is unknown or was released"
    assert answers.expired("7-r", 60).status == 410
    unrecorded = answers.loss_unrecorded("7-r")
    assert (unrecorded.status, unrecorded.code) == (503, "NOMAD_UNREACHABLE")
