"""facade: what the API, executions and file operations ask of the
controller, in one small type — environments and their counts, claims and
their use, and a fresh look at Nomad when an answer must not be stale.

Nothing behind it is reached around it: the API holds a `Pools`, not the
controller's parts, so the parts can change without the routes noticing.
Environment writes are here because only the API makes them; they show in
the snapshot at once and wake a pass over the environment.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from controller.clock import Clock
from controller.metrics import Metrics
from controller.model import Allocation, Environment, LossReason, RunnerView
from controller.nomad import jobs
from controller.nomad.gateway import NomadGateway
from controller.prewarm.policy import Decision, ceiling_for
from controller.reconcile.claims import Claims, NotLeader, TemplateUnread
from controller.reconcile.observe import Observer
from controller.reconcile.plan import PoolCounts, count_pool
from controller.reconcile.prewarming import Prewarmer
from controller.reconcile.reconciler import PoolReconciler
from controller.reconcile.snapshot import Snapshot
from controller.reconcile.uses import RunnerUse, Uses
from controller.reconcile.writes import SpecWriter


@dataclass(frozen=True)
class Prewarming:
    """How large an environment's pool is kept, and why."""

    adaptive: bool
    floor: int  # prewarmingPoolSize
    ceiling: int  # the floor when static
    target: int  # the pool kept now (the floor when static or before the first pass)
    decision: Decision | None  # adaptive, once a pass decided


