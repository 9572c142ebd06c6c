"""14. The controller's cost as ratios to the bare Nomad work it asks for (issue 22).

One simulator and one controller, each in a process of its own; the clients
are threads of this process over keep-alive `http.client` connections (and
WebSockets for executions). Every phase runs as a pair, one after the
other: once through the controller, once as the bare Nomad request the
controller makes for it, sent by the same clients straight to the
simulator (two pairs of each in a full run). Both therefore see the same
machine, and the ratio of the two is what the controller adds.

- Claims, open loop: 50 clients offering 100 claims/s, latency from each
  request's due time. Bare: the same clients at the same rate send the write
  a claim makes — a register with EnforceIndex (`PUT /v1/jobs`, the path the
  controller's client uses) of a runner-layout job with the claim added to its
  meta. Those jobs are named `bare-<uuid>`, which is not a runner id
  (`controller.nomad.jobs.runner_env_id`), so the controller neither adopts
  nor touches them. Their specs are read and encoded before each phase; each
  write takes its JobModifyIndex from the previous write's answer.
- Claims, closed loop: 50 clients, claims/s against bare writes/s.
- The floor (`bench.floorproc`): the same two loops through the claim's
  HTTP stack and write with nothing behind them, on jobs of its own; and
  "beside the upkeep": a floor process that claims the controller's own
  idle runners, each once, while the controller refills the pool in its
  own process (an API that observes nothing, the upkeep beside it).
  "The API observing nothing": the same, through the controller's own API
  and claims in a process of their own that keeps no pool up and stops
  observing after its first look (`bench.ctlproc.ApiOnly`), so the most an
  API process fed by the upkeep could gain, with the controller's stack
  rather than the floor's. And
  "the floor and its refill": the floor on its own jobs registering one new
  runner job after each claim's answer, with no observation and no pass, the
  least Nomad work a warm pool asks for per claim (its jobs deleted after
  each phase; its closed loop stops at the pool's size, as the
  controller's does).
- Executions (`echo hi`, POST + WebSocket until the exit frame and the close)
  at 10/s open loop on 10 claimed runners, against a bare Nomad exec of
  `sh -c 'echo hi'` (tty false, until the exit frame) in the same
  allocations, on each allocation's node agent as the controller does. Then
  one client back to back (serial).
- The chain alone: the two execs the controller opens for one execution
  (`controller.execution.command`: the command through the unprivileged
  wrapper with a TTY, and root's reader of its stderr FIFO), opened at once
  by the client straight to Nomad, with nothing of the controller, in the
  same two loops. Against the bare exec it is what the execution's
  semantics cost Nomad; the execution against it is the controller's share.
- stdout throughput: one execution writing 50 MB, against a bare exec of the
  same command, without a TTY and (a second ratio) with one, as the
  controller's own exec of the command has; and against the chain alone.
- Processes started per execution: the machine's fork count (`processes` in
  /proc/stat) around each of N serial executions, the median of them; the
  same for N bare execs and N runs of the chain alone. The counter counts
  threads too, so these clients run on an event loop: websockets'
  synchronous client starts two threads a connection (counted in the
  figures before `458e786`). The counter is machine-wide: the median keeps
  whatever else runs on the machine out as long as it forks during only a
  few of the N.
- Controller CPU per claim and per execution over the open-loop phases, the
  simulator's next to it.

Before each claim phase, bare ones included, the controller's pool is full
and quiet again. `--controller-tree PATH` (`python -m bench ratios`) runs the
controller from another checkout (its own `bench/ctlproc.py`); the
simulator, the bare requests and the clients stay this tree's. Nothing here
reads the controller's `/_bench/probe`, so older trees work as well.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from websockets.asyncio.client import connect as aconnect
from websockets.sync.client import connect

from bench import simproc
from bench.common import (
    Http,
    Result,
    gc_pauses,
    gc_pauses_between,
    git_commit,
    idle_runners,
    percentile,
    replica_settings,
    sim_gc_pauses,
    start_ctlproc,
    start_sim,
    summary_ms,
    wait_for,
)
from controller.execution.command import (
    ExecSettings,
    ExecutionRequest,
    main_command,
    stderr_command,
)
from controller.model import Claim, Environment
from controller.nomad import jobs
from tests.support.controller import start_controller_process
from tests.support.ports import free_port
from tests.support.processes import ChildProcess, child_processes, python_module

ENV_ID = 1
BARE_PREFIX = "bare-"
# The jobs bench.floorproc writes (the controller ignores them too).
FLOOR_PREFIX = "floor-"
NAMESPACE = "default"
CLIENTS = 50
CLAIM_RATE = 100.0
EXEC_RUNNERS = 10
EXEC_RATE = 10.0
ECHO = "echo hi"
# Seconds a bench exec may go without a frame before it is given up; seconds
# an exec of the chain may take in all.
EXEC_SILENCE_S = 60.0
EXEC_LIMIT_S = 300.0
CLAIM = {"executionEnvironmentId": ENV_ID, "inactivityTimeout": 0}
# Stand-ins in a bare write's encoded body, replaced per write.
_CLAIMED_AT = 1111111111111111111
_INDEX = 2222222222222222222


@dataclass(frozen=True)
class Scale:
    """How much of each phase a run does (FULL, or QUICK for a smoke run)."""

    rounds: int  # controller/bare pairs of each phase
    pool: int
    bare_jobs: int
    open_s: float
    closed_s: float
    exec_open_s: float
    serial: int
    stdout_bytes: int
    throughput_rounds: int
    forks: int


FULL = Scale(2, 1500, 500, 10.0, 5.0, 10.0, 50, 50_000_000, 5, 50)
QUICK = Scale(1, 400, 100, 3.0, 2.0, 3.0, 10, 10_000_000, 1, 10)


# -- load: open and closed loops over any request ------------------------------------


@dataclass
class Load:
    """What one phase measured: latencies of the requests that succeeded."""

    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, seconds: float, ok: bool) -> None:
        with self.lock:
            if ok:
                self.latencies.append(seconds)
            else:
                self.failures += 1

    def facts(self) -> dict[str, Any]:
        return {
            "ok": len(self.latencies),
            "failures": self.failures,
            "seconds": self.seconds,
            "per_s": len(self.latencies) / self.seconds if self.seconds else None,
            "latency": summary_ms(self.latencies),
        }


# One request of client `k` (its `i`th): True when it succeeded.
Action = Callable[[int, int], bool]


def attempt(action: Action, k: int, i: int) -> bool:
    """`action`, a request that raised counted as a failed one."""
    try:
        return action(k, i)
    except Exception:  # a broken connection or WebSocket: the phase goes on
        return False


def open_loop(
    clients: int,
    rate: float,
    seconds: float,
    action: Action,
    http: Http | None = None,
) -> Load:
    """`clients` clients together offering `rate` requests/s for `seconds`,
    each on a fixed schedule; latency from each request's due time. Each
    client connects to `http` before the clock starts (and closes after)."""
    load = Load()
    period = clients / rate
    per_client = max(1, int(seconds / period))
    barrier = threading.Barrier(clients + 1)
    start_at = [0.0]

    def client(k: int) -> None:
        if http is not None:
            http._conn()
        barrier.wait()
        first = start_at[0] + k * period / clients  # spread over one period
        for i in range(per_client):
            due = first + i * period
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            ok = attempt(action, k, i)
            load.record(time.perf_counter() - due, ok)
        if http is not None:
            http.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    start_at[0] = time.perf_counter() + 0.05
    barrier.wait()
    for t in threads:
        t.join()
    load.seconds = time.perf_counter() - start_at[0]
    return load


def closed_loop(
    clients: int,
    seconds: float,
    cap: int,
    action: Action,
    http: Http | None = None,
) -> Load:
    """`clients` clients each sending its next request when the last one
    answered, for `seconds` or `cap` requests in all, whichever comes first
    (connected to `http` as in `open_loop`)."""
    load = Load()
    left = [cap]
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    end_at = [0.0]

    def client(k: int) -> None:
        if http is not None:
            http._conn()
        barrier.wait()
        i = 0
        while time.perf_counter() < end_at[0]:
            with lock:
                if left[0] <= 0:
                    break
                left[0] -= 1
            started = time.perf_counter()
            ok = attempt(action, k, i)
            load.record(time.perf_counter() - started, ok)
            i += 1
        if http is not None:
            http.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    started = time.perf_counter()
    end_at[0] = started + seconds
    barrier.wait()
    for t in threads:
        t.join()
    load.seconds = time.perf_counter() - started
    return load


# -- bare claim writes ---------------------------------------------------------------


def bare_environment() -> Environment:
    """The environment whose layout the bare jobs take (never registered)."""
    return simproc.environment(ENV_ID, 0)


def write_body(spec: dict[str, Any], alloc_id: str) -> tuple[bytes, bytes, bytes]:
    """The register a claim makes of `spec` (a job as Nomad answers it), encoded
    once: the bytes before the claim time, between it and the JobModifyIndex,
    and after it."""
    claimed = jobs.with_claim(spec, Claim(timeout=0, alloc_id=alloc_id, claimed_at=_CLAIMED_AT))
    body = {
        "Job": {**claimed, "Namespace": NAMESPACE},
        "EnforceIndex": True,
        "JobModifyIndex": _INDEX,
    }
    head, rest = json.dumps(body).encode().split(str(_CLAIMED_AT).encode())
    middle, tail = rest.split(str(_INDEX).encode())
    return head, middle, tail


def fill(parts: tuple[bytes, bytes, bytes], claimed_at: int, index: int) -> bytes:
    head, middle, tail = parts
    return b"".join((head, str(claimed_at).encode(), middle, str(index).encode(), tail))


class BareJobs:
    """Runner-layout jobs the controller ignores, split among the clients:
    each client writes only its own, one after the other."""

    def __init__(self, sim: Http, count: int, prefix: str = BARE_PREFIX) -> None:
        self.sim = sim
        env = bare_environment()
        template = jobs.template_job(env)
        self.ids = [f"{prefix}{uuid.uuid4()}" for _ in range(count)]
        for job_id in self.ids:
            sim.json("PUT", "/v1/jobs", {"Job": jobs.runner_job(template, env, job_id)})
        self.parts: dict[str, tuple[bytes, bytes, bytes]] = {}
        self.index: dict[str, int] = {}
        self.writes = 0

    def prepare(self) -> None:
        """Each job's spec and JobModifyIndex, read and encoded (untimed)."""
        for job_id in self.ids:
            spec = self.sim.json("GET", f"/v1/job/{job_id}")
            self.parts[job_id] = write_body(spec, str(uuid.uuid4()))
            self.index[job_id] = jobs.modify_index(spec)

    def of(self, k: int, clients: int) -> list[str]:
        return self.ids[k::clients]

    def write(self, job_id: str) -> bool:
        """One claim's write; True when Nomad took it."""
        body = fill(self.parts[job_id], time.time_ns(), self.index[job_id])
        status, answer = self.sim.request("PUT", "/v1/jobs", data=body)
        if status != 200:
            return False
        self.index[job_id] = int(json.loads(answer)["JobModifyIndex"])
        return True


