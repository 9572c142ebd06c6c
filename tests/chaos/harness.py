"""What a chaos run stands on: the controller as a real subprocess, plain HTTP
to its API, and Nomad's own record of what happened.

- `ControllerProcess`: `python -m controller run` against the simulator, JSON
  logs to a file per process, SIGKILL and start again on the same port.
- `Ledger`: a listener on the simulator's state store that sees every write
  Nomad commits (before the write's HTTP answer leaves): runner jobs created,
  claimed, ended and purged, pool sizes of the templates, which node every
  allocation is on and how often its task started. It is Nomad's side of
  every invariant ("Nomad agrees").
- `nomad_state`: one consistent snapshot of the simulator's jobs,
  allocations and nodes, read on its own loop (no HTTP, so no injected fault
  can blur the final checks).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from nomadsim import SimServer
from nomadsim.core import Simulator
from nomadsim.records import Alloc
from nomadsim.state import ALLOCS, JOBS, Commit
from tests.helpers import wait_until
from tests.support.controller import controller_environ
from tests.support.ports import stable_port
from tests.support.processes import ChildProcess, python_module

RUNNER_ID = re.compile(r"^(\d+)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
TEMPLATE_ID = re.compile(r"^template-(\d+)$")
TERMINAL = frozenset({"complete", "failed", "lost"})
INVARIANT_SERIES = re.compile(r'^nrc_invariant_violations_total\{invariant="(\w+)"\} (\S+)$')

# The controller's timings for a chaos run (see `nomad-runner-controller config`).
CONTROLLER_ENV = {
    "NRC_LOG_FORMAT": "json",
    "NRC_LOG_LEVEL": "INFO",
    "NRC_RESYNC_INTERVAL": "1s",
    "NRC_ORPHAN_GRACE": "1s",
    "NRC_STARTUP_TIMEOUT": "10s",
    "NRC_MAX_BACKOFF": "1s",
    "NRC_NOMAD_WRITE_RATE": "0",
    "NRC_NOMAD_TIMEOUT": "5s",
    "NRC_LOST_RUNNER_RETENTION": "1h",
    # A drain (the controller_drain fault) lets work in flight end for this long.
    "NRC_SHUTDOWN_GRACE": "2s",
}


def config_meta(spec: dict[str, Any]) -> dict[str, str]:
    """The meta of a job's `config` group (where claims and pool sizes live)."""
    for group in spec.get("TaskGroups") or []:
        if isinstance(group, dict) and group.get("Name") == "config":
            meta = group.get("Meta") or {}
            return {str(k): str(v) for k, v in meta.items()}
    return {}


def runner_shape(spec: dict[str, Any]) -> tuple[str, int, int, str, tuple[int, ...]]:
    """What a runner is built from: image, CPU, memory, network mode, exposed ports."""
    for group in spec.get("TaskGroups") or []:
        if isinstance(group, dict) and group.get("Name") == "default-group":
            task = (group.get("Tasks") or [{}])[0]
            config = task.get("Config") or {}
            resources = task.get("Resources") or {}
            ports = tuple(
                sorted(
                    int(p.get("To") or 0)
                    for n in group.get("Networks") or []
                    for p in n.get("DynamicPorts") or []
                )
            )
            return (
                str(config.get("image", "")),
                int(resources.get("CPU") or 0),
                int(resources.get("MemoryMB") or 0),
                str(config.get("network_mode", "")),
                ports,
            )
    return ("", 0, 0, "", ())


# -- Nomad's record ------------------------------------------------------------------


@dataclass
class RunnerRecord:
    """One runner job's life as Nomad committed it."""

    job_id: str
    env_id: int
    claims: int = 0  # writes that turned used=false into used=true
    claim_alloc: str = ""
    claim_restarts: int = 0  # of claim_alloc's task when it was claimed
    lost_reason: str = ""
    purged_index: int = 0
    purged_idle: bool = False  # deleted while nobody held it
    running_at_purge: bool = False  # an allocation of it was running when it was deleted


