"""Prometheus metrics, on a registry the caller owns (no global registry, so
tests and several controllers in one process never clash).

The generic machinery uses controller-runtime's and client-go's names, so
existing Kubernetes-controller dashboards work unchanged; domain metrics
start with `nrc_`. Every label value a dashboard or alert needs is created at
start-up (at 0), so a rate() over it exists before the first occurrence.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controller.model import LossReason

CONTROLLER = "runner-pool"  # the `controller` / `name` label of the generic metrics
QUEUE = "environments"

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_STARTUP = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

RUNNER_STATES = ("idle", "starting", "claimed", "lost")
CLAIM_RESULTS = ("claimed", "empty", "conflict", "error")
DELETE_REASONS = (
    "surplus",
    "outdated",
    "dead",
    "failed_to_start",
    "startup_timeout",
    "inactivity_timeout",
    "lost_retention",
    "orphan",
    "released",
)
RECONCILE_RESULTS = ("success", "error", "requeue_after")
INVARIANTS = ("claimed_twice", "claimed_in_pool")
GUARDS = ("expectation", "stale_list")
EXECUTION_RESULTS = ("exit", "timeout", "lost", "error", "client_disconnected")
EXECUTION_STREAMS = ("stdin", "stdout", "stderr")
FILE_OPERATIONS = ("copy", "list", "download")
# ok; bad_request (400/413/416); lost (410: the runner is gone or was reset);
# not_found (424); conflict (409); failed (500: the runner could not);
# nomad_error (500: Nomad refused or broke off the exec); interrupted (the
# stream broke off after its answer had started).
FILE_RESULTS = (
    "ok",
    "bad_request",
    "lost",
    "not_found",
    "conflict",
    "failed",
    "nomad_error",
    "interrupted",
)
FILE_BYTES = ("copy", "download")
ACTIVITY_OPERATIONS = ("publish", "read", "delete")
ACTIVITY_RESULTS = ("ok", "error")
_EXECUTION = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        # -- controller-runtime / client-go names ------------------------------------
        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Reconcile passes by result.",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Reconcile passes that failed (retried with backoff).",
            ["controller"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Duration of one reconcile pass of one environment.",
            ["controller"],
            buckets=_FAST,
            registry=r,
        )
        self.queue_depth = Gauge(
            "workqueue_depth", "Keys waiting in the work queue.", ["name"], registry=r
        )
        self.queue_adds = Counter(
            "workqueue_adds_total", "Keys added to the work queue.", ["name"], registry=r
        )
        self.queue_wait_seconds = Histogram(
            "workqueue_queue_duration_seconds",
            "How long a key waited in the queue before a worker took it.",
            ["name"],
            buckets=_FAST,
            registry=r,
        )
        self.queue_work_seconds = Histogram(
            "workqueue_work_duration_seconds",
            "How long a worker spent on one key.",
            ["name"],
            buckets=_FAST,
            registry=r,
        )
        self.queue_retries = Counter(
            "workqueue_retries_total",
            "Keys re-queued with backoff after an error.",
            ["name"],
            registry=r,
        )
        self.leader = Gauge(
            "leader_election_master_status",
            "1 while this replica is the leader (always 1 without leader election).",
            ["name"],
            registry=r,
        )

        # -- domain ------------------------------------------------------------------
        self.runners = Gauge(
            "nrc_runners",
            "Runners per environment by state: idle (ready, unclaimed), starting, claimed, lost "
            "(claim ended, kept to tell the client).",
            ["environment", "state"],
            registry=r,
        )
        self.pool_desired = Gauge(
            "nrc_pool_desired_runners",
            "prewarmingPoolSize per environment.",
            ["environment"],
            registry=r,
        )
        self.prewarm_target = Gauge(
            "nrc_prewarm_target_runners",
            "The adaptive pool size per environment (NRC_PREWARM_POLICY=adaptive only).",
            ["environment"],
            registry=r,
        )
        self.prewarm_forecast = Gauge(
            "nrc_prewarm_forecast_claims_per_second",
            "The claim rate the adaptive pool is sized for, per environment.",
            ["environment"],
            registry=r,
        )
        self.prewarm_misses = Counter(
            "nrc_prewarm_misses_total",
            "Claims that found no ready runner at once (answered NOMAD_OVERLOAD, or served "
            "after waiting NRC_CLAIM_WAIT), per environment.",
            ["environment"],
            registry=r,
        )
        self.idle_runner_seconds = Counter(
            "nrc_idle_runner_seconds_total",
            "Runner-seconds spent idle (ready or starting, unclaimed), per environment.",
            ["environment"],
            registry=r,
        )
        self.environment_degraded = Gauge(
            "nrc_environment_degraded",
            "1 while an environment's new runners keep failing to start (creation backs off).",
            ["environment"],
            registry=r,
        )
        self.claims = Counter(
            "nrc_claims_total",
            "Claim attempts by result (claimed; empty: no ready runner; conflict: another "
            "writer won one runner, the next was tried; error: Nomad failed).",
            ["result"],
            registry=r,
        )
        self.claim_seconds = Histogram(
            "nrc_claim_duration_seconds",
            "Duration of a successful claim, Nomad write included.",
            buckets=_FAST,
            registry=r,
        )
        self.runner_startup_seconds = Histogram(
            "nrc_runner_startup_duration_seconds",
            "From placement to running, for each allocation seen ready for the first time.",
            buckets=_STARTUP,
            registry=r,
        )
        self.runner_losses = Counter(
            "nrc_runner_losses_total",
            "Claimed runners whose file system was reset, by reason.",
            ["reason"],
            registry=r,
        )
        self.jobs_created = Counter(
            "nrc_jobs_created_total", "Runner jobs created.", ["environment"], registry=r
        )
        self.jobs_deleted = Counter(
            "nrc_jobs_deleted_total", "Runner jobs deleted, by reason.", ["reason"], registry=r
        )
        self.activity_sync = Counter(
            "nrc_activity_sync_total",
            "Runner activity shared between replicas through Nomad variables (leader "
            "election only): publish (this replica's changed activity written), read (the leader's "
            "look at every replica's), delete (a stopped or crashed replica's removed), "
            "by result.",
            ["operation", "result"],
            registry=r,
        )
        self.nomad_requests = Counter(
            "nrc_nomad_requests_total",
            "HTTP requests to Nomad by operation and status (`none`: no answer), retries "
            "included; exec handshakes as `exec_node` (on the allocation's node), `exec` "
            "(NOMAD_ADDR) and `exec_fallback` (the node's agent could not be reached).",
            ["operation", "status"],
            registry=r,
        )
        self.nomad_request_seconds = Histogram(
            "nrc_nomad_request_duration_seconds",
            "Duration of HTTP requests to Nomad.",
            ["operation"],
            buckets=_FAST,
            registry=r,
        )
        self.nomad_writes = Counter(
            "nrc_nomad_writes_total",
            "Writes the reconciler issued, by action and outcome.",
            ["action", "outcome"],
            registry=r,
        )
        self.gc_pause_seconds = Histogram(
            "nrc_gc_pause_seconds",
            "Duration of one full (generation 2) garbage collection of the controller process, "
            "automatic or paced (NRC_GC_FREEZE_INTERVAL): every request in flight waits for it.",
            buckets=_FAST,
            registry=r,
        )
        self.observe_seconds = Histogram(
            "nrc_observe_duration_seconds",
            "Duration of one observation of Nomad (lists plus changed job specs).",
            buckets=_FAST,
            registry=r,
        )
        self.events = Counter(
            "nrc_events_total",
            "Nomad events received, by topic and type.",
            ["topic", "type"],
            registry=r,
        )
        self.event_stream_connected = Gauge(
            "nrc_event_stream_connected", "1 while the Nomad event stream is connected.", registry=r
        )
        self.event_stream_reconnects = Counter(
            "nrc_event_stream_reconnects_total",
            "Times the event stream connected again after losing its connection.",
            registry=r,
        )
        self.guard_hits = Counter(
            "nrc_overcreation_guard_total",
            "Times a lagging view of Nomad would have caused over-creation and a guard stopped it "
            "(expectation: creations issued but not yet listed; stale_list: a list older than one "
            "already seen).",
            ["guard"],
            registry=r,
        )
        self.invariant_violations = Counter(
            "nrc_invariant_violations_total",
            "Conditions that must never happen: claimed_twice (a runner we hand out claimed by "
            "another writer), claimed_in_pool (a runner we hand out seen idle). Page on any.",
            ["invariant"],
            registry=r,
        )
        self.executions = Counter(
            "nrc_executions_total",
            "Executions by how they ended: exit (the command's exit code), timeout, lost (the "
            "runner was reset under it), error (Nomad refused or broke off the exec, or the "
            "runner was released), client_disconnected.",
            ["result"],
            registry=r,
        )
        self.execution_seconds = Histogram(
            "nrc_execution_duration_seconds",
            "From the WebSocket connect to the terminal frame (or the client leaving).",
            buckets=_EXECUTION,
            registry=r,
        )
        self.executions_active = Gauge(
            "nrc_executions_active", "Executions connected right now.", registry=r
        )
        self.execution_bytes = Counter(
            "nrc_execution_bytes_total",
            "Bytes relayed between clients and commands: stdin to them, stdout and stderr "
            "from them.",
            ["stream"],
            registry=r,
        )
        self.file_operations = Counter(
            "nrc_file_operations_total",
            "File operations (copy: PATCH /files, list: GET /files, download: GET /files/raw) "
            "by result: " + ", ".join(FILE_RESULTS) + ".",
            ["operation", "result"],
            registry=r,
        )
        self.file_bytes = Counter(
            "nrc_file_bytes_total",
            "File content moved: copy (decoded bytes written into runners by successful "
            "copies), download (bytes sent to clients).",
            ["operation"],
            registry=r,
        )
        self._initialise()

    def _initialise(self) -> None:
        for execution_result in EXECUTION_RESULTS:
            self.executions.labels(execution_result)
        for stream in EXECUTION_STREAMS:
            self.execution_bytes.labels(stream)
        for operation in FILE_OPERATIONS:
            for file_result in FILE_RESULTS:
                self.file_operations.labels(operation, file_result)
        for operation in FILE_BYTES:
            self.file_bytes.labels(operation)
        self.reconcile_errors.labels(CONTROLLER)
        for result in RECONCILE_RESULTS:
            self.reconcile_total.labels(CONTROLLER, result)
        self.reconcile_seconds.labels(CONTROLLER)
        for metric in (self.queue_depth, self.queue_adds, self.queue_retries, self.leader):
            metric.labels(QUEUE if metric is not self.leader else CONTROLLER)
        self.queue_wait_seconds.labels(QUEUE)
        self.queue_work_seconds.labels(QUEUE)
        for claim_result in CLAIM_RESULTS:
            self.claims.labels(claim_result)
        for reason in LossReason:
            self.runner_losses.labels(reason.value)
        for delete_reason in DELETE_REASONS:
            self.jobs_deleted.labels(delete_reason)
        for invariant in INVARIANTS:
            self.invariant_violations.labels(invariant)
        for guard in GUARDS:
            self.guard_hits.labels(guard)
        for operation in ACTIVITY_OPERATIONS:
            for result in ACTIVITY_RESULTS:
                self.activity_sync.labels(operation, result)
        for action in ("create", "delete", "end_claim"):
            for outcome in ("ok", "error", "conflict", "unavailable"):
                self.nomad_writes.labels(action, outcome)

    def record_request(self, operation: str, outcome: str, status: str, seconds: float) -> None:
        """The NomadClient's on_request hook."""
        self.nomad_requests.labels(operation, status).inc()
        self.nomad_request_seconds.labels(operation).observe(seconds)

    def init_environment(self, env_id: int) -> None:
        label = str(env_id)
        for state in RUNNER_STATES:
            self.runners.labels(label, state)
        self.pool_desired.labels(label)
        self.environment_degraded.labels(label)
        self.jobs_created.labels(label)
        self.prewarm_misses.labels(label)
        self.idle_runner_seconds.labels(label)

    def drop_environment(self, env_id: int) -> None:
        label = str(env_id)
        with contextlib.suppress(KeyError):  # never initialised: nothing to drop
            for state in RUNNER_STATES:
                self.runners.remove(label, state)
            for gauge in (self.pool_desired, self.environment_degraded):
                gauge.remove(label)
        with contextlib.suppress(KeyError):  # static pools export none
            for gauge in (self.prewarm_target, self.prewarm_forecast):
                gauge.remove(label)
