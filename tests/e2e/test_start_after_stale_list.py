"""Regression (chaos seed 8183): a controller restarted while reads lag
forgets an environment for a full re-list interval.

What happened: the restarted controller's first full look listed jobs from a
lagging view (before `template-10` was registered) and allocations from a
fresh one. The event stream was then started after the newer of the two
indexes, so the registration, which lay between them, was never heard of,
and nothing else named the template until the next full re-list: meanwhile
`DELETE /execution-environments/10` answered 404, as would a claim.

The rule now: the stream starts after the *older* of the two indexes. Events
are hints, so hearing a few again costs a targeted read; missing one costs
an environment."""

from __future__ import annotations

from controller.model import Environment
from controller.nomad.client import NomadClient
from controller.nomad.gateway import JobListing
from controller.reconcile.loop import Controller
from nomadsim import SimServer
from tests.helpers import wait_until
from tests.support.controller import TEST_SETTINGS, start_controller, stream_factory

ENV = Environment(id=10, image="python:3.12", prewarming_pool_size=1)


class JobListsLag(NomadClient):
    """A Nomad whose full job lists are answered from behind (a follower's
    view from before the environment was put), while its allocation lists
    and the reads filtered to named jobs are fresh. In the chaos run it was
    the first two full looks (the start's, and the one after the stream
    connected); here it is every one, so that only the stream can tell."""

    def __init__(self, address: str, listing: JobListing) -> None:
        super().__init__(address=address, timeout_s=5.0, retry_attempts=5, retry_max_wait_s=0.2)
        self._lagging = listing

    def list_jobs(self, prefix: str = "", index: int = 0, wait_s: float = 0) -> JobListing:
        if not prefix and not index:
            return self._lagging
        return super().list_jobs(prefix, index, wait_s)


def test_a_start_whose_job_list_lags_still_hears_of_every_environment(sim: SimServer) -> None:
    before = NomadClient(address=sim.address).list_jobs()
    first = start_controller(sim.address)
    try:
        first.pools.put_environment(ENV)
        wait_until(
            lambda: any(v.env_id == ENV.id for v in first.observer.snapshot.runners.values())
        )
    finally:
        first.stop()
    assert before.index < NomadClient(address=sim.address).list_jobs().index

    restarted = Controller(
        JobListsLag(sim.address, before),
        TEST_SETTINGS,
        stream_factory=stream_factory(sim.address),
    )
    restarted.start()
    try:
        wait_until(restarted.ready, timeout=5)
        wait_until(lambda: restarted.pools.environment(ENV.id) is not None, timeout=3)
        known = restarted.pools.environment(ENV.id)
        assert known is not None and known.image == ENV.image
    finally:
        restarted.stop()
