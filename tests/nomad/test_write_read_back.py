"""A register of unknown outcome is read back, never assumed failed or done.

A forwarded write whose leader died with it in flight is answered 500
`rpc error: EOF`, committed or not (the simulator's `write_eof_rate`
fault). The retry of an EnforceIndex register whose first try was committed
conflicts with that try: both writers (the claims' `AsyncJobWriter` and
`NomadClient`) then read the job back, and take it as their own write when
it holds what they sent (`jobs.landed`); a change of another writer stays a
conflict. A release's purge whose every try was answered `rpc error: EOF`
is read back too: a job Nomad no longer has was deregistered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from controller.nomad import jobs
from controller.nomad.aclient import AsyncJobWriter
from controller.nomad.client import NomadClient
from controller.nomad.connection import NomadConnection
from controller.nomad.errors import NomadAPIError
from controller.nomad.gateway import IndexConflict, WriteResult
from nomadsim import SimServer
from tests.helpers import Http, runner_job
from tests.nomad.test_forwarded import Outcomes

Register = Callable[[dict[str, Any], int], WriteResult]


class AfterFirstTry(Outcomes):
    """Request outcomes, and `then` run once the first register has been answered."""

    def __init__(self, then: Callable[[], object]) -> None:
        super().__init__()
        self._then: Callable[[], object] | None = then

    def __call__(self, operation: str, outcome: str, status: str, seconds: float) -> None:
        super().__call__(operation, outcome, status, seconds)
        if operation == "register_job" and self._then is not None:
            then, self._then = self._then, None
            then()


def register_with(kind: str, address: str, outcomes: Outcomes) -> Register:
    if kind == "sync":
        client = NomadClient(address=address, retry_max_wait_s=0.01, on_request=outcomes)
        return lambda job, index: client.register_job(job, enforce_index=index)

    def register(job: dict[str, Any], index: int) -> WriteResult:
        writer = AsyncJobWriter(
            NomadConnection(address=address), retry_max_wait_s=0.01, on_request=outcomes
        )

        async def run() -> WriteResult:
            try:
                return await writer.register_job(job, enforce_index=index)
            finally:
                await writer.aclose()

        return asyncio.run(run())

    return register


@pytest.fixture
def server(make_sim: Callable[..., SimServer]) -> SimServer:
    return make_sim(servers=3, entry="client")


def claimed(job_id: str, at: str) -> dict[str, Any]:
    return {**runner_job(job_id), "Meta": {"used": "true", "nrc_claimed_at": at}}


def eof_once(server: SimServer, applied: bool) -> None:
    server.sim.faults.update(
        {"write_eof_rate": 1.0, "write_eof_applied_rate": 1.0 if applied else 0.0}
    )


def no_eof(server: SimServer) -> None:
    server.sim.faults.update({"write_eof_rate": 0.0})


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_retry_that_conflicts_with_its_own_committed_try_is_the_write(
    server: SimServer, kind: str
) -> None:
    first = NomadClient(address=server.address).register_job(runner_job("1-a"), enforce_index=0)
    outcomes = AfterFirstTry(lambda: no_eof(server))
    eof_once(server, applied=True)
    result = register_with(kind, server.address, outcomes)(
        claimed("1-a", "1"), first.job_modify_index
    )
    stored = Http(server.address).get("/v1/job/1-a")
    assert stored["Meta"] == {"used": "true", "nrc_claimed_at": "1"}
    assert result.job_modify_index == stored["JobModifyIndex"] > first.job_modify_index
    assert outcomes.of("register_job") == [("error", "500"), ("conflict", "500")]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_try_that_was_not_committed_is_simply_retried(server: SimServer, kind: str) -> None:
    first = NomadClient(address=server.address).register_job(runner_job("1-b"), enforce_index=0)
    outcomes = AfterFirstTry(lambda: no_eof(server))
    eof_once(server, applied=False)
    register_with(kind, server.address, outcomes)(claimed("1-b", "2"), first.job_modify_index)
    assert outcomes.of("register_job") == [("error", "500"), ("ok", "200")]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_another_writers_change_meanwhile_stays_a_conflict(server: SimServer, kind: str) -> None:
    first = NomadClient(address=server.address).register_job(runner_job("1-c"), enforce_index=0)
    other = NomadClient(address=server.address)

    def another_claim_lands() -> None:
        no_eof(server)
        other.register_job(claimed("1-c", "other"), enforce_index=first.job_modify_index)

    outcomes = AfterFirstTry(another_claim_lands)
    eof_once(server, applied=False)
    with pytest.raises(IndexConflict):
        register_with(kind, server.address, outcomes)(claimed("1-c", "3"), first.job_modify_index)
    assert Http(server.address).get("/v1/job/1-c")["Meta"]["nrc_claimed_at"] == "other"


@pytest.mark.parametrize("applied", [True, False])
def test_a_purge_answered_eof_every_time_is_read_back(server: SimServer, applied: bool) -> None:
    NomadClient(address=server.address).register_job(runner_job("1-d"), enforce_index=0)
    outcomes = Outcomes()
    client = NomadClient(
        address=server.address, retry_attempts=2, retry_max_wait_s=0.01, on_request=outcomes
    )
    eof_once(server, applied=applied)
    if applied:
        client.deregister_job("1-d", purge=True)  # no error: it was deregistered
        assert Http(server.address).request("GET", "/v1/job/1-d").status_code == 404
    else:
        with pytest.raises(NomadAPIError, match="EOF"):
            client.deregister_job("1-d", purge=True)
        assert Http(server.address).request("GET", "/v1/job/1-d").status_code == 200
    assert outcomes.of("deregister_job") == [("error", "500"), ("error", "500")]


def _job(meta: dict[str, str] | None, group_meta: dict[str, str] | None) -> dict[str, Any]:
    return {"ID": "1-x", "Meta": meta, "TaskGroups": [{"Name": "g", "Meta": group_meta}]}


@pytest.mark.parametrize(
    ("current", "landed"),
    [
        (_job({"a": "1"}, {"used": "true", "at": "5"}), True),
        (_job({"a": "1"}, {"used": "true", "at": "6"}), False),  # another claim
        (_job({"a": "2"}, {"used": "true", "at": "5"}), False),
        ({**_job({"a": "1"}, {"used": "true", "at": "5"}), "ID": "1-y"}, False),
        ({"ID": "1-x", "Meta": {"a": "1"}, "TaskGroups": []}, False),  # group gone
        (None, False),  # job gone
    ],
)
def test_landed_compares_the_meta_of_the_job_and_every_group(
    current: dict[str, Any] | None, landed: bool
) -> None:
    assert jobs.landed(_job({"a": "1"}, {"used": "true", "at": "5"}), current) is landed
    assert jobs.landed(_job(None, None), _job({}, {})) is True  # null and empty meta alike
