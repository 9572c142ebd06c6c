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

from typing import Any

import pytest

from controller.api import create_app
from controller.model import Environment
from controller.nomad import jobs
from controller.nomad.client import NomadClient
from controller.nomad.gateway import JobListing, NomadUnavailable
from controller.reconcile.claims import TemplateUnread
from controller.reconcile.loop import Controller
from nomadsim import SimServer
from tests.helpers import wait_until
from tests.support.api_client import client_for
from tests.support.controller import TEST_SETTINGS, start_controller, stream_factory

ENV = Environment(id=10, image="python:3.12", prewarming_pool_size=1)


class JobListsLag(NomadClient):
    """A Nomad whose first two full job lists (the start's, and the one after
    the stream connected, as in the chaos run) are answered from behind: a
    follower's view from before the environment was put. Allocation lists,
    reads filtered to named jobs and later lists are fresh."""

    def __init__(self, address: str, listing: JobListing, lagging: int = 2) -> None:
        super().__init__(address=address, timeout_s=5.0, retry_attempts=5, retry_max_wait_s=0.2)
        self._listing = listing
        self._lagging = lagging

    def list_jobs(self, prefix: str = "", index: int = 0, wait_s: float = 0) -> JobListing:
        if not prefix and not index and self._lagging > 0:
            self._lagging -= 1
            return self._listing
        return super().list_jobs(prefix, index, wait_s)


def put_by_a_first_controller(sim: SimServer) -> None:
    """ENV put, and its runner seen, by a controller that then stops."""
    first = start_controller(sim.address)
    try:
        first.pools.put_environment(ENV)
        wait_until(
            lambda: any(v.env_id == ENV.id for v in first.observer.snapshot.runners.values())
        )
    finally:
        first.stop()


def test_a_start_whose_job_list_lags_still_hears_of_every_environment(sim: SimServer) -> None:
    before = NomadClient(address=sim.address).list_jobs()
    put_by_a_first_controller(sim)
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


class TemplatesUnreadable(NomadClient):
    """A Nomad that lists every job but cannot answer the read of a
    template's spec (500 `No cluster leader` past every retry) while
    `unreadable` is set."""

    def __init__(self, address: str) -> None:
        super().__init__(address=address, timeout_s=5.0, retry_attempts=1, retry_max_wait_s=0.05)
        self.unreadable = True

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        if self.unreadable and job_id.startswith("template-"):
            raise NomadUnavailable("Nomad answered 500: No cluster leader")
        return super().get_job(job_id)


def test_an_environment_whose_template_cannot_be_read_yet_still_exists(sim: SimServer) -> None:
    """Chaos seed 8183, again: a controller restarted while Nomad had no
    leader listed `template-10` but could not read its spec. The environment
    is not unknown for that: it is deleted when asked (its job is
    deregistered by id), and a claim or a read of it is told to retry (500
    NOMAD_UNREACHABLE), never 404, which CodeOcean answers by putting it."""
    put_by_a_first_controller(sim)
    gateway = TemplatesUnreadable(sim.address)
    restarted = Controller(gateway, TEST_SETTINGS, stream_factory=stream_factory(sim.address))
    restarted.start()
    try:
        wait_until(restarted.ready, timeout=5)
        assert ENV.id in restarted.observer.snapshot.unread_templates
        with pytest.raises(TemplateUnread):
            restarted.pools.environment(ENV.id)
        with pytest.raises(TemplateUnread):
            restarted.pools.claim(ENV.id, 0)
        api = client_for(create_app(restarted.pools))
        for answer in (
            api.post("/api/v1/runners", json={"executionEnvironmentId": ENV.id}),
            api.get(f"/api/v1/execution-environments/{ENV.id}"),
        ):
            assert answer.status_code == 500
            assert answer.json()["errorCode"] == "NOMAD_UNREACHABLE"
            assert "retry later" in answer.json()["message"]

        assert restarted.pools.delete_environment(ENV.id) is True
        assert NomadClient(address=sim.address).get_job(jobs.template_job_id(ENV.id)) is None
        gateway.unreadable = False
        wait_until(lambda: not restarted.observer.snapshot.exists(ENV.id), timeout=5)
        assert restarted.pools.delete_environment(ENV.id) is False
    finally:
        restarted.stop()
