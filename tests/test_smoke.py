"""The `smoke` command and the `dev` banner that prints it: a real `dev`
process, every command line of its banner run as pasted (the smoke command
through the installed entry point, the curl lines in bash), and smoke's
failures: a wrong token, no API at the URL, an unknown environment, bad
arguments, and a step that fails after the claim (the runner is released
all the same) against a stand-in API, over HTTP and HTTPS."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import trustme

from controller.cli import build_parser, main
from controller.service import dev_banner
from tests.helpers import wait_until
from tests.support.http_stub import address_of, serve_in_thread
from tests.support.ports import free_port
from tests.support.processes import ChildProcess, child_processes, clean_environ, python_module

STEPS = ("environment", "claim", "copy", "execute", "websocket", "list", "download", "release")
# A line of the banner that is neither a command nor about one.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d ")


@dataclass(frozen=True)
class Dev:
    process: ChildProcess
    api: str  # http://127.0.0.1:PORT
    token: str
    commands: list[str]  # the banner's command lines, in order

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def banner_commands(banner: list[str]) -> list[str]:
    """The lines of the banner a user pastes: not its header, its indented
    URLs, comments, blank lines or its closing line (nor a log line that
    came between)."""
    return [
        line
        for line in banner[1:]
        if line.strip()
        and not line.startswith(("  ", "#"))
        and not LOG_LINE.match(line)
        and line != "Ctrl-C stops everything."
    ]


@pytest.fixture(scope="module")
def dev() -> Iterator[Dev]:
    port = free_port()
    with child_processes(signal.SIGINT, timeout=10) as started:
        process = ChildProcess(
            python_module("controller", "dev"),
            {"NRC_API_PORT": str(port), "NRC_LOG_FORMAT": "text"},
        )
        started.append(process)
        process.wait_for(r"^Ctrl-C stops everything\.$", timeout=30)
        lines = process.seen
        first = max(
            i for i, line in enumerate(lines) if line.startswith("nomad-runner-controller dev:")
        )
        last = lines.index("Ctrl-C stops everything.", first)
        banner = lines[first : last + 1]
        api = process.wait_for(r"API\s+(http://\S+)/api/v1").group(1)
        token = process.wait_for(r"API token\s+(\S+)\s").group(1)
        yield Dev(process, api, token, banner_commands(banner))
    # stopped by SIGINT on the way out, cleanly
    assert process.returncode == 0, process.tail()
    assert "Traceback" not in process.output()


def smoke(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m controller smoke args`, with no setting of ours in its environment."""
    return subprocess.run(
        python_module("controller", "smoke", *args),
        env=clean_environ(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=90,
    )


def idle_runners(dev: Dev, environment: int) -> int:
    r = requests.get(
        f"{dev.api}/api/v1/statistics/execution-environments", headers=dev.auth, timeout=5
    )
    assert r.status_code == 200, r.text
    return int(r.json().get(str(environment), {}).get("idleRunners", 0))


# -- the banner, as pasted ------------------------------------------------------------------


def test_the_banner_prints_only_commands_this_test_runs(dev: Dev) -> None:
    """Every command line is a smoke line or a curl line; both kinds are there,
    and none still points at a WebSocket client that sends no token."""
    kinds = [
        "smoke"
        if " smoke " in line
        else "curl"
        if re.match(r"^(RUNNER_ID=\$\()?curl ", line)
        else line
        for line in dev.commands
    ]
    assert set(kinds) == {"smoke", "curl"}, kinds
    assert kinds.count("smoke") == 1
    assert "python -m websockets" not in dev.process.output()
    # every request of the banner sends the token
    for line in dev.commands:
        if "curl " in line:
            assert f"Authorization: Bearer {dev.token}" in line, line


def test_the_banner_smoke_command_passes_as_pasted(dev: Dev, tmp_path: Path) -> None:
    (line,) = [c for c in dev.commands if " smoke " in c]
    argv = shlex.split(line)
    # the installed entry point, by a path that works from any directory
    assert os.path.isabs(argv[0]) and os.access(argv[0], os.X_OK), argv
    assert argv[1:] == ["smoke", "--url", f"{dev.api}/api/v1", f"--token={dev.token}"]
    result = subprocess.run(
        argv, env=clean_environ(), cwd=tmp_path, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert steps == list(STEPS), result.stdout
    assert re.search(r"^ok +websocket .*exit 42 +\(\d+ ms\)$", result.stdout, re.M)
    assert "smoke: all 8 steps passed" in result.stdout
    assert result.stderr == ""
    # nothing left claimed: the pool is whole again
    wait_until(lambda: idle_runners(dev, 1) == 5, timeout=30, interval=0.05)


def test_a_made_up_token_that_begins_with_a_dash_is_still_one_argument() -> None:
    """secrets.token_urlsafe may begin with `-`: `--token -x` would be an
    option to argparse, `--token=-x` is the value."""
    banner = dev_banner("http://127.0.0.1:7200", "http://127.0.0.1:4646", "-abc_def-0123456789")
    (line,) = [line for line in banner.splitlines() if " smoke " in line]
    argv = shlex.split(line)
    args = build_parser().parse_args(argv[argv.index("smoke") :])
    assert (args.url, args.token) == ("http://127.0.0.1:7200/api/v1", "-abc_def-0123456789")


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this host")
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this host")
def test_the_banner_curl_lines_work_as_pasted(dev: Dev, tmp_path: Path) -> None:
    """Pasted one after the other into one shell (the claim's RUNNER_ID is
    the next lines'), each line answers 2xx."""
    curl = [c for c in dev.commands if "curl " in c]
    assert len(curl) == 4
    # as a user who waits for the pool the banner announced
    wait_until(lambda: idle_runners(dev, 1) >= 1, timeout=30, interval=0.05)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(curl)],
        env=clean_environ(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    statuses = re.findall(r"\(HTTP (\d{3})\)", result.stdout)
    assert statuses == ["201", "200", "204"], result.stdout
    runner = result.stdout.splitlines()[1]
    assert re.fullmatch(r"1-[0-9a-f-]{36}", runner), result.stdout
    assert '"websocketUrl":"ws://' in result.stdout
    # what they did: environment 2 created, the runner claimed and released
    environment = requests.get(
        f"{dev.api}/api/v1/execution-environments/2", headers=dev.auth, timeout=5
    )
    assert environment.status_code == 200 and environment.json()["prewarmingPoolSize"] == 3
    released = requests.get(f"{dev.api}/api/v1/runners/{runner}", headers=dev.auth, timeout=5)
    assert released.status_code in (404, 410), released.text


# -- smoke's failures against the same dev ----------------------------------------------------


def test_a_wrong_token_fails_naming_the_401(dev: Dev) -> None:
    result = smoke("--url", dev.api, "--token", "not-the-token")
    assert result.returncode == 1
    assert re.search(r"^FAIL +environment GET /execution-environments → 401", result.stdout, re.M)
    assert "smoke: failed at environment: " in result.stderr and "401" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_an_unknown_environment_fails_naming_the_404(dev: Dev) -> None:
    result = smoke("--url", f"{dev.api}/api/v1/", f"--token={dev.token}", "--environment", "977")
    assert result.returncode == 1
    assert "GET /execution-environments/977 → 404" in result.stdout
    assert "claim" not in result.stdout  # nothing was claimed, nothing to release


def test_no_api_at_the_url_fails_in_one_line() -> None:
    result = smoke("--url", f"http://127.0.0.1:{free_port()}/api/v1", "--token", "t")
    assert result.returncode == 1
    assert "smoke: failed at environment: no answer: Connection refused" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "the following arguments are required: --url"),
        (["--url", "127.0.0.1:7200", "--token", "t"], "expected an http:// or https:// URL"),
        (["--url", "ftp://127.0.0.1/api/v1", "--token", "t"], "expected an http:// or https://"),
        (["--url", "http://127.0.0.1:7200", "--token", "t", "--environment", "x"], "integer"),
        (["--url", "http://127.0.0.1:7200", "--token", "t", "--environment", "-1"], "negative"),
        (
            ["--url", "http://127.0.0.1:7200", "--token", "t", "--ca-file", "/nonexistent"],
            "No such",
        ),
        (["--url", "http://127.0.0.1:7200"], "no token: give --token or set NRC_API_TOKEN"),
        (["--url", "http://127.0.0.1:7200", "--token", ""], "no token"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], needle: str) -> None:
    result = smoke(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


# -- a step failing after the claim, against a stand-in API -------------------------------------


class _StandIn(BaseHTTPRequestHandler):
    """An API whose pool fills while the first claim waits, then fails the
    copy: what smoke did is recorded."""

    calls: ClassVar[list[str]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> int:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with self.lock:
            self.calls.append(f"{self.command} {self.path} {self.headers.get('Poseidon-Token')}")
            return sum(1 for c in self.calls if c.startswith(f"{self.command} {self.path} "))

    def do_GET(self) -> None:
        self._record()
        if self.path == "/api/v1/execution-environments":
            empty = {"id": 2, "prewarmingPoolSize": 0}
            pooled = {"id": 3, "prewarmingPoolSize": 1}
            self._answer(200, {"executionEnvironments": [empty, pooled]})
        else:
            self._answer(404, {"message": "no such route"})

    def do_POST(self) -> None:
        if self._record() == 1:
            self._answer(500, {"message": "no idle runner", "errorCode": "NOMAD_OVERLOAD"})
        else:
            self._answer(200, {"runnerId": "3-abc", "mappedPorts": []})

    def do_PATCH(self) -> None:
        self._record()
        self._answer(500, {"message": "the disk is full", "errorCode": "UNKNOWN"})

    def do_DELETE(self) -> None:
        self._record()
        self._answer(204)


@pytest.fixture
def stand_in() -> list[str]:
    _StandIn.calls = []
    return _StandIn.calls


def _serve(tls: ssl.SSLContext | None) -> tuple[ThreadingHTTPServer, str]:
    """The stand-in on a free port, over TLS with `tls`, and its URL."""
    if tls is None:
        server = serve_in_thread(_StandIn)
        return server, address_of(server)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    server.daemon_threads = True
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    ).start()
    return server, f"https://127.0.0.1:{server.server_address[1]}"


def _released_after_the_failed_copy(
    calls: list[str], code: int, out: str, err: str, url: str
) -> None:
    assert code == 1, out + err
    assert re.search(
        r"^FAIL +copy +PATCH /runners/\{runnerId\}/files → 500, expected 204: "
        r"the disk is full \(UNKNOWN\)",
        out,
        re.M,
    ), out
    assert re.search(r"^ok +claim +POST /runners → 200: runner 3-abc after 2 tries", out, re.M)
    assert re.search(r"^ok +release +DELETE /runners/\{runnerId\} → 204", out, re.M), out
    assert (
        err == "smoke: failed at copy: PATCH /runners/{runnerId}/files → 500, expected 204: "
        "the disk is full (UNKNOWN)\n"
    )
    assert calls == [
        "GET /api/v1/execution-environments tok",
        "POST /api/v1/runners tok",
        "POST /api/v1/runners tok",
        "PATCH /api/v1/runners/3-abc/files tok",
        "DELETE /api/v1/runners/3-abc tok",
    ], url


def test_the_runner_is_released_after_a_failed_step(
    stand_in: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Environment 3 (the first with a pool), a claim tried again while the
    pool fills, the copy refused: the runner is released, exit 1."""
    server, url = _serve(None)
    try:
        code = main(["smoke", "--url", url, "--token", "tok"])
    finally:
        server.shutdown()
        server.server_close()
    out, err = capsys.readouterr()
    _released_after_the_failed_copy(stand_in, code, out, err, url)


def test_https_is_verified_against_the_ca_file(
    stand_in: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server, url = _serve(tls)
    try:
        unverified = main(["smoke", "--url", url, "--token", "tok"])
        out, err = capsys.readouterr()
        assert unverified == 1
        assert "smoke: failed at environment: no answer: certificate verify failed" in err, err
        assert stand_in == []  # the handshake failed: no request was made
        code = main(["smoke", "--url", url, "--token", "tok", "--ca-file", str(ca_file)])
    finally:
        server.shutdown()
        server.server_close()
    out, err = capsys.readouterr()
    _released_after_the_failed_copy(stand_in, code, out, err, url)
