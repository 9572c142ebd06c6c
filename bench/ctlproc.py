"""The controller service in its own process, for the benchmarks.

It runs what `nomad-runner-controller run` runs (settings from the
environment, `controller.service.build` and `serve`), and records a few
things the benchmarks read from `GET /_bench/probe` on its API port:

- every claim write (a register with EnforceIndex on an existing job): its
  job id and how long the Nomad request took, so a claim's latency can be
  split into the Nomad write and the controller's own share;
- requests to Nomad and the bytes of their answers (the event stream, a
  separate session, is not counted);
- with `BENCH_TRACK_READY=1`, when each runner first became claimable (the
  snapshot shows it ready) next to when its allocation started running.

`?reset=1` clears what was recorded. With `BENCH_MARKS=1`,
`GET /_bench/marks?on=1` (and `=0`) hands over and clears each claim's
marks (`bench.marks`: when the API saw and answered it, when its write was
sent and answered) and records them from then on (or not); without it no
request passes through the marking middleware. `BENCH_API_ONLY=1` makes it
an API that neither keeps pools up nor observes after its first look
(`ApiOnly`). Prints `READY <api address>`
once the API listens; SIGTERM stops it.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import requests

from bench.marks import ApiMarks, Recorder, now
from controller.config import load_settings
from controller.logs import configure_logging
from controller.model import Phase
from controller.nomad.gateway import JsonDict, WriteResult
from controller.reconcile.loop import Controller
from controller.reconcile.snapshot import Snapshot
from controller.service import Service, build, serve


def thread_cpu() -> dict[str, float]:
    """CPU seconds by kind of thread (name without its number): which part of
    the controller spends the process's CPU."""
    import re

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = re.sub(r"[-_]\d+$", "", names.get(t.id, "other"))
        name = re.sub(r"\s*\(.*\)$", "", name)
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


