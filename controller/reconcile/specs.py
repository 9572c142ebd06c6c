"""specs: the cache of job specs the observer keeps, one entry per job, and
the one rule of who wins when two versions of a spec meet: the one with the
newer JobModifyIndex (a spec we just wrote and a spec a list-and-read
brought in race all the time; neither may move the cache backwards).

Specs are kept as compressed JSON (about 1 KB a runner instead of about
16 KB of dicts), which keeps memory and garbage-collection work small at
10,000 runners. A runner job's spec is parsed once, when cached: a pass
reads the parsed runner, a claim decodes one spec.

Not thread-safe on its own: the observer holds its lock around every call,
so that a spec and the snapshot built from it change together.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from controller.model import RunnerJob
from controller.nomad import jobs

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class CachedSpec:
    modify_index: int  # the spec's JobModifyIndex
    data: bytes  # its compressed JSON
    runner: RunnerJob | None  # parsed once, for runner jobs (status comes from the list)

    @classmethod
    def of(cls, job_id: str, spec: JsonDict) -> CachedSpec:
        env_id = jobs.runner_env_id(job_id)
        runner = jobs.runner_from_job(spec, env_id) if env_id is not None else None
        data = zlib.compress(json.dumps(spec, separators=(",", ":")).encode(), 1)
        return cls(jobs.modify_index(spec), data, runner)

    def decode(self) -> JsonDict:
        spec: JsonDict = json.loads(zlib.decompress(self.data))
        return spec


class SpecCache:
    def __init__(self) -> None:
        self._specs: dict[str, CachedSpec] = {}

    def get(self, job_id: str) -> CachedSpec | None:
        return self._specs.get(job_id)

    def current_for(self, job_id: str, modify_index: int) -> CachedSpec | None:
        """The cached spec if it is at least as new as `modify_index` (a list
        shows that version): then it need not be read again."""
        cached = self._specs.get(job_id)
        return cached if cached is not None and cached.modify_index >= modify_index else None

    def put_if_newer(self, job_id: str, spec: CachedSpec) -> bool:
        """Keep `spec` unless the cache holds a newer version; True when kept."""
        cached = self._specs.get(job_id)
        if cached is not None and cached.modify_index > spec.modify_index:
            return False
        self._specs[job_id] = spec
        return True

    def drop(self, job_id: str) -> None:
        self._specs.pop(job_id, None)

    def keep_only(self, job_ids: Collection[str]) -> None:
        """Forget every job not in `job_ids` (a full list no longer shows them)."""
        for job_id in [j for j in self._specs if j not in job_ids]:
            del self._specs[job_id]
