"""The data plane under chaos: the programs a client runs on a runner it
holds, how it runs them, and what their answers must be.

Each program prints the code it will exit with (`code=N`) before it exits
with it, so that the check of an `exit` frame is on data: the frame carries
that code, and the program's own last words arrived before it. The programs
(`scenario.PROGRAMS`):

- `exit`: prints and exits;
- `stdin`: reads a line the client sends and echoes it back first;
- `stderr`: writes a line to stderr too, which must arrive as `stderr`;
- `timeout`: prints, then sleeps far past its one-second time limit: it must
  end with a `timeout` frame (or an `error`), never an `exit`;
- `background`: leaves a child sleeping in the background, then exits;
- `disconnect`: prints, sleeps, and the client closes the WebSocket after
  the first output (a student who closes the tab).

Every program's processes carry `CHAOS_RUN=<token>` in their environment
(set through the request's `environment`), so that the run can find any of
them still alive after the execution ended (`alive_runs`).

The invariants, checked per execution (`judge_execution`):

- exactly one terminal frame (`exit`, `timeout` or `error`), except for a
  client that disconnected (none is due) and an execution during which the
  controller was killed or drained (the process that would send it is gone);
- an `exit` carries the program's own code and comes after its output: a
  program that did not finish is never reported as exited, `exit 0` least of
  all;
- no process of an ended execution is alive `PROCESS_BOUND_S` after its end
  (checked once at the end of the run, for every execution whose controller
  outlived it: a SIGKILLed controller cannot end what it ran).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

# How long the processes of an ended execution may live on: a cut
# execution's kill is retried until its node's agent is back (down at most
# AGENT_DOWN_S), every 4 s at most.
PROCESS_BOUND_S = 10.0
TIME_LIMIT_S = 1
# How long the client waits for an execution's frames (its time limit, a
# drain's grace and a Nomad timeout, with room to spare).
READ_TIMEOUT_S = 20.0
# What a program that must not finish sleeps (well past any bound above).
LONG_SLEEP_S = 120
TERMINAL = frozenset({"exit", "timeout", "error"})


def command(program: str, code: int, token: str) -> str:
    """The shell command of a program (see the module docstring)."""
    done = f"echo code={code}; exit {code}"
    if program == "stdin":
        return f"read line; echo got=$line; {done}"
    if program == "stderr":
        return f"echo err-{token} >&2; echo out-{token}; {done}"
    if program in ("timeout", "disconnect"):
        return f"echo started-{token}; sleep {LONG_SLEEP_S}; {done}"
    if program == "background":
        return f"sleep {LONG_SLEEP_S} >/dev/null 2>&1 & echo bg-{token}; {done}"
    return done


@dataclass
class Outcome:
    """How one execution went, as its client saw it."""

    program: str
    code: int
    token: str
    start: int = 0  # the answer to POST /execute (0: none)
    start_body: Any = None
    connected: bool = False
    connect_error: str = ""
    frames: list[dict[str, Any]] = field(default_factory=list)
    hung: bool = False
    began: float = 0.0
    ended: float = 0.0

    def text(self, kind: str) -> str:
        return "".join(str(f.get("data", "")) for f in self.frames if f.get("type") == kind)

    def terminal(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("type") in TERMINAL]


def new_token() -> str:
    return secrets.token_hex(6)


def execute(api: Any, runner_id: str, program: str, code: int) -> Outcome:
    """Run `program` on the runner through the API (`api` is a chaos `Api`)
    and its WebSocket, as a client does; never raises for what the
    controller answers."""
    token = new_token()
    out = Outcome(program, code, token, began=time.monotonic())
    body = {
        "command": command(program, code, token),
        "timeLimit": TIME_LIMIT_S if program == "timeout" else 30,
        "environment": {"CHAOS_RUN": token},
    }
    answer = api.call("POST", f"/api/v1/runners/{runner_id}/execute", body)
    out.start, out.start_body = answer.status, answer.body
    if answer.status != 200 or not isinstance(answer.body, dict):
        out.ended = time.monotonic()
        return out
    try:
        with connect(str(answer.body["websocketUrl"]), open_timeout=5, close_timeout=2) as ws:
            out.connected = True
            _converse(ws, out)
    except (OSError, InvalidHandshake, InvalidStatus, TimeoutError, ConnectionClosed) as exc:
        # ConnectionClosed: reset during the handshake or the closing one (the
        # controller killed meanwhile); the frames read so far are kept.
        out.connect_error = f"{type(exc).__name__}: {exc}"[:160]
    out.ended = time.monotonic()
    return out


def _converse(ws: Any, out: Outcome) -> None:
    deadline = time.monotonic() + READ_TIMEOUT_S
    if out.program == "stdin":
        ws.send(f"{out.token}\n")
    while True:
        try:
            raw = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            out.hung = True
            return
        except ConnectionClosed:
            return
        frame = json.loads(raw)
        out.frames.append(frame)
        if out.program == "disconnect" and f"started-{out.token}" in out.text("stdout"):
            return  # leaving the `with` closes the connection mid-run


def judge_execution(out: Outcome, controller_went: bool) -> list[str]:
    """What is wrong with one execution's answers (see the module docstring);
    `controller_went`: the controller was killed or drained during it."""
    if out.start != 200 or not out.connected:
        return []  # nothing ran (the answer to the start is judged by the caller)
    what = f"execution {out.program} (token {out.token})"
    terminal = out.terminal()
    problems: list[str] = []
    if out.hung:
        problems.append(f"{what}: no end {READ_TIMEOUT_S:.0f}s after it started: {out.frames}")
    if out.program == "disconnect":
        if terminal and terminal[0]["type"] == "exit":
            problems.append(f"{what}: a program still sleeping was reported {terminal[0]}")
        return problems
    if len(terminal) > 1 or (not terminal and not controller_went and not out.hung):
        problems.append(f"{what}: {len(terminal)} terminal frames: {out.frames}")
    if not terminal:
        return problems
    frame = terminal[0]
    if frame["type"] == "exit":
        stdout = out.text("stdout")
        expect = {
            "stdin": f"got={out.token}",
            "stderr": f"out-{out.token}",
            "background": f"bg-{out.token}",
        }.get(out.program, "")
        if out.program == "timeout":
            problems.append(f"{what}: a program that sleeps past its limit was reported {frame}")
        elif frame.get("data") != out.code or f"code={out.code}" not in stdout:
            problems.append(
                f"{what}: reported exit {frame.get('data')!r}, but it prints and exits with "
                f"{out.code}; its output was {stdout!r}"
            )
        elif expect not in stdout:
            problems.append(f"{what}: exited without its output {expect!r}: {stdout!r}")
        elif out.program == "stderr" and f"err-{out.token}" not in out.text("stderr"):
            problems.append(f"{what}: its stderr line never came: {out.frames}")
    return problems


def alive_runs() -> dict[str, list[int]]:
    """Live processes by the CHAOS_RUN token in their environment (those
    that are gone or not ours to read are left out; zombies have none)."""
    found: dict[str, list[int]] = {}
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"CHAOS_RUN="):
                found.setdefault(entry[10:].decode(errors="replace"), []).append(pid)
    return found
