"""One chaos run: a seed's scenario against the simulator and a controller
subprocess, then quiescence, convergence and the invariants.

The invariants (docs/reliability.md has the full text):

1. no runner is handed to two clients, and Nomad agrees (one claim write per
   runner job, never a claim over a claim);
2. a claimed runner never becomes idle again, in Nomad or in the statistics;
3. a runner a client holds answers from the allocation it was claimed on, or
   410 with a reason the scenario explains; it never vanishes; and on the data
   itself (`invariant 3 (data)`): the marker file written after the claim reads
   back byte for byte, or the runner answers 410 with its loss (tests/chaos/actors.py);
4. after quiescence every pool converges to exactly `prewarmingPoolSize`
   ready idle runners and Nomad holds nothing else but claims and lost
   runners on their way out (no leaks);
5. runner jobs created ≤ pool increases + claims + replacements;
6. the invariant-violation counter stays 0 and no ERROR line is logged;
7. every execution ends as its program did, with exactly one terminal frame,
   and none of its processes outlives it by more than a bound
   (tests/chaos/executions.py); a listing after the claim's marker was
   written names it, as a download reads it (invariant 3 (data)).
"""

from __future__ import annotations

import re
import shlex
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from nomadsim import SimConfig, SimServer
from tests.chaos.actors import EXEC, Book, Client, FaultLog, Operator, read_marker
from tests.chaos.executions import PROCESS_BOUND_S, alive_runs
from tests.chaos.harness import (
    Api,
    ControllerProcess,
    JobState,
    Ledger,
    NomadState,
    nomad_state,
)
from tests.chaos.scenario import (
    HEARTBEAT_TTL_S,
    DeleteEnv,
    EnvSpec,
    PutEnv,
    Scenario,
    generate,
)
from tests.helpers import wait_until
from tests.support.sim import TOPOLOGY

REPLAY = ".venv/bin/pytest tests/chaos -q --chaos-seed={seed}"
# Bound on the time from quiescence to converged pools (invariant 4).
CONVERGENCE_TIMEOUT_S = 30.0


def sim_config(scenario: Scenario) -> SimConfig:
    """The simulated cluster of a scenario, with millisecond timings."""
    return SimConfig(
        nodes=scenario.nodes,
        seed=scenario.seed,
        startup_delay_ms=30.0,
        stop_delay_ms=20.0,
        migration_stop_lag_ms=30.0,
        heartbeat_interval_ms=200.0,
        stale_lag_ms=scenario.stale_lag_ms,
        # Runner templates: restart delay 15 s ⇒ 750 ms, reschedule delay 1 m ⇒ 3 s
        # (doubling to 4 m ⇒ 12 s); a batch default of 5 s ⇒ 250 ms.
        time_scale=0.05,
        # The restarts (nomadsim/restarts.py) at a tenth of production's pace,
        # or less: a heartbeat TTL that a long agent restart outlasts, a
        # notice, an election and a hold for a leader.
        heartbeat_ttl_ms=HEARTBEAT_TTL_S * 1000,
        failover_heartbeat_ttl_ms=4000.0,
        leader_notice_ms=200.0,
        election_ms=500.0,
        rpc_hold_ms=1000.0,
        **TOPOLOGY,
    )


DELETED = re.compile(r"^deleted runner (\S+) \((\w+)\)$")
# A deletion that failed (a 500 burst): the pool stopped counting the runner
# when it was planned, so a REPLACING reason still stands for a replacement
# even when the runner is deleted later for another reason (orphan, surplus).
DELETE_FAILED = re.compile(r"^deleting runner (\S+) \((\w+)\): ")
RELEASED = re.compile(r"^released runner (\S+)")
# A pass that replaces an idle runner says so before any of its writes: a
# SIGKILL may cut the deletion (retried through a 500 burst) after the
# replacement was created, or an unsafe pass may create it and leave the
# deletion to a later pass (said after a ";"), and the runner is then deleted
# later for another reason (an orphan once its environment is gone).
REPLACING_LINE = re.compile(r"^replacing runner (\S+) \((\w+)\)(?:;.*)?$")
# ... unless it was claimed before its deletion: then it counts as a claim.
CLAIMED_MEANWHILE = re.compile(r"^not deleting (\S+) \((\w+)\): it was claimed meanwhile$")
# Idle runners deleted for these reasons are replaced by a new job (invariant 5).
REPLACING = frozenset({"outdated", "dead", "failed_to_start", "startup_timeout"})
# Deleting a runner for these reasons says it was not running any more.
NOT_RUNNING = frozenset({"dead", "failed_to_start", "startup_timeout"})