@dataclass
class Ledger:
    """Every runner and template write the simulator commits (see the module docstring)."""

    sim: Simulator
    runners: dict[str, RunnerRecord] = field(default_factory=dict)
    created: Counter[int] = field(default_factory=Counter)
    pool_increases: Counter[int] = field(default_factory=Counter)
    alloc_node: dict[str, str] = field(default_factory=dict)
    # Allocation → (ClientStatus/DesiredStatus, task restarts), as last committed,
    # and when (monotonic) its task last restarted.
    alloc_life: dict[str, tuple[str, int]] = field(default_factory=dict)
    alloc_restarted: dict[str, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, server: SimServer) -> None:
        server.call(lambda: self.sim.store.add_listener(self.on_commit))

    def runner(self, job_id: str) -> RunnerRecord | None:
        with self._lock:
            rec = self.runners.get(job_id)
            return None if rec is None else RunnerRecord(**rec.__dict__)

    def node_of(self, alloc_id: str) -> str:
        with self._lock:
            return self.alloc_node.get(alloc_id, "")

    def claim_reset(self, job_id: str) -> bool:
        """Whether Nomad shows the file system a claim was made on reset or
        going: its task restarted since, or its allocation no longer runs."""
        with self._lock:
            rec = self.runners.get(job_id)
            if rec is None or not rec.claim_alloc:
                return False
            status, restarts = self.alloc_life.get(rec.claim_alloc, ("deleted", 0))
        return restarts > rec.claim_restarts or status != "running/run"

    def file_system(self, job_id: str, sent: float) -> str:
        """What Nomad says about the file system a claim was made on, for a
        request sent at `sent` (monotonic): whether its task restarted since
        the claim (a reset), and how long before the request."""
        with self._lock:
            rec = self.runners.get(job_id)
            if rec is None or not rec.claim_alloc:
                return "Nomad has no claim of it"
            status, restarts = self.alloc_life.get(rec.claim_alloc, ("deleted", 0))
            restarted = self.alloc_restarted.get(rec.claim_alloc)
            lost = f"loss recorded: {rec.lost_reason}" if rec.lost_reason else "no loss recorded"
        story = f"claimed on allocation {rec.claim_alloc[:8]} at {rec.claim_restarts} restarts"
        story += f", now {status} at {restarts} restarts"
        if restarts > rec.claim_restarts and restarted is not None:
            story += f" (the last {sent - restarted:.3f}s before the read was sent)"
        return f"Nomad: {story}; {lost}"

    def all_runners(self) -> list[RunnerRecord]:
        with self._lock:
            return [RunnerRecord(**r.__dict__) for r in self.runners.values()]

    def problems(self) -> list[str]:
        with self._lock:
            return list(self.violations)

    # Runs on the simulator's loop, inside every commit: keep it short.
    def on_commit(self, commit: Commit) -> None:
        with self._lock:
            purged_allocs: dict[str, list[Alloc]] = {}
            for ch in commit.changes:
                if ch.table == ALLOCS:
                    if ch.after is not None:
                        a = ch.after
                        self.alloc_node[a.id] = a.node_id
                        restarts = sum(state.restarts for _, state in a.task_states)
                        if restarts > self.alloc_life.get(a.id, ("", 0))[1]:
                            self.alloc_restarted[a.id] = time.monotonic()
                        self.alloc_life[a.id] = (f"{a.client_status}/{a.desired_status}", restarts)
                    else:
                        purged_allocs.setdefault(ch.before.job_id, []).append(ch.before)
            for ch in commit.changes:
                if ch.table != JOBS:
                    continue
                job_id = ch.key[1]
                before = ch.before.spec if ch.before is not None else None
                after = ch.after.spec if ch.after is not None else None
                template = TEMPLATE_ID.match(job_id)
                if template:
                    env_id = int(template.group(1))
                    was = int(config_meta(before).get("prewarmingPoolSize", 0)) if before else 0
                    now = int(config_meta(after).get("prewarmingPoolSize", 0)) if after else 0
                    self.pool_increases[env_id] += max(0, now - was)
                    continue
                runner = RUNNER_ID.match(job_id)
                if runner:
                    self._runner(commit.index, job_id, int(runner.group(1)), before, after)
                    if after is None:
                        rec = self.runners[job_id]
                        rec.running_at_purge = any(
                            a.client_status == "running" and a.desired_status == "run"
                            for a in purged_allocs.get(job_id, ())
                        )

    def _runner(
        self,
        index: int,
        job_id: str,
        env_id: int,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
    ) -> None:
        rec = self.runners.get(job_id)
        if rec is None:
            rec = self.runners[job_id] = RunnerRecord(job_id, env_id)
        if before is None and after is not None:
            self.created[env_id] += 1
            if config_meta(after).get("used") == "true":
                self.violations.append(
                    f"invariant 1: Nomad: runner {job_id} was created already claimed"
                )
            return
        old = config_meta(before) if before is not None else {}
        if after is None:
            rec.purged_index = index
            rec.purged_idle = old.get("used") != "true"
            return
        new = config_meta(after)
        was_used, is_used = old.get("used") == "true", new.get("used") == "true"
        if not was_used and is_used:
            rec.claims += 1
            rec.claim_alloc = new.get("nrc_claim_alloc", "")
            rec.claim_restarts = int(new.get("nrc_claim_restarts") or 0)
            if rec.claims > 1:
                self.violations.append(
                    f"invariant 1: Nomad: runner {job_id} was claimed {rec.claims} times"
                )
        elif was_used and not is_used:
            self.violations.append(
                f"invariant 2: Nomad: claimed runner {job_id} was made idle again (index {index})"
            )
        elif was_used and new.get("nrc_claimed_at") != old.get("nrc_claimed_at"):
            self.violations.append(
                f"invariant 1: Nomad: runner {job_id} was claimed again over its claim "
                f"(index {index})"
            )
        lost_was, lost_now = old.get("nrc_lost_reason", ""), new.get("nrc_lost_reason", "")
        if lost_was and lost_now != lost_was:
            self.violations.append(
                f"invariant 3: Nomad: loss of runner {job_id} rewritten from {lost_was!r} "
                f"to {lost_now!r}"
            )
        elif lost_now and not lost_was:
            rec.lost_reason = lost_now


