"""specs: the cache of job specs the observer keeps, one entry per job, and
the one rule of who wins when two versions of a spec meet: the one with the
newer JobModifyIndex (a spec we just wrote and a spec a list-and-read
brought in race all the time; neither may move the cache backwards).

Specs are kept as compressed JSON (about 1 KB a runner instead of about
16 KB of dicts), which keeps memory and garbage-collection work small at
10,000 runners. The runners of one environment are one template with a few
fields of their own, so each is compressed against the JSON of the first
runner spec seen of its environment (zlib's preset dictionary,
`Dictionaries`): 40–170 bytes a runner instead of 0.7–1.3 KB. A runner
job's spec is parsed once, when cached: a pass reads the parsed runner, a
claim decodes one spec.

A spec written on the event loop (a claim's) is cached as plain JSON and
compressed later by `compact`, on the refresh's thread: zlib lets go of the
GIL while it works, and the event loop that lets go of it mid-claim waits
for it again behind whichever thread took it (up to the 5 ms switch
interval) with every claim it serves.

`SpecCache` is not thread-safe on its own: the observer holds its lock
around every call, so that a spec and the snapshot built from it change
together. `Dictionaries` is, with a lock of its own.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson

from controller.model import RunnerJob
from controller.nomad import jobs

JsonDict = dict[str, Any]


class Dictionaries:
    """Per environment, the JSON of the first runner spec cached: the preset
    dictionary every later runner spec of that environment is compressed
    against. A template changed since still shares most of its text with
    the first; an entry keeps the dictionary it was compressed with, so
    nothing here is ever replaced. Thread-safe: refreshes, creations and
    the compaction of claims' specs compress on threads of their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_env: dict[int, bytes] = {}

    def of(self, env_id: int, data: bytes) -> bytes:
        """The environment's dictionary; `data` becomes it if it has none."""
        with self._lock:
            return self._by_env.setdefault(env_id, data)

    def keep_only(self, env_ids: Collection[int]) -> None:
        """Forget the environments not in `env_ids` (their entries keep theirs)."""
        with self._lock:
            self._by_env = {e: d for e, d in self._by_env.items() if e in env_ids}


@dataclass(frozen=True)
class CachedSpec:
    modify_index: int  # the spec's JobModifyIndex
    data: bytes  # its JSON, compressed unless `plain`
    runner: RunnerJob | None  # parsed once, for runner jobs (status comes from the list)
    plain: bool = False  # `data` not yet compressed (see `compact`)
    zdict: bytes = b""  # the preset dictionary `data` was compressed with (shared)

    @classmethod
    def of(
        cls,
        job_id: str,
        spec: JsonDict,
        *,
        compress: bool = True,
        dictionaries: Dictionaries | None = None,
    ) -> CachedSpec:
        env_id = jobs.runner_env_id(job_id)
        runner = jobs.runner_from_job(spec, env_id) if env_id is not None else None
        entry = cls(jobs.modify_index(spec), orjson.dumps(spec), runner, plain=True)
        return entry.compressed(dictionaries) if compress else entry

    def decode(self) -> JsonDict:
        if self.plain:
            data = self.data
        elif self.zdict:
            inflate = zlib.decompressobj(zdict=self.zdict)
            data = inflate.decompress(self.data) + inflate.flush()
        else:
            data = zlib.decompress(self.data)
        spec: JsonDict = orjson.loads(data)
        return spec

    def compressed(self, dictionaries: Dictionaries | None = None) -> CachedSpec:
        """The same entry with its JSON compressed, against its environment's
        dictionary when given one (runner jobs only: a template is one of a
        kind)."""
        if not self.plain:
            return self
        if dictionaries is None or self.runner is None:
            return CachedSpec(self.modify_index, zlib.compress(self.data, 1), self.runner)
        zdict = dictionaries.of(self.runner.env_id, self.data)
        deflate = zlib.compressobj(1, zdict=zdict)
        data = deflate.compress(self.data) + deflate.flush()
        return CachedSpec(self.modify_index, data, self.runner, zdict=zdict)


class SpecCache:
    def __init__(self) -> None:
        self._specs: dict[str, CachedSpec] = {}
        self._plain: set[str] = set()  # the jobs whose entry is not compressed yet

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
        if spec.plain:
            self._plain.add(job_id)
        else:
            self._plain.discard(job_id)
        return True

    def drop(self, job_id: str) -> None:
        self._specs.pop(job_id, None)
        self._plain.discard(job_id)

    def keep_only(self, job_ids: Collection[str]) -> None:
        """Forget every job not in `job_ids` (a full list no longer shows them)."""
        for job_id in [j for j in self._specs if j not in job_ids]:
            del self._specs[job_id]
        self._plain &= self._specs.keys()

    def plain_entries(self) -> dict[str, CachedSpec]:
        """The entries not compressed yet (for `compact`)."""
        return {job_id: self._specs[job_id] for job_id in self._plain}

    def replace_unchanged(self, job_id: str, old: CachedSpec, new: CachedSpec) -> None:
        """Put `new` in place of `old` unless the entry changed meanwhile."""
        if self._specs.get(job_id) is old:
            self._specs[job_id] = new
            self._plain.discard(job_id)


def compact(
    entries: dict[str, CachedSpec], dictionaries: Dictionaries | None = None
) -> dict[str, tuple[CachedSpec, CachedSpec]]:
    """Each plain entry with its compressed replacement (run without the
    observer's lock; `SpecCache.replace_unchanged` installs them under it)."""
    return {job_id: (cached, cached.compressed(dictionaries)) for job_id, cached in entries.items()}
