"""The simulated Nomad cluster: its parts, wired in the direction Nomad's own
depend on each other.

The state store is the one shared mutable thing. The scheduler plans against
it and writes plans to it; the client watches it for the allocations placed
on its nodes and reports through the node endpoint; the drainer reads it and
leaves migrations to the allocation endpoint; the event broker, the task
driver and the presenter's caches follow its commits. The endpoints (jobs,
nodes, allocations) are what the HTTP layer calls. Every operation runs on
the simulator's event loop; errors are raised as `NomadError` carrying
Nomad's status and text."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

from nomadsim.acl import Acl
from nomadsim.alloc_endpoint import AllocEndpoint
from nomadsim.client import Client
from nomadsim.clock import Clock, SimTime, SystemClock
from nomadsim.config import Faults, SimConfig
from nomadsim.drainer import Drainer
from nomadsim.driver import Driver
from nomadsim.errors import NomadError
from nomadsim.events import EventBroker
from nomadsim.frontends import Frontends
from nomadsim.job_endpoint import JobEndpoint
from nomadsim.node_endpoint import NodeEndpoint
from nomadsim.ports import Ports
from nomadsim.presenter import Presenter
from nomadsim.records import JsonDict
from nomadsim.restarts import Restarts
from nomadsim.scheduler import Scheduler
from nomadsim.state import StateStore
from nomadsim.variables import Variables


class Simulator:
    def __init__(self, config: SimConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or SimConfig()
        self.clock: Clock = clock or SystemClock()
        self.time = SimTime(self.clock, self.config.time_scale)
        self.rng = random.Random(self.config.seed)
        # Faults draw from their own stream so that injecting them does not
        # change the IDs and placements of the same calls.
        self.fault_rng = random.Random(self.config.seed + 1)
        self.faults = Faults()
        self.faults.update({"migration_ordering": self.config.migration_ordering})
        self.acl = Acl(self.config)
        self.requests: dict[str, int] = {}
        self.stopped = False
        # Exec streams being served: a stop waits for their last frames.
        self.exec_streams: set[asyncio.Future[None]] = set()
        # The agents in front of this state (their addresses are bound by
        # the server before `start`).
        self.frontends = Frontends(self.config)

        store = self.store = StateStore(self.clock.monotonic)
        self.ports = Ports()
        self.presenter = Presenter(store, self.ports)
        self.broker = EventBroker(self.presenter.alloc_event, self.config.event_buffer_size)
        self.driver = Driver(
            store,
            docker_users=self.config.docker_users,
            docker_stdin_close=self.config.docker_stdin_close_on_exit,
        )
        for listener in (self.broker.on_commit, self.driver.on_commit, self.presenter.on_commit):
            store.add_listener(listener)
        self.scheduler = Scheduler(
            store, self.time, self.new_id, self.ports, self.migration_ordering
        )
        self.alloc_endpoint = AllocEndpoint(
            store, self.time, self.new_id, self.scheduler, self.driver, self.acl
        )
        self.drainer = Drainer(store, self.time, self.alloc_endpoint)
        self.node_endpoint = NodeEndpoint(
            store, self.time, self.new_id, self.scheduler, self.drainer, self.ports
        )
        self.job_endpoint = JobEndpoint(
            store,
            self.time,
            self.new_id,
            self.scheduler,
            self.ports,
            memory_oversubscription=self.config.memory_oversubscription,
        )
        self.client = Client(store, self.time, self.config, self.node_endpoint)
        self.client.on_local = self.driver.client_changed
        self.driver.client_view = self.client.view
        store.watch(self.client.on_commit)
        self.variables = Variables(store, self.time, self.new_id)
        self.restarts = Restarts(
            store,
            self.time,
            self.config,
            self.node_endpoint,
            self.client,
            self.driver,
            self.frontends,
            # Its own stream: restarts change no ID or placement of the same calls.
            random.Random(self.config.seed + 2),
            self.clock.monotonic,
        )

    # -- lifecycle --------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the event loop and register the nodes."""
        self.time.timers.bind(loop)
        self.driver.start(loop)
        for i in range(1, self.config.nodes + 1):
            name = f"agent-{i}"
            ip = self.frontends.node_ip(name)
            self.node_endpoint.register(
                name,
                self.frontends.node_http_addr(name) or f"{ip}:4646",
                self.config.node_cpu_mhz,
                self.config.node_memory_mb,
                ip,
                self.config.node_disk_mb,
            )

    def stop(self) -> None:
        """Stop serving long requests: open event streams and blocked queries
        end, and from now on new ones end at once (the HTTP server still
        accepts connections until uvicorn notices it should exit). Every
        process exec started is killed, its exec stream ended. Idempotent."""
        self.stopped = True
        self.restarts.stop()
        self.broker.close_all()
        self.store.wake_all()
        self.time.timers.cancel_all()
        self.driver.close()

    # -- what the parts share -----------------------------------------------------

    def new_id(self) -> str:
        """The next ID of the seeded stream: the same seed and the same calls
        give the same IDs."""
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def migration_ordering(self) -> str:
        """The ordering the next migration follows (the `migration_ordering` fault)."""
        ordering = self.faults.migration_ordering
        if ordering == "random":
            return self.fault_rng.choice(("production", "client"))
        return ordering

    # -- the simulator's own operations (/_sim, tests, benchmarks, `dev`) --------

    def register_job(
        self, raw: object, namespace: str, enforce: bool, enforce_index: int
    ) -> JsonDict:
        """Register a job as `PUT /v1/jobs` does, without HTTP."""
        return self.job_endpoint.register(raw, namespace, enforce, enforce_index)

    def task_exit(self, alloc_id: str, oom: bool) -> None:
        """The allocation's task exits on its own (exit code 1, or 137 for an
        OOM kill) and its client applies the restart policy."""
        alloc = self.store.allocs.get(alloc_id)
        if alloc is None:
            raise NomadError(404, "alloc not found")
        if not self.client.task_exit(alloc_id, 137 if oom else 1, oom):
            raise NomadError(
                409,
                f"allocation {alloc_id} has no running task (client status {alloc.client_status})",
            )

    def exec_processes(self, alloc_id: str) -> list[int]:
        """Live processes the allocation's executions started (marker scan)."""
        return self.driver.processes(alloc_id)

    def task_dir(self, alloc_id: str, task: str | None = None) -> Path | None:
        """The working directory of the allocation's task (the group's first
        by default) while it runs, else None."""
        return self.driver.task_dir(alloc_id, task)

    @property
    def setuser_path(self) -> str:
        """Absolute path of the simulator's stand-in for `/sbin/setuser`."""
        return self.driver.setuser_path

    def stats(self) -> JsonDict:
        jobs: dict[str, int] = {}
        for rec in self.store.jobs.values():
            jobs[rec.spec["Status"]] = jobs.get(rec.spec["Status"], 0) + 1
        allocs: dict[str, int] = {}
        for a in self.store.allocs.values():
            allocs[a.client_status] = allocs.get(a.client_status, 0) + 1
        return {
            "Index": self.store.index,
            "Requests": dict(sorted(self.requests.items())),
            "Jobs": jobs,
            "Allocations": allocs,
            "JobsRegisteredTotal": self.store.jobs_ever_registered,
            "EventFramesPublished": self.broker.published,
            "EventSubscribers": self.broker.subscribers,
        }
