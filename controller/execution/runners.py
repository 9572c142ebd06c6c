"""The runner side of an execution, answered by the controller: is the
runner still what its client claimed, record its loss, keep it in use, stop it.

A narrow adapter (the relay depends on `relay.Runners`, not on the whole
controller), so the relay can be tested against a fake.
"""

from __future__ import annotations

from controller.execution.frames import Released
from controller.model import LossReason
from controller.reconcile.facade import Pools


class ControllerRunners:
    def __init__(self, controller: Pools) -> None:
        self._controller = controller

    def loss(self, runner_id: str) -> LossReason | Released | None:
        view = self._controller.lookup(runner_id)
        if view is None or view.job.claim is None:
            return Released()
        return view.job.claim.lost_reason or view.reset

    def record_loss(self, runner_id: str) -> LossReason | Released:
        view = self._controller.lookup(runner_id)
        if view is None or view.job.claim is None:
            return Released()
        if view.job.claim.lost_reason is None and view.reset is None:
            # Asked because the runner looked lost a moment ago: look again.
            self.refresh()
            view = self._controller.lookup(runner_id)
            if view is None or view.job.claim is None:
                return Released()
            if view.job.claim.lost_reason is None and view.reset is None:
                raise RuntimeError(f"runner {runner_id} is not lost")
        reason = self._controller.record_loss(view)
        return Released() if reason is None else reason

    def refresh(self) -> None:
        self._controller.refresh()

    def end_use(self, runner_id: str) -> None:
        self._controller.end_use(runner_id)

    def uses(self, runner_id: str) -> int:
        return self._controller.uses(runner_id)

    def stop_runner(self, runner_id: str, reason: LossReason) -> None:
        """End the claim with `reason` (the job is stopped with it: Nomad kills
        everything in the allocation). Nothing to do when it already ended."""
        view = self._controller.lookup(runner_id)
        if view is None or view.job.claim is None or view.job.claim.lost_reason:
            return
        self._controller.write_loss(view, reason)
