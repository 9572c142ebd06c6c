"""Deliberately broken controllers, to show the chaos suite notices.

Each mutant is Python run in the controller subprocess before `run` starts: it
patches one safeguard out of the real code (nothing on disk changes). A chaos
run against a mutant must fail, naming the invariant the safeguard protects.
`pytest tests/chaos --chaos-mutants` runs them (not part of CI: each costs a
few chaos runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.chaos.actors import DATA

# Starts the controller after the mutant's patch, as `python -m controller run` would.
LAUNCH = "\nfrom controller.cli import main\nraise SystemExit(main(['run']))\n"


@dataclass(frozen=True)
class Mutant:
    name: str
    breaks: str  # the text a violation must contain ("invariant 3", ...)
    patch: str


NO_LOSS_DETECTION = """
from controller.reconcile import derive
derive._reset = lambda *args: None
"""

MUTANTS = (
    Mutant(
        "claim_without_cache_update",
        # A claim written without EnforceIndex and not applied to the snapshot:
        # the next claimer picks the same runner until the next list.
        "invariant 1",
        """
from controller.model import Claim, Phase
from controller.nomad import jobs
from controller.reconcile import claims

def _try_claim(self, runner_id, timeout_s):
    current = self._observer.snapshot.runners.get(runner_id)
    spec = self._observer.spec(runner_id)
    if current is None or spec is None or current.alloc is None:
        return None
    if current.phase is not Phase.READY:
        return None
    claim = Claim(timeout=timeout_s, alloc_id=current.alloc.id,
                  restarts=current.alloc.restarts, claimed_at=self._clock.now_ns())
    self._gateway.register_job(jobs.with_claim(spec, claim))
    return current

claims.Claims._try_claim = _try_claim
""",
    ),
    Mutant(
        "no_loss_detection",
        # derive never says a claimed runner's file system was reset.
        "invariant 3",
        NO_LOSS_DETECTION,
    ),
    Mutant(
        "no_loss_detection_seen_in_data",
        # The same mutant, caught by the marker files alone (whatever else sees it).
        DATA,
        NO_LOSS_DETECTION,
    ),
    Mutant(
        "restarts_not_losses",
        # derive ignores a restart in place (crash, OOM kill): the runner goes on
        # being served from the allocation it was claimed on, with a fresh file
        # system. Nothing but the data shows it.
        DATA,
        """
from controller.model import LossReason
from controller.reconcile import derive

_reset = derive._reset

def _ignoring_restarts(job, allocs, current, phase):
    reason = _reset(job, allocs, current, phase)
    in_place = current is not None and job.claim is not None and current.id == job.claim.alloc_id
    if in_place and reason in (LossReason.RESTARTED, LossReason.OOM_KILLED):
        return None
    return reason

derive._reset = _ignoring_restarts
""",
    ),
    Mutant(
        "no_expectations",
        # Creations in flight are not counted: lagging lists over-create.
        "invariant 5",
        """
from controller.reconcile import expectations
expectations.Expectations.pending = lambda self, env_id: expectations.Pending(0, frozenset())
""",
    ),
    Mutant(
        "touch_does_not_reset_timer",
        # Requests no longer restart the inactivity timer: runners expire under use.
        "invariant 3",
        """
from controller.reconcile import claims
claims.Claims.touch = lambda self, runner_id: None
""",
    ),
    Mutant(
        "inactivity_never_expires",
        # The release of an expired claim is never decided (Claims.expired, which
        # this patched before, no longer exists: the mutant had become a no-op).
        "invariant 4",
        """
from controller.reconcile import claims
claims.Claims.begin_expiry = lambda self, view, now_ns: False
""",
    ),
)
