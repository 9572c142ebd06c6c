"""7. Files as a client outside the controller sees them.

The simulator (whose exec runs the file scripts for real, on this host) and
the controller run in processes of their own, as in the executions
benchmark; the client is this process, speaking HTTP over loopback as
CodeOcean does. Each part has a claimed runner of its own.

- Upload: `PATCH /files` of 1,000 files of 20 kB (20 MB) in 10 directories,
  the directories listed first and `"delete": ["./*"]`, as CodeOcean sends a
  submission: wall time from the client, repeated.
- Listing: `GET /files?path=./&recursive=true` of 10,000 files (copied by one
  PATCH): wall time until the whole JSON body has arrived; the entries are
  counted.
- Download: `GET /files/raw` of a 200 MB file an execution wrote: throughput
  as the client reads the streamed body; Content-Length, the byte count and
  the SHA-256 (against `sha256sum` in the runner) are checked.
- Missing path: `GET /files/raw` of a path that does not exist, repeated:
  the time until the 424 (the controller reads the allocation once its
  client could have reported a restart, NRC_NOMAD_CLIENT_SYNC, before it
  believes the file is missing rather than reset).
- The controller's RSS growth (peak while it runs minus before, sampled
  every 50 ms) during one PATCH of a single 100 MiB file (its base64 in the
  JSON body, sent from a generator so this process never holds it), during
  the first download, and during a listing of 100,000 entries (made by an
  execution), which streams through the controller. A 100 MiB file is ~140 MB of JSON, above the
  default NRC_FILES_MAX_UPLOAD, so the controller runs with a larger one.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from websockets.sync.client import connect

from bench.b6_executions import ENV_ID, children_cpu_s, claim, execute
from bench.common import (
    Http,
    Result,
    RssSampler,
    idle_runners,
    percentile,
    start_ctlproc,
    start_sim,
    wait_for,
)
from tests.support.processes import ChildProcess, child_processes

RUNNERS = 5  # one per part: upload, listing, download, large upload, large listing
MAX_UPLOAD = 200_000_000  # NRC_FILES_MAX_UPLOAD for the 100 MiB file's ~140 MB body
UPLOADS = 5
DOWNLOADS = 2
BLOCK = 3 * 2**20  # raw bytes per chunk of the streamed body (a multiple of 3)


# -- request bodies ------------------------------------------------------------------


def submission(files: int, directories: int, size: int, seed: int = 7) -> bytes:
    """A PATCH body as CodeOcean sends one: delete everything, the
    directories first (`dir/`), then the files spread over them."""
    rng = random.Random(seed)
    dirs = [f"dir{d:02d}/" for d in range(directories)]
    copy: list[dict[str, str]] = [{"path": d, "content": ""} for d in dirs]
    for n in range(files):
        content = base64.b64encode(rng.randbytes(size)).decode()
        copy.append({"path": f"{dirs[n % directories]}file{n:05d}.txt", "content": content})
    return json.dumps({"delete": ["./*"], "copy": copy}).encode()


@dataclass
class StreamedUpload:
    """A PATCH body copying one file of `size` pseudo-random bytes, produced
    chunk by chunk: `length` for Content-Length, `sha256` of the file."""

    path: str
    size: int
    seed: int = 7
    block: int = BLOCK

    def __post_init__(self) -> None:
        assert self.block % 3 == 0, "base64 of a block must not need padding"
        self._head = json.dumps({"copy": [{"path": self.path, "content": ""}]}).encode()
        self._cut = self._head.rindex(b'""') + 1  # between the content's quotes
        self.length = len(self._head) + 4 * -(-self.size // 3)
        digest = hashlib.sha256()
        for raw in self._raw():
            digest.update(raw)
        self.sha256 = digest.hexdigest()

    def _raw(self) -> Iterator[bytes]:
        block = random.Random(self.seed).randbytes(self.block)
        left = self.size
        while left > 0:
            yield block[:left]
            left -= len(block)

    def chunks(self) -> Iterator[bytes]:
        yield self._head[: self._cut]
        for raw in self._raw():
            yield base64.b64encode(raw)
        yield self._head[self._cut :]


# -- the client ----------------------------------------------------------------------


@dataclass
class Transfer:
    """One request as the client saw it: from sending it to the last byte."""

    status: int
    seconds: float
    first_byte_s: float
    received: int
    content_length: int | None
    sha256: str
    body: bytes  # the whole body when kept, else its first 64 KiB

    def describe(self) -> str:
        return f"{self.status}, {self.received} bytes: {self.body[:300]!r}"


def transfer(
    api: Http,
    method: str,
    path: str,
    body: bytes | Iterable[bytes] | None = None,
    length: int | None = None,
    keep: bool = False,
) -> Transfer:
    """A request on a new connection, its answer read in 1 MiB pieces and
    hashed as it arrives; an iterable body is sent as it is produced."""
    headers = {}
    if body is not None:
        headers["Content-Type"] = "application/json"
        headers["Content-Length"] = str(len(body) if isinstance(body, bytes) else length)
    conn = http.client.HTTPConnection(api.host, api.port, timeout=300)
    try:
        started = time.perf_counter()
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        first_byte = time.perf_counter() - started
        digest = hashlib.sha256()
        kept: list[bytes] = []
        received = 0
        while piece := response.read(1 << 20):
            received += len(piece)
            digest.update(piece)
            if keep or received <= 1 << 16:
                kept.append(piece)
        seconds = time.perf_counter() - started
    finally:
        conn.close()
    declared = response.getheader("Content-Length")
    return Transfer(
        status=response.status,
        seconds=seconds,
        first_byte_s=first_byte,
        received=received,
        content_length=None if declared is None else int(declared),
        sha256=digest.hexdigest(),
        body=b"".join(kept) if keep else b"".join(kept)[: 1 << 16],
    )


def files_path(runner: str, suffix: str = "", **query: str) -> str:
    path = f"/api/v1/runners/{runner}/files{suffix}"
    return path + ("?" + "&".join(f"{k}={quote(v)}" for k, v in query.items()) if query else "")


def patch(api: Http, runner: str, body: bytes | StreamedUpload) -> Transfer:
    if isinstance(body, StreamedUpload):
        done = transfer(api, "PATCH", files_path(runner), body.chunks(), body.length)
    else:
        done = transfer(api, "PATCH", files_path(runner), body)
    if done.status != 204:
        raise RuntimeError(f"PATCH {files_path(runner)}: {done.describe()}")
    return done


def shell(api: Http, runner: str, command: str) -> str:
    """An execution's stdout; an exit other than 0 is an error."""
    stdout: list[str] = []
    frames: list[dict[str, Any]] = []
    with connect(execute(api, runner, command), max_size=None, compression=None) as ws:
        for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "stdout":
                stdout.append(frame["data"])
            else:
                frames.append(frame)
    if not frames or frames[-1] != {"type": "exit", "data": 0}:
        raise RuntimeError(f"{command!r} ended with {frames[-3:]}")
    return "".join(stdout)


