"""derive: a runner job and *all* of its allocations ⇒ one RunnerView.

Pure. It never looks at a single event and never trusts PreviousAllocation:
the runner's current allocation is simply the newest one whose DesiredStatus
is `run`, so a migration is "the current allocation changed", whatever order
Nomad reported the steps in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from controller.model import Allocation, LossReason, Phase, RunnerJob, RunnerView


def current_allocation(allocs: Iterable[Allocation]) -> Allocation | None:
    """The newest allocation Nomad wants running (ties broken by creation time)."""
    wanted = [a for a in allocs if a.desired_status == "run"]
    return max(wanted, key=lambda a: (a.create_index, a.create_time, a.id), default=None)


def _phase(job: RunnerJob, allocs: Sequence[Allocation], current: Allocation | None) -> Phase:
    live = any(not a.client_terminal for a in allocs)
    if job.stop:
        return Phase.STOPPING if live else Phase.DEAD
    if current is None:
        # Not placed yet, or the old allocation is being replaced (a migration's
        # first step) — unless Nomad says the job will never run again.
        return Phase.STARTING if live or not allocs or job.status != "dead" else Phase.DEAD
    if current.client_status == "running":
        return Phase.READY
    if current.client_status == "pending":
        return Phase.STARTING
    # The current allocation ended; Nomad may still reschedule it.
    return Phase.DEAD if job.status == "dead" else Phase.STARTING


def _reset(
    job: RunnerJob, allocs: Sequence[Allocation], current: Allocation | None, phase: Phase
) -> LossReason | None:
    """Whether a claimed runner's file system was reset since the claim, and why."""
    claim = job.claim
    if claim is None or claim.lost_reason is not None:
        return None
    if job.stop:
        return LossReason.JOB_STOPPED
    if not claim.alloc_id:
        # An adopted Poseidon claim does not name its allocation: only its end shows.
        return LossReason.LOST if phase is Phase.DEAD else None
    claimed = next((a for a in allocs if a.id == claim.alloc_id), None)
    if claimed is None:
        return LossReason.LOST
    still_serving = (
        claimed is current
        and claimed.desired_status == "run"
        and claimed.client_status in ("running", "pending")
    )
    if still_serving:
        if claimed.restarts > claim.restarts:
            return LossReason.OOM_KILLED if claimed.last_exit_oom else LossReason.RESTARTED
        return None
    if claimed.desired_status == "run" and not claimed.client_terminal:
        # A newer allocation exists but nothing yet says why the claimed one is
        # being replaced (Nomad writes both in one plan, but reports can lag):
        # decide when the claimed allocation's own state tells.
        return None
    # The claimed allocation is gone or on its way out.
    if claimed.last_exit_oom and (
        claimed.client_status == "failed" or claimed.restarts > claim.restarts
    ):
        return LossReason.OOM_KILLED
    if claimed.migrate or "migrat" in claimed.desired_description.lower():
        return LossReason.MIGRATED
    if claimed.client_status == "lost":
        return LossReason.LOST
    if claimed.client_status == "failed" or (current is not None and current is not claimed):
        return LossReason.RESCHEDULED
    return LossReason.LOST


def derive_runner(job: RunnerJob, allocs: Sequence[Allocation]) -> RunnerView:
    current = current_allocation(allocs)
    phase = _phase(job, allocs, current)
    startup = None
    if phase is Phase.READY and current is not None and current.started_at is not None:
        startup = max(0, current.started_at - current.create_time)
    starting_since = 0
    if phase is Phase.STARTING:
        starting_since = (
            current.create_time
            if current is not None
            else max((a.modify_time for a in allocs), default=job.submit_time)
        )
    failed_to_start = phase is not Phase.READY and any(
        a.client_status == "failed" and a.started_at is None for a in allocs
    )
    return RunnerView(
        job=job,
        phase=phase,
        alloc=current,
        startup_ns=startup,
        starting_since=starting_since,
        failed_to_start=failed_to_start,
        reset=_reset(job, allocs, current, phase),
    )


def derive_runners(
    jobs: Iterable[RunnerJob], allocs_by_job: Mapping[str, Sequence[Allocation]]
) -> tuple[RunnerView, ...]:
    return tuple(derive_runner(job, allocs_by_job.get(job.id, ())) for job in jobs)