# -- executions ----------------------------------------------------------------------


def execute(api: Http, runner: str, command: str) -> tuple[float, int | None, int]:
    """One execution through the controller: (seconds from the POST to the
    close, exit code or None, stdout bytes)."""
    started = time.perf_counter()
    answer = api.json("POST", f"/api/v1/runners/{runner}/execute", {"command": command})
    code: int | None = None
    size = 0
    with connect(str(answer["websocketUrl"]), max_size=None, compression=None) as ws:
        for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "stdout":
                size += len(frame["data"].encode())
            elif frame["type"] == "exit":
                code = int(frame["data"])
    return time.perf_counter() - started, code, size


async def _execute_async(api: Http, runner: str, command: str) -> int | None:
    """`execute` with the WebSocket on an event loop (no thread): the exit code."""
    answer = api.json("POST", f"/api/v1/runners/{runner}/execute", {"command": command})
    code: int | None = None
    async with aconnect(str(answer["websocketUrl"]), max_size=None, compression=None) as ws:
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "exit":
                code = int(frame["data"])
    return code


@dataclass(frozen=True)
class Allocation:
    """Where a claimed runner runs: its allocation and its node's agent."""

    runner: str
    alloc_id: str
    agent: str  # ws://host:port


def allocation_of(sim: Http, runner: str) -> Allocation:
    stubs = sim.json("GET", f"/v1/job/{runner}/allocations")
    running = [a for a in stubs if a["ClientStatus"] == "running"]
    alloc = running[-1]
    node = sim.json("GET", f"/v1/node/{alloc['NodeID']}")
    address = str(node.get("HTTPAddr") or "")
    agent = f"ws://{address}" if address else "ws://" + urlsplit(sim.address).netloc
    return Allocation(runner, str(alloc["ID"]), agent)


