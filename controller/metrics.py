"""Prometheus metrics of the controller, on a registry the caller owns (no
global registry, so tests and several controllers in one process never clash).
All names start with `nrc_`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_STARTUP = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.nomad_requests = Counter(
            "nrc_nomad_requests",
            "HTTP requests to Nomad by operation and outcome (ok, conflict, error, unavailable).",
            ["operation", "outcome"],
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
            "nrc_nomad_writes",
            "Writes the reconciler issued, by action and outcome.",
            ["action", "outcome"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "nrc_reconcile_duration_seconds",
            "Duration of one reconcile pass of one environment.",
            buckets=_FAST,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "nrc_reconcile_errors", "Reconcile passes that failed and were retried.", registry=r
        )
        self.observe_seconds = Histogram(
            "nrc_observe_duration_seconds",
            "Duration of one observation of Nomad (lists and changed job specs).",
            buckets=_FAST,
            registry=r,
        )
        self.stale_lists = Counter(
            "nrc_stale_lists",
            "Lists discarded because their index was older than one already seen.",
            registry=r,
        )
        self.queue_depth = Gauge("nrc_queue_depth", "Environments waiting for a pass.", registry=r)
        self.pool_runners = Gauge(
            "nrc_pool_runners",
            "Runners per environment by state (idle_ready, idle_starting, claimed, lost).",
            ["environment", "state"],
            registry=r,
        )
        self.pool_desired = Gauge(
            "nrc_pool_desired", "prewarmingPoolSize per environment.", ["environment"], registry=r
        )
        self.environment_degraded = Gauge(
            "nrc_environment_degraded",
            "1 while an environment's new runners keep failing to start.",
            ["environment"],
            registry=r,
        )
        self.claims = Counter(
            "nrc_claims",
            "Claim attempts by outcome (claimed, empty, conflict).",
            ["outcome"],
            registry=r,
        )
        self.claim_seconds = Histogram(
            "nrc_claim_duration_seconds",
            "Duration of a successful claim.",
            buckets=_FAST,
            registry=r,
        )
        self.runner_losses = Counter(
            "nrc_runner_losses",
            "Claimed runners whose file system was reset, by reason.",
            ["reason"],
            registry=r,
        )
        self.runner_startup_seconds = Histogram(
            "nrc_runner_startup_seconds",
            "From placement to running, for runners seen ready for the first time.",
            buckets=_STARTUP,
            registry=r,
        )
        self.invariant_violations = Counter(
            "nrc_invariant_violations",
            "Conditions that must never happen (e.g. a runner claimed twice). Page on any.",
            ["invariant"],
            registry=r,
        )
        self.event_stream_connected = Gauge(
            "nrc_event_stream_connected", "1 while the Nomad event stream is connected.", registry=r
        )
        self.leader = Gauge("nrc_leader", "1 while this replica is the leader.", registry=r)

    def record_request(self, operation: str, outcome: str, seconds: float) -> None:
        self.nomad_requests.labels(operation, outcome).inc()
        self.nomad_request_seconds.labels(operation).observe(seconds)
