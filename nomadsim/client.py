"""The Nomad client side: what happens to an allocation on its node.

Task lifecycle with Nomad's task events: `Received` → `Task Setup` →
`Driver` → (startup delay) → `Started`; a stop is `Killing` → (stop delay) →
`Killed` and `complete`. A task that exits (crash, OOM kill) follows the
group's restart policy in place until the attempts in the interval are used
up: `Terminated`, then `Restarting`, which (as in Nomad's task runner) moves
the task to `pending` for the restart delay and at once counts the restart
(`Restarts` + 1, `LastRestart` = the event's time); after the delay `Started`
moves it back to `running` with a new `StartedAt`. When the attempts are used
up: `Not Restarting`, task dead and failed, allocation `failed`, and an
`alloc-failure` evaluation lets the scheduler reschedule it.

As Nomad's client, it learns of its allocations by watching the state store
(`on_commit`): an allocation the scheduler placed is received, one it told
to stop is killed, one purged or on a node that went down is dropped. It
reports back through `AllocUpdates` only (Nomad's Node.UpdateAlloc); each
report is an `AllocClientUpdate` transaction (AllocationUpdated events).

Reports are not instant in Nomad: the client batches its allocations'
changes and sends them every 200 ms (`allocSyncIntv`), and the server
commits the updates it receives in batches of its own (Node.UpdateAlloc,
50 ms). `client_sync_ms` models the sum: a change lives on the node at once
(the driver follows `view`, so a restarted task has its fresh container and
file system) but reaches the state store, and so the API and the event
stream, only when the pending batch is sent. 0 reports at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from nomadsim.clock import SimTime
from nomadsim.config import SimConfig
from nomadsim.encode import SECOND, go_duration, group_of
from nomadsim.records import (
    COMPLETE,
    FAILED,
    PENDING,
    RUNNING,
    Alloc,
    TaskEvent,
)
from nomadsim.state import ALLOCS, NODES, Commit, StateStore


class AllocUpdates(Protocol):
    """How a client reports an allocation's new state to the server (Nomad's
    Node.UpdateAlloc): the server commits it and decides what follows, such
    as an evaluation for a failed allocation. `NodeEndpoint` is one."""

    def update_alloc(self, alloc: Alloc) -> Alloc: ...


class Client:
    def __init__(
        self, store: StateStore, time: SimTime, config: SimConfig, server: AllocUpdates
    ) -> None:
        self._store = store
        self._time = time
        # Read at each use: the startup, stop and migration lag delays.
        self._config = config
        self._server = server
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # new alloc id -> old alloc id whose completion waits for it (production ordering)
        self._completes_after: dict[str, str] = {}
        # old alloc id -> new alloc waiting for it to be terminal (client ordering)
        self._waiting_on: dict[str, str] = {}
        # restart-policy interval per allocation: when it began, restarts used in it
        self._window_start: dict[str, int] = {}
        self._window_count: dict[str, int] = {}
        # Changes lived on the node but not yet reported (client_sync_ms), in
        # the order they happened; the timer sends them as one batch.
        self._unsynced: dict[str, Alloc] = {}
        self._sync_timer: asyncio.TimerHandle | None = None
        # Told of every change as it happens on the node (the driver).
        self.on_local: Callable[[str, Alloc], None] = lambda alloc_id, alloc: None
        # Nodes whose agent is down (restarts.py): what the servers decide
        # for them waits, and their reports wait, until it is back.
        self._agents_down: set[str] = set()
        # No server leads (restarts.py): nothing commits, so a client keeps
        # its updates and sends them once a leader is elected.
        self._servers_away = False

    # -- watching the state store -------------------------------------------------

    def on_commit(self, commit: Commit) -> None:
        """A store watcher: react to what the server wrote, in its order."""
        for change in commit.changes:
            if change.table == ALLOCS:
                before, after = change.before, change.after
                if after is None:
                    self._forget(change.key)  # purged
                    self._release_predecessor(change.key)
                elif before is None:
                    self._on_placed(after)
                elif before.desired_status == "run" and after.desired_status == "stop":
                    stopped = self.view(change.key)
                    assert stopped is not None
                    self._on_stop(stopped)
            elif change.table == NODES:
                before, after = change.before, change.after
                went_down = before is not None and before.status != "down"
                if after is not None and after.status == "down" and went_down:
                    self._on_node_down(change.key)

    # -- helpers ----------------------------------------------------------------

    def _later(self, alloc_id: str, delay_s: float, fn: object) -> None:
        assert callable(fn)
        timers = self._time.timers
        timers.cancel(self._timers.pop(alloc_id, None))
        self._timers[alloc_id] = timers.call_later(delay_s, fn)

    def _forget(self, alloc_id: str) -> None:
        self._time.timers.cancel(self._timers.pop(alloc_id, None))

    def _tasks(self, alloc: Alloc) -> list[str]:
        group = group_of(alloc.job, alloc.task_group) or {}
        return [t["Name"] for t in group.get("Tasks") or []]

    def _node_up(self, alloc: Alloc) -> bool:
        if alloc.node_id in self._agents_down:
            return False
        node = self._store.nodes.get(alloc.node_id)
        return node is not None and node.status == "ready"

    def agent_down(self, node_id: str) -> None:
        """The node's agent stopped: its timers stop with it (the tasks it
        started run on in Docker)."""
        self._agents_down.add(node_id)
        for alloc in self._store.node_allocs(node_id):
            self._forget(alloc.id)

    def agent_up(self, node_id: str) -> None:
        """The node's agent is back and has its allocations from the servers
        again: it sends what it lived meanwhile, kills what the servers
        stopped and starts what they placed."""
        self._agents_down.discard(node_id)
        self._sync()
        for alloc in self._store.node_allocs(node_id):
            view = self.view(alloc.id)
            if view is None or view.client_terminal():
                continue
            if view.desired_status == "stop":
                self._on_stop(view)
            elif view.client_status == PENDING:
                self._resume_pending(view)

    def _resume_pending(self, alloc: Alloc) -> None:
        """Go on with an allocation the agent left pending: placed and not
        yet received, waiting out a restart delay, or being set up."""
        events = [e for _, ts in alloc.task_states for e in ts.events]
        alloc_id = alloc.id
        if not events:
            self._on_placed(alloc)
        elif events[-1].type == "Restarting":
            self._later(alloc_id, 0, lambda: self._restart(alloc_id))
        else:
            delay_s = self._config.startup_delay_ms / 1000
            self._later(alloc_id, delay_s, lambda: self._start(alloc_id))

    def view(self, alloc_id: str) -> Alloc | None:
        """The allocation as its node knows it: the server's, with the client's
        state of a change not yet reported."""
        alloc = self._store.allocs.get(alloc_id)
        pending = self._unsynced.get(alloc_id)
        if alloc is None or pending is None:
            return alloc
        return _with_client_state(alloc, pending)

    def servers_away(self, away: bool) -> None:
        """No leader (True) or a leader again (False): the updates kept
        meanwhile are sent at once, in one burst (client/client.go keeps
        failed updates and retries them)."""
        self._servers_away = away
        if not away:
            self._sync()

    def _update(self, alloc: Alloc) -> Alloc:
        delay_s = self._config.client_sync_ms / 1000
        if delay_s <= 0 and not self._servers_away:
            return self._server.update_alloc(alloc)
        self._unsynced.pop(alloc.id, None)
        self._unsynced[alloc.id] = alloc
        self.on_local(alloc.id, alloc)
        # Without a leader the batch waits for the election (`servers_away`).
        if self._sync_timer is None and not self._servers_away:
            self._sync_timer = self._time.timers.call_later(delay_s, self._sync)
        return alloc

    def _sync(self) -> None:
        """Send the pending batch: each allocation's client state onto what the
        server holds now (a stop it decided meanwhile stays)."""
        self._sync_timer = None
        if self._servers_away:
            return  # sent once a leader is elected
        batch, self._unsynced = self._unsynced, {}
        for alloc_id, pending in batch.items():
            current = self._store.allocs.get(alloc_id)
            if current is not None and current.node_id in self._agents_down:
                self._unsynced[alloc_id] = pending  # sent once the agent is back
                continue
            if current is None or not self._node_up(current):
                continue
            self._server.update_alloc(_with_client_state(current, pending))

    def _with_event(self, alloc: Alloc, event: TaskEvent, **changes: object) -> Alloc:
        states = []
        for name in self._tasks(alloc):
            ts = alloc.task_state(name)
            ts = replace(ts, events=(*ts.events, event), **changes)  # type: ignore[arg-type]
            states.append((name, ts))
        return replace(alloc, task_states=tuple(states))

    def _current(self, alloc_id: str) -> Alloc | None:
        alloc = self.view(alloc_id)
        if alloc is None or not self._node_up(alloc):
            return None
        return alloc

    # -- placement and start ----------------------------------------------------

    def _on_placed(self, alloc: Alloc) -> None:
        self._later(alloc.id, 0, lambda: self._receive(alloc.id))

    def _receive(self, alloc_id: str) -> None:
        alloc = self._current(alloc_id)
        if alloc is None or alloc.client_status != PENDING or alloc.desired_status != "run":
            return
        now = self._time.now_ns()
        alloc = self._with_event(
            alloc, TaskEvent("Received", now, display_message="Task received by client")
        )
        prev = self.view(alloc.previous_allocation)
        if prev is not None and not prev.client_terminal() and self._node_up(prev):
            # Nomad's client waits for the previous allocation to stop first.
            self._update(alloc)
            self._waiting_on[prev.id] = alloc.id
            return
        self._setup(alloc)

    def _setup(self, alloc: Alloc) -> None:
        now = self._time.now_ns()
        alloc = self._with_event(
            alloc,
            TaskEvent(
                "Task Setup",
                now,
                message="Building Task Directory",
                display_message="Building Task Directory",
                details=(("message", "Building Task Directory"),),
            ),
        )
        image = self._image(alloc)
        alloc = self._with_event(
            alloc,
            TaskEvent(
                "Driver",
                now,
                display_message=f"Downloading image {image}" if image else "",
                details=(("image", image),) if image else (),
                driver_message=f"Downloading image {image}" if image else "",
            ),
        )
        alloc = self._update(alloc)
        self._later(alloc.id, self._config.startup_delay_ms / 1000, lambda: self._start(alloc.id))

    def _image(self, alloc: Alloc) -> str:
        group = group_of(alloc.job, alloc.task_group) or {}
        for task in group.get("Tasks") or []:
            image = (task.get("Config") or {}).get("image")
            if image:
                return str(image)
        return ""

    def _start(self, alloc_id: str) -> None:
        alloc = self._current(alloc_id)
        if alloc is None or alloc.desired_status != "run" or alloc.client_terminal():
            return
        self._update(self._running(alloc))
        old = self._completes_after.pop(alloc_id, None)
        if old is not None:
            lag = self._config.migration_stop_lag_ms / 1000
            self._later(old, lag, lambda: self._killed(old))

    # -- stop -----------------------------------------------------------------

    def _on_stop(self, alloc: Alloc) -> None:
        """The server set DesiredStatus stop: kill the tasks."""
        self._release_predecessor(alloc.id)
        if alloc.client_terminal() or not self._node_up(alloc):
            self._forget(alloc.id)
            return
        successor = self._store.migration_of(alloc.next_allocation)
        if successor is not None and successor.ordering == "production":
            # Production ordering: the old allocation keeps running until its
            # replacement is running, and completes shortly after.
            self._completes_after[alloc.next_allocation] = alloc.id
            self._forget(alloc.id)
            self._kill_event(alloc)
            return
        self._kill_event(alloc)
        self._later(alloc.id, self._stop_s(alloc), lambda: self._killed(alloc.id))

    def _release_predecessor(self, alloc_id: str) -> None:
        """A replacement that will never run (stopped, purged, its node down):
        the allocation it was to replace waits for it no longer. Nomad's client
        never waits for a replacement; only the order the simulator models
        does, so the old one is killed as any stopped allocation is."""
        old_id = self._completes_after.pop(alloc_id, None)
        old = self._current(old_id) if old_id is not None else None
        if old is None or old.client_terminal():
            return
        self._later(old.id, self._stop_s(old), lambda: self._killed(old.id))

    def _stop_s(self, alloc: Alloc) -> float:
        """How long the kill takes. A task running `sleep` (a runner) is PID 1
        of its container and ignores every signal but SIGKILL, as under
        Docker: Nomad waits its whole kill_timeout before SIGKILL."""
        delay = self._config.stop_delay_ms / 1000
        if not self._config.kill_timeouts or alloc.client_status != RUNNING:
            return delay
        config = self._task_field(alloc, "Config")
        signal = str(self._task_field(alloc, "KillSignal") or "SIGTERM")
        if not isinstance(config, dict) or config.get("command") != "sleep" or signal == "SIGKILL":
            return delay
        return delay + self._time.scaled(self._kill_timeout_ns(alloc)) / SECOND

    def _kill_timeout_ns(self, alloc: Alloc) -> int:
        timeout = self._task_field(alloc, "KillTimeout")
        return int(timeout) if isinstance(timeout, int) else 5 * SECOND

    def _kill_event(self, alloc: Alloc) -> None:
        if alloc.client_status != RUNNING:
            return
        now = self._time.now_ns()
        timeout = self._kill_timeout_ns(alloc)  # 0 is a timeout (SIGKILL at once), not unset
        alloc = self._with_event(
            alloc,
            TaskEvent(
                "Killing",
                now,
                display_message=(
                    f"Sent interrupt. Waiting {go_duration(timeout)} before force killing"
                ),
                kill_timeout=timeout,
            ),
        )
        self._update(alloc)

    def _task_field(self, alloc: Alloc, name: str) -> object:
        group = group_of(alloc.job, alloc.task_group) or {}
        for task in group.get("Tasks") or []:
            return task.get(name)
        return None

    def _killed(self, alloc_id: str) -> None:
        self._timers.pop(alloc_id, None)
        alloc = self._current(alloc_id)
        if alloc is None or alloc.client_terminal():
            return
        now = self._time.now_ns()
        was_running = alloc.client_status == RUNNING
        if was_running:
            alloc = self._with_event(
                alloc, TaskEvent("Killed", now, display_message="Task successfully killed")
            )
        alloc = (
            self._with_event(
                alloc,
                TaskEvent(
                    "Terminated",
                    now,
                    display_message="Exit Code: 0",
                    details=(("exit_code", "0"), ("oom_killed", "false"), ("signal", "0")),
                ),
            )
            if was_running
            else alloc
        )
        states = tuple(
            (name, replace(ts, state="dead", finished_at=now)) for name, ts in alloc.task_states
        )
        alloc = replace(
            alloc,
            task_states=states,
            client_status=COMPLETE,
            client_description="All tasks have completed",
        )
        self._update(alloc)
        waiting = self._waiting_on.pop(alloc_id, None)
        if waiting is not None:
            successor = self._current(waiting)
            if successor is not None and successor.desired_status == "run":
                self._setup(successor)

    # -- task exits ---------------------------------------------------------------

    def task_exit(self, alloc_id: str, exit_code: int, oom: bool) -> bool:
        """A running task exited on its own: apply the restart policy."""
        alloc = self._current(alloc_id)
        if alloc is None or alloc.client_status != RUNNING or alloc.desired_status != "run":
            return False
        now = self._time.now_ns()
        details = (
            ("exit_code", str(exit_code)),
            ("oom_killed", "true" if oom else "false"),
            ("signal", "9" if oom else "0"),
        )
        terminated = TaskEvent(
            "Terminated",
            now,
            message="OOM Killed" if oom else "",
            display_message=f"Exit Code: {exit_code}"
            + (', Exit Message: "OOM Killed"' if oom else ""),
            details=details,
            exit_code=exit_code,
            signal=9 if oom else 0,
        )
        alloc = self._with_event(alloc, terminated)
        group = group_of(alloc.job, alloc.task_group) or {}
        policy = group.get("RestartPolicy") or {}
        attempts = int(policy.get("Attempts") or 0)
        interval = int(policy.get("Interval") or 0)
        delay = int(policy.get("Delay") or 0)
        mode = policy.get("Mode") or "fail"
        # Restarts are counted per interval, from the first restart in it.
        window_start = self._window_start.get(alloc_id, 0)
        span = self._time.scaled(interval)
        if interval and now - window_start >= span:
            window_start = now
            self._window_start[alloc_id] = now
            self._window_count[alloc_id] = 0
        used = self._window_count.get(alloc_id, 0)
        if used < attempts or mode == "delay":
            # StartDelay is what the client really waits, in simulator time.
            wait = self._time.scaled(delay)
            if used >= attempts:
                wait = max(wait, window_start + span - now)
            self._window_count[alloc_id] = used + 1 if used < attempts else 0
            restarting = TaskEvent(
                "Restarting",
                now,
                display_message=f"Task restarting in {go_duration(wait)}",
                restart_reason="Restart within policy",
                start_delay=wait,
            )
            # Nomad's task runner: UpdateState(pending, Restarting) appends the
            # event, which counts the restart then and there (appendEvent:
            # Restarts++, LastRestart = the event's time), not when it starts.
            alloc = self._with_event(alloc, restarting, state=PENDING)
            states = tuple(
                (name, replace(ts, restarts=ts.restarts + 1, last_restart=restarting.time))
                for name, ts in alloc.task_states
            )
            alloc = replace(
                alloc,
                task_states=states,
                client_status=PENDING,
                client_description="Tasks are pending",
            )
            self._update(alloc)
            self._later(alloc_id, wait / SECOND, lambda: self._restart(alloc_id))
            return True
        not_restarting = TaskEvent(
            "Not Restarting",
            now,
            display_message=(
                f"Exceeded allowed attempts {attempts} in interval {go_duration(interval)} "
                f'and mode is "{mode}"'
            ),
            restart_reason=(
                f"Exceeded allowed attempts {attempts} in interval {go_duration(interval)} "
                f'and mode is "{mode}"'
            ),
            fails_task=True,
        )
        alloc = self._with_event(alloc, not_restarting, state="dead", failed=True, finished_at=now)
        alloc = replace(alloc, client_status=FAILED, client_description="Failed tasks")
        self._update(alloc)  # the server evaluates the job: a reschedule may follow
        return True

    def _running(self, alloc: Alloc) -> Alloc:
        """The allocation with its task started now: a Started event, a new
        `StartedAt`, and running on the client."""
        now = self._time.now_ns()
        alloc = self._with_event(
            alloc,
            TaskEvent("Started", now, display_message="Task started by client"),
            state=RUNNING,
            started_at=now,
        )
        return replace(alloc, client_status=RUNNING, client_description="Tasks are running")

    def _restart(self, alloc_id: str) -> None:
        """The restart delay is over: the task starts again. Moving from
        `pending` to `running` sets a new `StartedAt`, as every start does."""
        alloc = self._current(alloc_id)
        if alloc is None or alloc.desired_status != "run" or alloc.client_terminal():
            return
        self._update(self._running(alloc))

    def _on_node_down(self, node_id: str) -> None:
        """A down node's client reports nothing more: drop its timers."""
        for alloc in self._store.node_allocs(node_id):
            self._forget(alloc.id)
            self._unsynced.pop(alloc.id, None)
            self._release_predecessor(alloc.id)

    def pending_timers(self) -> int:
        return len(self._timers)


def _with_client_state(alloc: Alloc, client: Alloc) -> Alloc:
    """`alloc` with the fields a client reports (Node.UpdateAlloc) from `client`."""
    return replace(
        alloc,
        client_status=client.client_status,
        client_description=client.client_description,
        task_states=client.task_states,
    )