def sha256_in(api: Http, runner: str, path: str) -> tuple[int, str]:
    """The file's size and SHA-256 as the runner sees them."""
    out = shell(api, runner, f"stat -c %s {path} && sha256sum {path}").split()
    return int(out[0]), out[1]


# -- the parts -----------------------------------------------------------------------


class Cpu:
    """CPU seconds spent meanwhile by the controller, the simulator and the
    commands the simulator ran (the runner's side of the file scripts)."""

    def __init__(self, ctl: ChildProcess, sim: ChildProcess) -> None:
        self.ctl, self.sim = ctl, sim
        self.start = self._now()

    def _now(self) -> tuple[float, float, float]:
        return self.ctl.cpu_s(), self.sim.cpu_s(), children_cpu_s(self.sim)

    def spent(self, per: int = 1) -> dict[str, float]:
        now = self._now()
        names = ("controller", "simulator", "commands")
        return {n: (b - a) / per for n, a, b in zip(names, self.start, now, strict=True)}


def uploads(
    procs: tuple[ChildProcess, ChildProcess], api: Http, runner: str, files: int, times: int
) -> dict[str, Any]:
    body = submission(files, 10, 20_000)
    cpu = Cpu(*procs)
    seconds = [patch(api, runner, body).seconds for _ in range(times)]
    cpu_s = cpu.spent(times)
    listed = json.loads(transfer(api, "GET", files_path(runner), keep=True).body)["files"]
    return {
        "files": files,
        "directories": 10,
        "file_bytes": 20_000,
        "body_bytes": len(body),
        "seconds": seconds,
        "p50_s": percentile(seconds, 50),
        "max_s": max(seconds),
        "cpu_s_per_patch": cpu_s,
        "files_after": sum(1 for f in listed if f["entryType"] == "-"),
    }


