"""NomadClient through a client agent and a follower server of a three-server
simulator: errors come back as Nomad forwards them (`rpc error: …`) and are
read as if they came direct."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from controller.nomad.client import NomadClient
from controller.nomad.gateway import IndexConflict, LockHeld
from nomadsim import SimServer
from tests.helpers import runner_job


class Outcomes:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, operation: str, outcome: str, status: str, seconds: float) -> None:
        self.calls.append((operation, outcome, status))

    def of(self, operation: str) -> list[tuple[str, str]]:
        return [(o, s) for op, o, s in self.calls if op == operation]


@pytest.fixture(params=["client", "follower"])
def entry(request: pytest.FixtureRequest, make_sim: Callable[..., SimServer]) -> str:
    server: SimServer = make_sim(servers=3, entry=request.param)
    return server.address


def test_a_forwarded_enforce_index_conflict_is_a_conflict(entry: str) -> None:
    outcomes = Outcomes()
    client = NomadClient(address=entry, retry_max_wait_s=0.01, on_request=outcomes)
    first = client.register_job(runner_job("1-a"), enforce_index=0)
    with pytest.raises(IndexConflict, match="rpc error: Enforcing job modify index"):
        client.register_job(runner_job("1-a"), enforce_index=0)
    with pytest.raises(IndexConflict, match="conflicting job modify index"):
        client.register_job(runner_job("1-a"), enforce_index=first.job_modify_index + 7)
    # One request each, never retried as a server error.
    assert outcomes.of("register_job") == [
        ("ok", "200"),
        ("conflict", "500"),
        ("conflict", "500"),
    ]


def test_a_forwarded_lost_lock_is_lock_held(entry: str) -> None:
    outcomes = Outcomes()
    client = NomadClient(address=entry, retry_max_wait_s=0.01, on_request=outcomes)
    lock = client.lock_acquire("nrc/leader", ttl_s=15, lock_delay_s=0)
    client.lock_release(lock)
    with pytest.raises(LockHeld):
        client.lock_renew(lock)
    assert [o for o, _ in outcomes.of("lock_renew")] == ["conflict"]