def exec_url(alloc: Allocation, argv: Sequence[str], tty: bool) -> str:
    """Nomad's exec of `argv` in the allocation's runner task, on its node's agent."""
    command = json.dumps(list(argv))
    query = urlencode({"task": jobs.RUNNER_TASK, "command": command, "tty": str(tty).lower()})
    return f"{alloc.agent}/v1/client/allocation/{alloc.alloc_id}/exec?{query}"


@dataclass
class ExecTally:
    """What one exec's frames said: its stdout (counted, and kept when
    asked) and its exit code."""

    keep: bool = False
    size: int = 0
    kept: list[bytes] = field(default_factory=list)
    code: int | None = None

    def add(self, raw: str | bytes) -> bool:
        """Take one frame; True once it is the exit frame."""
        frame = json.loads(raw)
        out = frame.get("stdout") or {}
        if "data" in out:
            data = base64.b64decode(out["data"])
            self.size += len(data)
            if self.keep:
                self.kept.append(data)
        if frame.get("exited"):
            self.code = int((frame.get("result") or {}).get("exit_code") or 0)
            return True
        return False


def bare_exec(
    alloc: Allocation, argv: Sequence[str], tty: bool = False
) -> tuple[float, int | None, int]:
    """One bare Nomad exec: (seconds from the connect to the exit frame, exit
    code or None, stdout bytes)."""
    tally = ExecTally()
    started = time.perf_counter()
    with connect(exec_url(alloc, argv, tty), max_size=None, compression=None) as ws:
        while not tally.add(ws.recv(timeout=EXEC_SILENCE_S)):
            pass
    return time.perf_counter() - started, tally.code, tally.size


async def _nomad_exec_async(
    alloc: Allocation, argv: Sequence[str], tty: bool, keep: bool = False
) -> ExecTally:
    tally = ExecTally(keep)
    url = exec_url(alloc, argv, tty)
    # A side of a FIFO whose other side never came would wait forever. One
    # deadline for the whole exec: a timeout per frame costs a task each.
    async with asyncio.timeout(EXEC_LIMIT_S):
        async with aconnect(url, max_size=None, compression=None) as ws:
            while not tally.add(await ws.recv()):
                pass
    return tally


def chain_exec(
    alloc: Allocation, command: str, wrapper: Sequence[str]
) -> tuple[float, int | None, int, bytes]:
    """The two execs the controller opens for one execution of `command`
    (`controller.execution.command`: the command through the unprivileged
    wrapper with a TTY, and root's reader of its stderr FIFO without one),
    opened at once by this client straight to Nomad, with nothing of the
    controller: (seconds from the first connect until both have exited, the
    command's exit code or None, its stdout bytes, its stderr). On an event
    loop of its own, so that, unlike websockets' synchronous client, it
    starts no thread the machine's fork count would take for a process."""
    marker = uuid.uuid4().hex
    settings = ExecSettings(task=jobs.RUNNER_TASK, unprivileged_wrapper=tuple(wrapper))
    main = main_command(marker, ExecutionRequest(command=command), settings)
    reader = stderr_command(marker, False)

    async def both() -> tuple[float, int | None, int, bytes]:
        started = time.perf_counter()
        out, err = await asyncio.gather(
            _nomad_exec_async(alloc, main, True), _nomad_exec_async(alloc, reader, False, True)
        )
        seconds = time.perf_counter() - started
        if err.code != 0:
            return seconds, None, out.size, b""
        return seconds, out.code, out.size, b"".join(err.kept)

    return asyncio.run(both())