def listing(api: Http, runner: str, files: int, times: int) -> dict[str, Any]:
    patch(api, runner, submission(files, 100, 100))
    path = files_path(runner, path="./", recursive="true")
    runs = [transfer(api, "GET", path, keep=True) for _ in range(times)]
    bad = [r.describe() for r in runs if r.status != 200]
    if bad:
        raise RuntimeError(f"GET {path}: {bad[0]}")
    entries = json.loads(runs[-1].body)["files"]
    seconds = [r.seconds for r in runs]
    return {
        "files": files,
        "directories": 100,
        "seconds": seconds,
        "first_byte_s": [r.first_byte_s for r in runs],
        "body_bytes": runs[-1].received,
        "p50_s": percentile(seconds, 50),
        "max_s": max(seconds),
        "entries": len(entries),
        "file_entries": sum(1 for f in entries if f["entryType"] == "-"),
    }


def downloads(ctl: ChildProcess, api: Http, runner: str, size: int, times: int) -> dict[str, Any]:
    started = time.perf_counter()
    shell(api, runner, f"head -c {size} /dev/urandom > big")
    written_s = time.perf_counter() - started
    on_disk, sha256 = sha256_in(api, runner, "big")
    path = files_path(runner, "/raw", path="big")
    runs: list[dict[str, Any]] = []
    rss_before = peak = 0.0
    for n in range(times):
        before = ctl.rss_mb()
        with RssSampler(ctl, 0.05) as sampler:
            got = transfer(api, "GET", path)
        if n == 0:
            rss_before, peak = before, sampler.peak_mb
        if got.status != 200:
            raise RuntimeError(f"GET {path}: {got.describe()}")
        runs.append(
            {
                "seconds": got.seconds,
                "first_byte_s": got.first_byte_s,
                "received": got.received,
                "content_length": got.content_length,
                "mb_per_s": got.received / got.seconds / 1e6,
                "sha256_matches": got.sha256 == sha256,
                "rss_before_mb": before,
                "rss_peak_mb": sampler.peak_mb,
            }
        )
    rates = [r["mb_per_s"] for r in runs]
    return {
        "size": size,
        "written_by_execution_s": written_s,
        "size_on_disk": on_disk,
        "runs": runs,
        "mb_per_s_p50": percentile(rates, 50),
        "complete": sum(
            1 for r in runs if r["received"] == r["content_length"] == size and r["sha256_matches"]
        ),
        "rss_before_mb": rss_before,
        "rss_peak_mb": peak,
    }


