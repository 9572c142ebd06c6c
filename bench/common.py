"""What every benchmark shares: machine facts, results (JSON per benchmark and
the table), percentiles, the simulator and controller processes, a small
keep-alive HTTP client and CPU/RSS readings of a process."""

from __future__ import annotations

import http.client
import json
import math
import os
import platform
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import psutil

from tests.support.controller import start_controller_process
from tests.support.ports import free_port
from tests.support.processes import ChildProcess, python_module

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
T = TypeVar("T")


# -- results -------------------------------------------------------------------------


@dataclass
class Figure:
    """One reported number, with its target when the issue sets one."""

    name: str
    value: float | None
    unit: str
    target: str = ""  # e.g. "<= 10" (same unit); "" when the figure has no target
    note: str = ""

    @property
    def met(self) -> bool | None:
        if not self.target or self.value is None:
            return None
        m = re.fullmatch(r"\s*(<=|>=|==)\s*([0-9.]+)\s*", self.target)
        if m is None:
            return None
        bound = float(m.group(2))
        return {
            "<=": self.value <= bound,
            ">=": self.value >= bound,
            "==": self.value == bound,
        }[m.group(1)]


@dataclass
class Result:
    benchmark: str  # file name: bench/results/<benchmark>.json
    title: str
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    duration_s: float = 0.0

    def add(
        self, name: str, value: float | None, unit: str, target: str = "", note: str = ""
    ) -> Figure:
        figure = Figure(name, None if value is None else round(value, 3), unit, target, note)
        self.figures.append(figure)
        return figure


def git_commit(tree: Path) -> str:
    """The short commit checked out at `tree` ("" when git cannot say)."""
    with suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    return ""