def forks() -> int:
    """Processes the machine has started since boot."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("processes "):
                return int(line.split()[1])
    raise RuntimeError("no processes line in /proc/stat")


def forks_per_run(run_once: Callable[[], object], n: int) -> dict[str, Any]:
    """The machine's forks around each of `n` serial calls of `run_once`. The
    median is the figure: a call during which something else on the machine
    started processes counts more, but only a few calls in `n` are hit."""
    counted = []
    for _ in range(n):
        before = forks()
        run_once()
        counted.append(forks() - before)
    return {
        "runs": n,
        "per_run": percentile(counted, 50),
        "min": min(counted),
        "max": max(counted),
        "mean": sum(counted) / n,
        "each": counted,
    }


def claims_to(http: Http, taken: list[str] | None = None) -> Action:
    """Claims sent to `http` (the controller or a floor process); the runner
    ids handed out are appended to `taken`, when given."""

    def claim(k: int, i: int) -> bool:
        status, body = http.request("POST", "/api/v1/runners", CLAIM)
        if status == 200 and taken is not None:
            taken.append(json.loads(body)["runnerId"])
        return status == 200

    return claim


# -- the run ---------------------------------------------------------------------------


class Bench:
    def __init__(
        self, scale: Scale, sim_proc: ChildProcess, sim: Http, ctl: ChildProcess, api: Http
    ) -> None:
        self.scale = scale
        self.sim_proc, self.sim, self.ctl, self.api = sim_proc, sim, ctl, api
        self.cpu: dict[str, dict[str, float]] = {}
        # The full garbage collections during each metered phase, of the
        # controller and of the simulator.
        self.gc: dict[str, list[dict[str, float | None]]] = {}
        self.sim_gc: dict[str, list[dict[str, float | None]]] = {}
        self.no_refill = False
        # bench.floorproc: the claim's HTTP stack and write with no controller.
        self.floor: tuple[ChildProcess, Http] | None = None
        # `--follower`: the replica that leads and keeps the pool up, while
        # the clients talk to `ctl`, a follower.
        self.leader: ChildProcess | None = None
        # Where processes started during the run are listed (and stopped).
        self.procs: list[ChildProcess] = []
        # The unprivileged wrapper the controller's executions go through.
        self.wrapper: tuple[str, ...] = ()
        # Where the controller comes from (`--controller-tree`), and its settings.
        self.tree: Path | None = None
        self.settings: Mapping[str, str] = {}

    @contextlib.contextmanager
    def refill_off(self) -> Iterator[None]:
        """`--no-refill`: the pool's creations off during a controller claim
        phase, on again after it (see bench.ctlproc.RefillSwitch)."""
        if not self.no_refill:
            yield
            return
        self.api.json("GET", f"/_bench/refill?on=0&env_id={ENV_ID}")
        try:
            yield
        finally:
            self.api.json("GET", f"/_bench/refill?on=1&env_id={ENV_ID}")

    def quiet(self) -> None:
        """The controller's pool full and nothing left to create."""
        wait_for(
            lambda: idle_runners(self.api, ENV_ID) >= self.scale.pool,
            timeout=300,
            what="pool refilled",
        )
        time.sleep(1.0)

    def metered(
        self, what: str, run: Callable[[], Load], floor: ChildProcess | None = None
    ) -> Load:
        """`run`, with the controller's and the simulator's CPU over it and
        the requests that succeeded added to `what` (and `floor`'s, the
        standard floor's by default)."""
        ctl, sim = self.ctl.cpu_s(), self.sim_proc.cpu_s()
        if floor is None and self.floor is not None:
            floor = self.floor[0]
        floor_cpu = floor.cpu_s() if floor is not None else 0.0
        leader_cpu = self.leader.cpu_s() if self.leader is not None else 0.0
        gc0, sim_gc0 = gc_pauses(self.api), sim_gc_pauses(self.sim)
        load = run()
        tally = self.cpu.setdefault(what, {"controller_s": 0.0, "simulator_s": 0.0, "units": 0})
        tally["controller_s"] += self.ctl.cpu_s() - ctl
        tally["simulator_s"] += self.sim_proc.cpu_s() - sim
        if floor is not None:
            tally["floor_s"] = tally.get("floor_s", 0.0) + floor.cpu_s() - floor_cpu
        if self.leader is not None:
            tally["leader_s"] = tally.get("leader_s", 0.0) + self.leader.cpu_s() - leader_cpu
        tally["units"] += len(load.latencies)
        self.gc.setdefault(what, []).append(gc_pauses_between(gc0, gc_pauses(self.api)))
        self.sim_gc.setdefault(what, []).append(gc_pauses_between(sim_gc0, sim_gc_pauses(self.sim)))
        return load

    def cpu_ms(self, what: str) -> dict[str, float | None]:
        tally = self.cpu.get(what) or {}
        units = tally.get("units") or 0
        return {
            "controller": tally["controller_s"] * 1000 / units if units else None,
            "simulator": tally["simulator_s"] * 1000 / units if units else None,
            "floor": tally.get("floor_s", 0.0) * 1000 / units if units else None,
            "leader": tally["leader_s"] * 1000 / units if units and "leader_s" in tally else None,
        }

    # claims

    def claim(self, k: int, i: int) -> bool:
        return claims_to(self.api)(k, i)

    @contextlib.contextmanager
    def floor_refilling(self) -> Iterator[Http]:
        """The floor registering a new job after each claim; once the phase
        is over, it waits for those under way and deletes them all."""
        assert self.floor is not None
        floor = self.floor[1]
        floor.json("GET", "/_bench/refill?on=1")
        try:
            yield floor
        finally:
            floor.json("GET", "/_bench/refill?on=0")

    @contextlib.contextmanager
    def beside_the_upkeep(self) -> Iterator[tuple[ChildProcess, Http]]:
        """A floor process that claims the controller's own idle runners
        (`bench.floorproc`, `BENCH_FLOOR_IDLE_OF`), started on a full and
        quiet pool and stopped after the phase; the controller refills."""
        self.quiet()
        proc = start_controller_process(
            self.procs,
            self.sim.address,
            {"BENCH_FLOOR_IDLE_OF": str(ENV_ID)},
            argv=python_module("bench.floorproc"),
        )
        try:
            yield proc, Http(proc.address)
        finally:
            proc.stop()

    @contextlib.contextmanager
    def api_only(self) -> Iterator[tuple[ChildProcess, Http, Action] | None]:
        """The controller's API observing nothing (`bench.ctlproc.ApiOnly`)
        and the claims to send it, started on a full and quiet pool and
        stopped after the phase; the controller refills. The runners it
        handed out are then deleted, so the simulator's nodes hold no more
        claimed runners than before these phases were measured. None from a
        controller tree whose bench.ctlproc does not know `BENCH_API_ONLY`
        (it would lead, and keep the pool up beside the controller): the
        phase is left out."""
        self.quiet()
        proc, api = start_ctlproc(
            self.procs,
            self.sim.address,
            {**self.settings, "BENCH_API_ONLY": "1"},
            tree=self.tree,
        )
        taken: list[str] = []
        try:
            yield (proc, api, claims_to(api, taken)) if role(proc) == "follower" else None
        finally:
            proc.stop()
            for runner in taken:
                self.sim.request("DELETE", f"/v1/job/{runner}?purge=true")

    def claim_phases(self, bare: BareJobs) -> dict[str, list[Load]]:
        s = self.scale
        phases = (
            "open",
            "open_bare",
            "open_floor",
            "open_beside",
            "closed",
            "closed_bare",
            "closed_floor",
            "closed_beside",
            "open_api_only",
            "closed_api_only",
            "open_refill",
            "closed_refill",
        )
        out: dict[str, list[Load]] = {k: [] for k in phases}
        assert self.floor is not None
        floor = self.floor[1]

        def write(k: int, i: int) -> bool:
            mine = bare.of(k, CLIENTS)
            return bare.write(mine[i % len(mine)])

        def claims_open() -> Load:
            with self.refill_off():
                return open_loop(CLIENTS, CLAIM_RATE, s.open_s, self.claim, self.api)

        def writes_open() -> Load:
            return open_loop(CLIENTS, CLAIM_RATE, s.open_s, write, self.sim)

        def floor_open() -> Load:
            return open_loop(CLIENTS, CLAIM_RATE, s.open_s, claims_to(floor), floor)

        for _ in range(s.rounds):
            self.quiet()
            out["open"].append(self.metered("claims", claims_open))
            self.quiet()
            bare.prepare()
            out["open_bare"].append(self.metered("bare writes", writes_open))
            out["open_floor"].append(self.metered("floor claims", floor_open))
            with self.floor_refilling():
                out["open_refill"].append(self.metered("floor claims refilling", floor_open))
            with self.beside_the_upkeep() as (proc, beside):
                out["open_beside"].append(
                    self.metered(
                        "claims beside the upkeep",
                        lambda: open_loop(CLIENTS, CLAIM_RATE, s.open_s, claims_to(beside), beside),
                        proc,
                    )
                )
            with self.api_only() as started:
                if started is not None:
                    proc, alone, claim = started
                    out["open_api_only"].append(
                        self.metered(
                            "claims through the API observing nothing",
                            functools.partial(
                                open_loop, CLIENTS, CLAIM_RATE, s.open_s, claim, alone
                            ),
                            proc,
                        )
                    )
        for _ in range(s.rounds):
            self.quiet()
            # Never more claims than the pool holds (an empty pool answers at once).
            cap = s.pool - 50
            with self.refill_off():
                out["closed"].append(closed_loop(CLIENTS, s.closed_s, cap, self.claim, self.api))
            self.quiet()
            bare.prepare()
            out["closed_bare"].append(closed_loop(CLIENTS, s.closed_s, 10**9, write, self.sim))
            out["closed_floor"].append(
                closed_loop(CLIENTS, s.closed_s, 10**9, claims_to(floor), floor)
            )
            with self.floor_refilling():
                out["closed_refill"].append(
                    closed_loop(CLIENTS, s.closed_s, cap, claims_to(floor), floor)
                )
            with self.beside_the_upkeep() as (_, beside):
                out["closed_beside"].append(
                    closed_loop(CLIENTS, s.closed_s, cap, claims_to(beside), beside)
                )
            with self.api_only() as started:
                if started is not None:
                    _, alone, claim = started
                    out["closed_api_only"].append(
                        closed_loop(CLIENTS, s.closed_s, cap, claim, alone)
                    )
        return out

    # executions

    def exec_phases(self, allocs: list[Allocation]) -> dict[str, Any]:
        s = self.scale
        n = len(allocs)
        out: dict[str, Any] = {
            f"{how}{who}": [] for how in ("open", "serial") for who in ("", "_bare", "_chain")
        }

        def through(k: int, i: int) -> bool:
            return execute(self.api, allocs[k].runner, ECHO)[1] == 0

        def bare(k: int, i: int) -> bool:
            return bare_exec(allocs[k], ["sh", "-c", ECHO])[1] == 0

        def chain(k: int, i: int) -> bool:
            return chain_exec(allocs[k], ECHO, self.wrapper)[1] == 0

        # The executions through the controller, the bare execs, and the
        # controller's own execs of them opened straight to Nomad (the chain).
        actions: dict[str, tuple[str, Action, Http | None]] = {
            "": ("executions", through, self.api),
            "_bare": ("bare execs", bare, None),
            "_chain": ("chain execs", chain, None),
        }
        # Warm-up, not recorded: the first exec in an allocation sets it up.
        for _, action, http in actions.values():
            open_loop(n, float(n), 1.0, action, http)
        for _ in range(s.rounds):
            for who, (what, action, http) in actions.items():
                load = functools.partial(open_loop, n, EXEC_RATE, s.exec_open_s, action, http)
                out[f"open{who}"].append(self.metered(what, load))
        for _ in range(s.rounds):
            for who, (_, action, http) in actions.items():
                out[f"serial{who}"].append(closed_loop(1, 3600.0, s.serial, action, http))
        command = f"head -c {s.stdout_bytes} /dev/zero | tr '\\0' c"
        rates: dict[str, list[float]] = {"controller": [], "bare": [], "bare_tty": [], "chain": []}
        for _ in range(s.throughput_rounds):
            seconds, code, size = execute(self.api, allocs[0].runner, command)
            if code == 0 and size == s.stdout_bytes:
                rates["controller"].append(size / seconds / 1e6)
            for tty, key in ((False, "bare"), (True, "bare_tty")):
                seconds, code, size = bare_exec(allocs[0], ["sh", "-c", command], tty)
                if code == 0 and size == s.stdout_bytes:
                    rates[key].append(size / seconds / 1e6)
            seconds, code, size, _ = chain_exec(allocs[0], command, self.wrapper)
            if code == 0 and size == s.stdout_bytes:
                rates["chain"].append(size / seconds / 1e6)
        out["stdout_mb_per_s"] = rates
        # Counted with clients on an event loop: websockets' synchronous
        # client starts two threads a connection, which the count would take
        # for processes.
        api, alloc, bare_argv = self.api, allocs[0], ["sh", "-c", ECHO]
        out["forks"] = forks_per_run(
            lambda: asyncio.run(_execute_async(api, alloc.runner, ECHO)), s.forks
        )
        out["forks_bare"] = forks_per_run(
            lambda: asyncio.run(_nomad_exec_async(alloc, bare_argv, False)), s.forks
        )
        out["forks_chain"] = forks_per_run(lambda: chain_exec(alloc, ECHO, self.wrapper), s.forks)
        return out