class Pools:
    def __init__(
        self,
        *,
        gateway: NomadGateway,
        observer: Observer,
        claims: Claims,
        writer: SpecWriter,
        reconciler: PoolReconciler,
        clock: Clock,
        metrics: Metrics,
        is_leader: Callable[[], bool],
        ready: Callable[[], bool],
        enqueue: Callable[[int], None],
        prewarmer: Prewarmer | None = None,
        template: jobs.TemplatePolicy | None = None,
    ) -> None:
        self._gateway = gateway
        self._observer = observer
        self._claims = claims
        self._writer = writer
        self._reconciler = reconciler
        self.clock = clock
        self.metrics = metrics
        self.is_leader = is_leader
        self.ready = ready  # serving: leading and Nomad observed since
        self._enqueue = enqueue
        self._prewarmer = prewarmer  # None: static pools
        self.template = template or jobs.TemplatePolicy()  # what every template is written with

    # -- Nomad, as observed ------------------------------------------------------

    def nomad_error(self) -> str | None:
        """Why Nomad cannot be observed right now, or None."""
        if self._observer.last_error is not None:
            return self._observer.last_error
        if not self._observer.observed_once:
            return "Nomad has not been observed yet"
        return None

    def fetch_environments(self, env_id: int | None = None) -> None:
        """Read the environments from Nomad now, whether or not an event named
        them yet (`?fetch=true`: a template another writer just registered
        shows even before its event arrives): the template job of `env_id`,
        or every template job Nomad lists and every one the snapshot shows
        (so a deleted one is seen gone). Raises when Nomad cannot be read."""
        if env_id is not None:
            ids = {jobs.template_job_id(env_id)}
        else:
            listed = self._gateway.list_jobs(prefix=jobs.TEMPLATE_PREFIX)
            ids = {stub.id for stub in listed.jobs if jobs.template_env_id(stub.id) is not None}
            ids |= {jobs.template_job_id(e) for e in self._observer.snapshot.templates}
        self._observer.reread(ids)

    def reread(self, runner_ids: Collection[str]) -> None:
        """Read these runners from Nomad now (see `Observer.reread`)."""
        self._observer.reread(runner_ids)

    def observed_node(self, alloc_id: str) -> str | None:
        """The node the snapshot shows the allocation on; None when it shows
        no such allocation. A scan of every runner's allocations: for when
        Nomad cannot be asked."""
        for allocs in self._observer.snapshot.allocs.values():
            for alloc in allocs:
                if alloc.id == alloc_id:
                    return alloc.node_id or None
        return None

    def allocation(self, alloc_id: str) -> Allocation | None:
        """One allocation as Nomad's leader holds it now (one read; the
        snapshot is not changed by it)."""
        return self._gateway.get_allocation(alloc_id)

    def _known(self) -> Snapshot:
        """The snapshot, listing Nomad first if it never was: before that an
        empty snapshot would say that no environment exists."""
        if self._observer.observed_once:
            return self._observer.snapshot
        return self._observer.current()

    # -- environments ---------------------------------------------------------------

    def environments(self) -> list[Environment]:
        snap = self._observer.snapshot
        return [snap.templates[e].env for e in sorted(snap.templates)]

    def environment(self, env_id: int) -> Environment | None:
        """The environment; None when it does not exist. Raises
        `TemplateUnread` when its template job is listed but its spec could
        not be read yet (Nomad without a leader)."""
        snap = self._observer.snapshot
        template = snap.templates.get(env_id)
        if template is None and env_id in snap.unread_templates:
            raise TemplateUnread(env_id)
        return template.env if template else None

    def pool_counts(self, env_id: int) -> PoolCounts:
        """Live counts from the snapshot (a claim shows at once, before any pass)."""
        return count_pool(self._observer.snapshot.views(env_id))

    def degraded(self, env_id: int) -> bool:
        return self._reconciler.degraded(env_id)

    def prewarming(self, env_id: int) -> Prewarming | None:
        """The environment's pool size and the forecast behind it; None when
        the environment does not exist."""
        env = self.environment(env_id)
        if env is None:
            return None
        floor = env.prewarming_pool_size
        if self._prewarmer is None:
            return Prewarming(
                adaptive=False, floor=floor, ceiling=floor, target=floor, decision=None
            )
        s = self._prewarmer.settings
        decision = self._prewarmer.decision(env_id)
        return Prewarming(
            adaptive=True,
            floor=floor,
            ceiling=ceiling_for(floor, s.ceiling_multiple, s.ceiling_cap),
            target=decision.target if decision is not None else floor,
            decision=decision,
        )

    def put_environment(self, env: Environment) -> bool:
        """Create or replace an environment's template; True when it is new.
        Claimed runners keep running; idle ones built from an older template
        are replaced by the next pass. The leader, or any replica that
        serves, may write it (the leader's next pass builds the pool)."""
        if not (self.is_leader() or self.ready()):
            raise NotLeader
        created = not self._known().exists(env.id)
        self._writer.register(jobs.template_job(env, self.template))
        self._enqueue(env.id)
        return created

    def delete_environment(self, env_id: int) -> bool:
        """Delete the template; idle runners go at once, claimed ones when released."""
        if not (self.is_leader() or self.ready()):
            raise NotLeader
        # A template listed but not readable yet exists all the same: its
        # job is deregistered by id, no spec needed.
        if not self._known().exists(env_id):
            return False
        self._gateway.deregister_job(jobs.template_job_id(env_id), purge=True)
        self._observer.forget(jobs.template_job_id(env_id))
        self._reconciler.orphaned_now(env_id)
        self._enqueue(env_id)
        return True

    # -- claims and their use -----------------------------------------------------------

    def claim(self, env_id: int, timeout_s: int) -> RunnerView:
        return self._claims.claim(env_id, timeout_s)

    async def claim_async(self, env_id: int, timeout_s: int) -> RunnerView:
        """`claim` on the event loop (the API's)."""
        return await self._claims.claim_async(env_id, timeout_s)

    def lookup(self, runner_id: str) -> RunnerView | None:
        return self._claims.lookup(runner_id)

    def lookup_claimed(self, runner_id: str) -> RunnerView | None:
        """`lookup`, read from Nomad first when not seen claimed (blocking)."""
        return self._claims.lookup_claimed(runner_id)

    def touch(self, runner_id: str) -> bool:
        return self._claims.touch(runner_id)

    def release(self, runner_id: str) -> bool:
        return self._claims.release(runner_id)

    def record_loss(self, view: RunnerView) -> LossReason | None:
        return self._claims.record_loss(view)

    def write_loss(self, view: RunnerView, reason: LossReason) -> LossReason | None:
        return self._claims.write_loss(view, reason)

    def begin_use(self, runner_id: str, what: str) -> RunnerUse | None:
        """A token for a use of the runner (None: it expired); see `uses`."""
        return self._claims.begin_use(runner_id, what)

    @property
    def uses(self) -> Uses:
        """The uses in flight: per runner, and all of them."""
        return self._claims.uses