@dataclass
class ChaosResult:
    seed: int
    steps: int
    controller_starts: int = 0
    convergence_s: float | None = None
    total_s: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)
    created: int = 0
    needed: int = 0
    violations: list[str] = field(default_factory=list)
    log_dir: Path | None = None

    def summary(self) -> str:
        conv = "—" if self.convergence_s is None else f"{self.convergence_s:5.2f}s"
        losses = ",".join(
            f"{k.split(':', 1)[1]}={v}" for k, v in sorted(self.counts.items()) if "lost:" in k
        )
        ends = ",".join(
            f"{k.split(':', 1)[1]}={v}"
            for k, v in sorted(self.counts.items())
            if k.startswith("execution_end:")
        )
        return (
            f"seed {self.seed:4}: converged in {conv}, {self.steps} steps, "
            f"{self.controller_starts} controller starts, {self.counts['claimed']} claims, "
            f"created {self.created} ≤ needed {self.needed}, losses [{losses}], "
            f"{self.counts['stuck_stopping']} allocations told to stop still alive; "
            f"markers: {self.counts['marker_written']} written, "
            f"{self.counts['marker_read']} read back; open file route issues: "
            f"{self.counts['marker_stale_reread']} reads answered 424 after a stale re-read; "
            f"executions: {self.counts['executions']} [{ends}], {self.counts['listed']} listings; "
            f"{self.total_s:.1f}s in all"
        )


def final_environments(scenario: Scenario) -> dict[int, EnvSpec]:
    envs: dict[int, EnvSpec] = {e.id: e for e in scenario.envs}
    for step in scenario.steps:
        if isinstance(step.action, PutEnv):
            envs[step.action.env.id] = step.action.env
        elif isinstance(step.action, DeleteEnv):
            envs.pop(step.action.env_id, None)
    return envs


def serving(job: JobState, alloc_id: str | None = None) -> bool:
    """The job runs exactly one allocation it wants running (that one, if named), and
    it is running. Allocations told to stop may still be stopping: on their way out."""
    wanted = [a for a in job.allocs if a.desired_status == "run" and a.live]
    return len(wanted) == 1 and wanted[0].serving and (alloc_id is None or wanted[0].id == alloc_id)