def run(
    quick: bool = False,
    tree: Path | None = None,
    label: str = "",
    no_refill: bool = False,
    settings: Mapping[str, str] | None = None,
    follower: bool = False,
) -> Result:
    label = label or ("follower" if follower else "")
    name = f"ratios_{label}" if label else "ratios"
    commit = git_commit(tree) if tree is not None else ""
    title = "The controller's cost as ratios to the bare Nomad work it asks for"
    if tree is not None:
        title += f" (controller from {tree}, {commit or 'unknown commit'})"
    result = Result(name, title)
    s = QUICK if quick else FULL
    details: dict[str, Any] = {
        "controller_tree": str(tree or ""),
        "controller_commit": commit,
        "settings": dict(settings or {}),
        "no_refill": no_refill,
        "follower": follower,
    }
    with child_processes() as procs:
        sim_proc, sim = start_sim(procs, startup_delay_s=0.05, stop_delay_s=0.05)
        sim.json("POST", "/_bench/seed", {"env_id": ENV_ID, "runners": s.pool, "pool": s.pool})
        bare = BareJobs(sim, s.bare_jobs)
        BareJobs(sim, s.bare_jobs, FLOOR_PREFIX)
        wait_for(
            lambda: sim.json("GET", "/_bench/status")["running"] >= s.pool + 2 * s.bare_jobs,
            timeout=300,
            what="seeded runners running",
        )
        setuser = sim.json("GET", "/_bench/status")["setuser"]
        ctl_settings = {
            "NRC_EXEC_UNPRIVILEGED_WRAPPER": f"{setuser} user",
            **({"BENCH_NO_REFILL": "1"} if no_refill else {}),
            **dict(settings or {}),
        }
        leader: ChildProcess | None = None
        if follower:
            first, _ = start_replica(procs, sim.address, ctl_settings, tree)
            wait_for(lambda: role(first) == "leader", timeout=60, what="the first replica leads")
            leader = first
            ctl_proc, api = start_replica(procs, sim.address, ctl_settings, tree)
            if role(ctl_proc) != "follower":
                raise RuntimeError(
                    "the second replica leads: the claims would not go to a follower"
                )
        else:
            ctl_proc, api = start_ctlproc(procs, sim.address, ctl_settings, tree=tree)
        bench = Bench(s, sim_proc, sim, ctl_proc, api)
        bench.leader = leader
        bench.wrapper = (setuser, "user")
        bench.procs = procs
        bench.tree, bench.settings = tree, ctl_settings
        floor_proc = start_controller_process(
            procs,
            sim.address,
            {"BENCH_FLOOR_PREFIX": FLOOR_PREFIX},
            argv=python_module("bench.floorproc"),
        )
        bench.floor = (floor_proc, Http(floor_proc.address))
        bench.no_refill = no_refill
        bench.quiet()
        closed_loop(1, 60.0, 20, bench.claim)  # warm-up, not recorded
        claims = bench.claim_phases(bare)
        bench.quiet()
        runners = [
            str(api.json("POST", "/api/v1/runners", CLAIM)["runnerId"]) for _ in range(EXEC_RUNNERS)
        ]
        allocs = [allocation_of(sim, r) for r in runners]
        execs = bench.exec_phases(allocs)
        details["bare_jobs_untouched"] = untouched_by_controller(sim, bare)
        cpu = {what: bench.cpu_ms(what) for what in bench.cpu}
        details["gc_full_collections"] = bench_gc = bench.gc
        details["simulator_gc_full_collections"] = sim_gc = bench.sim_gc
    details["claims"] = {k: [load.facts() for load in v] for k, v in claims.items()}
    details["executions"] = {
        k: [load.facts() for load in v] if isinstance(v, list) else v
        for k, v in execs.items()
        if k not in ("stdout_mb_per_s",)
    }
    details["stdout_mb_per_s"] = execs["stdout_mb_per_s"]
    details["cpu_ms"] = cpu
    details["scale"] = s.__dict__
    result.details = details
    figures(result, claims, execs, cpu)
    for who, phases, what, source in (
        ("controller", bench_gc, "claim", "nrc_gc_pause_seconds"),
        ("simulator", sim_gc, "claim", "bench.simproc"),
        ("simulator", sim_gc, "bare write", "bench.simproc"),
    ):
        collections = [c for c in phases.get(f"{what}s", []) if c["count"] is not None]
        if not collections:
            continue
        count = sum(c["count"] or 0 for c in collections)
        result.add(
            f"{who} full garbage collections, mean pause, {what} phases",
            sum(c["total_ms"] or 0.0 for c in collections) / count if count else None,
            "ms",
            note=f"{count:.0f} in {len(collections)} phases ({source})",
        )
    if follower:
        leader_cpu = cpu.get("claims", {}).get("leader")
        result.add(
            "leader replica's CPU per claim (it refills the pool the claims empty)",
            leader_cpu,
            "ms",
            note="the claims and executions went to the other replica, a follower",
        )
        result.title += " (claims and executions through a follower; the leader keeps the pool up)"
    if no_refill:
        # A diagnostic: no pool is refilled, so no goal applies.
        for figure in result.figures:
            figure.target = ""
        result.title += " (diagnostic: no refill during the controller's claim phases)"
    if quick:
        # A smoke run's p99 is its third-worst request: one pause of the
        # simulator decides it, so the goals are not judged on it.
        for figure in result.figures:
            figure.target = ""
        result.title += " (quick: goals not judged)"
    return result


