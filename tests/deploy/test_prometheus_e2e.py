"""A real Prometheus server with deploy/prometheus/prometheus.yml and
alerts.yml scraping a real controller (`dev` mode): the nrc_ series arrive,
every alert rule loads and evaluates without error, every series the alerts
and the dashboard select exists, every dashboard query runs, and against a
healthy controller no alert's condition holds.

Only the scrape target (the controller's free port) and the intervals (1 s, to
keep this fast) differ from the shipped file; Prometheus listens on loopback
and is given nothing to reach but the controller."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.deploy.support import (
    PROMETHEUS_DIR,
    alert_rules,
    dashboard_exprs,
    grafana_substitute,
    load_yaml,
    require_tool,
    selectors,
)
from tests.helpers import wait_until
from tests.support.ports import free_port
from tests.support.processes import ChildProcess

JOB = "nomad-runner-controller"  # the shipped scrape job
# Selectors that a healthy dev controller may rightly leave empty.
MAY_BE_EMPTY = {
    'nrc_nomad_requests_total{status!~"2.."}',  # every Nomad request succeeded
    # the controller here runs the default static policy: no adaptive target
    'nrc_prewarm_target_runners{environment=~".*"}',
    'nrc_prewarm_forecast_claims_per_second{environment=~".*"}',
}


def pointed_at(target: str, workdir: Path) -> Path:
    """The shipped prometheus.yml with `target` as every scrape target, 1 s
    intervals, and alerts.yml beside it; the path of the copy."""
    config: dict[str, Any] = load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    assert not config.get("alerting"), "no Alertmanager: Prometheus would try to reach it"
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    for job in config["scrape_configs"]:
        assert set(job) <= {"job_name", "metrics_path", "static_configs"}, (
            f"{job['job_name']}: only static targets can be pointed at the test's controller"
        )
        for static in job["static_configs"]:
            static["targets"] = [target]
    for rule_file in config["rule_files"]:
        shutil.copy(PROMETHEUS_DIR / rule_file, workdir / rule_file)
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()

    def api(self, path: str, **params: str) -> Any:
        response = self.session.get(f"{self.url}/api/v1/{path}", params=params, timeout=5)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result


@pytest.fixture(scope="module")
def prometheus(
    dev_controller: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    binary = require_tool("prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = pointed_at(dev_controller.removeprefix("http://"), workdir)
    url = f"http://127.0.0.1:{free_port()}"
    log = workdir / "prometheus.log"
    proc = ChildProcess(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}",
        ],
        log=log,
        cwd=workdir,
    )
    try:
        wait_until(lambda: not proc.alive() or _ready(url), timeout=15, interval=0.05)
        assert proc.alive(), log.read_text()
        server = Prometheus(url)
        # Prometheus hands discovered targets to its scrapers every 5 s.
        wait_until(lambda: server.query(f'up{{job="{JOB}"}} == 1'), timeout=15, interval=0.1)
        yield server
    finally:
        proc.stop(timeout=10)


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def test_it_scrapes_the_controller_and_ingests_its_series(
    prometheus: Prometheus, dev_controller: str
) -> None:
    (target,) = prometheus.api("targets")["activeTargets"]
    assert target["labels"]["job"] == JOB
    assert target["scrapeUrl"] == f"{dev_controller}/metrics"
    assert target["health"] == "up"
    # The demo environment's pool, as the controller exports it.
    wait_until(
        lambda: prometheus.query('nrc_pool_desired_runners{environment="1"} == 5'),
        timeout=10,
        interval=0.1,
    )
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in requests.get(f"{dev_controller}/metrics", timeout=5).text.splitlines()
        if line.startswith("nrc_")
    }

    def missing() -> set[str]:
        return exported - set(prometheus.api("label/__name__/values"))

    wait_until(lambda: not missing(), timeout=10, interval=0.1)


def test_every_alert_rule_is_loaded_and_evaluates(prometheus: Prometheus) -> None:
    wanted = [rule["alert"] for rule in alert_rules()]

    def evaluated() -> list[dict[str, Any]]:
        groups = prometheus.api("rules", type="alert")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        done = all(rule["health"] != "unknown" for rule in rules)
        return rules if done and len(rules) == len(wanted) else []

    rules = wait_until(evaluated, timeout=10, interval=0.1)
    assert [rule["name"] for rule in rules] == wanted
    # "ok" means the expression ran against the real series without error (a
    # many-to-many match in a join would be "err").
    assert {rule["name"]: rule["health"] for rule in rules} == dict.fromkeys(wanted, "ok")


def test_every_series_the_alerts_and_the_dashboard_select_exists(prometheus: Prometheus) -> None:
    exprs = [rule["expr"] for rule in alert_rules()] + [e for _, e in dashboard_exprs()]
    wanted = {grafana_substitute(s.text) for e in exprs for s in selectors(e)} - MAY_BE_EMPTY

    def empty() -> list[str]:
        return sorted(s for s in wanted if not prometheus.query(f"count({s})"))

    try:
        wait_until(lambda: not empty(), timeout=10, interval=0.2)
    except AssertionError:
        pytest.fail(f"no series for: {empty()}")


def test_every_dashboard_query_runs(prometheus: Prometheus) -> None:
    for _, expr in dashboard_exprs():
        prometheus.query(grafana_substitute(expr))  # asserts that Prometheus ran it
    # The pool panel's join on the leader finds the leading replica's gauges.
    pool = next(e for t, e in dashboard_exprs() if t.startswith("Runners of environment"))
    states = wait_until(
        lambda: {r["metric"].get("state") for r in prometheus.query(grafana_substitute(pool))},
        timeout=10,
        interval=0.1,
    )
    assert states == {"idle", "starting", "claimed"}


def test_no_alert_condition_holds_for_a_healthy_controller(prometheus: Prometheus) -> None:
    rules = alert_rules()

    def holding() -> dict[str, Any]:
        return {r["alert"]: res for r in rules if (res := prometheus.query(r["expr"]))}

    # Until the demo pool is full, RunnerPoolDepleting's condition may hold.
    try:
        wait_until(lambda: not holding(), timeout=10, interval=0.2)
    except AssertionError:
        pytest.fail(f"alert conditions hold: {holding()}")
    firing = [a for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"]
    assert firing == []