def missing(api: Http, runner: str, times: int) -> dict[str, Any]:
    """Reads of a path that does not exist: seconds until each 424."""
    seconds: list[float] = []
    statuses: list[int] = []
    for i in range(times):
        started = time.perf_counter()
        status, _ = api.request("GET", files_path(runner, "/raw", path=f"no-such-file-{i}"))
        seconds.append(time.perf_counter() - started)
        statuses.append(status)
    return {
        "seconds": [round(s, 4) for s in seconds],
        "statuses": statuses,
        "p50_s": percentile(seconds, 50),
        "p99_s": percentile(seconds, 99),
    }


def large_listing(ctl: ChildProcess, api: Http, runner: str, entries: int) -> dict[str, Any]:
    """A listing too large to hold: its entries are made by an execution, and
    the controller's RSS is sampled while the JSON streams through it."""
    shell(api, runner, f"mkdir many && cd many && seq 1 {entries} | xargs touch")
    path = files_path(runner, path="many", recursive="true")
    before = ctl.rss_mb()
    with RssSampler(ctl, 0.05) as sampler:
        got = transfer(api, "GET", path, keep=True)
    if got.status != 200:
        raise RuntimeError(f"GET {path}: {got.describe()}")
    return {
        "entries": entries,
        "listed": len(json.loads(got.body)["files"]),
        "seconds": got.seconds,
        "body_bytes": got.received,
        "rss_before_mb": before,
        "rss_peak_mb": sampler.peak_mb,
    }


def large_upload(
    procs: tuple[ChildProcess, ChildProcess], api: Http, runner: str, size: int
) -> dict[str, Any]:
    ctl = procs[0]
    body = StreamedUpload("upload.bin", size)
    before = ctl.rss_mb()
    cpu = Cpu(*procs)
    with RssSampler(ctl, 0.05) as sampler:
        done = patch(api, runner, body)
    cpu_s = cpu.spent()
    on_disk, sha256 = sha256_in(api, runner, "upload.bin")
    return {
        "size": size,
        "body_bytes": body.length,
        "seconds": done.seconds,
        "body_mb_per_s": body.length / done.seconds / 1e6,
        "cpu_s": cpu_s,
        "size_on_disk": on_disk,
        "sha256_matches": sha256 == body.sha256,
        "rss_before_mb": before,
        "rss_peak_mb": sampler.peak_mb,
    }


