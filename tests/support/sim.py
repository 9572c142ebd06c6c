"""The simulator's settings for tests: short, fixed timings, so the suite is
fast and deterministic in order (the `make_sim` fixture of tests/conftest.py
starts simulators with them), and the topology the suite runs against.

`PRODUCTION_TOPOLOGY` is the one switch: True (the default) runs the suite
through a client agent of a three-server cluster with Nomad's default
limits, as `sim` serves by default and production runs; False puts it back
on the old direct entry (the leader, one server, no connection limits)."""

from __future__ import annotations

from typing import Any

PRODUCTION_TOPOLOGY = True

# The production topology: SimConfig's own defaults.
PRODUCTION: dict[str, Any] = {
    "servers": 3,
    "entry": "client",
    "http_max_conns_per_client": 100,
    "rpc_max_conns_per_client": 100,
}
# The old kindness: requests go straight to the leader, nothing is limited.
DIRECT: dict[str, Any] = {
    "servers": 1,
    "entry": "leader",
    "http_max_conns_per_client": 0,
    "rpc_max_conns_per_client": 0,
}

TOPOLOGY = PRODUCTION if PRODUCTION_TOPOLOGY else DIRECT

FAST: dict[str, Any] = {
    "startup_delay_ms": 30.0,
    "stop_delay_ms": 20.0,
    "migration_stop_lag_ms": 30.0,
    "heartbeat_interval_ms": 200.0,
    "stale_lag_ms": 300.0,
    **TOPOLOGY,
    # Stops take stop_delay_ms even for jobs without Poseidon's SIGKILL/0s
    # (tests/sim/test_placement.py turns the 5 s kill_timeout wait on).
    "kill_timeouts": False,
}
