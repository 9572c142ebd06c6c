"""The actors of a chaos run: API clients that claim, touch and release
runners, and the operator who changes environments and breaks Nomad.

Each actor runs its own part of the scenario's timeline on its own thread, so
clients race each other, the operator and the controller. Everything a client
is handed is recorded in the `Book`, which checks on the spot what it can
(nobody is handed a runner that somebody else was handed; a held runner
answers from the allocation it was claimed on, or 410 with a plausible reason;
it never vanishes).

No silent reset, checked on the data itself: right after a claim the client
writes a marker file with content of its own into the runner
(`PATCH /runners/{id}/files`), and wherever it looks at a runner it holds (a
touch, a keep-alive, the final check; every keep-alive tick also reads the
runners without an inactivity timeout) it reads the marker back
(`GET /runners/{id}/files/raw`). The simulator gives every task start a fresh
working directory, so a restart, reschedule or migration really loses the
marker. The answer must be the marker's exact bytes, or 410 with a loss that
Nomad already records (`Book.judge`); a marker that is missing (424) or
changed while the runner does not answer 410 is a silent reset (`DATA`), and
so, at the final check, is any other answer than those two. One exception
while an open issue lasts (`Book.judge_marker`): a 424 while Nomad's reads
may lag (the stale_reads fault) and Nomad already shows the reset.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nomadsim import SimServer
from nomadsim.errors import NomadError
from tests.chaos.executions import Outcome, execute, judge_execution
from tests.chaos.harness import (
    RUNNER_ID,
    Answer,
    Api,
    ControllerProcess,
    Ledger,
    config_meta,
)
from tests.chaos.scenario import (
    HEARTBEAT_TTL_S,
    OPERATOR,
    Action,
    Claim,
    DeleteEnv,
    Drain,
    Execute,
    KillTask,
    ListFiles,
    NodeDown,
    NodeUp,
    PutEnv,
    Release,
    RestartAgent,
    RestartController,
    RestartDocker,
    RestartServer,
    Scenario,
    SetFaults,
    Step,
    StopAlloc,
    Touch,
    Undrain,
)
from tests.helpers import wait_until

LOST = re.compile(r"was lost: (\w+)")
NO_LEADER = "No cluster leader"
# What Nomad answers while a server or the operator's agent restarts: the
# write did not happen (or, `rpc error`, may have; the operator's are idempotent).
RESTARTING = (NO_LEADER, "rpc error", "failed to get conn", "No path to node")
# How long the operator repeats a call that meets a restart.
RESTART_RIDE_S = 30.0
# The file every claim writes into its runner, and how long the client tries to
# write it while the controller does not answer definitively (restarting, Nomad failing).
MARKER_PATH = "nrc-marker"
MARKER_WRITE_TIMEOUT_S = 10.0
# The longest lag of a stale read the scenarios inject (Scenario.stale_lag_ms ≤ 800).
STALE_LAG_MAX_S = 1.0
# How a violation of "no silent reset" seen on the runner's files is named.
DATA = "invariant 3 (data)"
# How a violation seen on an execution's frames is named.
EXEC = "invariant 7 (executions)"
FAULTS_OFF = {
    "http_error_rate": 0.0,
    "http_latency_ms": 0.0,
    "stale_read_rate": 0.0,
    "event_duplicate_rate": 0.0,
    "event_stream_cut_every": 0,
    "event_stream_stall": False,
    "write_eof_rate": 0.0,
    "heartbeat_loss": False,
    "migration_ordering": "production",
}


def pause(stop: threading.Event, seconds: float) -> None:
    """Let scenario time pass (the workload's pacing, not synchronisation)."""
    if seconds > 0:
        stop.wait(seconds)


@dataclass
class FaultLog:
    """What the operator did to which allocation or node: what makes a loss plausible."""

    oom: set[str] = field(default_factory=set)
    crashed: set[str] = field(default_factory=set)
    stopped: set[str] = field(default_factory=set)
    drained: set[str] = field(default_factory=set)
    down: set[str] = field(default_factory=set)
    # Nodes whose Docker restarted (or whose host rebooted): their tasks restarted.
    restarted: set[str] = field(default_factory=set)
    # When the controller was killed or drained (monotonic).
    controller_gone: list[float] = field(default_factory=list)
    # When Nomad's reads could lag (the stale_reads fault): [on, off] in monotonic
    # time, widened by the fault's longest lag; off is None while it is on.
    stale_reads: list[tuple[float, float | None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, target: str) -> None:
        with self._lock:
            getattr(self, kind).add(target)

    def reads_lag(self, on: bool, at: float) -> None:
        with self._lock:
            if on:
                self.stale_reads.append((at, None))
            elif self.stale_reads and self.stale_reads[-1][1] is None:
                self.stale_reads[-1] = (self.stale_reads[-1][0], at + STALE_LAG_MAX_S)

    def lagging(self, start: float, end: float) -> bool:
        """Whether Nomad's reads could lag at some moment from `start` to `end`."""
        with self._lock:
            return any(on <= end and (off is None or off >= start) for on, off in self.stale_reads)

    def plausible(self, alloc_id: str, node_id: str) -> set[str]:
        """The loss reasons that what happened to this allocation and its node can explain."""
        with self._lock:
            out: set[str] = set()
            if alloc_id in self.oom:
                out |= {"oom_killed", "restarted", "rescheduled", "lost"}
            if alloc_id in self.crashed:
                out |= {"restarted", "rescheduled", "lost"}
            if alloc_id in self.stopped or node_id in self.drained:
                out |= {"migrated", "lost"}
            if node_id in self.down:
                out |= {"lost", "rescheduled"}
            if node_id in self.restarted:
                out |= {"restarted", "rescheduled", "lost"}
            return out

    def controller_went(self, start: float, end: float) -> bool:
        """Whether the controller was killed or drained from `start` to `end`."""
        with self._lock:
            return any(start <= t <= end for t in self.controller_gone)

    def controller_stops(self) -> None:
        with self._lock:
            self.controller_gone.append(time.monotonic())


@dataclass
class Held:
    """A runner a client was handed and has not given back (204)."""

    runner_id: str
    env_id: int
    client: str
    timeout: int
    last_touch: float  # monotonic: sending of the claim, or of the last GET answered 200
    lost_reason: str = ""
    # A DELETE of it was sent and may have happened (no answer yet, or none at all).
    release_sent: bool = False
    gone: bool = False  # answered 410 unknown or released (for a good reason)
    lost_at: float = 0.0  # monotonic: when its first 410 naming a loss was received
    marker: bytes | None = None  # the marker file's content, once its PATCH answered 204
    reset_seen: bool = False  # its marker was found missing or changed (reported once)


class Book:
    """Every runner handed out, to whom, and every violation seen on the way."""

    def __init__(self, ledger: Ledger, faults: FaultLog) -> None:
        self.ledger = ledger
        self.faults = faults
        self._lock = threading.Lock()
        self.ever: dict[str, str] = {}  # runner id → the client it was handed to
        self.held: dict[str, Held] = {}
        self.released: set[str] = set()
        self.violations: list[str] = []
        self.counts: Counter[str] = Counter()
        self.losses: dict[str, str] = {}  # runner id → the loss reason its client was told
        # Every execution that started, and whether the controller went during it.
        self.executions: list[tuple[Outcome, bool]] = []

    def violation(self, text: str) -> None:
        with self._lock:
            self.violations.append(text)

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def handed(self, client: str, runner_id: str, env_id: int, timeout: int, sent: float) -> Held:
        rec = self.ledger.runner(runner_id)
        held = Held(runner_id, env_id, client, timeout, sent)
        with self._lock:
            self.counts["claimed"] += 1
            if runner_id in self.ever:
                self.violations.append(
                    f"invariant 1: runner {runner_id} handed to {client} after it was handed "
                    f"to {self.ever[runner_id]}"
                )
            self.ever[runner_id] = client
            self.held[runner_id] = held
        if not RUNNER_ID.match(runner_id) or not runner_id.startswith(f"{env_id}-"):
            self.violation(f"claim for environment {env_id} answered runner {runner_id}")
        if rec is None or rec.claims != 1:
            self.violation(
                f"invariant 1: runner {runner_id} handed to {client} but Nomad shows "
                f"{0 if rec is None else rec.claims} claims of it"
            )
        return held

    def holding(self, client: str) -> list[Held]:
        with self._lock:
            return [h for h in self.held.values() if h.client == client and not h.gone]

    def all_held(self) -> list[Held]:
        with self._lock:
            return [h for h in self.held.values() if not h.gone]

    def release_done(self, runner_id: str) -> None:
        with self._lock:
            self.held.pop(runner_id, None)
            self.released.add(runner_id)

    def judge(self, held: Held, sent: float, answer: Answer, final: bool = False) -> None:
        """Check one answer about a held runner (GET, or a DELETE's 410)."""
        rid = held.runner_id
        if answer.status == 200:
            body = answer.body if isinstance(answer.body, dict) else {}
            rec = self.ledger.runner(rid)
            if body.get("executionEnvironmentId") != held.env_id:
                self.violation(f"runner {rid}: answered environment {body} not {held.env_id}")
            if rec is None or rec.claims != 1:
                self.violation(f"invariant 1: runner {rid} is served but Nomad has no claim of it")
            elif body.get("allocationId") != rec.claim_alloc:
                self.violation(
                    f"invariant 3: runner {rid} of {held.client} is served from allocation "
                    f"{body.get('allocationId')} (status {body.get('status')}) but was claimed "
                    f"on {rec.claim_alloc}, and no loss was reported"
                )
            if held.lost_reason:
                self.violation(
                    f"runner {rid} answered 200 after it answered 410 {held.lost_reason}"
                )
            with self._lock:
                held.last_touch = max(held.last_touch, sent)
            return
        if answer.status == 410:
            match = LOST.search(answer.message())
            if match:
                self._lost(held, match.group(1))
            else:
                self._gone(held, time.monotonic(), answer.message())
            return
        if answer.status in (0, 503) and not final:
            return  # the controller is restarting or not ready yet: allowed
        self.violation(
            f"runner {rid} of {held.client}: unexpected answer {answer.status} {answer.body!r}"
        )

    def ran(self, held: Held, out: Outcome) -> None:
        """Check one execution on a held runner (tests/chaos/executions.py)."""
        went = self.faults.controller_went(out.began, out.ended + 0.5)
        terminal = out.terminal()
        end = terminal[0]["type"] if terminal else "none"
        with self._lock:
            self.executions.append((out, went))
            self.counts["executions"] += 1
            self.counts[f"execution_end:{end}"] += 1
        for problem in judge_execution(out, went):
            self.violation(f"{EXEC}: runner {held.runner_id} of {held.client}: {problem}")

    def marked(self, held: Held, content: bytes, sent: float) -> None:
        """Its marker was written (204): from now on it must read back."""
        with self._lock:
            held.marker = content
            held.last_touch = max(held.last_touch, sent)
            self.counts["marker_written"] += 1

    def judge_marker(self, held: Held, sent: float, answer: Answer, final: bool = False) -> None:
        """Check one read-back of a held runner's marker: its exact bytes, or
        the runner's 410 (judged as any 410 is: a loss Nomad already records)."""
        rid = held.runner_id
        told_lost = held.lost_reason and held.lost_at < sent
        if answer.status == 410:
            self.judge(held, sent, answer, final)
            return
        if answer.status in (0, 500, 503) and not final:
            # No answer, Nomad failing (an injected fault) or not ready: allowed.
            self.count(f"marker_read:{answer.status}")
            return
        if told_lost:
            self.violation(
                f"{DATA}: runner {rid} of {held.client} answered {answer.status} to a read of "
                f"its marker after it answered 410 ({held.lost_reason})"
            )
            return
        if answer.status == 200 and answer.body == held.marker:
            with self._lock:
                held.last_touch = max(held.last_touch, sent)
                self.counts["marker_read"] += 1
            return
        if answer.status == 424 and (held.release_sent or rid in self.released):
            self.count("marker_read:released")  # deleted under the read
            return
        if (
            answer.status == 424
            and not final
            and self.ledger.claim_reset(rid)
            and self.faults.lagging(sent, time.monotonic())
        ):
            # The open issue (test_known_issues.py, "when Nomad reads lag"): the
            # re-read of Nomad after a failed read may predate the reset Nomad
            # shows. Excused only while the stale_reads fault can cause that;
            # the marker or the 410 is still due at every read after, and at the end.
            self.count("marker_stale_reread")
            return
        if answer.status == 200:
            body = answer.body if isinstance(answer.body, bytes) else b""
            what = f"200 with other bytes ({len(body)}: {body[:60]!r})"
        else:
            what = f"{answer.status} {answer.message() or answer.body!r}"
        self._silent(held, sent, what)

    def _silent(self, held: Held, sent: float, what: str) -> None:
        """The marker is gone, changed or unreadable, and the runner did not say
        it was lost (reported once per runner)."""
        with self._lock:
            if held.reset_seen:
                return
            held.reset_seen = True
        nomad = self.ledger.file_system(held.runner_id, sent)
        self.violation(
            f"{DATA}: runner {held.runner_id} of {held.client} lost its data silently: the "
            f"marker {MARKER_PATH!r} it wrote ({held.marker!r}) reads back as {what}, "
            f"neither its bytes nor 410 with a loss; {nomad}"
        )

    def _lost(self, held: Held, reason: str) -> None:
        rid = held.runner_id
        if held.lost_reason and held.lost_reason != reason:
            self.violation(f"runner {rid}: loss reason changed {held.lost_reason} → {reason}")
        if held.lost_reason:
            return
        held.lost_reason = reason
        held.lost_at = time.monotonic()
        self.count(f"lost:{reason}")
        rec = self.ledger.runner(rid)
        if rec is None or not rec.claim_alloc:
            self.violation(f"runner {rid} answers lost ({reason}) but Nomad has no claim")
            return
        if rec.lost_reason != reason:
            # The controller writes a loss before it tells it (so that every later
            # answer, from any process, repeats it): Nomad must already have it.
            self.violation(
                f"invariant 3: runner {rid} answered lost ({reason}) while Nomad records "
                f"{rec.lost_reason!r}"
            )
        with self._lock:
            # Compared with Nomad again at the end: a recorded loss is never rewritten.
            self.losses[rid] = reason
        node = self.ledger.node_of(rec.claim_alloc)
        plausible = self.faults.plausible(rec.claim_alloc, node)
        if reason not in plausible:
            self.violation(
                f"invariant 3: runner {rid} reported lost ({reason}) but nothing the scenario "
                f"did to allocation {rec.claim_alloc} or node {node} explains that "
                f"(plausible: {sorted(plausible) or 'none'})"
            )

    def check_losses(self) -> None:
        """Every loss a client was told is the one Nomad records — unless the
        runner was deleted (its client released it) before the record was written."""
        with self._lock:
            losses = dict(self.losses)
        for rid, reason in sorted(losses.items()):
            rec = self.ledger.runner(rid)
            recorded = rec.lost_reason if rec is not None else ""
            if recorded == reason or (rec is not None and rec.purged_index and not recorded):
                continue
            self.violation(
                f"invariant 3: runner {rid} answered lost ({reason}) but Nomad records {recorded!r}"
            )

    def _gone(self, held: Held, now: float, message: str) -> None:
        """410 'unknown or released' for a runner its client still holds."""
        rid = held.runner_id
        with self._lock:
            if rid in self.released:
                return  # its client released it meanwhile (a keep-alive GET in flight)
        if held.release_sent:
            with self._lock:
                held.gone = True
            self.count("released_unanswered")
            return
        if held.timeout > 0 and now - held.last_touch >= held.timeout:
            with self._lock:
                held.gone = True
            self.count("expired")
            return
        rec = self.ledger.runner(rid)
        where = (
            "Nomad never had it"
            if rec is None
            else f"Nomad deleted it at index {rec.purged_index}"
            if rec.purged_index
            else "Nomad still has it"
        )
        self.violation(
            f"invariant 3: runner {rid} of {held.client} vanished: 410 {message!r} "
            f"{now - held.last_touch:.2f}s after its last touch (timeout {held.timeout}s); "
            f"{where}"
        )
        with self._lock:
            held.gone = True


def read_marker(api: Api, book: Book, held: Held, final: bool = False) -> None:
    """Read a held runner's marker back and judge the answer (once it was written)."""
    if held.marker is None or held.gone or held.reset_seen:
        return
    sent = time.monotonic()
    answer = api.download(f"/api/v1/runners/{held.runner_id}/files/raw?path={MARKER_PATH}")
    book.judge_marker(held, sent, answer, final)


class Actor(threading.Thread):
    def __init__(
        self, name: str, steps: tuple[Step, ...], stop: threading.Event, t0: float
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.steps = steps
        self.stop = stop
        self.t0 = t0
        self.errors: list[str] = []
        self.done: Counter[str] = Counter()

    def run(self) -> None:
        for step in self.steps:
            pause(self.stop, self.t0 + step.at - time.monotonic())
            if self.stop.is_set():
                return
            try:
                self.act(step.action)
                self.done[step.kind] += 1
            except Exception as exc:  # a harness failure must not look like a pass
                self.errors.append(f"{self.name} at {step.at:.2f}s {step.action}: {exc!r}")

    def act(self, action: Action) -> None:
        raise NotImplementedError


class Client(Actor):
    """One API client: claims, touches (GET) and releases its own runners."""

    def __init__(
        self,
        name: str,
        steps: tuple[Step, ...],
        stop: threading.Event,
        t0: float,
        base: str,
        book: Book,
    ) -> None:
        super().__init__(name, steps, stop, t0)
        self.base = base
        self.book = book
        self.api = Api(base)
        self.kept: set[str] = set()  # runners this client keeps alive
        self.steps_done = threading.Event()

    def run(self) -> None:
        ticker = threading.Thread(target=self.keep_alive, name=f"{self.name}-keepalive")
        ticker.start()
        try:
            super().run()
        finally:
            self.steps_done.set()
            ticker.join(30)

    def keep_alive(self) -> None:
        """Touch every kept-alive runner every 0.25 s (a quarter of the shortest
        timeout), as a client running code in it would, until this client's steps
        are done. Each time, read back the marker of every runner it touches and
        of every one without an inactivity timeout (a read touches the runner:
        these are the runners for which that changes nothing)."""
        api = Api(self.base)
        while not (self.steps_done.is_set() or self.stop.is_set()):
            for held in self.book.holding(self.name):
                if held.lost_reason:
                    continue
                if held.runner_id in self.kept:
                    sent = time.monotonic()
                    answer = api.call("GET", f"/api/v1/runners/{held.runner_id}")
                    self.book.judge(held, sent, answer)
                if held.runner_id in self.kept or held.timeout == 0:
                    read_marker(api, self.book, held)
            self.steps_done.wait(0.25)
        api.close()

    def act(self, action: Action) -> None:
        if isinstance(action, Claim):
            if action.parallel == 1:
                self.claim(self.api, action)
                return
            threads = [
                threading.Thread(target=self.claim, args=(Api(self.base), action), daemon=True)
                for _ in range(action.parallel)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        elif isinstance(action, Touch | Release):
            held = self.book.holding(self.name)
            if not held:
                return
            runner = held[action.pick % len(held)]
            if isinstance(action, Touch):
                self.touch(runner)
            else:
                self.release(runner)
        elif isinstance(action, Execute | ListFiles):
            usable = [h for h in self.book.holding(self.name) if not h.lost_reason]
            if not usable and isinstance(action, Execute):
                self.claim(self.api, Claim(action.env_id, 0))
                usable = [h for h in self.book.holding(self.name) if not h.lost_reason]
            if not usable:
                return
            runner = usable[action.pick % len(usable)]
            if isinstance(action, Execute):
                self.run_program(runner, action)
            else:
                self.list_files(runner)

    def run_program(self, held: Held, action: Execute) -> None:
        """Run a program on the runner and judge its frames; then its marker
        must still read back (an execution resets nothing), or the runner
        answers 410 with its loss."""
        sent = time.monotonic()
        out = execute(self.api, held.runner_id, action.program, action.code)
        if out.start == 200:
            self.book.ran(held, out)
        elif out.start in (0, 500, 503):
            self.book.count(f"execute:{out.start}")  # no answer, Nomad failing, not ready
        else:
            self.book.judge(held, sent, Answer(out.start, out.start_body))
        if not held.lost_reason:
            read_marker(self.api, self.book, held)

    def list_files(self, held: Held) -> None:
        """List the runner's files: once its marker is written, the listing
        must name it (judged as a read of the marker is)."""
        if held.marker is None or held.gone or held.reset_seen:
            return
        sent = time.monotonic()
        answer = self.api.call("GET", f"/api/v1/runners/{held.runner_id}/files?path=./")
        if answer.status == 200:
            files = answer.body.get("files") if isinstance(answer.body, dict) else None
            names = [str(f.get("name", "")) for f in files or [] if isinstance(f, dict)]
            found = any(n.rsplit("/", 1)[-1] == MARKER_PATH for n in names)
            self.book.count("listed")
            answer = Answer(200, held.marker if found else f"a listing of {names}".encode())
        self.book.judge_marker(held, sent, answer)

    def claim(self, api: Api, action: Claim) -> None:
        sent = time.monotonic()
        answer = api.call(
            "POST",
            "/api/v1/runners",
            {"executionEnvironmentId": action.env_id, "inactivityTimeout": action.timeout},
        )
        if answer.status == 200 and isinstance(answer.body, dict):
            runner_id = str(answer.body.get("runnerId"))
            held = self.book.handed(self.name, runner_id, action.env_id, action.timeout, sent)
            self.write_marker(api, held)
            if action.keepalive:
                self.kept.add(runner_id)
        elif answer.status in (0, 404, 500, 503):
            # No answer (restart), unknown (deleted) environment, no ready runner or
            # Nomad failing, not ready: all allowed, nothing was handed out.
            self.book.count(f"claim:{answer.status}")
        else:
            self.book.violation(f"claim: unexpected answer {answer.status} {answer.body!r}")

    def write_marker(self, api: Api, held: Held) -> None:
        """Write the claim's marker: content of its own, bytes that are not text
        included. Sent again (the copy overwrites) while the controller gives no
        definitive answer; a 410 is judged like any other (the claim is lost)."""
        rid = held.runner_id
        content = f"{rid} {held.client} ".encode() + os.urandom(12)
        item = {"path": MARKER_PATH, "content": base64.b64encode(content).decode()}
        deadline = time.monotonic() + MARKER_WRITE_TIMEOUT_S
        while True:
            sent = time.monotonic()
            answer = api.call("PATCH", f"/api/v1/runners/{rid}/files", {"copy": [item]})
            if answer.status == 204:
                self.book.marked(held, content, sent)
                return
            if answer.status == 410:
                self.book.judge(held, sent, answer)
                return
            if answer.status not in (0, 500, 503):
                self.book.violation(
                    f"runner {rid} of {held.client}: writing its marker answered "
                    f"{answer.status} {answer.body!r}"
                )
                return
            self.book.count(f"marker_write:{answer.status}")
            if time.monotonic() > deadline or self.stop.is_set():
                self.book.count("marker_unwritten")
                return
            pause(self.stop, 0.05)

    def touch(self, held: Held) -> None:
        sent = time.monotonic()
        answer = self.api.call("GET", f"/api/v1/runners/{held.runner_id}")
        self.book.judge(held, sent, answer)
        if not held.lost_reason:
            read_marker(self.api, self.book, held)

    def release(self, held: Held) -> None:
        sent = time.monotonic()
        held.release_sent = True  # a keep-alive GET may see it gone before this answer
        answer = self.api.call("DELETE", f"/api/v1/runners/{held.runner_id}")
        if answer.status == 204:
            self.book.release_done(held.runner_id)
            self.book.count("released")
        elif answer.status == 0:
            pass  # no answer: it may have been released
        elif answer.status in (500, 503):
            held.release_sent = False  # Nomad failed the deregistration, or not ready
        else:
            held.release_sent = False
            self.book.judge(held, sent, answer)


class Operator(Actor):
    """Changes environments, drains and breaks nodes, kills tasks, the controller."""

    def __init__(
        self,
        scenario: Scenario,
        stop: threading.Event,
        t0: float,
        server: SimServer,
        controller: ControllerProcess,
        faults: FaultLog,
    ) -> None:
        super().__init__(OPERATOR, scenario.steps_of(OPERATOR), stop, t0)
        self.server = server
        self.controller = controller
        self.faults = faults
        self.api = Api(controller.base)
        self.nomad = Api(server.address)
        self.skipped: Counter[str] = Counter()
        self.wrong_404 = 0  # DELETE environment answered 404 while it existed

    def act(self, action: Action) -> None:
        if isinstance(action, PutEnv):
            self.put_env(action)
        elif isinstance(action, DeleteEnv):
            self.delete_env(action.env_id)
        elif isinstance(action, Drain):
            self.sim_call("PUT", "/_sim/faults", {"migration_ordering": action.ordering})
            node = self.node_id(action.node)
            self.faults.add("drained", node)
            self.nomad_write(
                f"/v1/node/{node}/drain",
                {"DrainSpec": {"Deadline": -1, "IgnoreSystemJobs": False}, "Meta": None},
            )
        elif isinstance(action, Undrain):
            self.undrain(self.node_id(action.node))
        elif isinstance(action, NodeDown):
            node = self.node_id(action.node)
            self.faults.add("down", node)
            self.sim_call("POST", f"/_sim/node/{node}/down")
        elif isinstance(action, NodeUp):
            self.sim_call("POST", f"/_sim/node/{self.node_id(action.node)}/up")
        elif isinstance(action, KillTask):
            self.kill_task(action)
        elif isinstance(action, StopAlloc):
            alloc = self.pick_alloc(action.target, action.pick)
            if alloc is None:
                self.skipped["alloc_stop"] += 1
                return
            self.faults.add("stopped", alloc)
            self.nomad_write(f"/v1/allocation/{alloc}/stop", None, gone_ok=True)
        elif isinstance(action, RestartAgent | RestartDocker | RestartServer):
            self.restart(action)
        elif isinstance(action, RestartController):
            self.faults.controller_stops()
            if action.graceful:
                self.controller.drain()
            else:
                self.controller.kill()
            pause(self.stop, action.downtime)
            self.controller.start()
        elif isinstance(action, SetFaults):
            values = action.as_dict()
            if values.get("stale_read_rate"):
                self.faults.reads_lag(True, time.monotonic())
            self.sim_call("PUT", "/_sim/faults", values)
            if "stale_read_rate" in values and not values["stale_read_rate"]:
                self.faults.reads_lag(False, time.monotonic())

    def restart(self, action: RestartAgent | RestartDocker | RestartServer) -> None:
        """A restart of the maintenance night, made on the simulator's loop (the
        agent the operator's HTTP goes through may be the one restarted). One
        that Nomad's state refuses (409: the node is down, its agent or a
        server already restarting) is skipped."""
        sim = self.server.sim
        restarts = sim.restarts
        try:
            if isinstance(action, RestartServer):
                if action.which == "all":
                    self.server.call(lambda: restarts.all_servers(action.down))
                    return
                view = self.server.call(restarts.servers_view)
                leader = view["Leader"]
                followers = sorted(str(n) for n in view["Servers"] if n != leader)  # type: ignore[attr-defined]
                name = str(leader) if action.which == "leader" and leader else followers[0]
                self.server.call(lambda: restarts.server(name, action.down))
                return
            node = self.node_id(action.node)
            if isinstance(action, RestartDocker):
                self.faults.add("restarted", node)
                self.server.call(lambda: restarts.docker(node))
                return
            if action.reboot:
                self.faults.add("restarted", node)
            if action.down > HEARTBEAT_TTL_S:
                self.faults.add("down", node)
            self.server.call(lambda: restarts.agent(node, action.down, reboot=action.reboot))
        except NomadError as exc:
            if exc.status != 409:
                raise
            self.skipped[type(action).__name__] += 1

    # -- helpers ---------------------------------------------------------------------

    def sim_call(self, method: str, path: str, body: Any = None) -> Answer:
        """A `/_sim` call, repeated while the operator's agent restarts."""
        deadline = time.monotonic() + RESTART_RIDE_S
        while True:
            answer = self.nomad.call(method, path, body)
            if answer.status == 200:
                return answer
            if answer.status != 0 or time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: {answer.status} {answer.body!r}")
            pause(self.stop, 0.05)

    def nomad_write(self, path: str, body: Any, gone_ok: bool = False) -> None:
        """A Nomad write, repeated while Nomad answers 'No cluster leader' (a fault
        the scenario injects) or a restart is in the way (`RESTARTING`, no
        answer). With `gone_ok`, a 404 (the allocation was deleted since it
        was picked) is fine."""
        deadline = time.monotonic() + RESTART_RIDE_S
        while True:
            answer = self.nomad.call("POST", path, body)
            if answer.status == 200 or (gone_ok and answer.status == 404):
                return
            restarting = answer.status == 0 or (
                answer.status == 500 and any(text in str(answer.body) for text in RESTARTING)
            )
            if not restarting or time.monotonic() > deadline:
                raise RuntimeError(f"POST {path}: {answer.status} {answer.body!r}")
            pause(self.stop, 0.02)

    def undrain(self, node: str) -> None:
        self.nomad_write(f"/v1/node/{node}/drain", {"DrainSpec": None, "MarkEligible": True})

    def node_id(self, index: int) -> str:
        def read() -> list[str]:
            nodes = sorted(self.server.sim.store.nodes.values(), key=lambda n: n.name)
            return [n.id for n in nodes]

        ids = self.server.call(read)
        assert isinstance(ids, list)
        return str(ids[index])

    def pick_alloc(self, target: str, pick: int) -> str | None:
        """A running allocation of a claimed (or idle) runner, by `pick`."""
        store = self.server.sim.store

        def read() -> list[str]:
            found: list[tuple[int, str]] = []
            for (ns, job_id), rec in store.jobs.items():
                if not RUNNER_ID.match(job_id) or rec.stopped:
                    continue
                meta = config_meta(rec.spec)
                claimed = meta.get("used") == "true" and not meta.get("nrc_lost_reason")
                if claimed != (target == "claimed"):
                    continue
                for a in store.job_allocs(ns, job_id):
                    if a.client_status == "running" and a.desired_status == "run":
                        found.append((a.create_index, a.id))
            return [a for _, a in sorted(found)]

        allocs = self.server.call(read)
        assert isinstance(allocs, list)
        return str(allocs[pick % len(allocs)]) if allocs else None

    def alloc_status(self, alloc_id: str) -> str:
        def read() -> str:
            a = self.server.sim.store.allocs.get(alloc_id)
            return "gone" if a is None else f"{a.client_status}/{a.desired_status}"

        return str(self.server.call(read))

    def kill_task(self, action: KillTask) -> None:
        alloc = self.pick_alloc(action.target, action.pick)
        if alloc is None:
            self.skipped["kill"] += 1
            return
        kind = "oom" if action.oom else "crash"
        self.faults.add("oom" if action.oom else "crashed", alloc)
        for n in range(action.times):
            if n:
                # Wait (in scenario time) until the task is back from its restart.
                deadline = time.monotonic() + 2.0
                while self.alloc_status(alloc) != "running/run" and time.monotonic() < deadline:
                    pause(self.stop, 0.01)
            answer = self.nomad.call("POST", f"/_sim/allocation/{alloc}/{kind}")
            if answer.status != 200:
                return  # not running (restarting, stopped, gone): nothing to kill

    def put_env(self, action: PutEnv) -> None:
        self.until_definitive(
            "PUT",
            f"/api/v1/execution-environments/{action.env.id}",
            action.env.body(),
            (201, 204),
        )

    def delete_env(self, env_id: int, timeout: float = 30.0) -> None:
        """Delete until Nomad has no template left. A 404 while Nomad still has
        the template is a wrong answer (test_known_issues.py has the bug it
        was): counted as a violation, and the delete is sent again."""
        deadline = time.monotonic() + timeout
        while True:
            self.until_definitive(
                "DELETE", f"/api/v1/execution-environments/{env_id}", None, (204, 404)
            )
            if not self.template_exists(env_id):
                return
            self.wrong_404 += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"environment {env_id} answers 404 but its template stays")
            pause(self.stop, 0.05)

    def template_exists(self, env_id: int) -> bool:
        store = self.server.sim.store
        return bool(self.server.call(lambda: store.job("default", f"template-{env_id}")))

    def until_definitive(
        self, method: str, path: str, body: Any, ok: tuple[int, ...], timeout: float = 30.0
    ) -> None:
        """Environment changes are repeated until the controller answers (they
        are idempotent), so the scenario knows they happened."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.api.call(method, path, body)
            if answer.status in ok:
                return
            if answer.status not in (0, 500, 503) or time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: {answer.status} {answer.body!r}")
            pause(self.stop, 0.05)

    def quiesce(self) -> None:
        """Stop every fault: Nomad behaves, every restart is over (agents and
        servers back, a leader elected), every node is up and eligible."""
        self.sim_call("PUT", "/_sim/faults", FAULTS_OFF)
        restarts = self.server.sim.restarts

        def over() -> bool:
            view = self.server.call(restarts.servers_view)
            return not self.server.call(lambda: set(restarts.agents_down)) and bool(view["Leader"])

        wait_until(over, timeout=RESTART_RIDE_S, interval=0.05)
        for index in range(len(self.server.sim.store.nodes)):
            node = self.node_id(index)
            self.sim_call("POST", f"/_sim/node/{node}/up")
            self.undrain(node)
