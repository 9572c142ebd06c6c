"""The runner a client claimed, as executions and file operations both ask
about it: may it be used (`claimed`, `begin`), and — when something failed —
was it lost meanwhile (`verdict`). One adapter over the controller's façade,
so both halves of the data plane decide alike.

A loss is told only once Nomad records it: a reset the controller has
derived but not written is written first (`Pools.record_loss`), so every
later answer, from any controller, names the same reason.

After a failure, Nomad is read again on one schedule (`read_times`): its
servers hear of a restart a little after it happened (a client reports its
allocations in batches; a lagging server answers from before), so a failure
that may come from a reset file system is believed only once the runner still
looks claimed after the settle time.

A missing path is believed sooner (`Look.QUIET`): a reset file system means
the task restarted before the exec that met it started, and a Nomad client
reports such a change within its sync time (NRC_NOMAD_CLIENT_SYNC: its 200 ms
update batch, then the server's 50 ms one). A restart its policy makes is
decided, and reported, when the task exits, and runs the task again only
after the policy's delay (Poseidon's template: 15 s). So when every restart
the allocation's job allows waits at least the sync time (`restart_notice_ns`),
a restart before the exec already shows in Nomad: one read of the allocation
at once, showing the claim's allocation still running with the claim's
restart count and nothing stopping or migrating it (`nothing_in_flight`),
settles it (`believed_at_once`). With less notice (a delay shorter than the
sync, a check or template that restarts at once) a second read that long
after the exec was opened must show the same. Anything else falls back to
the settle. A restart asked through Nomad's API (`nomad alloc restart`)
comes at once and no job shows it: one finished within the sync time before
the exec is the case a 424 cannot exclude (docs/architecture.md,
how a file operation flows, step 7).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from controller.dataplane import answers
from controller.dataplane.answers import Answer, Look
from controller.model import Allocation, Claim, LossReason, RunnerView
from controller.nomad.errors import NomadError
from controller.reconcile.claims import NotLeader
from controller.reconcile.facade import Pools
from controller.reconcile.uses import RunnerUse

log = logging.getLogger(__name__)

# The settle schedule's first waits after a failure (seconds from it): a read
# at once, then quickly, then ever more spread out up to the settle time.
READ_OFFSETS_S = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def read_times(settle_s: float) -> tuple[float, ...]:
    """When to read the runner again after a failure (seconds from it): the
    offsets below `settle_s`, and `settle_s` itself last."""
    early = tuple(t for t in READ_OFFSETS_S if t < settle_s)
    step = READ_OFFSETS_S[-1]
    while early and early[-1] + step < settle_s:
        early += (early[-1] + step,)
    return (*early, settle_s) if settle_s > 0 else (0.0,)


def nothing_in_flight(alloc: Allocation | None, claim: Claim) -> bool:
    """Whether Nomad's `alloc` shows the claim's allocation running as it was
    claimed: not restarted since, and no stop or migration decided."""
    return (
        alloc is not None
        and bool(claim.alloc_id)
        and alloc.id == claim.alloc_id
        and alloc.restarts == claim.restarts
        and alloc.client_status == "running"
        and alloc.desired_status == "run"
        and not alloc.migrate
    )


def believed_at_once(alloc: Allocation | None, claim: Claim, client_sync_s: float) -> bool:
    """Whether Nomad's `alloc`, read after a failure, settles it at once:
    nothing in flight, and no restart of it can run its task again before its
    client reported it (the job's restart notice is at least the sync time)."""
    return (
        nothing_in_flight(alloc, claim)
        and alloc is not None
        and alloc.restart_notice_ns is not None
        and alloc.restart_notice_ns >= client_sync_s * 1e9
    )


class Unusable(Exception):
    """The runner cannot be used; `answer` says why (410 or 503)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.message)
        self.answer = answer


@dataclass(frozen=True)
class Ended:
    """The claim is over, as Nomad records it: lost (`reason`) or released (None)."""

    reason: LossReason | None

    def answer(self, runner_id: str) -> Answer:
        return answers.ended(runner_id, self.reason)


@dataclass(frozen=True)
class Unrecorded:
    """A loss shows, but Nomad did not take the write that records it."""

    def answer(self, runner_id: str) -> Answer:
        return answers.loss_unrecorded(runner_id)


Verdict = Ended | Unrecorded | None


class ClaimedRunners:
    """`settle_s`: how long after a failure Nomad is read again for a loss
    (NRC_LOSS_SETTLE); `client_sync_s`: how long a Nomad client takes to
    report an allocation's change (NRC_NOMAD_CLIENT_SYNC)."""

    def __init__(self, pools: Pools, settle_s: float = 0.85, client_sync_s: float = 0.25) -> None:
        self._pools = pools
        self.settle_s = settle_s
        self.client_sync_s = client_sync_s

    # -- before the work (blocking) ----------------------------------------------------

    def claimed(self, runner_id: str) -> RunnerView:
        """The claimed runner, touched (its inactivity timer starts again).
        Raises NotLeader when this replica does not serve, `Unusable` when the
        runner is unknown, released, lost (recorded in Nomad first) or
        expired. Blocking: it may read Nomad, and write the loss."""
        if not self._pools.ready():
            raise NotLeader
        return self._usable(runner_id, self._pools.lookup_claimed(runner_id))

    async def claimed_async(self, runner_id: str) -> RunnerView:
        """`claimed` from the event loop. In the common case, a runner this
        replica's snapshot shows claimed and not lost, it is answered there
        (no read, no write: a thread hop would cost more than the check);
        only when Nomad must be read or written first (not seen claimed, a
        loss to record) does `claimed` run on a thread."""
        if not self._pools.ready():
            raise NotLeader
        view = self._pools.lookup(runner_id)
        if view is None or view.job.claim is None or view.loss is not None:
            return await asyncio.to_thread(self.claimed, runner_id)
        return self._usable(runner_id, view)

    def _usable(self, runner_id: str, view: RunnerView | None) -> RunnerView:
        """`view`, touched, if it may be used; else raises as `claimed`."""
        claim = view.job.claim if view is not None else None
        if view is None or claim is None:
            raise Unusable(answers.ended(runner_id, None))
        if view.loss is not None:
            # Never serve the claim from the replacement allocation.
            verdict = self._record(view)
            raise Unusable(verdict.answer(runner_id))
        if not self._pools.touch(runner_id):
            raise Unusable(answers.expired(runner_id, claim.timeout))
        return view

    def begin(self, view: RunnerView, what: str) -> RunnerUse:
        """A use of the claimed runner `view` begins (`claimed` first); raises
        `Unusable` when it expired meanwhile."""
        claim = view.job.claim
        assert claim is not None
        use = self._pools.begin_use(view.id, what)
        if use is None:
            raise Unusable(answers.expired(view.id, claim.timeout))
        return use

    def uses(self, runner_id: str) -> int:
        """Uses of the runner in flight (executions, file operations)."""
        return self._pools.uses.count(runner_id)

    # -- after it (async) ----------------------------------------------------------------

    def ended(self, runner_id: str) -> bool:
        """A loss or release of the runner shows in what the controller has
        read; no new read."""
        view = self._pools.lookup(runner_id)
        return view is None or view.job.claim is None or view.loss is not None

    async def verdict(self, runner_id: str, *, read: bool = True, settle_s: float = 0.0) -> Verdict:
        """Whether the claim is over: `Ended` (a loss recorded in Nomad first)
        or `Unrecorded`; None while the runner is still claimed. Nomad is read
        again first unless `read` is false: at `read_times(settle_s)`, until
        the claim shows as over. When a read fails, what is known stands."""
        if not read:
            return await asyncio.to_thread(self._look, runner_id)
        loop = asyncio.get_running_loop()
        start = loop.time()
        verdict: Verdict = None
        for at in read_times(settle_s):
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            try:
                await asyncio.to_thread(self._pools.reread, [runner_id])
            except Exception as exc:
                log.warning("reading runner %s again from Nomad: %s", runner_id, exc)
                return await asyncio.to_thread(self._look, runner_id)
            verdict = await asyncio.to_thread(self._look, runner_id)
            if isinstance(verdict, Ended):
                return verdict
        return verdict

    async def looked(self, runner_id: str, look: Look, since: float | None = None) -> Verdict:
        """`verdict` as hard as a failure's `look` asks (answers.Look): no
        read, one read now, reads over the settle time, or — for `QUIET`, with
        `since` the event loop time the failing exec was opened — one read of
        the allocation at once, and when its restarts give less notice than
        the client's sync time one more once its client has reported; the
        settle only when a read shows something in flight."""
        if look is Look.NONE:
            return None
        if look is Look.QUIET and since is not None:
            return await self._quiet(runner_id, since)
        wait = look in (Look.SETTLE, Look.QUIET)
        return await self.verdict(runner_id, settle_s=self.settle_s if wait else 0.0)

    async def _quiet(self, runner_id: str, since: float) -> Verdict:
        view = self._pools.lookup(runner_id)
        claim = view.job.claim if view is not None else None
        if view is None or claim is None or view.loss is not None:
            return await asyncio.to_thread(self._look, runner_id)
        alloc = await self._allocation(runner_id, claim.alloc_id)
        if believed_at_once(alloc, claim, self.client_sync_s):
            return await asyncio.to_thread(self._look, runner_id)
        if nothing_in_flight(alloc, claim):
            loop = asyncio.get_running_loop()
            await asyncio.sleep(max(0.0, since + self.client_sync_s - loop.time()))
            alloc = await self._allocation(runner_id, claim.alloc_id)
            if nothing_in_flight(alloc, claim):
                return await asyncio.to_thread(self._look, runner_id)
        return await self.verdict(runner_id, settle_s=self.settle_s)

    async def _allocation(self, runner_id: str, alloc_id: str) -> Allocation | None:
        """The allocation as Nomad's leader holds it now; None when the read fails."""
        try:
            return await asyncio.to_thread(self._pools.allocation, alloc_id)
        except Exception as exc:
            log.warning("reading the allocation of runner %s from Nomad: %s", runner_id, exc)
            return None

    async def stop(self, runner_id: str, reason: LossReason) -> None:
        """End the claim with `reason` (the job is stopped with it: Nomad kills
        everything in the allocation). Nothing to do when it already ended."""
        view = self._pools.lookup(runner_id)
        if view is None or view.job.claim is None or view.job.claim.lost_reason:
            return
        await asyncio.to_thread(self._pools.write_loss, view, reason)

    # -- one look ------------------------------------------------------------------------

    def _look(self, runner_id: str) -> Verdict:
        """The claim's end as the controller sees it now, a derived loss
        recorded in Nomad first (blocking)."""
        view = self._pools.lookup(runner_id)
        if view is None or view.job.claim is None:
            return Ended(None)
        if view.loss is None:
            return None
        try:
            return self._record(view)
        except NotLeader:
            return Unrecorded()  # another replica records it

    def _record(self, view: RunnerView) -> Ended | Unrecorded:
        try:
            return Ended(self._pools.record_loss(view))
        except NomadError as exc:
            log.warning("the loss of runner %s is not recorded yet: %s", view.id, exc)
            return Unrecorded()
