"""The Prometheus configuration and alert rules: promtool's own checks and the
unit tests in deploy/prometheus/alerts_test.yml, plus what promtool cannot
know: that every series they name is one the controller exports, with its
labels and label values, and that every alert has its runbook."""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict

import pytest

from controller.metrics import Metrics
from tests.deploy.support import (
    PROMETHEUS_DIR,
    REPO,
    Selector,
    alert_rules,
    dashboard_exprs,
    load_yaml,
    metric_series,
    require_tool,
    selectors,
)

ALERTS = alert_rules()
ALERT_NAMES = [rule["alert"] for rule in ALERTS]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "config", "deploy/prometheus/prometheus.yml"),
        ("check", "rules", "deploy/prometheus/alerts.yml"),
        ("test", "rules", "deploy/prometheus/alerts_test.yml"),
    ],
    ids=["check-config", "check-rules", "test-rules"],
)
def test_promtool(args: tuple[str, ...]) -> None:
    result = promtool(*args)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_make_every_alert_fire_and_stay_quiet() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in load_yaml(PROMETHEUS_DIR / "alerts_test.yml")["tests"]:
        for case in test.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else quiet).add(case["alertname"])
    assert sorted(fires) == sorted(ALERT_NAMES), "an alert never fires in alerts_test.yml"
    assert sorted(quiet) == sorted(ALERT_NAMES), "an alert is never checked quiet"


def test_the_issue_asks_for_these_alerts() -> None:
    assert ALERT_NAMES == [
        "RunnerPoolDepleting",
        "RunnerEnvironmentDegraded",
        "RunnerReconcileErrorsRising",
        "RunnerEventStreamDisconnected",
        "RunnerControllerNoLeader",
        "ClaimedRunnerLossRateHigh",
        "RunnerWarmPoolMisses",
        "RunnerInvariantViolated",
        "RunnerControllerDown",
    ]
    invariant = ALERTS[ALERT_NAMES.index("RunnerInvariantViolated")]
    assert invariant["labels"]["severity"] == "critical" and "for" not in invariant


def test_every_alert_has_a_severity_and_a_runbook() -> None:
    operations = (REPO / "docs" / "operations.md").read_text()
    readme_alerts = (REPO / "README.md").read_text().split("\n## Alerts\n", 1)[1]
    readme_alerts = readme_alerts.split("\n## ", 1)[0]
    for rule in ALERTS:
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(annotations), name
        anchor = f"docs/operations.md#{name.lower()}"
        assert annotations["runbook"].endswith(f"See {anchor}."), name
        assert re.search(rf"^### {name}$", operations, re.M), f"docs/operations.md: ### {name}"
        assert f"`{name}`" in readme_alerts, f"README's Alerts section does not name {name}"


def series_values() -> dict[tuple[str, str], set[str]]:
    """Label values that exist from start-up and once an environment is known,
    by (series, label): the sets an alert or panel can select among. Labels
    whose values come from outside (environment ids, Nomad operations and
    statuses, event topics) are left to the end-to-end test."""
    metrics = Metrics()
    metrics.init_environment(1)
    values: dict[tuple[str, str], set[str]] = defaultdict(set)
    for family in metrics.registry.collect():
        for sample in family.samples:
            for label, value in sample.labels.items():
                values[(sample.name, label)].add(value)
    return values


SERIES = metric_series()
VALUES = series_values()


def check_selector(selector: Selector) -> list[str]:
    """Problems of one selector: an unknown series, label, or label value."""
    if selector.metric == "up":
        return []
    if selector.metric not in SERIES:
        return [f"{selector.text}: the controller exports no series {selector.metric}"]
    problems = []
    for label, op, value in selector.matchers:
        if label not in SERIES[selector.metric]:
            problems.append(f"{selector.text}: {selector.metric} has no label {label}")
            continue
        known = VALUES.get((selector.metric, label))
        if not known or label == "environment":
            continue
        # An exact value, or a regex that is a plain alternation of values.
        wanted = [value] if op in ("=", "!=") else value.split("|")
        if op in ("=~", "!~") and not all(re.fullmatch(r"[\w-]+", w) for w in wanted):
            continue
        problems += [
            f"{selector.text}: {label}={w!r} never occurs" for w in wanted if w not in known
        ]
    return problems


@pytest.mark.parametrize(
    ("where", "expr"),
    [(f"alert {rule['alert']}", rule["expr"]) for rule in ALERTS]
    + [(f"panel {title!r}", expr) for title, expr in dashboard_exprs()],
)
def test_every_series_named_is_exported_with_those_labels(where: str, expr: str) -> None:
    found = list(selectors(expr))
    assert found, f"{where}: names none of the controller's series"
    problems = [p for s in found for p in check_selector(s)]
    assert not problems, f"{where}: " + "; ".join(problems)


def test_alerts_select_generic_series_by_the_controllers_own_labels() -> None:
    # controller-runtime and client-go names are shared with other controllers
    # a Prometheus may scrape: select ours by label value.
    for rule in ALERTS:
        for s in selectors(rule["expr"]):
            if s.metric.startswith(("controller_runtime_", "workqueue_", "leader_election_")):
                labels = {label for label, _, _ in s.matchers}
                assert labels & {"controller", "name"}, f"{rule['alert']}: {s.text}"


def test_down_alert_matches_the_scrape_jobs() -> None:
    jobs = [
        job["job_name"] for job in load_yaml(PROMETHEUS_DIR / "prometheus.yml")["scrape_configs"]
    ]
    rule = ALERTS[ALERT_NAMES.index("RunnerControllerDown")]
    (up,) = [s for s in selectors(rule["expr"]) if s.metric == "up"]
    ((_, _, pattern),) = up.matchers
    assert jobs and all(re.fullmatch(pattern, job) for job in jobs)
