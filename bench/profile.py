"""`--profile` for the claims and executions benchmarks: where the
controller's CPU goes per claim or per execution, by function.

py-spy (a dev dependency) samples the controller process from outside, 250
times a second, without stopping it (`--nonblocking`), and keeps the stack
of whichever thread holds the GIL (`--gil`): own (the function on top) and
inclusive (anywhere on the stack). Each sample stands for 1/250 s of the
GIL held, the one thing the event loop, the passes and the event stream
queue for; divided by the claims or executions the run made, that is "GIL
ms per claim" by function. Time in C code that keeps the GIL (uvloop,
httptools, orjson, a socket's send on the event loop) goes to the Python
function that called it; C code that lets the GIL go (a blocking read of
`requests`, zlib on large inputs) is the process's CPU but no one's wait,
and is not in the table. Without `--gil` py-spy cannot tell a thread
blocked in a read or a queue from one at work here: the waits took most of
the samples. The process's whole CPU (user and system, from /proc) heads
the table.

The controller's own sampler (bench/ctlproc.py `Sampler`, behind
`/_bench/probe?sample=start` … `=stop`) is the fallback where py-spy cannot
attach (no ptrace rights, no binary). It needs the GIL to look, so it looks
when the thread it looks at lets go of the GIL and charges what that thread
spent since the last look to where it let go: the event loop's idle wait,
or a C call that releases the GIL, gets the CPU of the Python code before
it (docs/performance.md, "Profiling"). The result says which sampler made
it.
The profiled run is an extra run after the measured ones: the sampler's own
cost never reaches the benchmark's figures.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from bench.common import RESULTS, Http

RATE_HZ = 250
TOP = 40
# What each sampler's table adds up to.
SAMPLED = {"py-spy --gil": "GIL held", "in-process": "CPU shared out"}


class Profiled(Protocol):
    """The controller's process as the benchmarks hold it."""

    @property
    def pid(self) -> int: ...

    def cpu_s(self) -> float: ...


def py_spy() -> str | None:
    """py-spy beside this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Sampling:
    """One profiled run: `start` it, run the load, `stop` it."""

    def __init__(self, api: Http, process: Profiled) -> None:
        self.api = api
        self.process = process
        self._spy: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._cpu0 = 0.0

    def start(self) -> None:
        binary = py_spy()
        if binary is not None:
            self._dir = Path(tempfile.mkdtemp(prefix="nrc-profile-"))
            argv = [binary, "record", "--pid", str(self.process.pid), "--format", "raw"]
            argv += ["--rate", str(RATE_HZ), "--gil", "--nonblocking"]
            argv += ["--output", str(self._dir / "stacks.txt")]
            with open(self._dir / "stderr.txt", "wb") as stderr:
                spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
            time.sleep(1.0)  # attached, or failed to
            if spy.poll() is None:
                self._spy = spy
                self._cpu0 = self.process.cpu_s()
                return
            why = (self._dir / "stderr.txt").read_text(errors="replace").strip()
            shutil.rmtree(self._dir, ignore_errors=True)
            print(f"py-spy could not sample the controller ({why[:200]}); its own sampler does")
        self.api.json("GET", "/_bench/probe?sample=start")

    def stop(self) -> dict[str, Any]:
        """The seconds by function, as `per_unit` takes them."""
        spy, directory = self._spy, self._dir
        if spy is None or directory is None:
            return {
                "sampler": "in-process",
                **self.api.json("GET", "/_bench/probe?sample=stop")["profile"],
            }
        cpu_s = self.process.cpu_s() - self._cpu0
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()
        stacks = directory / "stacks.txt"
        lines = stacks.read_text().splitlines() if stacks.exists() else []
        shutil.rmtree(directory, ignore_errors=True)
        return {"sampler": "py-spy --gil", "cpu_s": cpu_s, **charged(lines, 1 / RATE_HZ)}


def charged(lines: Iterable[str], sample_s: float, top: int = TOP) -> dict[str, Any]:
    """py-spy's raw stacks (`outer (file:line);…;inner (file:line) N`) as
    seconds by function, each sample `sample_s`: own to the innermost frame,
    inclusive once to each function on the stack."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    samples = 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        names = [_function(frame) for frame in stack.split(";")]
        samples += n
        own[names[-1]] += n
        for name in set(names):
            inclusive[name] += n

    def ranked(counts: Counter[str], n: int) -> list[list[Any]]:
        return [[name, c * sample_s] for name, c in counts.most_common(n)]

    return {
        "rounds": samples,
        "sampled_s": samples * sample_s,
        "own": ranked(own, top),
        "inclusive": ranked(inclusive, 2 * top),
    }


def _function(frame: str) -> str:
    """`name (path:line)` as `path:name`: a function's lines counted together."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0] or where.rstrip(")")
    return f"{path}:{name}"


def per_unit(profile: dict[str, Any], units: int) -> dict[str, Any]:
    """The CPU seconds as milliseconds per unit (a claim, an execution)."""
    ms = 1000 / max(1, units)
    return {
        "units": units,
        "sampler": profile.get("sampler", "in-process"),
        "rounds": profile["rounds"],
        "cpu_ms_per_unit": round(float(profile["cpu_s"]) * ms, 4),
        # what the table's functions add up to: the GIL held (py-spy), or all
        # the CPU the in-process sampler shared out
        "sampled_ms_per_unit": round(float(profile.get("sampled_s", profile["cpu_s"])) * ms, 4),
        "own_ms": [[name, round(s * ms, 4)] for name, s in profile["own"]],
        "inclusive_ms": [[name, round(s * ms, 4)] for name, s in profile["inclusive"]],
    }


def write(name: str, unit: str, table: dict[str, Any], directory: Path = RESULTS) -> Path:
    """bench/results/<name>_profile.json and a text table beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}_profile.json"
    path.write_text(json.dumps({"unit": unit, **table}, indent=1) + "\n")
    lines = [
        f"controller CPU per {unit}: {table['cpu_ms_per_unit']:.3f} ms",
        f"{SAMPLED.get(table['sampler'], 'sampled')} per {unit}: "
        f"{table['sampled_ms_per_unit']:.3f} ms ({table['rounds']} samples by "
        f"{table['sampler']} over {table['units']} {unit}s)",
        "",
        f"{'own ms':>9}  function",
        *(f"{ms:9.3f}  {fn}" for fn, ms in table["own_ms"]),
        "",
        f"{'incl. ms':>9}  function",
        *(f"{ms:9.3f}  {fn}" for fn, ms in table["inclusive_ms"]),
    ]
    path.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    return path