def run(quick: bool = False) -> Result:
    result = Result("files", "Files: upload, listing, download and memory from a client")
    scale = 0.1 if quick else 1.0
    # The listing's PATCH copies 10,000 files in 100 directories: more items
    # than NRC_FILES_MAX_ITEMS allows by default (10,000).
    env = {"NRC_FILES_MAX_UPLOAD": str(MAX_UPLOAD), "NRC_FILES_MAX_ITEMS": "20000"}
    details: dict[str, Any] = {"quick": quick, "controller_env": env}
    with child_processes() as procs:
        sim_proc, sim = start_sim(procs, nodes=5, startup_delay_s=0.05, stop_delay_s=0.05)
        sim.json("POST", "/_bench/seed", {"env_id": ENV_ID, "runners": RUNNERS, "pool": RUNNERS})
        wait_for(
            lambda: sim.json("GET", "/_bench/status")["running"] >= RUNNERS, 120, what="running"
        )
        setuser = sim.json("GET", "/_bench/status")["setuser"]
        wrapper = {"NRC_EXEC_UNPRIVILEGED_WRAPPER": f"{setuser} user"}
        ctl, api = start_ctlproc(procs, sim.address, {**wrapper, **env})
        wait_for(lambda: idle_runners(api, ENV_ID) >= RUNNERS, 120, what="pool adopted")
        runners = [claim(api) for _ in range(RUNNERS)]
        both = (ctl, sim_proc)
        details["upload"] = uploads(
            both, api, runners[0], int(1000 * scale), 2 if quick else UPLOADS
        )
        details["listing"] = listing(api, runners[1], int(10_000 * scale), 2 if quick else 5)
        details["missing"] = missing(api, runners[1], 5 if quick else 20)
        details["download"] = downloads(
            ctl, api, runners[2], int(200_000_000 * scale), 1 if quick else DOWNLOADS
        )
        details["large_upload"] = large_upload(both, api, runners[3], int(100 * 2**20 * scale))
        details["large_listing"] = large_listing(ctl, api, runners[4], int(100_000 * scale))
        details["controller_output"] = ctl.drain()[-20:]
    result.details = details
    up = details["upload"]
    result.add(
        f"PATCH of {up['files']:,} files of 20 kB in 10 directories, p50",
        up["p50_s"],
        "s",
        "<= 3",
        note=f"max {up['max_s']:.2f} s over {len(up['seconds'])}, "
        f"{up['body_bytes'] / 1e6:.1f} MB body",
    )
    cpu = up["cpu_s_per_patch"]
    result.add(
        f"CPU per PATCH of {up['files']:,} files: controller",
        cpu["controller"],
        "s",
        note=f"simulator {cpu['simulator']:.2f} s, commands {cpu['commands']:.2f} s",
    )
    result.add("files in the runner after the PATCHes", up["files_after"], "", f"== {up['files']}")
    ls = details["listing"]
    result.add(
        f"recursive listing of {ls['files']:,} files, p50 until the whole body",
        ls["p50_s"],
        "s",
        "<= 2",
        note=f"max {ls['max_s']:.2f} s over {len(ls['seconds'])}, "
        f"{ls['body_bytes'] / 1e6:.1f} MB of JSON",
    )
    result.add(
        "files in the listing",
        ls["file_entries"],
        "",
        f"== {ls['files']}",
        note=f"{ls['entries']} entries with the directories",
    )
    gone = details["missing"]
    result.add(
        "424 for a missing path, p50",
        gone["p50_s"] * 1000,
        "ms",
        "<= 250",
        note=f"p99 {gone['p99_s'] * 1000:.0f} ms over {len(gone['seconds'])}; "
        f"{gone['statuses'].count(424)} answered 424",
    )
    dl = details["download"]
    result.add(
        f"download of a {dl['size'] / 1e6:.0f} MB file, p50",
        dl["mb_per_s_p50"],
        "MB/s",
        ">= 20",
        note=", ".join(f"{r['mb_per_s']:.1f}" for r in dl["runs"]) + " MB/s",
    )
    result.add(
        "downloads with Content-Length, every byte and the SHA-256 right",
        dl["complete"],
        "",
        f"== {len(dl['runs'])}",
    )
    result.add(
        "controller RSS growth, one download",
        dl["rss_peak_mb"] - dl["rss_before_mb"],
        "MB",
        "<= 30",
    )
    big = details["large_upload"]
    result.add(
        f"controller RSS growth, PATCH of one {big['size'] / 2**20:.0f} MiB file",
        big["rss_peak_mb"] - big["rss_before_mb"],
        "MB",
        "<= 30",
        note=f"{'right' if big['sha256_matches'] else 'WRONG'} bytes in the runner; "
        f"NRC_FILES_MAX_UPLOAD={MAX_UPLOAD}",
    )
    many = details["large_listing"]
    result.add(
        f"controller RSS growth, listing of {many['entries']:,} entries",
        many["rss_peak_mb"] - many["rss_before_mb"],
        "MB",
        "<= 30",
        note=f"{many['listed']:,} listed in {many['seconds']:.2f} s, "
        f"{many['body_bytes'] / 1e6:.1f} MB of JSON",
    )
    cpu = big["cpu_s"]
    result.add(
        f"PATCH of one {big['size'] / 2**20:.0f} MiB file ({big['body_bytes'] / 1e6:.0f} MB "
        "of JSON)",
        big["seconds"],
        "s",
        note=f"CPU: controller {cpu['controller']:.1f} s, simulator {cpu['simulator']:.1f} s, "
        f"commands {cpu['commands']:.1f} s",
    )
    return result
