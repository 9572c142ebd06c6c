"""One environment's pool over the in-memory Nomad, for unit tests of the
parts the Controller wires: Observer, Expectations, SpecWriter, RunnerGuard,
Claims and Actor, built by keyword as the Controller builds them, on a ManualClock.
Nothing runs on its own: the test refreshes, claims and executes plans.
`restart` replaces every part, as a new controller process over the same
Nomad would."""

from __future__ import annotations

import asyncio
import itertools

from controller.clock import ManualClock
from controller.metrics import Metrics
from controller.model import Environment, RunnerView
from controller.nomad import jobs
from controller.nomad.gateway import WriteResult
from controller.reconcile.act import Actor
from controller.reconcile.claims import Claims, RunnerGuard
from controller.reconcile.expectations import Expectations
from controller.reconcile.observe import Observer
from controller.reconcile.ratelimit import TokenBucket
from controller.reconcile.snapshot import Snapshot
from controller.reconcile.uses import RunnerUse
from controller.reconcile.writes import SpecWriter
from tests.support.fake_nomad import FakeNomad, JsonDict

ENV = Environment(id=3, image="python:3.12", prewarming_pool_size=2)


class AsyncOver:
    """The in-memory Nomad's register as the claims' asynchronous writer
    (controller.nomad.aclient) offers it."""

    def __init__(self, nomad: FakeNomad) -> None:
        self.nomad = nomad

    async def register_job(self, job: JsonDict, enforce_index: int | None = None) -> WriteResult:
        return self.nomad.register_job(job, enforce_index)


class Pool:
    """`serving` and `leading` stand for the Controller's `ready` and
    `is_leader`; `changed` records the environments Claims asked a pass for."""

    def __init__(self, nomad: FakeNomad | None = None, shared: bool = False) -> None:
        self.nomad = nomad if nomad is not None else FakeNomad(ManualClock())
        self.shared = shared  # other replicas claim too (the Actor's `shared`)
        assert isinstance(self.nomad.clock, ManualClock)
        self.clock: ManualClock = self.nomad.clock
        self.serving = True
        self.leading = True
        self.held: list[RunnerUse] = []  # uses begun by a test, oldest first
        self._uids = itertools.count(1)
        self._wire()

    def _wire(self) -> None:
        self.changed: list[int] = []
        self.metrics = Metrics()
        self.expectations = Expectations(self.clock)
        self.observer = Observer(
            gateway=self.nomad,
            clock=self.clock,
            expectations=self.expectations,
            metrics=self.metrics,
        )
        self.writer = SpecWriter(
            gateway=self.nomad, observer=self.observer, async_gateway=AsyncOver(self.nomad)
        )
        self.guard = RunnerGuard()
        self.claims = Claims(
            gateway=self.nomad,
            observer=self.observer,
            writer=self.writer,
            expectations=self.expectations,
            guard=self.guard,
            clock=self.clock,
            metrics=self.metrics,
            can_serve=lambda: self.serving,
            on_change=self.changed.append,
        )
        self.actor = Actor(
            gateway=self.nomad,
            observer=self.observer,
            expectations=self.expectations,
            guard=self.guard,
            claims=self.claims,
            clock=self.clock,
            metrics=self.metrics,
            rate=TokenBucket(0, 1, self.clock),  # unlimited
            concurrency=2,
            is_leader=lambda: self.leading,
            shared=self.shared,
        )

    def restart(self) -> None:
        """A new controller process: new parts, timers and metrics, same Nomad."""
        self.actor.shutdown()
        self._wire()

    def close(self) -> None:
        self.actor.shutdown()

    # -- Nomad's side ------------------------------------------------------------------

    def environment(self, env: Environment = ENV) -> None:
        self.nomad.put(jobs.template_job(env))

    def add_runner(self, env: Environment = ENV, status: str = "running") -> str:
        """A runner job of the environment with one allocation in `status`."""
        template = self.nomad.specs[jobs.template_job_id(env.id)]
        job_id = jobs.runner_job_id(env.id, f"00000000-0000-4000-8000-{next(self._uids):012d}")
        # Built from the template as observed (with the policy it was written under).
        observed = jobs.environment_from_job(template, env.id)
        self.nomad.put(jobs.runner_job(template, observed, job_id))
        self.nomad.run(job_id, status)
        return job_id

    def ready_runners(self, count: int, env: Environment = ENV) -> list[str]:
        """The environment with `count` ready idle runners (oldest first), observed."""
        self.environment(env)
        ids = [self.add_runner(env) for _ in range(count)]
        self.refresh()
        return ids

    # -- the controller's side ---------------------------------------------------------

    def refresh(self) -> Snapshot:
        return self.observer.refresh()

    def view(self, runner_id: str) -> RunnerView:
        return self.observer.snapshot.runners[runner_id]

    def claim(self, timeout_s: int = 0, env: Environment = ENV) -> RunnerView:
        return self.claims.claim(env.id, timeout_s)

    def claim_async(self, timeout_s: int = 0, env: Environment = ENV) -> RunnerView:
        """`claim` as the API makes it: on an event loop, the write awaited."""
        return asyncio.run(self.claims.claim_async(env.id, timeout_s))

    def claim_ready(self, timeout_s: int = 60) -> str:
        """The environment with one ready runner, claimed (inactivity `timeout_s`); its id."""
        self.ready_runners(1)
        return self.claim(timeout_s).id

    def count(self, metric: str, **labels: str) -> float:
        """A counter's value (`metric` without `_total`), 0 when never incremented."""
        value = self.metrics.registry.get_sample_value(f"{metric}_total", labels)
        return value or 0.0
