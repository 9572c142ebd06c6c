"""`--profile` for the claims and executions benchmarks: where the
controller's CPU goes per claim or per execution, by function.

The controller process (bench/ctlproc.py) looks at every thread every 2 ms
while a profiled run goes on (`/_bench/probe?sample=start` … `=stop`) and
charges the CPU time the thread used since the last look to the functions on
its stack: own (the function on top) and inclusive (anywhere on it). A thread
that waited costs nothing. Divided by the claims or executions the run made,
that is "CPU ms per claim" by function (time in C code — uvloop, httptools,
the JSON encoder — goes to the Python function that called it or, for the
event loop itself, to `asyncio.run`).
The profiled run is an extra run after the measured ones: the sampler's own
cost never reaches the benchmark's figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS, Http


def start(api: Http) -> None:
    api.json("GET", "/_bench/probe?sample=start")


def stop(api: Http) -> dict[str, Any]:
    return dict(api.json("GET", "/_bench/probe?sample=stop")["profile"])


def per_unit(profile: dict[str, Any], units: int) -> dict[str, Any]:
    """The CPU seconds as milliseconds per unit (a claim, an execution)."""
    ms = 1000 / max(1, units)
    return {
        "units": units,
        "rounds": profile["rounds"],
        "cpu_ms_per_unit": round(float(profile["cpu_s"]) * ms, 4),
        "own_ms": [[name, round(s * ms, 4)] for name, s in profile["own"]],
        "inclusive_ms": [[name, round(s * ms, 4)] for name, s in profile["inclusive"]],
    }


def write(name: str, unit: str, table: dict[str, Any], directory: Path = RESULTS) -> Path:
    """bench/results/<name>_profile.json and a text table beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}_profile.json"
    path.write_text(json.dumps({"unit": unit, **table}, indent=1) + "\n")
    lines = [
        f"controller CPU per {unit}: {table['cpu_ms_per_unit']:.3f} ms "
        f"(sampled every 2 ms over {table['units']} {unit}s)",
        "",
        f"{'own ms':>9}  function",
        *(f"{ms:9.3f}  {fn}" for fn, ms in table["own_ms"]),
        "",
        f"{'incl. ms':>9}  function",
        *(f"{ms:9.3f}  {fn}" for fn, ms in table["inclusive_ms"]),
    ]
    path.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    return path
