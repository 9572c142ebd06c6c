"""Regression (chaos seed 145): a runner its client had just touched was deleted
for `inactivity_timeout`.

What happened: a restarted controller planned the release of an expired claim
and re-checked the expiry, then its deregistration went through retries in a
burst of Nomad 500s. Meanwhile the client's `GET /runners/{id}` was answered
200 (its timer started again), and 0.26 s later the retried deregistration
landed: a runner deleted while its client held it and had been told it was
alive.

The timing is reproduced exactly: the deregistration of the in-memory Nomad
calls back while it is "in flight", and the client's request is made there.
A release that is decided is final: the request is answered 410 naming the
inactivity timeout, never 200.
"""

from __future__ import annotations

from controller.nomad.gateway import NomadUnavailable
from tests.support.one_runner import ENV, OneRunner

TIMEOUT_S = 1


def test_a_touch_while_the_release_is_in_flight_is_told_the_runner_expired(
    one_runner: OneRunner,
) -> None:
    runner_id = one_runner.claim(TIMEOUT_S)
    one_runner.clock.advance(TIMEOUT_S + 0.5)  # nobody touched it: expired
    answers: list[tuple[int, str]] = []

    def client_touches_meanwhile(job_id: str) -> None:
        if job_id == runner_id:
            got = one_runner.api.get(f"/api/v1/runners/{runner_id}")
            answers.append((got.status_code, str(got.json().get("message", ""))))

    one_runner.nomad.before_deregister = client_touches_meanwhile
    one_runner.reconcile()

    assert one_runner.nomad.deregistered() == [runner_id]
    assert len(answers) == 1
    status, message = answers[0]
    assert status == 410, "the client was told its runner is alive while it was being deleted"
    assert "inactivity timeout" in message
    # and after the deletion, it is simply gone
    assert one_runner.api.get(f"/api/v1/runners/{runner_id}").status_code == 410


def test_a_touch_before_the_release_is_decided_keeps_the_runner(one_runner: OneRunner) -> None:
    runner_id = one_runner.claim(TIMEOUT_S)
    one_runner.clock.advance(TIMEOUT_S - 0.2)
    assert one_runner.api.get(f"/api/v1/runners/{runner_id}").status_code == 200
    one_runner.clock.advance(0.5)  # past the claim's first expiry, not past the touch's
    one_runner.reconcile()
    assert runner_id not in one_runner.nomad.deregistered()
    assert one_runner.api.get(f"/api/v1/runners/{runner_id}").status_code == 200


def test_a_failed_release_stays_decided(one_runner: OneRunner) -> None:
    """A release that failed is retried by the next pass; the claim stays
    expired in between (a 410 is never followed by a 200)."""
    runner_id = one_runner.claim(TIMEOUT_S)
    one_runner.clock.advance(TIMEOUT_S + 0.5)

    def unavailable(job_id: str) -> None:
        raise NomadUnavailable("No cluster leader")

    one_runner.nomad.before_deregister = unavailable
    one_runner.controller.observer.refresh()
    assert not one_runner.controller.reconciler.reconcile(ENV.id).ok  # the write failed
    assert one_runner.api.get(f"/api/v1/runners/{runner_id}").status_code == 410
    one_runner.nomad.before_deregister = None
    one_runner.reconcile()
    assert one_runner.nomad.deregistered() == [runner_id]
