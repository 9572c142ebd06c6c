"""Execution ids waiting for their connect are bounded (issue 24, finding 6:
300 never-used ids with 1 MiB commands took the controller from 74 to 374 MiB)."""

from __future__ import annotations

import errno
import subprocess

import pytest

from controller.clock import ManualClock
from controller.execution.command import ExecSettings, ExecutionRequest, command_size
from controller.execution.ids import Signer
from controller.execution.store import MAX_ARG_BYTES, ExecutionStore, Limits, Refused

SETTINGS = ExecSettings()


def store(clock: ManualClock, **limits: int) -> ExecutionStore:
    return ExecutionStore(
        clock, 60.0, Limits(**limits), lambda request: command_size(request, SETTINGS)
    )


def test_pending_ids_are_bounded_per_runner_and_in_all() -> None:
    clock = ManualClock()
    ids = store(clock, max_pending_per_runner=2, max_pending=3)
    ids.add("r1", ExecutionRequest("true"))
    ids.add("r1", ExecutionRequest("true"))
    with pytest.raises(Refused) as refused:
        ids.add("r1", ExecutionRequest("true"))
    assert refused.value.status == 429 and "this runner" in refused.value.message
    taken = ids.add("r2", ExecutionRequest("true"))
    with pytest.raises(Refused) as refused:
        ids.add("r3", ExecutionRequest("true"))
    assert refused.value.status == 429 and "NRC_EXECUTION_MAX_PENDING" in refused.value.message
    # a connect frees its slot, and so does expiry
    assert ids.take("r2", taken.id) is taken
    ids.add("r3", ExecutionRequest("true"))
    clock.advance(61)
    for _ in range(2):
        ids.add("r1", ExecutionRequest("true"))


def test_a_command_is_measured_as_the_shell_gets_it() -> None:
    ids = store(ManualClock(), max_command_bytes=64 * 1024)
    ids.add("r", ExecutionRequest("x" * 60_000))
    # quoting makes the same number of characters larger: a quote takes 5
    with pytest.raises(Refused) as refused:
        ids.add("r", ExecutionRequest("'" * 14_000))
    assert refused.value.status == 400 and "NRC_EXECUTION_MAX_COMMAND_SIZE" in refused.value.message
    with pytest.raises(Refused):
        ids.add("r", ExecutionRequest("true", environment={"BIG": "v" * 70_000}))
    with pytest.raises(Refused):
        ids.add("r", ExecutionRequest("x" * (1 << 20)))  # the finding's 1 MiB
    assert len(ids) == 1


def test_what_is_accepted_can_run() -> None:
    """The largest default command fits Linux's per-argument limit."""
    assert Limits().max_command_bytes < MAX_ARG_BYTES
    size = command_size(ExecutionRequest("y" * 60_000, environment={"A": "b"}), SETTINGS)
    assert 60_000 < size < Limits().max_command_bytes


def test_linux_runs_an_argument_just_below_the_limit_and_not_at_it() -> None:
    script = "true #"
    ok = subprocess.run(["bash", "-c", script + "x" * (MAX_ARG_BYTES - 1 - len(script))])
    assert ok.returncode == 0
    with pytest.raises(OSError, match="Argument list too long") as too_long:
        subprocess.run(["bash", "-c", script + "x" * (MAX_ARG_BYTES - len(script))])
    assert too_long.value.errno == errno.E2BIG


def test_ids_waiting_leave_by_their_take_or_their_expiry() -> None:
    clock = ManualClock()
    s = ExecutionStore(clock, ttl_s=10)
    first, _ = s.add("r", ExecutionRequest("a")), s.add("r", ExecutionRequest("b"))
    assert s.waiting() == 2
    assert s.take("r", first.id) is not None
    assert s.waiting() == 1
    clock.advance(10)
    assert s.waiting() == 0


def test_ids_come_from_the_given_maker_and_the_runner_sees_only_their_nonce() -> None:
    signer = Signer("http://10.0.0.5:7200", b"k" * 32)
    s = ExecutionStore(ManualClock(), ttl_s=10, new_id=signer.new_id)
    execution = s.add("r", ExecutionRequest("a"))
    assert signer.is_mine(execution.id)
    assert execution.marker == execution.id.split(".")[0]
    assert len(execution.marker) == 32
    local = ExecutionStore(ManualClock(), ttl_s=10).add("r", ExecutionRequest("a"))
    assert local.marker == local.id and len(local.id) == 32
