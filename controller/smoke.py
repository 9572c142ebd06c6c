"""`nomad-runner-controller smoke`: one runner taken through every step a
learning platform takes, against a running API, as CodeOcean takes it.

It claims a runner of an environment with a pool, copies a small file into
it (base64 in a PATCH, as CodeOcean sends it), runs a command over the
execution WebSocket (stdin in, stdout, a line on stderr, the file read back,
a chosen exit code out), lists and downloads the file, and releases the
runner. Each step is one line: what was asked, what was answered and
checked, and how long it took. The runner is released whatever happened
once it was claimed.

A client of the HTTP API and nothing else (the `smoke-a-client` contract):
it imports nothing of the controller, so it checks what a deploy serves,
not what this checkout would.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import secrets
import shlex
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import quote, urlsplit

import requests
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

API_PATH = "/api/v1"
# What the execution is given and must hand back.
EXIT_CODE = 42
STDERR_LINE = "nrc smoke: a line on stderr"
# A claim that finds no ready runner (a pool still filling after a deploy) is
# tried again until this long after the first try.
CLAIM_PATIENCE_S = 30.0
# One HTTP request, the WebSocket's handshake, and the execution's output.
REQUEST_TIMEOUT_S = 30.0
EXECUTION_TIMEOUT_S = 30.0


class UsageError(ValueError):
    """An argument the smoke test cannot start with (exit 2)."""


class StepFailed(Exception):
    """A step's answer was not what it must be; the message says why."""