def start_replica(
    procs: list[ChildProcess], nomad: str, settings: Mapping[str, str], tree: Path | None
) -> tuple[ChildProcess, Http]:
    """One controller replica with leader election on (`--follower`)."""
    port = free_port()
    return start_ctlproc(procs, nomad, {**replica_settings(port), **settings}, tree=tree, port=port)


def role(replica: ChildProcess) -> str:
    """`leader` or `follower`, as the replica's /readyz says."""
    return str(Http(replica.address).json("GET", "/readyz").get("role"))


def untouched_by_controller(sim: Http, bare: BareJobs) -> bool:
    """True when every bare job is still registered and not stopped (the
    controller left them alone)."""
    for job_id in bare.ids:
        status, body = sim.request("GET", f"/v1/job/{job_id}")
        if status != 200 or json.loads(body).get("Stop"):
            return False
    return True


def ms(values: Sequence[float], p: float) -> float | None:
    """The `p`th percentile of `values` (seconds) in ms."""
    value = percentile(values, p)
    return None if value is None else value * 1000


def pooled(loads: Sequence[Load]) -> list[float]:
    return [s for load in loads for s in load.latencies]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def figures(
    result: Result,
    claims: dict[str, list[Load]],
    execs: dict[str, Any],
    cpu: dict[str, dict[str, float | None]],
) -> None:
    at = f"{CLIENTS} clients offering {CLAIM_RATE:.0f}/s"
    ctl, bare = pooled(claims["open"]), pooled(claims["open_bare"])
    failures = sum(x.failures for x in claims["open"])
    bare_failures = sum(x.failures for x in claims["open_bare"])
    for p, target in ((50, ""), (99, "<= 2")):
        result.add(
            f"claim p{p} ÷ bare write p{p}, {at}",
            ratio(ms(ctl, p), ms(bare, p)),
            "×",
            target,
            note=f"{_ms(ms(ctl, p))} vs {_ms(ms(bare, p))} ms",
        )
    result.add(f"claim p50, {at}", ms(ctl, 50), "ms", note=f"{failures} failed")
    result.add(f"claim p99, {at}", ms(ctl, 99), "ms", note=f"max {_ms(ms(ctl, 100))} ms")
    result.add(f"bare claim write p50, {at}", ms(bare, 50), "ms", note=f"{bare_failures} failed")
    result.add(f"bare claim write p99, {at}", ms(bare, 99), "ms", note=f"max {_ms(ms(bare, 100))}")
    rate = median([x.facts()["per_s"] or 0.0 for x in claims["closed"]])
    bare_rate = median([x.facts()["per_s"] or 0.0 for x in claims["closed_bare"]])
    result.add(
        f"claims/s ÷ bare writes/s, {CLIENTS} clients (closed loop)",
        ratio(rate, bare_rate),
        "×",
        ">= 0.5",
        note=f"{_n(rate)} vs {_n(bare_rate)} /s",
    )
    # The floor (bench.floorproc): the claim's HTTP stack and write, no controller.
    bare = pooled(claims["open_bare"])
    floor = "through FastAPI + uvicorn + the write alone"
    stack_figures(result, "floor", floor, claims, "floor", bare, bare_rate)
    # Beside the upkeep: the floor claiming the controller's own runners while
    # the controller, in its own process, observes them and refills the pool.
    beside = "through the floor, the controller refilling"
    stack_figures(result, "beside the upkeep", beside, claims, "beside", bare, bare_rate)
    # The controller's own API and claims, observing nothing and keeping no
    # pool up, beside the controller that refills: the most a split could gain.
    alone = "through it, the controller refilling"
    stack_figures(result, "the API observing nothing", alone, claims, "api_only", bare, bare_rate)
    # The floor and its refill: what a claim and the creation it causes cost
    # Nomad here, with nothing of the controller.
    refilled = "through the floor, one creation after each"
    stack_figures(result, "floor and its refill", refilled, claims, "refill", bare, bare_rate)
    ctl, bare = pooled(execs["open"]), pooled(execs["open_bare"])
    at = f"{EXEC_RATE:.0f}/s on {EXEC_RUNNERS} runners"
    for p in (50, 99):
        result.add(
            f"execution p{p} ÷ bare exec p{p}, {at}",
            ratio(ms(ctl, p), ms(bare, p)),
            "×",
            "<= 1.5",
            note=f"{_ms(ms(ctl, p))} vs {_ms(ms(bare, p))} ms",
        )
    ctl, bare = pooled(execs["serial"]), pooled(execs["serial_bare"])
    result.add(
        "execution p50 ÷ bare exec p50, serial (1 client)",
        ratio(ms(ctl, 50), ms(bare, 50)),
        "×",
        note=f"{_ms(ms(ctl, 50))} vs {_ms(ms(bare, 50))} ms",
    )
    rates = execs["stdout_mb_per_s"]
    mbs, bare_mbs = median(rates["controller"]), median(rates["bare"])
    tty_mbs = median(rates["bare_tty"])
    throughputs(result, "one execution ÷ a bare exec", mbs, bare_mbs, ">= 0.95")
    throughputs(
        result, "one execution ÷ a bare exec with a TTY (as the controller asks)", mbs, tty_mbs
    )
    through, direct = execs["forks"], execs["forks_bare"]
    result.add(
        "processes started per execution",
        through["per_run"],
        "",
        note=f"bare exec {direct['per_run']:.1f}; the median of the machine's forks around "
        f"each (least {through['min']} and {direct['min']})",
    )
    result.add(
        "processes per execution − per bare exec", through["per_run"] - direct["per_run"], ""
    )
    chain_figures(result, execs, cpu)
    floor_cpu = cpu.get("floor claims") or {}
    result.add(
        "floor: CPU per claim of FastAPI + uvicorn + the write alone",
        floor_cpu.get("floor"),
        "ms",
        note=f"simulator {_ms(floor_cpu.get('simulator'))} ms",
    )
    refill_cpu = cpu.get("floor claims refilling") or {}
    result.add(
        "floor and its refill: simulator CPU per claim and its creation",
        refill_cpu.get("simulator"),
        "ms",
        note=f"a bare write {_ms((cpu.get('bare writes') or {}).get('simulator'))} ms; "
        f"floor {_ms(refill_cpu.get('floor'))} ms",
    )
    beside_cpu = cpu.get("claims beside the upkeep") or {}
    result.add(
        "beside the upkeep: CPU per claim of the floor + the controller refilling",
        (beside_cpu.get("floor") or 0.0) + (beside_cpu.get("controller") or 0.0)
        if beside_cpu
        else None,
        "ms",
        note=f"floor {_ms(beside_cpu.get('floor'))} ms, controller "
        f"{_ms(beside_cpu.get('controller'))} ms, simulator {_ms(beside_cpu.get('simulator'))} ms",
    )
    alone_cpu = cpu.get("claims through the API observing nothing") or {}
    result.add(
        "the API observing nothing: its CPU per claim",
        alone_cpu.get("floor"),
        "ms",
        note=f"the controller refilling {_ms(alone_cpu.get('controller'))} ms, "
        f"simulator {_ms(alone_cpu.get('simulator'))} ms",
    )
    for what, unit, bare_what, bare_unit in (
        ("claims", "claim", "bare writes", "bare write"),
        ("executions", "execution", "bare execs", "bare exec"),
    ):
        mine, theirs = cpu.get(what) or {}, cpu.get(bare_what) or {}
        result.add(
            f"controller CPU per {unit}",
            mine.get("controller"),
            "ms",
            note=f"simulator {_ms(mine.get('simulator'))} ms; per {bare_unit}: "
            f"simulator {_ms(theirs.get('simulator'))} ms, "
            f"controller {_ms(theirs.get('controller'))} ms",
        )