# -- one consistent look at the simulator ----------------------------------------------


@dataclass(frozen=True)
class AllocState:
    id: str
    node_id: str
    client_status: str
    desired_status: str
    create_index: int

    @property
    def live(self) -> bool:
        return self.client_status not in TERMINAL

    @property
    def serving(self) -> bool:
        return self.client_status == "running" and self.desired_status == "run"


@dataclass(frozen=True)
class JobState:
    id: str
    env_id: int
    template: bool
    stop: bool
    meta: dict[str, str]
    shape: tuple[str, int, int, str, tuple[int, ...]]
    allocs: tuple[AllocState, ...]

    @property
    def claimed(self) -> bool:
        return self.meta.get("used") == "true"

    @property
    def lost_reason(self) -> str:
        return self.meta.get("nrc_lost_reason", "")


@dataclass(frozen=True)
class NodeState:
    id: str
    name: str
    status: str
    eligibility: str
    draining: bool


@dataclass(frozen=True)
class NomadState:
    jobs: dict[str, JobState]
    nodes: tuple[NodeState, ...]  # sorted by name

    def templates(self) -> dict[int, JobState]:
        return {j.env_id: j for j in self.jobs.values() if j.template}

    def runners(self, env_id: int | None = None) -> list[JobState]:
        return sorted(
            (
                j
                for j in self.jobs.values()
                if not j.template and (env_id is None or j.env_id == env_id)
            ),
            key=lambda j: j.id,
        )


def nomad_state(server: SimServer) -> NomadState:
    sim = server.sim

    def read() -> NomadState:
        jobs: dict[str, JobState] = {}
        for (ns, job_id), rec in sim.store.jobs.items():
            template = TEMPLATE_ID.match(job_id)
            runner = RUNNER_ID.match(job_id)
            match = template or runner
            if match is None:
                continue
            allocs = tuple(
                AllocState(a.id, a.node_id, a.client_status, a.desired_status, a.create_index)
                for a in sim.store.job_allocs(ns, job_id)
            )
            jobs[job_id] = JobState(
                id=job_id,
                env_id=int(match.group(1)),
                template=template is not None,
                stop=rec.stopped,
                meta=config_meta(rec.spec),
                shape=runner_shape(rec.spec),
                allocs=allocs,
            )
        nodes = tuple(
            sorted(
                (
                    NodeState(n.id, n.name, n.status, n.eligibility, n.drain is not None)
                    for n in sim.store.nodes.values()
                ),
                key=lambda n: n.name,
            )
        )
        return NomadState(jobs, nodes)

    state = server.call(read)
    assert isinstance(state, NomadState)
    return state


# -- the controller process ------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    process: int  # which start of the controller (1, 2, ...)
    level: str
    message: str
    fields: dict[str, Any]