def machine() -> dict[str, Any]:
    """The facts a reader needs to compare figures across machines."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = git_commit(ROOT)
    return {
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_model": model,
        "memory_total_mb": round(psutil.virtual_memory().total / 2**20),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "git_commit": commit,
    }


def write_result(result: Result, facts: Mapping[str, Any], directory: Path = RESULTS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.benchmark}.json"
    body = {
        "benchmark": result.benchmark,
        "title": result.title,
        "machine": dict(facts),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(result.started_at)),
        "duration_s": round(result.duration_s, 1),
        "figures": [{**asdict(f), "met": f.met} for f in result.figures],
        "details": result.details,
    }
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    return path


def render_table(results: Sequence[Result], markdown: bool = True) -> str:
    rows = [("benchmark", "figure", "value", "target", "")]
    for r in results:
        for f in r.figures:
            value = "n/a" if f.value is None else f"{_fmt(f.value)} {f.unit}".strip()
            target = f"{f.target.strip()} {f.unit}".strip() if f.target else ""
            mark = {True: "met", False: "MISSED", None: ""}[f.met]
            rows.append((r.benchmark, f.name, value, target, mark))
    if markdown:
        head, *body = rows
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(text)


def _fmt(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# -- statistics ----------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms) if ms else None,
        "mean_ms": sum(ms) / len(ms) if ms else None,
    }


# -- processes (tests/support/processes.py runs them) ---------------------------------


def start_sim(
    procs: list[ChildProcess],
    *,
    nodes: int = 25,
    startup_delay_s: float = 0.5,
    stop_delay_s: float = 0.2,
    event_buffer: int = 100,
    topology: str = "tests",
    marks: bool = False,
    maintenance: bool = False,
) -> tuple[ChildProcess, Http]:
    """The simulator in its own process (see bench.simproc); `topology` is
    `tests` (what the suite runs against), `production` or `direct`; `marks`
    adds its claim writes' marks (`bench.marks`); `maintenance`, the short,
    production-shaped restart timings of `bench.simproc --maintenance`."""
    proc = ChildProcess(
        python_module(
            "bench.simproc",
            "--port",
            str(free_port()),
            "--nodes",
            str(nodes),
            "--startup-delay",
            str(startup_delay_s),
            "--stop-delay",
            str(stop_delay_s),
            "--event-buffer",
            str(event_buffer),
            "--topology",
            topology,
            *(["--marks"] if marks else []),
            *(["--maintenance"] if maintenance else []),
        )
    )
    procs.append(proc)
    address = proc.wait_ready()
    return proc, Http(address)


def replica_settings(port: int) -> dict[str, str]:
    """What a controller replica listening on `port` needs to run beside
    others: leader election on, the address the others reach it at, and the
    secret they share."""
    return {
        "NRC_LEADER_ELECTION": "true",
        "NRC_API_ADVERTISE_URL": f"http://127.0.0.1:{port}",
        "NRC_REPLICA_SECRET": "bench-replica-secret-0123456789abcdef",
    }


def start_ctlproc(
    procs: list[ChildProcess],
    nomad: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    tree: Path | None = None,
    port: int | None = None,
) -> tuple[ChildProcess, Http]:
    """The controller service in its own process (see bench.ctlproc); returns
    once its API answers and it has observed Nomad. With `tree`, the
    controller (and that tree's bench.ctlproc) comes from that checkout of
    the repository, run by this interpreter: its directory is the process's
    working directory and first on its PYTHONPATH, ahead of the editable
    install of this tree."""
    settings = {"NRC_LOG_LEVEL": "WARNING", "NRC_LOG_FORMAT": "text", **dict(env or {})}
    if tree is not None:
        settings["PYTHONPATH"] = str(tree)
    proc = start_controller_process(
        procs,
        nomad,
        settings,
        argv=python_module("bench.ctlproc"),
        timeout=timeout,
        cwd=tree,
        port=port,
    )
    return proc, Http(proc.address)


def wait_for(
    check: Callable[[], T], timeout: float = 60.0, interval: float = 0.05, what: str = "condition"
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s (last: {value!r})")
        time.sleep(interval)


# -- HTTP ------------------------------------------------------------------------------


class Http:
    """A keep-alive HTTP/1.1 client for one host, one connection per thread
    (lighter than requests, so clients cost the benchmark little CPU)."""

    def __init__(self, address: str, timeout: float = 60.0) -> None:
        parts = urlsplit(address)
        self.address = address.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout = timeout
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = conn
        return conn

    def request(
        self, method: str, path: str, body: Any = None, *, data: bytes | None = None
    ) -> tuple[int, bytes]:
        """`body` is sent as JSON; `data`, bytes already encoded as JSON, instead."""
        if body is not None:
            data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def status(self, method: str, path: str, body: Any = None) -> int:
        try:
            return self.request(method, path, body)[0]
        except OSError:
            return 0

    def json(self, method: str, path: str, body: Any = None) -> Any:
        status, data = self.request(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        return json.loads(data) if data else None

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


# -- the environment and readings ---------------------------------------------------------


def environment_body(env_id: int, pool: int) -> dict[str, Any]:
    return {
        "id": env_id,
        "image": "python:3.12-slim",
        "prewarmingPoolSize": pool,
        "cpuLimit": 100,
        "memoryLimit": 256,
        "networkAccess": False,
        "exposedPorts": [],
    }


def idle_runners(api: Http, env_id: int) -> int:
    stats = api.json("GET", "/api/v1/statistics/execution-environments")
    return int((stats.get(str(env_id)) or {}).get("idleRunners") or 0)


def gc_pauses(api: Http) -> tuple[int, float] | None:
    """The controller's full garbage collections so far (`nrc_gc_pause_seconds`):
    how many and their seconds in all; None from a controller without the metric."""
    status, body = api.request("GET", "/metrics")
    text = body.decode()
    if status != 200 or "nrc_gc_pause_seconds_count" not in text:
        return None
    return (
        int(metric_sum(text, "nrc_gc_pause_seconds_count")),
        metric_sum(text, "nrc_gc_pause_seconds_sum"),
    )


def sim_gc_pauses(sim: Http) -> tuple[int, float] | None:
    """The simulator process's full garbage collections so far (bench.simproc's
    `/_bench/status`): how many and their seconds in all."""
    paused = sim.json("GET", "/_bench/status").get("gc_pauses")
    return None if paused is None else (int(paused["count"]), float(paused["total_s"]))


def gc_pauses_between(
    before: tuple[int, float] | None, after: tuple[int, float] | None
) -> dict[str, float | None]:
    """The full collections between two `gc_pauses` readings: how many, their
    ms in all and on average."""
    if before is None or after is None:
        return {"count": None, "total_ms": None, "mean_ms": None}
    count = after[0] - before[0]
    total_ms = (after[1] - before[1]) * 1000
    return {"count": count, "total_ms": total_ms, "mean_ms": total_ms / count if count else None}


def metric_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sum of a Prometheus series' samples whose labels include `labels`."""
    total = 0.0
    want = dict(labels or {})
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m is None or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in want.items()):
            total += float(m.group(3))
    return total


class RssSampler:
    """Samples a process's RSS on a thread; `peak_mb` is the highest seen."""

    def __init__(self, proc: ChildProcess, interval: float = 0.2) -> None:
        self.proc = proc
        self.interval = interval
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_mb = max(self.peak_mb, self.proc.rss_mb())
            except psutil.Error:
                return
            self._stop.wait(self.interval)


def chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