def throughputs(
    result: Result, what: str, mbs: float | None, other: float | None, target: str = ""
) -> None:
    """The ratio of two stdout throughputs (MB/s), as `stdout MB/s of <what>`."""
    result.add(
        f"stdout MB/s of {what}",
        ratio(mbs, other),
        "×",
        target,
        note=f"{_n(mbs)} vs {_n(other)} MB/s",
    )


def chain_figures(
    result: Result, execs: dict[str, Any], cpu: dict[str, dict[str, float | None]]
) -> None:
    """The chain alone (the controller's two execs of an execution, opened
    straight to Nomad) against the bare exec, and the executions through the
    controller against the chain: what the execution's semantics cost Nomad,
    and what the controller adds to that."""
    chain = "the chain alone (the controller's two execs, straight to Nomad)"
    at = f"{EXEC_RATE:.0f}/s on {EXEC_RUNNERS} runners"
    for how, where, ps in (("open", at, (50, 99)), ("serial", "serial (1 client)", (50,))):
        ctl, bare, alone = (pooled(execs[f"{how}{who}"]) for who in ("", "_bare", "_chain"))
        failures = sum(x.failures for x in execs[f"{how}_chain"])
        for p in ps:
            result.add(
                f"{chain}: p{p} ÷ bare exec p{p}, {where}",
                ratio(ms(alone, p), ms(bare, p)),
                "×",
                note=f"{_ms(ms(alone, p))} vs {_ms(ms(bare, p))} ms; {failures} failed",
            )
            result.add(
                f"execution p{p} ÷ the chain alone p{p}, {where}",
                ratio(ms(ctl, p), ms(alone, p)),
                "×",
                note=f"{_ms(ms(ctl, p))} vs {_ms(ms(alone, p))} ms",
            )
    rates = execs["stdout_mb_per_s"]
    mbs, bare_mbs, chain_mbs = (median(rates[k]) for k in ("controller", "bare", "chain"))
    throughputs(result, "the chain alone ÷ a bare exec", chain_mbs, bare_mbs)
    throughputs(result, "one execution ÷ the chain alone", mbs, chain_mbs)
    forks = execs["forks_chain"]
    result.add(
        "processes started per run of the chain alone",
        forks["per_run"],
        "",
        note=f"the median of the machine's forks around each (least {forks['min']})",
    )
    mine, chain_cpu, bare_cpu = (
        cpu.get(k) or {} for k in ("executions", "chain execs", "bare execs")
    )
    result.add(
        "simulator CPU per run of the chain alone",
        chain_cpu.get("simulator"),
        "ms",
        note=f"per execution {_ms(mine.get('simulator'))} ms; "
        f"per bare exec {_ms(bare_cpu.get('simulator'))} ms",
    )


def stack_figures(
    result: Result,
    name: str,
    how: str,
    claims: dict[str, list[Load]],
    phase: str,
    bare: Sequence[float],
    bare_rate: float | None,
) -> None:
    """The ratios of claims sent to a floor process (the `open_<phase>` and
    `closed_<phase>` loads) to the bare writes."""
    loads = claims[f"open_{phase}"]
    latencies = pooled(loads)
    for p in (50, 99):
        result.add(
            f"{name}: claim p{p} {how} ÷ bare write p{p}",
            ratio(ms(latencies, p), ms(bare, p)),
            "×",
            note=f"{_ms(ms(latencies, p))} vs {_ms(ms(bare, p))} ms; "
            f"{sum(x.failures for x in loads)} failed",
        )
    rate = median([x.facts()["per_s"] or 0.0 for x in claims[f"closed_{phase}"]])
    result.add(
        f"{name}: claims/s {how} ÷ bare writes/s",
        ratio(rate, bare_rate),
        "×",
        note=f"{_n(rate)} vs {_n(bare_rate)} /s",
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _n(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"
