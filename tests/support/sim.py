"""The simulator's timings for tests: short and fixed, so the suite is fast and
deterministic in order (the `make_sim` fixture of tests/conftest.py starts
simulators with them)."""

from __future__ import annotations

FAST = {
    "startup_delay_ms": 30.0,
    "stop_delay_ms": 20.0,
    "migration_stop_lag_ms": 30.0,
    "heartbeat_interval_ms": 200.0,
    "stale_lag_ms": 300.0,
}
