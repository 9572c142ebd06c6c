"""heard: what the event stream has told the observer since its last read —
the newest event index heard of, and which jobs events named, up to which
index — so a refresh knows what to read and how fresh its result is.

Per job three indexes are kept: the newest event about the job itself, the
newest about its allocations, and the oldest of all (a read older than the
oldest event cannot settle the job's creation or deletion). A refresh takes
them all at once; what it could not settle is put back, merged with what
was heard meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from controller.nomad import jobs
from controller.nomad.events import EventRef


@dataclass
class Mentions:
    """The event indexes that named one job since it was last read."""

    job: int = 0  # newest event about the job
    allocs: int = 0  # newest event about one of its allocations
    first: int = 0  # oldest of all (0: none yet)

    def note(self, index: int, is_job: bool) -> None:
        if is_job:
            self.job = max(self.job, index)
        else:
            self.allocs = max(self.allocs, index)
        self.first = min(self.first, index) if self.first else index

    def merge(self, other: Mentions) -> None:
        self.job = max(self.job, other.job)
        self.allocs = max(self.allocs, other.allocs)
        firsts = [f for f in (self.first, other.first) if f]
        self.first = min(firsts) if firsts else 0


Named = Mapping[str, Mentions]


class Heard:
    """Thread-safe; `_changed` is notified whenever a frame is noted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._newest = 0
        self._named: dict[str, Mentions] = {}

    @property
    def newest(self) -> int:
        """The newest event index heard of."""
        with self._lock:
            return self._newest

    def note(self, index: int, events: Iterable[EventRef]) -> None:
        """A frame at `index`: the jobs its Job and Allocation events name are
        to be read again (evaluations and nodes change nothing we read)."""
        named = [
            (e.job_id, e.topic == "Job")
            for e in events
            if e.topic in ("Job", "Allocation")
            and e.job_id
            and jobs.env_id_of(e.job_id) is not None
        ]
        with self._lock:
            for job_id, is_job in named:
                self._named.setdefault(job_id, Mentions()).note(index, is_job)
            self._newest = max(self._newest, index)
            self._changed.notify_all()

    def name(self, job_ids: Collection[str]) -> None:
        """Have these jobs read again by the next refresh, events or not."""
        with self._lock:
            for job_id in job_ids:
                mentions = self._named.setdefault(job_id, Mentions())
                mentions.note(0, True)
                mentions.note(0, False)

    def take(self) -> tuple[int, dict[str, Mentions]]:
        """The newest index and every job named up to it, handed to a
        refresh (and forgotten here until `put_back`)."""
        with self._lock:
            named, self._named = self._named, {}
            return self._newest, named

    def put_back(self, named: Named) -> None:
        """Jobs a refresh could not settle: read them again next time."""
        with self._lock:
            for job_id, old in named.items():
                self._named.setdefault(job_id, Mentions()).merge(old)

    def wait_for_news(self, covered: Callable[[], float], timeout_s: float) -> bool:
        """True at once when an event newer than `covered()` was heard; else
        wait for the next frame (or `timeout_s`) and answer False. Checked and
        waited under one lock, so a frame noted in between is not missed."""
        with self._lock:
            if self._newest > covered():
                return True
            self._changed.wait(timeout_s)
            return False