class ControllerProcess:
    """`python -m controller run` against the simulator; restartable on one port."""

    def __init__(
        self, nomad_address: str, log_dir: Path, prelude: str = "", wrapper: str = "none"
    ) -> None:
        self.nomad_address = nomad_address
        # NRC_EXEC_UNPRIVILEGED_WRAPPER: the simulator's stand-in for /sbin/setuser,
        # which this host does not have (as `nomad-runner-controller dev` sets it).
        self.wrapper = wrapper
        # Python run before `run` starts (a mutant, tests/chaos/mutants.py), or nothing.
        self.prelude = prelude
        self.port = stable_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.starts = 0
        self.proc: ChildProcess | None = None
        self.logs: list[Path] = []
        self.killed: set[int] = set()  # processes ended by SIGKILL (their last line may be cut)
        # nrc_invariant_violations_total of processes we killed, read just before.
        self.invariant_violations: list[dict[str, float]] = []
        # Exit codes of the processes stopped with SIGTERM (each must drain and exit 0).
        self.drain_exits: list[int] = []

    def start(self) -> None:
        self.starts += 1
        path = self.log_dir / f"controller-{self.starts}.log"
        self.logs.append(path)
        environ = controller_environ(
            self.nomad_address,
            self.port,
            **CONTROLLER_ENV,
            NRC_EXEC_UNPRIVILEGED_WRAPPER=self.wrapper,
        )
        if self.prelude:
            command = [sys.executable, "-c", self.prelude]
        else:
            command = python_module("controller", "run")
        self.proc = ChildProcess(command, environ, log=path)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def invariant_counters(self) -> dict[str, float] | None:
        """nrc_invariant_violations_total by invariant, or None when unreadable."""
        try:
            text = requests.get(f"{self.base}/metrics", timeout=2).text
        except requests.RequestException:
            return None
        out: dict[str, float] = {}
        for line in text.splitlines():
            match = INVARIANT_SERIES.match(line)
            if match:
                out[match.group(1)] = float(match.group(2))
        return out

    def kill(self) -> None:
        """SIGKILL, as an OOM killer or a node failure would."""
        if self.proc is None:
            return
        counters = self.invariant_counters()
        if counters is not None:
            self.invariant_violations.append(counters)
        if self.proc.alive():
            self.killed.add(self.starts)
        self.proc.kill()

    def drain(self) -> None:
        """SIGTERM, as a deploy stops it; returns once it exited (its drain
        ends work in flight within NRC_SHUTDOWN_GRACE)."""
        if self.proc is None:
            return
        # A deploy stops a replica that serves: one still starting (the
        # previous fault's restart) is waited for, up to 10 s.
        with contextlib.suppress(AssertionError):
            wait_until(self._answers, timeout=10, interval=0.05)
        counters = self.invariant_counters()
        if counters is not None:
            self.invariant_violations.append(counters)
        self.drain_exits.append(self.proc.stop(signal.SIGTERM, timeout=30))

    def _answers(self) -> bool:
        try:
            return requests.get(f"{self.base}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def log_lines(self) -> tuple[list[LogLine], list[str]]:
        """Every JSON log line of every process, and the lines that were not JSON
        (the last line of a SIGKILLed process may be cut short: not reported)."""
        lines: list[LogLine] = []
        other: list[str] = []
        for n, path in enumerate(self.logs, start=1):
            raw = path.read_text(errors="replace").splitlines()
            for i, text in enumerate(raw):
                try:
                    obj = json.loads(text)
                except ValueError:
                    cut_short = n in self.killed and i == len(raw) - 1
                    if text.strip() and not cut_short:
                        other.append(f"controller {n}: {text}")
                    continue
                if isinstance(obj, dict):
                    lines.append(LogLine(n, str(obj.get("level")), str(obj.get("message")), obj))
        return lines, other


# -- plain HTTP -------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (connection refused or reset, timeout, a body cut short)
    body: Any  # JSON, text, or the bytes of a download (`Api.download`)

    def message(self) -> str:
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else ""


class Api:
    """One HTTP client (one per thread: sessions are not shared)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.session = requests.Session()

    def call(self, method: str, path: str, body: Any = None, timeout: float = 5.0) -> Answer:
        try:
            response = self.session.request(method, self.base + path, json=body, timeout=timeout)
        except requests.RequestException:
            return Answer(0, None)
        return self._answer(response)

    def download(self, path: str, timeout: float = 5.0) -> Answer:
        """A GET whose 200 body is kept as bytes; other answers as `call` gives them.
        A body shorter than its Content-Length (a download cut off) is no answer."""
        try:
            response = self.session.get(self.base + path, timeout=timeout)
        except requests.RequestException:
            return Answer(0, None)
        if response.status_code == 200:
            return Answer(200, response.content)
        return self._answer(response)

    @staticmethod
    def _answer(response: requests.Response) -> Answer:
        try:
            data = response.json() if response.content else None
        except ValueError:
            data = response.text
        return Answer(response.status_code, data)

    def close(self) -> None:
        self.session.close()