def unconverged(
    state: NomadState, expected: dict[int, EnvSpec], stats: object, ready: int
) -> list[str]:
    """Why the cluster is not (yet) in its converged state; empty when it is."""
    out: list[str] = []
    if ready != 200:
        out.append(f"/readyz answers {ready}")
    for node in state.nodes:
        if node.status != "ready" or node.eligibility != "eligible" or node.draining:
            out.append(f"node {node.name} is {node.status}/{node.eligibility}")
    templates = state.templates()
    if set(templates) != set(expected):
        out.append(f"templates {sorted(templates)} ≠ environments {sorted(expected)}")
    for env_id, template in templates.items():
        spec = expected.get(env_id)
        pool = int(template.meta.get("prewarmingPoolSize", -1))
        if spec is not None and pool != spec.pool:
            out.append(f"environment {env_id}: template pool {pool} ≠ {spec.pool}")
        idle = [j for j in state.runners(env_id) if not j.claimed]
        ready_idle = [j for j in idle if not j.stop and j.shape == template.shape and serving(j)]
        if len(ready_idle) != pool or len(idle) != len(ready_idle):
            out.append(
                f"environment {env_id}: {len(ready_idle)} ready idle runners of {len(idle)} "
                f"idle runner jobs, pool {pool}"
            )
    for env_id in {j.env_id for j in state.runners()} - set(templates):
        leftover = [j.id for j in state.runners(env_id) if not j.claimed]
        if leftover:
            out.append(f"deleted environment {env_id} still has idle runners {leftover}")
    for job in state.runners():
        if not job.claimed:
            continue
        if job.lost_reason:
            if not job.stop:
                out.append(f"lost runner {job.id} is not stopped")
        elif int(job.meta.get("timeout") or 0) > 0:
            out.append(f"claimed runner {job.id} outlived its inactivity timeout")
        elif job.stop or not serving(job, job.meta.get("nrc_claim_alloc")):
            allocs = [f"{a.id[:8]} {a.client_status}/{a.desired_status}" for a in job.allocs]
            out.append(
                f"claimed runner {job.id} is not served from its claim's allocation {allocs}"
            )
    if not isinstance(stats, dict):
        out.append(f"statistics: {stats!r}")
        return out
    if set(stats) != {str(e) for e in templates}:
        out.append(f"statistics list {sorted(stats)}, Nomad has templates {sorted(templates)}")
    for env_id, template in templates.items():
        got = stats.get(str(env_id)) or {}
        pool = int(template.meta.get("prewarmingPoolSize", -1))
        used = sum(1 for j in state.runners(env_id) if j.claimed and not j.lost_reason)
        want = {"prewarmingPoolSize": pool, "idleRunners": pool, "usedRunners": used}
        have = {k: got.get(k) for k in want}
        if have != want:
            out.append(f"statistics of {env_id}: {have} ≠ {want}")
    return out


