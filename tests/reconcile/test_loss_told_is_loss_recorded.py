"""Regression (chaos seeds 15 and 23): a client was told one loss reason and
Nomad recorded another (or none).

What happened: `GET /runners/{id}` answered 410 with the reason the
controller had just *derived* (`oom_killed`: the claimed task was OOM-killed
and restarted in place), before any `EndClaim` write. Before the pass wrote
it, a drain stopped the allocation for migration; its last task event was now
a kill, not an OOM, so the pass derived and recorded `migrated`. Every later
answer — and every answer of a restarted controller — said `migrated`: the
client's reason changed under it.

Now the request that first meets a derived reset writes the loss itself
(EndClaim with EnforceIndex) before answering, so the reason told is the
reason recorded, and the first one written is never rewritten.
"""

from __future__ import annotations

from dataclasses import replace

from controller.nomad.gateway import NomadUnavailable
from tests.support.one_runner import OneRunner


def lost_reason(answer_json: dict[str, object]) -> str:
    message = str(answer_json.get("message", ""))
    assert "was lost: " in message, message
    return message.split("was lost: ", 1)[1].split(" ", 1)[0]


def oom_restart(s: OneRunner) -> None:
    alloc = s.nomad.allocs["alloc-1"]
    s.nomad.put_alloc(replace(alloc, restarts=alloc.restarts + 1, last_exit_oom=True))
    s.controller.observer.refresh()


def migrate(s: OneRunner) -> None:
    alloc = s.nomad.allocs["alloc-1"]
    s.nomad.put_alloc(
        replace(
            alloc,
            desired_status="stop",
            desired_description="alloc is being migrated",
            last_exit_oom=False,  # the migration's kill is the newest task event now
        )
    )


def test_the_reason_told_is_written_first_and_never_changes(one_runner: OneRunner) -> None:
    s = one_runner
    runner_id = s.claim()
    oom_restart(s)

    answer = s.api.get(f"/api/v1/runners/{runner_id}")
    assert answer.status_code == 410
    assert lost_reason(answer.json()) == "oom_killed"
    # written before the answer, by the request itself (no pass ran)
    assert s.nomad.end_claims(runner_id) == ["oom_killed"]

    migrate(s)
    s.reconcile()
    assert s.nomad.end_claims(runner_id) == ["oom_killed"], "the recorded loss was rewritten"
    again = s.api.get(f"/api/v1/runners/{runner_id}")
    assert lost_reason(again.json()) == "oom_killed"

    # A controller started afresh on the same Nomad tells the same.
    other = OneRunner(s.nomad)
    try:
        other.controller.observer.refresh()
        answer = other.api.get(f"/api/v1/runners/{runner_id}")
        assert answer.status_code == 410
        assert lost_reason(answer.json()) == "oom_killed"
    finally:
        other.close()


def test_a_pass_that_wrote_first_is_what_the_client_hears(one_runner: OneRunner) -> None:
    s = one_runner
    runner_id = s.claim()
    oom_restart(s)
    view = s.controller.claims.lookup(runner_id)
    assert view is not None and view.reset is not None
    s.reconcile()  # the pass writes oom_killed; the request then reads it
    migrate(s)
    s.controller.observer.refresh()
    assert lost_reason(s.api.get(f"/api/v1/runners/{runner_id}").json()) == "oom_killed"
    # the request's own write, based on its older view, lost to the pass's: one record
    assert s.controller.claims.record_loss(view) is not None
    assert s.nomad.end_claims(runner_id) == ["oom_killed"]


def test_when_nomad_cannot_take_the_write_the_client_retries(one_runner: OneRunner) -> None:
    s = one_runner
    runner_id = s.claim()
    oom_restart(s)

    def unavailable(spec: object, enforce_index: int | None) -> None:
        raise NomadUnavailable("No cluster leader")

    s.nomad.before_register = unavailable
    answer = s.api.get(f"/api/v1/runners/{runner_id}")
    assert answer.status_code == 503, "never a reason that Nomad does not record"
    assert "reset" in answer.json()["message"]
    assert s.nomad.end_claims(runner_id) == []
    s.nomad.before_register = None
    answer = s.api.get(f"/api/v1/runners/{runner_id}")
    assert answer.status_code == 410
    assert lost_reason(answer.json()) == "oom_killed"
