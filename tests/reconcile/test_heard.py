"""heard: which jobs events named, up to which index."""

from __future__ import annotations

import threading

from controller.nomad import jobs
from controller.nomad.events import EventRef
from controller.reconcile.heard import Heard, Mentions

JOB = jobs.runner_job_id(7, "00000000-0000-0000-0000-000000000001")


def job_event(job_id: str) -> EventRef:
    return EventRef("Job", "JobRegistered", job_id, job_id)


def alloc_event(job_id: str) -> EventRef:
    return EventRef("Allocation", "AllocationUpdated", "alloc-1", job_id)


def test_jobs_and_allocations_are_noted_separately_with_the_oldest_index() -> None:
    heard = Heard()
    heard.note(10, [alloc_event(JOB)])
    heard.note(12, [job_event(JOB)])
    heard.note(11, [alloc_event(JOB)])
    newest, named = heard.take()
    assert newest == 12
    assert named == {JOB: Mentions(job=12, allocs=11, first=10)}
    assert heard.take() == (12, {})  # taken once


def test_events_about_nothing_we_read_only_move_the_index() -> None:
    heard = Heard()
    heard.note(
        20,
        [
            EventRef("Evaluation", "EvaluationUpdated", "e1", JOB),
            EventRef("Node", "NodeDrain", "n1", None),
            job_event("some-other-job"),
        ],
    )
    assert heard.take() == (20, {})


def test_put_back_merges_with_what_was_heard_meanwhile() -> None:
    heard = Heard()
    heard.note(10, [job_event(JOB)])
    _, named = heard.take()
    heard.note(15, [alloc_event(JOB)])
    heard.put_back(named)
    assert heard.take()[1] == {JOB: Mentions(job=10, allocs=15, first=10)}


def test_name_has_a_job_read_whatever_events_said() -> None:
    heard = Heard()
    heard.name([JOB])
    newest, named = heard.take()
    assert newest == 0 and JOB in named


def test_wait_for_news_answers_at_once_when_something_newer_was_heard() -> None:
    heard = Heard()
    heard.note(5, [])
    assert heard.wait_for_news(lambda: 4, 10.0)  # no waiting: 5 > 4
    woke = threading.Event()

    def waiter() -> None:
        heard.wait_for_news(lambda: 5, 30.0)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    heard.note(6, [])
    # Woken by the frame, long before the timeout.
    assert woke.wait(10.0)
    thread.join()