class Probe:
    def __init__(self, service: Service, track_ready: bool, marks: bool = False) -> None:
        self._lock = threading.Lock()
        self.claim_writes: dict[str, float] = {}
        self.requests: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.ready: dict[str, tuple[int, int | None]] = {}
        self.api_marks = Recorder()
        self.write_marks = Recorder()
        if marks:
            service.app.add_middleware(ApiMarks, recorder=self.api_marks)
        controller = service.controller
        gateway: Any = controller.gateway
        self._observer = controller.observer
        register: Callable[..., WriteResult] = gateway.register_job

        def timed_register(job: JsonDict, enforce_index: int | None = None) -> WriteResult:
            started = time.perf_counter()
            result = register(job, enforce_index)
            if enforce_index:
                with self._lock:
                    self.claim_writes[str(job.get("ID"))] = time.perf_counter() - started
            return result

        gateway.register_job = timed_register
        # Claims write through the async writer on the event loop (aclient.py).
        claim_writer: Any = controller.writer._async_gateway
        if claim_writer is not None:
            aregister = claim_writer.register_job

            async def timed_aregister(job: JsonDict, enforce_index: int | None = None) -> Any:
                started, sent = time.perf_counter(), now()
                result = await aregister(job, enforce_index)
                if enforce_index and self.write_marks.on:
                    self.write_marks.note(str(job.get("ID")), sent, now())
                with self._lock:
                    if enforce_index:
                        self.claim_writes[str(job.get("ID"))] = time.perf_counter() - started
                    self.requests["PUT /v1/jobs"] = self.requests.get("PUT /v1/jobs", 0) + 1
                return result

            claim_writer.register_job = timed_aregister
        session: requests.Session = gateway._session
        session.hooks["response"].append(self._count)
        if track_ready:
            observe: Callable[[], Snapshot] = controller.observer._observe

            def tracked() -> Snapshot:
                snap = observe()
                self._note_ready(snap)
                return snap

            controller.observer._observe = tracked  # type: ignore[method-assign]

    def _count(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        path = (response.request.path_url or "").split("?")[0]
        if path.startswith("/v1/job/"):
            path = "/v1/job/:id"
        key = f"{response.request.method} {path}"
        size = len(response.content)
        with self._lock:
            self.requests[key] = self.requests.get(key, 0) + 1
            self.bytes[key] = self.bytes.get(key, 0) + size

    def _note_ready(self, snap: Snapshot) -> None:
        now = time.time_ns()
        with self._lock:
            for runner_id, view in snap.runners.items():
                if runner_id in self.ready or view.phase is not Phase.READY or view.alloc is None:
                    continue
                self.ready[runner_id] = (now, view.alloc.started_at)

    def report(self, reset: bool = False) -> dict[str, Any]:
        with self._lock:
            out = {
                "claim_writes": dict(self.claim_writes),
                "requests": dict(self.requests),
                "bytes": dict(self.bytes),
                "ready": {k: list(v) for k, v in self.ready.items()},
                "refreshes": dict(self._observer.refreshes),
                "gc": gc.get_stats(),
                "threads": threading.active_count(),
                "thread_cpu_s": thread_cpu(),
            }
            if reset:
                self.claim_writes.clear()
                self.requests.clear()
                self.bytes.clear()
                self.ready.clear()
        return out


class RefillSwitch:
    """With `BENCH_NO_REFILL=1`: `GET /_bench/refill?on=0` turns the pool's
    creations into no-ops (a diagnostic of `ratios --no-refill`: what a claim
    costs when no refill follows it, the bound of any batching of refills).
    Each creation skipped is still expected, so passes do not retry it;
    `?on=1` drops those expectations and asks for a pass, which refills."""

    def __init__(self, service: Service) -> None:
        from controller.nomad import jobs

        self._controller = service.controller
        actor: Any = service.controller.actor
        self._expectations = actor._expectations
        self._skipped: list[str] = []
        self._off = False
        create: Callable[[int, Any], bool] = actor._create

        def switched(env_id: int, template: Any) -> bool:
            if not self._off:
                return create(env_id, template)
            job_id = jobs.runner_job_id(env_id, str(uuid.uuid4()))
            self._skipped.append(job_id)
            self._expectations.expect_create(env_id, job_id)
            return True

        actor._create = switched

    def set(self, on: int, env_id: int = 1) -> dict[str, Any]:
        self._off = not on
        skipped = len(self._skipped)
        if on:
            for job_id in self._skipped:
                self._expectations.create_failed(job_id)
            self._skipped.clear()
            self._controller.enqueue(env_id)
        return {"refill": bool(on), "skipped": skipped}


class ApiOnly:
    """With `BENCH_API_ONLY=1` (`ratios`, "the API observing nothing"): the
    controller's own API, claims and snapshot, with no upkeep (it never leads:
    no pass, no creation) and no observation once it has looked at Nomad
    once (no event stream, every later refresh keeps the snapshot it has).
    Started on a full, quiet pool beside a controller that keeps that pool
    up, it hands out the runners of its first look, each once, and sees only
    its own claims' writes. It is what a claim would cost in an API process
    fed by an upkeep process, less whatever the feed itself would cost: the
    most that moving observation and upkeep out of the API's process could
    gain."""

    @staticmethod
    def before_build() -> None:
        os.environ["NRC_EVENT_STREAM"] = "false"
        # Before `build`: the controller's parts take `is_leader` when wired.
        Controller.is_leader = lambda self: False  # type: ignore[method-assign]

    @staticmethod
    def after_build(service: Service) -> None:
        observer = service.controller.observer
        observe: Callable[[], Snapshot] = observer._observe

        def once() -> Snapshot:
            return observer.snapshot if observer.observed_once else observe()

        observer._observe = once  # type: ignore[method-assign]


def _profile_threads(path: str) -> Callable[[], None]:
    """cProfile in every thread started from now on (and this one); the
    merged statistics are written to `path` by the returned function."""
    import cProfile
    import pstats

    profiles: list[cProfile.Profile] = []

    def start(*_: Any) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    threading.setprofile(start)
    start()

    def dump() -> None:
        for profile in profiles:
            profile.disable()
        stats = pstats.Stats(*profiles)
        stats.dump_stats(path)

    return dump


class Sampler:
    """An all-thread CPU profiler by sampling (cProfile and pyinstrument see
    one thread): every 2 ms, each thread's CPU time since the last look is
    charged to the functions on its stack — own to the top one, inclusive
    to every one. A thread that waited costs nothing, wherever it waits
    (uvloop's C loop included). It looks only when it gets the GIL, so the
    CPU lands where the thread let go of it (a wait, a C call that releases
    it): the totals hold, the shares lean; `--profile` uses py-spy where it
    can (bench/profile.py). Started and read through
    `/_bench/probe?sample=start` and `?sample=stop` (or `=<path>`)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.inclusive: dict[str, float] = {}
        self.own: dict[str, float] = {}
        self.rounds = 0
        self.cpu_s = 0.0

    def start(self) -> None:
        self.stop()
        self.inclusive, self.own, self.rounds, self.cpu_s = {}, {}, 0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def report(self, top: int = 40) -> dict[str, Any]:
        """Stop and answer the CPU seconds by function, the largest first."""
        self.stop()

        def ranked(charged: dict[str, float], n: int) -> list[list[Any]]:
            return [[name, s] for name, s in sorted(charged.items(), key=lambda kv: -kv[1])[:n]]

        return {
            "rounds": self.rounds,
            "cpu_s": self.cpu_s,
            "own": ranked(self.own, top),
            "inclusive": ranked(self.inclusive, 2 * top),
        }

    def write(self, path: str) -> None:
        report = self.report(60)
        with open(path, "w") as out:
            out.write(f"{report['rounds']} rounds, {report['cpu_s']:.3f} s of CPU\n\n== own ==\n")
            for name, s in report["own"]:
                out.write(f"{s * 1000:10.1f} ms  {name}\n")
            out.write("\n== inclusive ==\n")
            for name, s in report["inclusive"]:
                out.write(f"{s * 1000:10.1f} ms  {name}\n")

    def _run(self) -> None:
        import sys

        me = threading.get_ident()
        last: dict[int, float] = {}
        while not self._stop.wait(self.interval_s):
            self.rounds += 1
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                try:
                    now = time.clock_gettime(time.pthread_getcpuclockid(ident))
                except OSError:  # the thread ended meanwhile
                    continue
                spent = now - last.get(ident, now)
                last[ident] = now
                if spent <= 0:
                    continue
                self.cpu_s += spent
                seen: set[str] = set()
                f: Any = frame
                while f is not None:
                    code = f.f_code
                    where = os.path.relpath(code.co_filename)
                    name = f"{where}:{code.co_firstlineno}:{code.co_name}"
                    if not seen:
                        self.own[name] = self.own.get(name, 0.0) + spent
                    if name not in seen:
                        self.inclusive[name] = self.inclusive.get(name, 0.0) + spent
                        seen.add(name)
                    f = f.f_back


def main() -> int:
    profile_to = os.environ.get("BENCH_PROFILE")
    dump = _profile_threads(profile_to) if profile_to else None
    api_only = os.environ.get("BENCH_API_ONLY") == "1"
    if api_only:
        ApiOnly.before_build()
    settings = load_settings()
    configure_logging(settings.log_level, settings.effective_log_format)
    service = build(settings)
    if api_only:
        ApiOnly.after_build(service)
    marks = os.environ.get("BENCH_MARKS") == "1"
    probe = Probe(service, os.environ.get("BENCH_TRACK_READY") == "1", marks)

    sampler = Sampler()

    def bench_probe(reset: int = 0, sample: str = "") -> dict[str, Any]:
        if sample == "start":
            sampler.start()
        elif sample == "stop":
            return {**probe.report(bool(reset)), "profile": sampler.report()}
        elif sample:
            sampler.write(sample)
        return probe.report(bool(reset))

    service.app.add_api_route("/_bench/probe", bench_probe, methods=["GET"])
    if marks:

        def bench_marks(on: int = 0) -> dict[str, Any]:
            return {
                "api": probe.api_marks.take(bool(on)),
                "writes": probe.write_marks.take(bool(on)),
            }

        service.app.add_api_route("/_bench/marks", bench_marks, methods=["GET"])
    if os.environ.get("BENCH_NO_REFILL") == "1":
        switch = RefillSwitch(service)
        service.app.add_api_route("/_bench/refill", switch.set, methods=["GET"])
    tokens = os.environ.get("BENCH_API_THREADS")
    if tokens:
        import anyio.to_thread

        @service.app.on_event("startup")
        async def limit_threads() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = int(tokens)

    try:
        return serve(service, lambda api: print(f"READY {api}", flush=True))
    finally:
        if dump is not None:
            dump()


if __name__ == "__main__":
    raise SystemExit(main())
