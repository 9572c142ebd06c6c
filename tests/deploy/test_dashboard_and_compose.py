"""The Grafana dashboard (well-formed, shows what the issue asks for) and
deploy/compose.yaml (refers only to what exists and sets only settings the
controller reads). Their queries and series are checked against the
controller in test_prometheus_rules.py and test_prometheus_e2e.py."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from controller.config import load_settings, variables
from tests.deploy.support import (
    COMPOSE,
    DASHBOARD,
    DEPLOY,
    DOCKERFILE,
    GRAFANA_VARIABLES,
    PROMETHEUS_DIR,
    dashboard_exprs,
    image_env,
    load_yaml,
    selectors,
)

BOARD: dict[str, Any] = json.loads(DASHBOARD.read_text())
PANELS = [p for p in BOARD["panels"] if p["type"] != "row"]


def test_dashboard_panels_are_well_formed() -> None:
    assert BOARD["uid"] and BOARD["title"]
    ids = [p["id"] for p in BOARD["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables_defined = {v["name"] for v in BOARD["templating"]["list"]}
    assert variables_defined == {"datasource", "environment"}
    for panel in PANELS:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in BOARD["panels"]:
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_dashboard_queries_use_only_its_own_variables() -> None:
    for title, expr in dashboard_exprs():
        for variable in re.findall(r"\$\{?\w+", expr):
            assert variable.replace("{", "") in GRAFANA_VARIABLES, f"{title}: {variable}"


def test_dashboard_shows_what_operators_asked_for() -> None:
    named = {s.metric for _, expr in dashboard_exprs() for s in selectors(expr)}
    wanted = {
        # pools: idle / starting / claimed vs desired
        "nrc_runners",
        "nrc_pool_desired_runners",
        "nrc_environment_degraded",
        # claim latency, startup duration, losses by reason
        "nrc_claims_total",
        "nrc_claim_duration_seconds_bucket",
        "nrc_runner_startup_duration_seconds_bucket",
        "nrc_runner_losses_total",
        # reconcile duration and queue depth
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "workqueue_depth",
        "leader_election_master_status",
        "nrc_event_stream_connected",
        # Nomad request rates and errors
        "nrc_nomad_requests_total",
        "nrc_nomad_request_duration_seconds_bucket",
    }
    assert wanted <= named, sorted(wanted - named)
    pools = [expr for _, expr in dashboard_exprs() if "nrc_runners" in expr]
    assert any(all(s in expr for s in ("idle", "starting", "claimed")) for expr in pools)


COMPOSE_DOC: dict[str, Any] = load_yaml(COMPOSE)
SERVICES: dict[str, Any] = COMPOSE_DOC["services"]


def test_compose_runs_nomad_the_controller_and_prometheus() -> None:
    assert set(SERVICES) == {"nomad", "controller", "prometheus"}
    nomad = SERVICES["nomad"]
    assert nomad["image"].startswith("hashicorp/nomad:")
    assert "-dev" in nomad["command"]
    assert SERVICES["prometheus"]["image"].startswith("prom/prometheus:")


def test_compose_builds_the_controller_from_this_repository() -> None:
    build = SERVICES["controller"]["build"]
    assert (DEPLOY / build["context"]).resolve() / build["dockerfile"] == DOCKERFILE


def controller_env() -> dict[str, str]:
    """The controller's environment as compose makes it, a token exported."""
    env = {str(k): str(v) for k, v in SERVICES["controller"]["environment"].items()}
    # `${VAR:?message}`: compose refuses to start without VAR (fail closed).
    assert env["NRC_API_TOKEN"].startswith("${NRC_API_TOKEN:?")
    return {**env, "NRC_API_TOKEN": "exported-token-0123456789"}


def test_compose_controller_settings_are_ones_the_controller_reads() -> None:
    env = controller_env()
    assert set(env) <= set(variables())
    settings = load_settings({**image_env(), **env})
    assert settings.open_api_problem() is None
    assert urlsplit(settings.nomad_addr).hostname == "nomad"
    assert f"{settings.api_port}:{settings.api_port}" in SERVICES["controller"]["ports"]


def test_compose_prometheus_loads_the_shipped_files_and_scrapes_the_controller() -> None:
    volumes = {}
    for volume in SERVICES["prometheus"]["volumes"]:
        source, target, *_ = volume.split(":")
        assert (DEPLOY / source).is_file(), volume
        volumes[target] = (DEPLOY / source).resolve()
    config_flag = next(a for a in SERVICES["prometheus"]["command"] if "--config.file=" in a)
    config_path = config_flag.split("=", 1)[1]
    assert volumes[config_path] == PROMETHEUS_DIR / "prometheus.yml"
    config = load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    # rule_files resolve next to the config file inside the container too.
    for rule_file in config["rule_files"]:
        inside = config_path.rsplit("/", 1)[0] + "/" + rule_file
        assert volumes[inside] == PROMETHEUS_DIR / rule_file
    targets = [
        t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    ]
    port = load_settings({**image_env(), **controller_env()}).api_port
    assert targets == [f"controller:{port}"]
