"""Metrics: names dashboards expect, label sets present from start-up."""

from __future__ import annotations

from prometheus_client import generate_latest

from controller.metrics import Metrics


def test_generic_and_domain_series_exist_at_zero_from_start_up() -> None:
    m = Metrics()
    m.init_environment(7)
    text = generate_latest(m.registry).decode()
    for series in [
        'controller_runtime_reconcile_total{controller="runner-pool",result="success"} 0.0',
        'controller_runtime_reconcile_errors_total{controller="runner-pool"} 0.0',
        'workqueue_depth{name="environments"} 0.0',
        'workqueue_retries_total{name="environments"} 0.0',
        'nrc_invariant_violations_total{invariant="claimed_twice"} 0.0',
        'nrc_invariant_violations_total{invariant="claimed_in_pool"} 0.0',
        'nrc_runner_losses_total{reason="migrated"} 0.0',
        'nrc_claims_total{result="empty"} 0.0',
        'nrc_runners{environment="7",state="idle"} 0.0',
        'nrc_pool_desired_runners{environment="7"} 0.0',
        'nrc_overcreation_guard_total{guard="expectation"} 0.0',
        "nrc_event_stream_connected 0.0",
    ]:
        assert series in text, series
    assert "controller_runtime_reconcile_time_seconds_bucket" in text
    assert "workqueue_queue_duration_seconds_bucket" in text


def test_an_environment_s_series_go_with_it() -> None:
    m = Metrics()
    m.init_environment(7)
    m.drop_environment(7)
    assert 'environment="7",state' not in generate_latest(m.registry).decode()


def test_nomad_requests_by_operation_and_status() -> None:
    m = Metrics()
    m.record_request("register_job", "conflict", "500", 0.01)
    assert (
        'nrc_nomad_requests_total{operation="register_job",status="500"} 1.0'
        in generate_latest(m.registry).decode()
    )