class ChaosRun:
    def __init__(self, seed: int, log_dir: Path, prelude: str = "") -> None:
        self.prelude = prelude
        self.scenario = generate(seed)
        self.result = ChaosResult(seed, len(self.scenario.steps), log_dir=log_dir)
        self.server = SimServer(sim_config(self.scenario))
        self.log_dir = log_dir
        self.stop = threading.Event()

    def execute(self) -> ChaosResult:
        started = time.monotonic()
        self.server.start()
        self.ledger = Ledger(self.server.sim)
        self.ledger.install(self.server)
        self.faults = FaultLog()
        self.book = Book(self.ledger, self.faults)
        setuser = self.server.call(lambda: self.server.sim.setuser_path)
        self.controller = ControllerProcess(
            self.server.address, self.log_dir, self.prelude, wrapper=f"{shlex.quote(setuser)} user"
        )
        try:
            self._run()
        finally:
            self.stop.set()
            self.controller.close()
            self.server.stop()
            self.result.controller_starts = self.controller.starts
            self.result.counts.update(self.book.counts)
            self.result.total_s = time.monotonic() - started
        return self.result

    def _run(self) -> None:
        scenario, result = self.scenario, self.result
        api = Api(self.controller.base)
        self.controller.start()
        wait_until(lambda: api.call("GET", "/readyz").status == 200, timeout=20, interval=0.02)
        t0 = time.monotonic()
        operator = Operator(scenario, self.stop, t0, self.server, self.controller, self.faults)
        for env in scenario.envs:
            operator.put_env(PutEnv(env, "create"))

        def filled() -> bool:
            stats = api.call("GET", "/api/v1/statistics/execution-environments").body
            return isinstance(stats, dict) and all(
                (stats.get(str(e.id)) or {}).get("idleRunners") == e.pool for e in scenario.envs
            )

        wait_until(filled, timeout=20, interval=0.02)  # setup: the first claims find runners
        t0 = time.monotonic()
        operator.t0 = t0
        clients = [
            Client(name, scenario.steps_of(name), self.stop, t0, self.controller.base, self.book)
            for name in scenario.clients
        ]
        actors = [operator, *clients]
        for actor in actors:
            actor.start()
        for actor in actors:
            actor.join(scenario.duration + 120)
            if actor.is_alive():
                result.violations.append(f"harness: {actor.name} did not finish")
            result.violations += [f"harness: {e}" for e in actor.errors]
        operator.quiesce()
        if operator.wrong_404:
            result.violations.append(
                f"DELETE /execution-environments answered 404 {operator.wrong_404} times "
                "while Nomad had the environment's template"
            )
        if not self.controller.alive():
            log = self.controller.logs[-1]
            tail = log.read_text(errors="replace").splitlines()[-15:]
            result.violations.append(
                f"controller {self.controller.starts} exited on its own "
                f"(code {self.controller.exit_code()}); the end of {log}:\n" + "\n".join(tail)
            )
            return
        quiet = time.monotonic()
        expected = final_environments(scenario)
        last: list[str] = []

        def converged() -> bool:
            stats = api.call("GET", "/api/v1/statistics/execution-environments").body
            ready = api.call("GET", "/readyz").status
            last[:] = unconverged(nomad_state(self.server), expected, stats, ready)
            return not last

        try:
            wait_until(converged, timeout=CONVERGENCE_TIMEOUT_S, interval=0.05)
            result.convergence_s = time.monotonic() - quiet
        except AssertionError:
            result.violations.append(
                f"invariant 4: not converged {CONVERGENCE_TIMEOUT_S:.0f}s after quiescence: "
                + "; ".join(last)
            )
        self._check_clients(api)
        self._check_processes()
        self.book.check_losses()
        self._check_nomad(nomad_state(self.server))
        self._check_bound(expected)
        self._check_controller()
        result.violations = result.violations + self.ledger.problems() + self.book.violations

    def _check_clients(self, api: Api) -> None:
        """Invariant 3, for good: every runner still held answers as it should,
        and so does its marker (its bytes, or the 410 of its loss)."""
        for held in self.book.all_held():
            sent = time.monotonic()
            self.book.judge(held, sent, api.call("GET", f"/api/v1/runners/{held.runner_id}"), True)
            read_marker(api, self.book, held, final=True)

    def _check_processes(self) -> None:
        """Invariant 7: no process of an ended execution is alive
        PROCESS_BOUND_S after its end (unless the controller that ran it was
        killed or drained meanwhile: it cannot end what it ran)."""
        checked = {out.token: out for out, went in self.book.executions if not went}
        if not checked:
            return
        last = max(out.ended for out in checked.values())
        alive: dict[str, list[int]] = {}

        def ended() -> bool:
            alive.clear()
            alive.update({t: p for t, p in alive_runs().items() if t in checked})
            return not alive

        try:
            wait_until(ended, timeout=max(0.1, last + PROCESS_BOUND_S - time.monotonic()))
        except AssertionError:
            for token, pids in sorted(alive.items()):
                out = checked[token]
                ends = [f.get("type") for f in out.terminal()] or ["no terminal frame"]
                self.result.violations.append(
                    f"{EXEC}: {len(pids)} processes of execution {out.program} (token {token}, "
                    f"ended {ends}) alive {time.monotonic() - out.ended:.1f}s after its end"
                )

    def _check_nomad(self, state: NomadState) -> None:
        # Allocations told to stop that still run (within their kill timeout):
        # Nomad's business, not a leaked job.
        self.result.counts["stuck_stopping"] = sum(
            1 for job in state.runners() for a in job.allocs if a.live and a.desired_status != "run"
        )
        for runner_id in self.book.released:
            if runner_id in state.jobs:
                self.result.violations.append(f"released runner {runner_id} is still in Nomad")
        for held in self.book.all_held():
            job = state.jobs.get(held.runner_id)
            if job is None or not job.claimed:
                self.result.violations.append(
                    f"invariant 2: runner {held.runner_id} held by {held.client} is "
                    f"{'gone' if job is None else 'idle'} in Nomad"
                )

    def _deletions(self) -> tuple[dict[str, str], set[str], set[str]]:
        """Runner deletions the controllers logged (runner → reason), releases, and
        the runners the controllers set out to replace (a replacement announced,
        or a deletion for a REPLACING reason logged, done or failed), less those
        claimed before their deletion."""
        lines, _ = self.controller.log_lines()
        deleted: dict[str, str] = {}
        released: set[str] = set()
        replacing: set[str] = set()
        claimed_meanwhile: set[str] = set()
        for line in lines:
            match = CLAIMED_MEANWHILE.match(line.message)
            if match:
                claimed_meanwhile.add(match.group(1))
            for pattern in (REPLACING_LINE, DELETED, DELETE_FAILED):
                match = pattern.match(line.message)
                if match and match.group(2) in REPLACING:
                    replacing.add(match.group(1))
            match = DELETED.match(line.message)
            if match:
                deleted[match.group(1)] = match.group(2)
            match = RELEASED.match(line.message)
            if match:
                released.add(match.group(1))
        return deleted, released, replacing - claimed_meanwhile

    def _check_bound(self, expected: dict[int, EnvSpec]) -> None:
        """Invariant 5: created ≤ pool increases + claims + replacements, per environment."""
        deleted, released, replacing = self._deletions()
        records = self.ledger.all_runners()
        envs = {r.env_id for r in records} | set(expected)
        for env_id in sorted(envs):
            mine = [r for r in records if r.env_id == env_id]
            claims = sum(1 for r in mine if r.claims)
            replaced = sum(1 for r in mine if r.job_id in replacing)
            unattributed = sum(
                1
                for r in mine
                if r.purged_idle and r.job_id not in deleted and r.job_id not in released
            )
            increases = self.ledger.pool_increases[env_id]
            created = self.ledger.created[env_id]
            needed = increases + claims + replaced + unattributed
            self.result.created += created
            self.result.needed += needed
            self.result.counts["replaced"] += replaced
            self.result.counts["deleted_unlogged"] += unattributed
            if created > needed:
                surplus = sum(1 for r in mine if deleted.get(r.job_id) == "surplus")
                self.result.violations.append(
                    f"invariant 5: environment {env_id}: {created} runner jobs created > "
                    f"{needed} needed ({increases} pool increases + {claims} claims + "
                    f"{replaced} replacements + {unattributed} unlogged deletions); "
                    f"{surplus} surplus deletions"
                )
        for r in records:
            if deleted.get(r.job_id) in NOT_RUNNING and r.running_at_purge:
                self.result.violations.append(
                    f"invariant 5: runner {r.job_id} deleted as {deleted[r.job_id]} while it "
                    "was running"
                )

    def _check_controller(self) -> None:
        """Invariant 6: no violation counted, no ERROR logged, no traceback."""
        final = self.controller.invariant_counters()
        if final is None:
            self.result.violations.append("could not read the controller's metrics at the end")
        counters = [*self.controller.invariant_violations, final or {}]
        if any(any(c.values()) for c in counters):
            self.result.violations.append(
                f"invariant 6: nrc_invariant_violations_total per process: {counters}"
            )
        lines, other = self.controller.log_lines()
        errors = [line for line in lines if line.level in ("ERROR", "CRITICAL")]
        for line in errors[:10]:
            self.result.violations.append(
                f"invariant 6: controller {line.process} logged {line.level}: {line.message} "
                f"{line.fields.get('exception', '')}"
            )
        for text in other[:10]:
            if "Traceback" in text or "Error" in text:
                self.result.violations.append(f"invariant 6: not a log line: {text}")
        self.result.counts["warnings"] = sum(1 for line in lines if line.level == "WARNING")
        if any(code != 0 for code in self.controller.drain_exits):
            self.result.violations.append(
                f"invariant 6: a controller stopped with SIGTERM exited with "
                f"{self.controller.drain_exits} (each must drain and exit 0)"
            )