def api_base(url: str) -> str:
    """The API's base URL as CodeOcean configures it, with or without its
    `/api/v1` suffix: always ending in it, without a trailing slash."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"expected an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment:
        raise UsageError(f"expected the API's base URL without a query, got {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith(API_PATH):
        path += API_PATH
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class Options:
    url: str  # as api_base returns it
    token: str
    environment: int | None = None
    ca_file: str | None = None


@dataclass
class Report:
    """The lines printed, and the first step that failed."""

    out: TextIO
    failed: str | None = None
    why: str = ""
    steps: int = 0

    def line(self, ok: bool, step: str, answer: str, seconds: float) -> None:
        mark = "ok" if ok else "FAIL"
        print(
            f"{mark:4}  {step:<11} {answer}  ({seconds * 1000:.0f} ms)", file=self.out, flush=True
        )


@dataclass
class Smoke:
    options: Options
    report: Report
    session: requests.Session = field(default_factory=requests.Session)
    runner: str | None = None  # claimed and not yet released
    nonce: str = field(default_factory=lambda: secrets.token_hex(6))

    def __post_init__(self) -> None:
        self.session.headers["Poseidon-Token"] = self.options.token

    # -- the run -------------------------------------------------------------------------

    def run(self) -> int:
        """Every step in order; the runner released if it was claimed. 0 when
        every step passed, 1 otherwise."""
        name = "nrc-smoke.txt"
        content = f"nrc smoke file {self.nonce}\n".encode()
        try:
            environment = self.step("environment", self.pick_environment)
            runner: str = self.step("claim", lambda: self.claim(environment))
            self.step("copy", lambda: self.copy(runner, name, content))
            url = self.step("execute", lambda: self.execute(runner, name))
            self.step("websocket", lambda: self.websocket(url, content))
            self.step("list", lambda: self.listing(runner, name, len(content)))
            self.step("download", lambda: self.download(runner, name, content))
        except StepFailed:
            pass
        finally:
            # Also after Ctrl-C: a smoke test leaves no runner claimed.
            if self.runner is not None:
                runner = self.runner
                with contextlib.suppress(StepFailed):
                    self.step("release", lambda: self.release(runner))
        return 0 if self.report.failed is None else 1

    def step(self, name: str, action: Callable[[], tuple[Any, str]]) -> Any:
        """Run one step and print its line; raise StepFailed (after printing)
        when its answer was wrong or there was none."""
        started = time.perf_counter()
        try:
            value, answer = action()
        except StepFailed as exc:
            self.report.line(False, name, str(exc), time.perf_counter() - started)
            if self.report.failed is None:
                self.report.failed, self.report.why = name, str(exc)
            raise
        except (requests.RequestException, WebSocketException, OSError) as exc:
            why = _unreachable(exc)
            self.report.line(False, name, why, time.perf_counter() - started)
            if self.report.failed is None:
                self.report.failed, self.report.why = name, why
            raise StepFailed(why) from None
        self.report.line(True, name, answer, time.perf_counter() - started)
        self.report.steps += 1
        return value

    # -- the steps: each returns its value and the line's answer --------------------------

    def pick_environment(self) -> tuple[int, str]:
        wanted = self.options.environment
        if wanted is not None:
            r = self.request("GET", f"/execution-environments/{wanted}")
            expect(r, 200)
            pool = _field(r, "prewarmingPoolSize")
            return wanted, f"{_said(r)}: environment {wanted}, prewarmingPoolSize {pool}"
        r = self.request("GET", "/execution-environments")
        expect(r, 200)
        listed = _field(r, "executionEnvironments")
        if not isinstance(listed, list):
            raise StepFailed(f"{_said(r)}: executionEnvironments is not a list")
        for environment in listed:
            if (
                isinstance(environment, dict)
                and _positive(environment.get("prewarmingPoolSize"))
                and isinstance(environment.get("id"), int)
            ):
                chosen = int(environment["id"])
                return chosen, (
                    f"{_said(r)}: environment {chosen}, the first of {len(listed)} with a pool "
                    f"(prewarmingPoolSize {environment['prewarmingPoolSize']})"
                )
        raise StepFailed(
            f"{_said(r)}: none of the {len(listed)} environments has prewarmingPoolSize > 0 "
            "(create one, or name it with --environment)"
        )

    def claim(self, environment: int) -> tuple[str, str]:
        body = {"executionEnvironmentId": environment, "inactivityTimeout": 60}
        deadline = time.monotonic() + CLAIM_PATIENCE_S
        tries = 0
        while True:
            tries += 1
            r = self.request("POST", "/runners", json=body)
            if r.status_code != 200 and _error_code(r) == "NOMAD_OVERLOAD":
                # No runner ready yet: a pool still filling, as after a deploy.
                if time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                raise StepFailed(
                    f"{_said(r)}: still no ready runner after {CLAIM_PATIENCE_S:g} s "
                    f"({tries} tries)"
                )
            break
        expect(r, 200)
        runner = _field(r, "runnerId")
        if not isinstance(runner, str) or not runner:
            raise StepFailed(f"{_said(r)}: runnerId is not a string")
        self.runner = runner  # released from here on, whatever happens next
        after = f" after {tries} tries (the pool was filling)" if tries > 1 else ""
        return runner, f"{_said(r)}: runner {runner}{after}"

    def copy(self, runner: str, name: str, content: bytes) -> tuple[None, str]:
        body = {
            "copy": [{"path": name, "content": base64.b64encode(content).decode("ascii")}],
            "delete": [],
        }
        r = self.request("PATCH", f"/runners/{_segment(runner)}/files", json=body)
        expect(r, 204)
        return None, f"{_said(r)}: {name}, {len(content)} bytes as base64"

    def execute(self, runner: str, name: str) -> tuple[str, str]:
        command = (
            f'read -r line; echo "stdin: $line"; echo {shlex.quote(STDERR_LINE)} >&2; '
            f"cat {shlex.quote(name)}; exit {EXIT_CODE}"
        )
        body = {"command": command, "timeLimit": int(EXECUTION_TIMEOUT_S)}
        r = self.request("POST", f"/runners/{_segment(runner)}/execute", json=body)
        expect(r, 200)
        url = _field(r, "websocketUrl")
        if not isinstance(url, str) or urlsplit(url).scheme not in ("ws", "wss"):
            raise StepFailed(f"{_said(r)}: websocketUrl is not a ws:// or wss:// URL: {url!r}")
        return url, f"{_said(r)}: a {urlsplit(url).scheme}:// websocketUrl"

    def websocket(self, url: str, content: bytes) -> tuple[None, str]:
        stdin = f"nrc smoke stdin {self.nonce}"
        frames = self.frames(url, stdin + "\n")
        kinds = [frame.get("type") for frame in frames]
        if not kinds or kinds[0] != "start":
            raise StepFailed(f"the first frame is not start: {_brief(kinds)}")
        stdout = _joined(frames, "stdout").replace("\r\n", "\n")
        stderr = _joined(frames, "stderr").replace("\r\n", "\n")
        last = frames[-1]
        if last.get("type") != "exit":
            raise StepFailed(f"the execution ended with {_brief(last)}, not an exit frame")
        missing = [
            what
            for what, text in (
                ("the stdin line echoed", f"stdin: {stdin}\n"),
                ("the copied file", content.decode()),
            )
            if text not in stdout
        ]
        if missing:
            raise StepFailed(f"stdout lacks {' and '.join(missing)}: {_brief(stdout)}")
        if STDERR_LINE in stderr:
            where = "stderr"
        elif STDERR_LINE in stdout:
            where = "stdout (stderr merged: NRC_EXEC_SEPARATE_STDERR=false)"
        else:
            raise StepFailed(f"the stderr line is in no frame: stderr {_brief(stderr)}")
        if last.get("data") != EXIT_CODE:
            raise StepFailed(f"exit code {last.get('data')!r}, expected {EXIT_CODE}")
        return None, (
            f"{len(frames)} frames: start, the stdin line read back, the file's content, "
            f"the stderr line on {where}, exit {EXIT_CODE}"
        )

    def listing(self, runner: str, name: str, size: int) -> tuple[None, str]:
        r = self.request("GET", f"/runners/{_segment(runner)}/files", params={"path": "./"})
        expect(r, 200)
        files = _field(r, "files")
        if not isinstance(files, list):
            raise StepFailed(f"{_said(r)}: files is not a list")
        for entry in files:
            if isinstance(entry, dict) and entry.get("name") in (name, f"./{name}"):
                if entry.get("size") != size:
                    raise StepFailed(
                        f"{_said(r)}: {entry['name']} has size {entry.get('size')!r}, "
                        f"expected {size}"
                    )
                return None, f"{_said(r)}: {entry['name']}, {size} bytes, among {len(files)}"
        names = [e.get("name") for e in files if isinstance(e, dict)]
        raise StepFailed(f"{_said(r)}: {name} is not listed: {_brief(names)}")

    def download(self, runner: str, name: str, content: bytes) -> tuple[None, str]:
        r = self.request(
            "GET", f"/runners/{_segment(runner)}/files/raw", params={"path": f"./{name}"}
        )
        expect(r, 200)
        if r.content != content:
            raise StepFailed(f"{_said(r)}: {len(r.content)} bytes, not the ones copied")
        return None, f"{_said(r)}: {len(content)} bytes, the ones copied"

    def release(self, runner: str) -> tuple[None, str]:
        r = self.request("DELETE", f"/runners/{_segment(runner)}")
        # Answered at all: whatever it said, asking again would not help.
        self.runner = None
        expect(r, 204)
        return None, f"{_said(r)}: released"

    # -- the wire ------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        # `verify` on each request: a session's is overridden by
        # REQUESTS_CA_BUNDLE, and --ca-file must win.
        return self.session.request(
            method,
            self.options.url + path,
            timeout=REQUEST_TIMEOUT_S,
            verify=self.options.ca_file or True,
            **kwargs,
        )

    def frames(self, url: str, stdin: str) -> list[dict[str, Any]]:
        """The execution's frames until the server closes the WebSocket, the
        stdin line sent as a text frame once it started."""
        context = None
        if urlsplit(url).scheme == "wss":
            context = ssl.create_default_context(cafile=self.options.ca_file)
        headers = {"Poseidon-Token": self.options.token}
        frames: list[dict[str, Any]] = []
        deadline = time.monotonic() + EXECUTION_TIMEOUT_S
        try:
            with connect(
                url, ssl=context, additional_headers=headers, open_timeout=REQUEST_TIMEOUT_S
            ) as ws:
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StepFailed(
                            f"no end within {EXECUTION_TIMEOUT_S:g} s: {_brief(frames)}"
                        )
                    try:
                        raw = _receive(ws, remaining)
                    except ConnectionClosed:
                        break
                    frame = json.loads(raw)
                    if not isinstance(frame, dict):
                        raise StepFailed(f"a frame that is not a JSON object: {_brief(raw)}")
                    frames.append(frame)
                    if frame.get("type") == "start":
                        ws.send(stdin)
        except InvalidStatus as exc:
            status = exc.response.status_code
            body = exc.response.body.decode("utf-8", "replace") if exc.response.body else ""
            raise StepFailed(f"the WebSocket handshake answered {status}: {_brief(body)}") from None
        except ValueError as exc:  # not JSON
            raise StepFailed(f"a frame that is not JSON: {exc}") from None
        return frames


def _receive(ws: ClientConnection, timeout: float) -> str:
    try:
        raw = ws.recv(timeout=timeout)
    except TimeoutError:
        raise StepFailed(f"no frame within {timeout:.0f} s") from None
    return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")


def expect(r: requests.Response, status: int) -> None:
    if r.status_code != status:
        raise StepFailed(f"{_said(r)}, expected {status}: {_brief(_message(r))}")


def _said(r: requests.Response) -> str:
    """The request and its status, the path below the API's base with a
    runner's id as `{runnerId}` (the claim's line shows it)."""
    path = urlsplit(r.request.url or "").path
    suffix = path.find(API_PATH)
    shown = path[suffix + len(API_PATH) :] if suffix >= 0 else path
    shown = re.sub(r"^/runners/[^/]+", "/runners/{runnerId}", shown)
    return f"{r.request.method} {shown} → {r.status_code}"


def _field(r: requests.Response, name: str) -> Any:
    try:
        body = r.json()
    except ValueError:
        raise StepFailed(f"{_said(r)}: not JSON: {_brief(r.text)}") from None
    if not isinstance(body, dict) or name not in body:
        raise StepFailed(f"{_said(r)}: no {name} in {_brief(body)}")
    return body[name]


def _message(r: requests.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        code = body.get("errorCode")
        return f"{body['message']} ({code})" if code else str(body["message"])
    return r.text


def _error_code(r: requests.Response) -> str | None:
    try:
        body = r.json()
    except ValueError:
        return None
    code = body.get("errorCode") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _joined(frames: list[dict[str, Any]], kind: str) -> str:
    return "".join(str(f.get("data", "")) for f in frames if f.get("type") == kind)


def _segment(text: str) -> str:
    return quote(text, safe="")


def _brief(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.strip() if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


_REASONS = (
    re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)"),
    re.compile(r"(certificate verify failed[^'\"(\]]*)"),
    re.compile(r"(Name or service not known|Temporary failure in name resolution)"),
    re.compile(r"(Read timed out|timed out)"),
)


def _unreachable(exc: BaseException) -> str:
    """One line for an answer that never came: the innermost reason, not the
    chain of wrappers requests and urllib3 print."""
    text = str(exc)
    for pattern in _REASONS:
        if match := pattern.search(text):
            return f"no answer: {match.group(1).strip()}"
    return f"no answer: {type(exc).__name__}: {_brief(text)}"


def run(options: Options, out: TextIO, err: TextIO) -> int:
    """The smoke test against `options.url`; its lines on `out`, the verdict
    on `out` (passed) or `err` (the step that failed and why)."""
    print(f"smoke test of {options.url}", file=out, flush=True)
    report = Report(out)
    code = Smoke(options, report).run()
    if report.failed is None:
        print(f"smoke: all {report.steps} steps passed", file=out, flush=True)
    else:
        print(f"smoke: failed at {report.failed}: {report.why}", file=err, flush=True)
    return code
