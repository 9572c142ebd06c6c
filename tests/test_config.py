"""Configuration from environment variables: defaults, one clear line per bad
variable, Go durations, secrets never shown, typos caught, TLS files checked,
and the mapping onto ControllerSettings, NomadClient and EventStream."""

from __future__ import annotations

import io
import logging
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
import trustme
from pydantic import ValidationError

from controller.config import (
    ConfigError,
    SettingRow,
    Settings,
    describe,
    format_duration,
    is_loopback,
    load_settings,
    parse_duration,
    render_table,
    variables,
)
from controller.execution.ids import replica_key
from controller.model import SECOND
from controller.nomad.client import NomadClient
from controller.nomad.connection import NomadConnection
from controller.nomad.events import EventRef
from controller.nomad.exec import ExecClient
from controller.nomad.jobs import TemplatePolicy
from controller.nomad.stream import EventStream
from controller.reconcile.loop import ControllerSettings
from controller.reconcile.plan import PlanSettings
from controller.reconcile.prewarming import PrewarmSettings

NOMAD_TOKEN = "3f9c1e1a-nomad-secret-token"
API_TOKEN = "api-secret-token-0b7d"

ALL_VARIABLES = [
    "NOMAD_ADDR",
    "NOMAD_TOKEN",
    "NOMAD_NAMESPACE",
    "NOMAD_REGION",
    "NOMAD_CACERT",
    "NOMAD_CLIENT_CERT",
    "NOMAD_CLIENT_KEY",
    "NOMAD_SKIP_VERIFY",
    "NRC_API_HOST",
    "NRC_API_PORT",
    "NRC_API_TOKEN",
    "NRC_API_WEBSOCKET_SCHEME",
    "NRC_API_TRUST_PROXY_HEADERS",
    "NRC_API_ADVERTISE_URL",
    "NRC_REPLICA_SECRET",
    "NRC_SHUTDOWN_GRACE",
    "NRC_EXEC_TASK",
    "NRC_EXEC_UNPRIVILEGED_WRAPPER",
    "NRC_EXEC_SEPARATE_STDERR",
    "NRC_EXEC_BROKEN_END",
    "NRC_EXEC_SIGNAL_LOSS_WINDOW",
    "NRC_LOSS_SETTLE",
    "NRC_NOMAD_CLIENT_SYNC",
    "NRC_EXECUTION_ID_TTL",
    "NRC_FILES_MAX_UPLOAD",
    "NRC_TEMPLATE_MEMORY_RESERVATION",
    "NRC_TEMPLATE_EPHEMERAL_DISK",
    "NRC_TEMPLATE_NETWORK_MODE",
    "NRC_TEMPLATE_DATACENTERS",
    "NRC_TEMPLATE_FORCE_PULL",
    "NRC_TEMPLATE_PIDS_LIMIT",
    "NRC_TEMPLATE_CAP_DROP",
    "NRC_TEMPLATE_NO_NEW_PRIVILEGES",
    "NRC_TEMPLATE_JOB_FILE",
    "NRC_CLAIM_WAIT",
    "NRC_CLAIM_MAX_WAITING",
    "NRC_RESYNC_INTERVAL",
    "NRC_GC_FREEZE_INTERVAL",
    "NRC_GC_FULL_INTERVAL",
    "NRC_GIL_SWITCH_INTERVAL",
    "NRC_ORPHAN_GRACE",
    "NRC_STARTUP_TIMEOUT",
    "NRC_LOST_RUNNER_RETENTION",
    "NRC_NOMAD_WRITE_RATE",
    "NRC_NOMAD_WRITE_CONCURRENCY",
    "NRC_NOMAD_EXEC_ON_NODE",
    "NRC_NOMAD_MAX_CONNS_PER_AGENT",
    "NRC_NOMAD_CONN_QUEUE",
    "NRC_NOMAD_TIMEOUT",
    "NRC_WORKERS",
    "NRC_MAX_BACKOFF",
    "NRC_EVENT_STREAM",
    "NRC_POOL_ALERT_THRESHOLD",
    "NRC_MAX_POOL_SIZE",
    "NRC_FAILURE_BUDGET",
    "NRC_PREWARM_POLICY",
    "NRC_PREWARM_CEILING_MULTIPLE",
    "NRC_PREWARM_CEILING_CAP",
    "NRC_LEADER_ELECTION",
    "NRC_LEADER_LOCK_PATH",
    "NRC_LEADER_TTL",
    "NRC_ACTIVITY_PUBLISH_INTERVAL",
    "NRC_LOG_LEVEL",
    "NRC_LOG_FORMAT",
    "NRC_API_ALLOW_UNAUTHENTICATED",
    "NRC_API_ALLOWED_HOSTS",
    "NRC_API_ALLOWED_ORIGINS",
    "NRC_EXECUTION_MAX_PENDING_PER_RUNNER",
    "NRC_EXECUTION_MAX_PENDING",
    "NRC_EXECUTION_MAX_COMMAND_SIZE",
    "NRC_FILES_MAX_ITEMS",
    "NRC_FILES_MAX_PATH_BYTES",
    "NRC_FILES_MAX_RANGE_HEADER",
    "NRC_FILES_MAX_CONCURRENT_UPLOADS",
    "NRC_FILES_UPLOAD_IDLE_TIMEOUT",
    "NRC_API_REQUEST_HEAD_TIMEOUT",
]


def problems_of(environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(environ)
    return str(info.value).split("\n")


@pytest.fixture
def pem_files(tmp_path: Path) -> dict[str, str]:
    """A CA, a client certificate and its key (and both in one PEM), real
    enough for the TLS context NomadConnection builds."""
    ca = trustme.CA()
    client = ca.issue_cert("nomad-runner-controller")
    files = {name: str(tmp_path / name) for name in ("ca.pem", "cert.pem", "key.pem", "both.pem")}
    ca.cert_pem.write_to_path(files["ca.pem"])
    client.cert_chain_pems[0].write_to_path(files["cert.pem"])
    client.private_key_pem.write_to_path(files["key.pem"])
    client.private_key_and_cert_chain_pem.write_to_path(files["both.pem"])
    return files


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.environ without any variable we read or any NRC_* variable."""
    for name in list(os.environ):
        if name in ALL_VARIABLES or name.upper().startswith("NRC_"):
            monkeypatch.delenv(name)


# --- defaults ----------------------------------------------------------------


def test_defaults() -> None:
    s = load_settings({})
    assert s.nomad_addr == "http://127.0.0.1:4646"
    assert s.nomad_token is None
    assert s.nomad_namespace == "default"
    assert s.nomad_region is None
    assert (s.nomad_cacert, s.nomad_client_cert, s.nomad_client_key) == (None, None, None)
    assert s.nomad_skip_verify is False
    assert (s.api_host, s.api_port, s.api_auth_token) == ("127.0.0.1", 7200, None)
    assert s.resync_interval_s == 30.0
    assert s.orphan_grace_s == 60.0
    assert s.startup_timeout_s == 300.0
    assert s.lost_runner_retention_s == 3600.0
    assert s.nomad_write_rate_per_s == 50.0
    assert s.nomad_write_concurrency == 8
    assert s.nomad_timeout_s == 10.0
    assert s.workers == 4
    assert s.max_backoff_s == 30.0
    assert s.event_stream is True
    assert s.pool_alert_threshold == 0.5
    assert s.max_pool_size == 10000
    assert s.failure_budget == 3
    assert s.leader_election is False
    assert s.leader_lock_path == "nomad-runner-controller/leader"
    assert s.leader_ttl_s == 15.0
    assert s.log_level == "INFO"
    assert s.log_format == "auto"


def test_defaults_agree_with_the_loop_and_plan_defaults() -> None:
    # One source of truth per knob: the env defaults must not drift from the
    # library defaults the tests of the loop run with. One knob differs on
    # purpose: an in-process controller (tests on a ManualClock, whose time
    # never passes by itself) answers an empty pool at once; the service
    # waits NRC_CLAIM_WAIT.
    loaded = load_settings({}).controller_settings()
    assert loaded == replace(ControllerSettings(), claim_wait_s=2.0)
    assert ControllerSettings().claim_wait_s == 0.0


def test_empty_variable_counts_as_unset() -> None:
    s = load_settings({"NRC_API_PORT": "", "NOMAD_TOKEN": "", "NRC_LOG_FORMAT": ""})
    assert (s.api_port, s.nomad_token, s.log_format) == (7200, None, "auto")


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch, clean_environ: None) -> None:
    monkeypatch.setenv("NRC_API_PORT", "8080")
    monkeypatch.setenv("NOMAD_NAMESPACE", "sandboxes")
    s = load_settings()
    assert (s.api_port, s.nomad_namespace) == (8080, "sandboxes")
    monkeypatch.setenv("NRC_API_PROT", "8080")
    with pytest.raises(ConfigError, match="NRC_API_PROT"):
        load_settings()


def test_given_mapping_ignores_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NRC_API_PORT", "not a port")
    monkeypatch.setenv("NRC_WORKERS", "9")
    s = load_settings({})
    assert (s.api_port, s.workers) == (7200, 4)


def test_every_field_is_documented_and_has_its_variable() -> None:
    assert list(variables()) == ALL_VARIABLES
    for name, info in Settings.model_fields.items():
        assert info.description and info.description.endswith("."), name
        extra = info.json_schema_extra
        assert isinstance(extra, dict) and extra["allowed"], name


# --- values accepted ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        (" Yes ", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("NO", False),
    ],
)
def test_booleans(text: str, expected: bool) -> None:
    s = load_settings({"NRC_EVENT_STREAM": text, "NRC_LEADER_ELECTION": text})
    assert s.event_stream is expected
    assert s.leader_election is expected


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("debug", "DEBUG"),
        ("Warning", "WARNING"),
        # Poseidon's (logrus') names, as its configuration.yaml has them
        ("TRACE", "DEBUG"),
        ("warn", "WARNING"),
        ("Fatal", "ERROR"),
        ("PANIC", "ERROR"),
    ],
)
def test_log_level_any_case(text: str, level: str) -> None:
    assert load_settings({"NRC_LOG_LEVEL": text}).log_level == level


@pytest.mark.parametrize(
    ("text", "fmt"),
    [("TextFormatter", "text"), ("JSONFormatter", "json"), ("jsonformatter", "json")],
)
def test_poseidons_log_formatters(text: str, fmt: str) -> None:
    assert load_settings({"NRC_LOG_FORMAT": text}).log_format == fmt


def test_an_unknown_log_level_names_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as error:
        load_settings({"NRC_LOG_LEVEL": "VERBOSE"})
    assert "TRACE" in str(error.value) and "WARNING" in str(error.value)


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return self.tty


@pytest.mark.parametrize(
    ("fmt", "tty", "effective"),
    [
        ("auto", True, "text"),
        ("auto", False, "json"),
        ("AUTO", True, "text"),
        ("json", True, "json"),
        ("text", False, "text"),
    ],
)
def test_log_format_auto_follows_the_terminal(fmt: str, tty: bool, effective: str) -> None:
    s = load_settings({"NRC_LOG_FORMAT": fmt})
    assert s.resolve_log_format(FakeStream(tty)) == effective


def test_log_format_auto_with_closed_or_missing_stderr() -> None:
    closed = FakeStream(True)
    closed.close()
    s = load_settings({})
    assert s.resolve_log_format(closed) == "json"
    assert s.resolve_log_format(None) == "json"
    assert s.effective_log_format in ("json", "text")


def test_nomad_addr_forms() -> None:
    assert load_settings({"NOMAD_ADDR": "https://nomad.example:4646/"}).nomad_addr == (
        "https://nomad.example:4646"
    )
    assert load_settings({"NOMAD_ADDR": "http://[::1]:4646"}).nomad_addr == "http://[::1]:4646"


@pytest.mark.parametrize(
    "path",
    ["leader", "a/b/c", "nrc-prod_1~x/leader", "nomad/jobs/controller/leader", "x" * 100],
)
def test_valid_lock_paths(path: str) -> None:
    assert load_settings({"NRC_LEADER_LOCK_PATH": path}).leader_lock_path == path


# --- Go durations ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("0.5", 0.5),
        (".5", 0.5),
        ("0", 0.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("250ms", 0.25),
        ("1500ms", 1.5),
        ("100us", 0.0001),
        ("100µs", 0.0001),  # U+00B5 micro sign
        ("100μs", 0.0001),  # U+03BC Greek mu
        ("2ns", 2e-9),
        ("1m30.5s", 90.5),
        ("1h1m1s1ms", 3661.001),
        ("0.1s", 0.1),
        (" 10s ", 10.0),
        ("-5s", -5.0),
        ("+2m", 120.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "text",
    ["", "s", "5x", "5 s", "1h 30m", "5sec", "1d", "1e3", "1_000", "inf", "nan", "--5s", "5s-"],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (30.0, "30s"),
        (60.0, "1m"),
        (300.0, "5m"),
        (3600.0, "1h"),
        (5400.0, "1h30m"),
        (3661.5, "1h1m1.5s"),
        (0.25, "250ms"),
        (0.0015, "1.5ms"),
        (2e-9, "2ns"),
        (1e-6, "1us"),
        (-90.0, "-1m30s"),
    ],
)
def test_format_duration_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_durations_reach_the_loop_in_their_units() -> None:
    s = load_settings(
        {
            "NRC_STARTUP_TIMEOUT": "1.5h",
            "NRC_ORPHAN_GRACE": "0",
            "NRC_LOST_RUNNER_RETENTION": "250ms",
            "NRC_RESYNC_INTERVAL": "2.5",
        }
    )
    plan = s.controller_settings().plan
    assert plan.startup_timeout_ns == 5400 * SECOND
    assert plan.orphan_grace_ns == 0
    assert plan.lost_retention_ns == SECOND // 4
    assert s.controller_settings().resync_interval_s == 2.5


def test_execution_settings() -> None:
    default = load_settings({}).execution_settings()
    assert default.exec.unprivileged_wrapper == ("/sbin/setuser", "user")
    assert (default.exec.task, default.exec.separate_stderr, default.id_ttl_s) == (
        "default-task",
        True,
        300.0,
    )
    s = load_settings(
        {
            "NRC_EXEC_UNPRIVILEGED_WRAPPER": "'/opt/my tools/su' student",
            "NRC_EXEC_SEPARATE_STDERR": "false",
            "NRC_EXECUTION_ID_TTL": "1m",
            "NRC_API_WEBSOCKET_SCHEME": "WSS",
            "NRC_LOSS_SETTLE": "2s",
        }
    )
    assert s.execution_settings().loss_settle_s == 2.0
    assert s.execution_settings().exec.unprivileged_wrapper == ("/opt/my tools/su", "student")
    assert not s.execution_settings().exec.separate_stderr
    assert s.execution_settings().id_ttl_s == 60.0
    assert s.api_websocket_scheme == "wss"
    none = load_settings({"NRC_EXEC_UNPRIVILEGED_WRAPPER": "None"}).execution_settings()
    assert none.exec.unprivileged_wrapper == ()


def test_template_policy_from_settings() -> None:
    s = load_settings(
        {
            "NRC_TEMPLATE_MEMORY_RESERVATION": "64",
            "NRC_TEMPLATE_EPHEMERAL_DISK": "20",
            "NRC_TEMPLATE_NETWORK_MODE": "cni/secure-bridge",
            "NRC_TEMPLATE_DATACENTERS": "dc1, dc2",
            "NRC_TEMPLATE_FORCE_PULL": "false",
            "NRC_TEMPLATE_PIDS_LIMIT": "0",
            "NRC_TEMPLATE_CAP_DROP": "CAP_NET_RAW, mknod",
            "NRC_TEMPLATE_NO_NEW_PRIVILEGES": "no",
        }
    )
    assert s.template_policy() == TemplatePolicy(
        memory_reservation_mb=64,
        ephemeral_disk_mb=20,
        network_mode="cni/secure-bridge",
        datacenters=("dc1", "dc2"),
        force_pull=False,
        pids_limit=0,
        cap_drop=("net_raw", "mknod"),
        no_new_privileges=False,
    )
    assert load_settings({}).template_policy() == TemplatePolicy(), "defaults agree"
    assert load_settings({"NRC_TEMPLATE_CAP_DROP": "none"}).template_policy().cap_drop == ()


def test_file_settings() -> None:
    default = load_settings({}).file_settings()
    assert default.max_upload_bytes == 100 * 1024 * 1024
    assert default.exec == load_settings({}).execution_settings().exec
    s = load_settings({"NRC_FILES_MAX_UPLOAD": "5000", "NRC_EXEC_TASK": "main"})
    assert (s.file_settings().max_upload_bytes, s.file_settings().exec.task) == (5000, "main")


# --- bad values: one line naming the variable --------------------------------

DURATION = "as seconds (30, 0.5) or a Go duration (30s, 5m, 1h30m, 250ms)"
LOCK_PATH = (
    "must be a Nomad variable path: up to 100 letters, digits, '-', '_', '~' and '/', "
    "without a leading, trailing or doubled '/', and under nomad/ only in nomad/jobs/"
)


@pytest.mark.parametrize(
    ("var", "value", "line"),
    [
        # integers
        ("NRC_API_PORT", "abc", 'NRC_API_PORT: must be an integer between 1 and 65535 (got "abc")'),
        ("NRC_API_PORT", "0", 'NRC_API_PORT: must be an integer between 1 and 65535 (got "0")'),
        (
            "NRC_API_PORT",
            "65536",
            'NRC_API_PORT: must be an integer between 1 and 65535 (got "65536")',
        ),
        (
            "NRC_API_PORT",
            "80.0",
            'NRC_API_PORT: must be an integer between 1 and 65535 (got "80.0")',
        ),
        ("NRC_WORKERS", "0", 'NRC_WORKERS: must be an integer between 1 and 64 (got "0")'),
        ("NRC_WORKERS", "65", 'NRC_WORKERS: must be an integer between 1 and 64 (got "65")'),
        ("NRC_WORKERS", "1_0", 'NRC_WORKERS: must be an integer between 1 and 64 (got "1_0")'),
        (
            "NRC_NOMAD_WRITE_CONCURRENCY",
            "257",
            'NRC_NOMAD_WRITE_CONCURRENCY: must be an integer between 1 and 256 (got "257")',
        ),
        (
            "NRC_NOMAD_MAX_CONNS_PER_AGENT",
            "2",
            'NRC_NOMAD_MAX_CONNS_PER_AGENT: must be an integer between 3 and 10000 (got "2")',
        ),
        (
            "NRC_NOMAD_CONN_QUEUE",
            "-1",
            'NRC_NOMAD_CONN_QUEUE: must be an integer between 0 and 100000 (got "-1")',
        ),
        ("NRC_MAX_POOL_SIZE", "-1", 'NRC_MAX_POOL_SIZE: must be an integer, at least 0 (got "-1")'),
        ("NRC_FAILURE_BUDGET", "0", 'NRC_FAILURE_BUDGET: must be an integer, at least 1 (got "0")'),
        # numbers
        (
            "NRC_NOMAD_WRITE_RATE",
            "-1",
            "NRC_NOMAD_WRITE_RATE: must be a number of writes per second, at least 0 "
            '(0 = unlimited) (got "-1")',
        ),
        (
            "NRC_NOMAD_WRITE_RATE",
            "inf",
            "NRC_NOMAD_WRITE_RATE: must be a number of writes per second, at least 0 "
            '(0 = unlimited) (got "inf")',
        ),
        (
            "NRC_POOL_ALERT_THRESHOLD",
            "1.5",
            'NRC_POOL_ALERT_THRESHOLD: must be a number between 0 and 1 (got "1.5")',
        ),
        (
            "NRC_POOL_ALERT_THRESHOLD",
            "nan",
            'NRC_POOL_ALERT_THRESHOLD: must be a number between 0 and 1 (got "nan")',
        ),
        (
            "NRC_POOL_ALERT_THRESHOLD",
            "50%",
            'NRC_POOL_ALERT_THRESHOLD: must be a number between 0 and 1 (got "50%")',
        ),
        (
            "NRC_API_WEBSOCKET_SCHEME",
            "https",
            'NRC_API_WEBSOCKET_SCHEME: must be ws or wss (got "https")',
        ),
        (
            "NRC_EXEC_UNPRIVILEGED_WRAPPER",
            "su 'user",
            'NRC_EXEC_UNPRIVILEGED_WRAPPER: must be shell words, or none (got "su \'user")',
        ),
        (
            "NRC_EXEC_TASK",
            "my task",
            'NRC_EXEC_TASK: must be a Nomad task name without whitespace (got "my task")',
        ),
        (
            "NRC_LOSS_SETTLE",
            "61s",
            f'NRC_LOSS_SETTLE: must be a duration from 0 to 60s, {DURATION} (got "61s")',
        ),
        (
            "NRC_EXECUTION_ID_TTL",
            "0",
            f'NRC_EXECUTION_ID_TTL: must be a duration above 0, {DURATION} (got "0")',
        ),
        (
            "NRC_FILES_MAX_UPLOAD",
            "0",
            'NRC_FILES_MAX_UPLOAD: must be an integer above 0 (bytes) (got "0")',
        ),
        (
            "NRC_FILES_MAX_UPLOAD",
            "100MiB",
            'NRC_FILES_MAX_UPLOAD: must be an integer above 0 (bytes) (got "100MiB")',
        ),
        (
            "NRC_TEMPLATE_MEMORY_RESERVATION",
            "5",
            "NRC_TEMPLATE_MEMORY_RESERVATION: must be an integer of at least 10 (MB, Nomad's "
            'minimum) (got "5")',
        ),
        (
            "NRC_TEMPLATE_NETWORK_MODE",
            "cni/",
            'NRC_TEMPLATE_NETWORK_MODE: must be none, bridge, host or cni/<name> (got "cni/")',
        ),
        (
            "NRC_TEMPLATE_DATACENTERS",
            "dc1,,dc2",
            "NRC_TEMPLATE_DATACENTERS: must be datacenter names or globs, comma-separated "
            '(got "dc1,,dc2")',
        ),
        (
            "NRC_TEMPLATE_CAP_DROP",
            "net_raw,CAP_KILL",
            "NRC_TEMPLATE_CAP_DROP: must be capability names without CAP_, comma-separated, or "
            'none (got "net_raw,CAP_KILL")',
        ),
        (
            "NRC_TEMPLATE_PIDS_LIMIT",
            "-1",
            'NRC_TEMPLATE_PIDS_LIMIT: must be an integer, 0 or above (got "-1")',
        ),
        # durations
        (
            "NRC_RESYNC_INTERVAL",
            "0",
            f'NRC_RESYNC_INTERVAL: must be a duration above 0, {DURATION} (got "0")',
        ),
        (
            "NRC_RESYNC_INTERVAL",
            "5 minutes",
            f'NRC_RESYNC_INTERVAL: must be a duration above 0, {DURATION} (got "5 minutes")',
        ),
        (
            "NRC_ORPHAN_GRACE",
            "-1s",
            f'NRC_ORPHAN_GRACE: must be a duration of at least 0, {DURATION} (got "-1s")',
        ),
        (
            "NRC_STARTUP_TIMEOUT",
            "1d",
            f'NRC_STARTUP_TIMEOUT: must be a duration above 0, {DURATION} (got "1d")',
        ),
        (
            "NRC_NOMAD_TIMEOUT",
            "0s",
            f'NRC_NOMAD_TIMEOUT: must be a duration above 0, {DURATION} (got "0s")',
        ),
        (
            "NRC_LEADER_TTL",
            "9s",
            f'NRC_LEADER_TTL: must be a duration between 10s and 24h, {DURATION} (got "9s")',
        ),
        (
            "NRC_LEADER_TTL",
            "25h",
            f'NRC_LEADER_TTL: must be a duration between 10s and 24h, {DURATION} (got "25h")',
        ),
        # booleans
        (
            "NRC_EVENT_STREAM",
            "maybe",
            'NRC_EVENT_STREAM: must be true or false (also 1/0, yes/no) (got "maybe")',
        ),
        (
            "NOMAD_SKIP_VERIFY",
            "2",
            'NOMAD_SKIP_VERIFY: must be true or false (also 1/0, yes/no) (got "2")',
        ),
        # choices
        (
            "NRC_LOG_LEVEL",
            "verbose",
            "NRC_LOG_LEVEL: must be one of DEBUG, INFO, WARNING, ERROR, or Poseidon's TRACE, "
            'WARN, FATAL, PANIC (any case) (got "verbose")',
        ),
        (
            "NRC_LOG_FORMAT",
            "xml",
            "NRC_LOG_FORMAT: must be one of json, text, auto, TextFormatter, JSONFormatter "
            '(any case) (got "xml")',
        ),
        # strings with rules
        (
            "NOMAD_ADDR",
            "127.0.0.1:4646",
            "NOMAD_ADDR: must be an http:// or https:// URL such as http://127.0.0.1:4646 "
            '(got "127.0.0.1:4646")',
        ),
        (
            "NOMAD_ADDR",
            "unix:///var/run/nomad.sock",
            "NOMAD_ADDR: must be an http:// or https:// URL such as http://127.0.0.1:4646 "
            '(got "unix:///var/run/nomad.sock")',
        ),
        (
            "NOMAD_ADDR",
            "http://nomad:99999",
            "NOMAD_ADDR: must be an http:// or https:// URL such as http://127.0.0.1:4646 "
            '(got "http://nomad:99999")',
        ),
        (
            "NOMAD_ADDR",
            "http://",
            "NOMAD_ADDR: must be an http:// or https:// URL such as http://127.0.0.1:4646 "
            '(got "http://")',
        ),
        (
            "NOMAD_NAMESPACE",
            "my ns",
            "NOMAD_NAMESPACE: must be a Nomad namespace name: 1 to 128 letters, digits and '-' "
            '(got "my ns")',
        ),
        (
            "NRC_API_HOST",
            "local host",
            'NRC_API_HOST: must be a host name or IP address without whitespace (got "local host")',
        ),
        ("NRC_LEADER_LOCK_PATH", "/leader", f'NRC_LEADER_LOCK_PATH: {LOCK_PATH} (got "/leader")'),
        ("NRC_LEADER_LOCK_PATH", "leader/", f'NRC_LEADER_LOCK_PATH: {LOCK_PATH} (got "leader/")'),
        ("NRC_LEADER_LOCK_PATH", "a//b", f'NRC_LEADER_LOCK_PATH: {LOCK_PATH} (got "a//b")'),
        ("NRC_LEADER_LOCK_PATH", "a/../x", f'NRC_LEADER_LOCK_PATH: {LOCK_PATH} (got "a/../x")'),
        ("NRC_LEADER_LOCK_PATH", "a.b", f'NRC_LEADER_LOCK_PATH: {LOCK_PATH} (got "a.b")'),
        (
            "NRC_LEADER_LOCK_PATH",
            "nomad/leader",
            f'NRC_LEADER_LOCK_PATH: {LOCK_PATH} (got "nomad/leader")',
        ),
        (
            "NRC_LEADER_LOCK_PATH",
            "x" * 101,
            f'NRC_LEADER_LOCK_PATH: {LOCK_PATH} (got "{"x" * 77}...")',
        ),
        # the value is quoted so that a line break cannot split the message
        (
            "NRC_LOG_FORMAT",
            "json\nNRC_OTHER",
            "NRC_LOG_FORMAT: must be one of json, text, auto, TextFormatter, JSONFormatter "
            '(any case) (got "json\\nNRC_OTHER")',
        ),
    ],
)
def test_bad_value_gives_one_line_naming_the_variable(var: str, value: str, line: str) -> None:
    assert problems_of({var: value}) == [line]


def test_several_bad_variables_give_one_line_each() -> None:
    lines = problems_of(
        {"NRC_API_PORT": "abc", "NRC_WORKERS": "many", "NRC_LEADER_TTL": "1s", "NRC_API_PROT": "1"}
    )
    assert [line.split(":")[0] for line in lines] == [
        "NRC_API_PROT",
        "NRC_API_PORT",
        "NRC_WORKERS",
        "NRC_LEADER_TTL",
    ]


def test_config_error_has_no_pydantic_boilerplate() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"NRC_API_PORT": "abc", "NOMAD_ADDR": "nomad"})
    text = str(info.value)
    for noise in ("pydantic", "http://errors", "validation error", "Input should", "type="):
        assert noise not in text
    # Raised `from None`: a crash report shows our lines, not pydantic's too.
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__
    assert info.value.problems == tuple(text.split("\n"))


def test_config_error_lines_never_span_lines() -> None:
    for line in problems_of({"NRC_API_HOST": "a\nb", "NRC_LEADER_LOCK_PATH": "\n"}):
        assert re.fullmatch(r"NRC_[A-Z_]+: must be [^\n]+", line)


# --- secrets -----------------------------------------------------------------


def secret_settings() -> Settings:
    return load_settings({"NOMAD_TOKEN": NOMAD_TOKEN, "NRC_API_TOKEN": API_TOKEN})


def assert_no_secret(text: str) -> None:
    assert NOMAD_TOKEN not in text
    assert API_TOKEN not in text


def test_secrets_are_usable() -> None:
    s = secret_settings()
    assert s.api_auth_token == API_TOKEN
    connection = s.nomad_connection()
    assert connection.token == NOMAD_TOKEN
    assert connection.headers == {"X-Nomad-Token": NOMAD_TOKEN}
    assert NOMAD_TOKEN not in repr(connection)


def test_secrets_never_rendered() -> None:
    s = secret_settings()
    rows = describe(s, {"NOMAD_TOKEN": NOMAD_TOKEN, "NRC_API_TOKEN": API_TOKEN})
    for text in (
        repr(s),
        str(s),
        s.model_dump_json(),
        repr(s.model_dump()),
        repr(rows),
        render_table(rows),
        render_table(rows, markdown=True),
    ):
        assert_no_secret(text)
    shown = {row.variable: (row.value, row.source) for row in rows}
    assert shown["NOMAD_TOKEN"] == ("(set)", "environment")
    assert shown["NRC_API_TOKEN"] == ("(set)", "environment")
    unset = {row.variable: row.value for row in describe(load_settings({}), {})}
    assert unset["NOMAD_TOKEN"] == unset["NRC_API_TOKEN"] == "(unset)"


def test_secrets_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    s = secret_settings()
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("settings %s / %r / %s", s, s, s.model_dump())
    assert caplog.records
    assert_no_secret(caplog.text)


@pytest.mark.parametrize("var", ["NOMAD_TOKEN", "NRC_API_TOKEN"])
def test_bad_secret_is_not_echoed(var: str) -> None:
    secret = "abc def-secret-part"
    lines = problems_of({var: secret})
    assert lines[0].startswith(f"{var}: must be a token ")
    assert lines[0].endswith("without whitespace or control characters")
    assert "secret-part" not in lines[0]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.1", False),
        ("controller.example", False),  # a name may resolve to anything
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_api_fails_closed_without_a_token() -> None:
    """Issue 24, finding 3: unset, empty or short, the token turned authentication off."""
    assert load_settings({}).open_api_problem() is None  # loopback by default
    open_ = load_settings({"NRC_API_HOST": "0.0.0.0"})
    assert "NRC_API_TOKEN is not set" in (open_.open_api_problem() or "")
    empty = load_settings({"NRC_API_HOST": "0.0.0.0", "NRC_API_TOKEN": ""})
    assert empty.open_api_problem() is not None
    allowed = {"NRC_API_HOST": "0.0.0.0", "NRC_API_ALLOW_UNAUTHENTICATED": "true"}
    assert load_settings(allowed).open_api_problem() is None
    token = {"NRC_API_HOST": "0.0.0.0", "NRC_API_TOKEN": "x" * 16}
    assert load_settings(token).open_api_problem() is None
    assert problems_of({"NRC_API_TOKEN": "x" * 15}) == [
        "NRC_API_TOKEN: must be a token of 16 or more characters without whitespace or "
        "control characters"
    ]


def test_execution_ids_name_this_replica_only_with_an_advertised_url_and_a_key() -> None:
    assert load_settings({}).execution_settings().ids is None
    token = {"NRC_API_TOKEN": API_TOKEN}
    assert load_settings(token).execution_settings().ids is None  # not advertised
    advertised = {"NRC_API_ADVERTISE_URL": "http://10.0.0.5:23456/"}
    alone = load_settings(advertised)
    assert alone.execution_settings().ids is None
    assert "NRC_REPLICA_SECRET nor NRC_API_TOKEN" in (alone.replicas_problem() or "")
    assert load_settings(token).replicas_problem() is None
    from_token = load_settings({**advertised, **token}).execution_settings().ids
    assert from_token is not None and from_token.url == "http://10.0.0.5:23456"
    assert from_token.key == replica_key(None, API_TOKEN)
    secret = "s" * 32
    own = load_settings({**advertised, **token, "NRC_REPLICA_SECRET": secret}).id_signer()
    assert own is not None and own.key == replica_key(secret, None) != from_token.key
    assert load_settings({**advertised, "NRC_REPLICA_SECRET": secret}).replicas_problem() is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("10.0.0.5:7200", "NRC_API_ADVERTISE_URL: must be an http:// or https:// URL without path"),
        ("http://10.0.0.5:7200/api", "NRC_API_ADVERTISE_URL: must be an http:// or https:// URL"),
        ("http://u:p@10.0.0.5", "NRC_API_ADVERTISE_URL: must be an http:// or https:// URL"),
    ],
)
def test_the_advertised_url_is_a_base_url(value: str, problem: str) -> None:
    (line,) = problems_of({"NRC_API_ADVERTISE_URL": value})
    assert line.startswith(problem)
    assert "u:p@" not in line


@pytest.mark.parametrize("secret", ["s" * 31, "a secret with spaces in it, 40 characters"])
def test_a_short_or_spaced_replica_secret_is_refused_without_echo(secret: str) -> None:
    (line,) = problems_of({"NRC_REPLICA_SECRET": secret})
    assert line.startswith("NRC_REPLICA_SECRET: must be a secret of 32 or more characters")
    assert secret not in line


def test_credentials_in_nomad_addr_are_not_echoed() -> None:
    lines = problems_of({"NOMAD_ADDR": "http://admin:hunter2@nomad:4646"})
    assert lines == ["NOMAD_ADDR: must be an http:// or https:// URL such as http://127.0.0.1:4646"]


def test_validation_error_of_direct_construction_hides_input(
    monkeypatch: pytest.MonkeyPatch, clean_environ: None
) -> None:
    # Settings() used directly (not through load_settings) raises pydantic's
    # error; it must not carry the token into a log either.
    monkeypatch.setenv("NOMAD_TOKEN", "bad token-" + NOMAD_TOKEN)
    with pytest.raises(ValidationError) as info:
        Settings()
    assert "NOMAD_TOKEN" in str(info.value)
    assert NOMAD_TOKEN not in str(info.value)


def test_direct_construction_reads_os_environ(
    monkeypatch: pytest.MonkeyPatch, clean_environ: None
) -> None:
    monkeypatch.setenv("NRC_WORKERS", "7")
    assert Settings().workers == 7


# --- unknown variables -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (
            "NRC_API_PROT",
            "NRC_API_PROT: unknown variable (did you mean NRC_API_PORT or NRC_API_HOST?)",
        ),
        ("NRC_WORKER", "NRC_WORKER: unknown variable (did you mean NRC_WORKERS?)"),
        (
            "NRC_LEADER_TIMEOUT",
            "NRC_LEADER_TIMEOUT: unknown variable (did you mean NRC_LEADER_TTL or "
            "NRC_NOMAD_TIMEOUT or NRC_STARTUP_TIMEOUT?)",
        ),
        (
            "nrc_api_port",
            "nrc_api_port: unknown variable (did you mean NRC_API_PORT? "
            "variable names are case-sensitive)",
        ),
        ("NRC_BANANA", "NRC_BANANA: unknown variable (no NRC_ setting is spelt alike)"),
    ],
)
def test_unknown_nrc_variable_is_caught_with_suggestion(name: str, line: str) -> None:
    assert problems_of({name: "1"}) == [line]


def test_unknown_nomad_variables_are_left_alone() -> None:
    # Nomad sets many NOMAD_* variables in a task's environment (the controller
    # may run as a Nomad job), and its CLI reads more than we do.
    s = load_settings({"NOMAD_ALLOC_ID": "x", "NOMAD_CLI_NO_COLOR": "1", "PATH": "/bin"})
    assert s == load_settings({})


# --- TLS files ---------------------------------------------------------------


def test_tls_files(pem_files: dict[str, str]) -> None:
    s = load_settings(
        {
            "NOMAD_ADDR": "https://nomad:4646",
            "NOMAD_CACERT": pem_files["ca.pem"],
            "NOMAD_CLIENT_CERT": pem_files["cert.pem"],
            "NOMAD_CLIENT_KEY": pem_files["key.pem"],
        }
    )
    connection = s.nomad_connection()
    assert connection.ca_cert == pem_files["ca.pem"]
    assert connection.requests_verify == pem_files["ca.pem"]
    assert connection.requests_cert == (pem_files["cert.pem"], pem_files["key.pem"])
    assert connection.ssl_context is not None


def test_client_cert_without_key(pem_files: dict[str, str]) -> None:
    assert problems_of({"NOMAD_CLIENT_CERT": pem_files["cert.pem"]}) == [
        "NOMAD_CLIENT_KEY: must be set together with NOMAD_CLIENT_CERT "
        "(only NOMAD_CLIENT_CERT is set, and its file holds no private key)"
    ]


def test_client_cert_holding_its_key(pem_files: dict[str, str]) -> None:
    s = load_settings(
        {"NOMAD_ADDR": "https://nomad:4646", "NOMAD_CLIENT_CERT": pem_files["both.pem"]}
    )
    connection = s.nomad_connection()
    assert connection.requests_cert == pem_files["both.pem"]
    assert connection.ssl_context is not None  # the combined PEM loads for exec too


def test_client_key_without_cert(pem_files: dict[str, str]) -> None:
    assert problems_of({"NOMAD_CLIENT_KEY": pem_files["key.pem"]}) == [
        "NOMAD_CLIENT_CERT: must be set together with NOMAD_CLIENT_KEY "
        "(only NOMAD_CLIENT_KEY is set)"
    ]


@pytest.mark.parametrize("var", ["NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY"])
def test_missing_tls_file(var: str, pem_files: dict[str, str], tmp_path: Path) -> None:
    environ = {
        "NOMAD_CACERT": pem_files["ca.pem"],
        "NOMAD_CLIENT_CERT": pem_files["cert.pem"],
        "NOMAD_CLIENT_KEY": pem_files["key.pem"],
    }
    missing = str(tmp_path / "missing.pem")
    environ[var] = missing
    assert problems_of(environ) == [
        f'{var}: must be the path of an existing, readable file (got "{missing}")'
    ]


def test_tls_file_that_is_a_directory(tmp_path: Path) -> None:
    assert problems_of({"NOMAD_CACERT": str(tmp_path)}) == [
        f'NOMAD_CACERT: must be the path of an existing, readable file (got "{tmp_path}")'
    ]


# --- mapping onto the rest of the controller ---------------------------------


def full_environ(pem_files: dict[str, str]) -> dict[str, str]:
    return {
        "NOMAD_ADDR": "https://nomad.internal:4646/",
        "NOMAD_TOKEN": NOMAD_TOKEN,
        "NOMAD_NAMESPACE": "sandboxes",
        "NOMAD_REGION": "eu",
        "NOMAD_CACERT": pem_files["ca.pem"],
        "NOMAD_CLIENT_CERT": pem_files["cert.pem"],
        "NOMAD_CLIENT_KEY": pem_files["key.pem"],
        "NOMAD_SKIP_VERIFY": "yes",
        "NRC_API_HOST": "0.0.0.0",
        "NRC_API_PORT": "8080",
        "NRC_API_TOKEN": API_TOKEN,
        "NRC_RESYNC_INTERVAL": "1m",
        "NRC_ORPHAN_GRACE": "2m",
        "NRC_STARTUP_TIMEOUT": "10m",
        "NRC_LOST_RUNNER_RETENTION": "30m",
        "NRC_NOMAD_WRITE_RATE": "0",
        "NRC_NOMAD_WRITE_CONCURRENCY": "16",
        "NRC_NOMAD_TIMEOUT": "2.5s",
        "NRC_WORKERS": "8",
        "NRC_MAX_BACKOFF": "1m",
        "NRC_EVENT_STREAM": "false",
        "NRC_POOL_ALERT_THRESHOLD": "0.25",
        "NRC_MAX_POOL_SIZE": "500",
        "NRC_FAILURE_BUDGET": "5",
        "NRC_LEADER_ELECTION": "true",
        "NRC_LEADER_LOCK_PATH": "nrc/prod/leader",
        "NRC_LEADER_TTL": "20s",
        "NRC_ACTIVITY_PUBLISH_INTERVAL": "500ms",
        "NRC_CLAIM_WAIT": "500ms",
        "NRC_CLAIM_MAX_WAITING": "8",
        "NRC_LOG_LEVEL": "warning",
        "NRC_LOG_FORMAT": "text",
    }


def test_controller_settings_mapping(pem_files: dict[str, str]) -> None:
    s = load_settings(full_environ(pem_files))
    assert s.controller_settings() == ControllerSettings(
        resync_interval_s=60.0,
        workers=8,
        write_concurrency=16,
        write_rate_per_s=0.0,
        max_backoff_s=60.0,
        leader_election=True,
        leader_lock_path="nrc/prod/leader",
        leader_ttl_s=20.0,
        activity_publish_interval_s=0.5,
        claim_wait_s=0.5,
        claim_max_waiting=8,
        plan=PlanSettings(
            orphan_grace_ns=120 * SECOND,
            startup_timeout_ns=600 * SECOND,
            lost_retention_ns=1800 * SECOND,
            degraded_after=5,
        ),
    )
    assert (s.api_host, s.api_port, s.api_auth_token) == ("0.0.0.0", 8080, API_TOKEN)
    assert (s.event_stream, s.pool_alert_threshold, s.max_pool_size) == (False, 0.25, 500)
    assert (s.log_level, s.log_format) == ("WARNING", "text")


def test_nomad_connection_mapping(pem_files: dict[str, str]) -> None:
    s = load_settings(full_environ(pem_files))
    assert s.nomad_connection() == NomadConnection(
        address="https://nomad.internal:4646",
        token=NOMAD_TOKEN,
        namespace="sandboxes",
        region="eu",
        ca_cert=pem_files["ca.pem"],
        client_cert=pem_files["cert.pem"],
        client_key=pem_files["key.pem"],
        verify=False,
    )
    assert s.nomad_timeout_s == 2.5
    assert s.nomad_connection("http://10.0.0.1:4646").address == "http://10.0.0.1:4646"


def test_nomad_connection_defaults() -> None:
    assert load_settings({}).nomad_connection() == NomadConnection()
    assert NomadConnection().address == "http://127.0.0.1:4646"
    assert NomadConnection().ssl_context is None  # plain HTTP


def test_one_connection_for_the_three_clients(pem_files: dict[str, str]) -> None:
    # Constructing opens no connection.
    connection = load_settings(full_environ(pem_files)).nomad_connection()
    client = NomadClient(connection)
    assert (client.address, client.namespace) == ("https://nomad.internal:4646", "sandboxes")

    def on_events(index: int, events: tuple[EventRef, ...]) -> None:
        pass

    stream = EventStream(connection, topics=["Job"], on_events=on_events)
    assert stream.address == "https://nomad.internal:4646"
    execs = ExecClient(connection)
    assert execs.url("a", "t", ["true"], False).startswith("wss://nomad.internal:4646/")
    assert execs.connection.ssl_context is connection.ssl_context  # built once


# --- describe and render_table -----------------------------------------------


def test_describe_values_and_sources() -> None:
    environ = {"NRC_API_PORT": "8080", "NRC_STARTUP_TIMEOUT": "90", "NRC_EVENT_STREAM": "0"}
    rows = {row.variable: row for row in describe(load_settings(environ), environ)}
    assert list(rows) == ALL_VARIABLES
    assert (rows["NRC_API_PORT"].value, rows["NRC_API_PORT"].source) == ("8080", "environment")
    assert (rows["NRC_STARTUP_TIMEOUT"].value, rows["NRC_STARTUP_TIMEOUT"].default) == (
        "1m30s",
        "5m",
    )
    assert rows["NRC_EVENT_STREAM"].value == "false"
    assert (rows["NRC_WORKERS"].value, rows["NRC_WORKERS"].source) == ("4", "default")
    assert rows["NRC_POOL_ALERT_THRESHOLD"].value == "0.5"
    assert rows["NOMAD_REGION"].value == "(unset)"
    assert rows["NRC_API_PORT"].description == "Port the HTTP API listens on (1–65535)."


def test_describe_without_environ_uses_what_was_loaded() -> None:
    rows = {row.variable: row for row in describe(load_settings({"NRC_WORKERS": "2"}))}
    assert rows["NRC_WORKERS"].source == "environment"
    assert rows["NRC_API_PORT"].source == "default"


def test_plain_table_is_aligned() -> None:
    environ = {"NRC_API_PORT": "8080"}
    lines = render_table(describe(load_settings(environ), environ)).splitlines()
    assert lines[0].split() == ["VARIABLE", "VALUE", "SOURCE", "DESCRIPTION"]
    assert len(lines) == 1 + len(ALL_VARIABLES)
    value_at = lines[0].index("VALUE")
    source_at = lines[0].index("SOURCE")
    for line, var in zip(lines[1:], ALL_VARIABLES, strict=True):
        assert line.startswith(var + " ")
        assert line[value_at - 1] == " " and line[value_at] != " "
        assert line[source_at:].startswith(("environment", "default"))
    assert "8080" in next(line for line in lines if line.startswith("NRC_API_PORT "))


def test_markdown_table_lists_every_variable_with_its_default() -> None:
    # Loaded with non-default values: the README table must not depend on them.
    environ = {"NRC_API_PORT": "9999", "NRC_LOG_LEVEL": "ERROR"}
    text = render_table(describe(load_settings(environ), environ), markdown=True)
    lines = text.splitlines()
    assert lines[:2] == ["| variable | default | description |", "|---|---|---|"]
    assert len(lines) == 2 + len(ALL_VARIABLES)
    for line, var in zip(lines[2:], ALL_VARIABLES, strict=True):
        assert line.startswith(f"| `{var}` | ")
        assert line.endswith(" |")
    assert "| `NRC_API_PORT` | `7200` | Port the HTTP API listens on (1–65535). |" in lines
    assert "| `NRC_LEADER_TTL` | `15s` |" in text
    assert "| `NOMAD_TOKEN` | (unset) |" in text
    assert "9999" not in text and "`ERROR`" not in text


def test_markdown_escapes_pipes() -> None:
    row = SettingRow("NRC_X", "a|b", "default", "one | two.", "a|b")
    assert render_table([row], markdown=True).splitlines()[2] == (
        "| `NRC_X` | `a\\|b` | one \\| two. |"
    )


# --- prewarming ----------------------------------------------------------------


def test_prewarming_is_static_by_default() -> None:
    prewarm = load_settings({}).controller_settings().prewarm
    assert prewarm == PrewarmSettings()
    assert (prewarm.adaptive, prewarm.ceiling_multiple, prewarm.ceiling_cap) == (False, 10.0, 100)


@pytest.mark.parametrize(
    ("environ", "adaptive", "multiple", "cap"),
    [
        ({"NRC_PREWARM_POLICY": "adaptive"}, True, 10.0, 100),
        ({"NRC_PREWARM_POLICY": "Adaptive"}, True, 10.0, 100),
        ({"NRC_PREWARM_POLICY": "static"}, False, 10.0, 100),
        ({"NRC_PREWARM_CEILING_MULTIPLE": "2.5", "NRC_PREWARM_CEILING_CAP": "0"}, False, 2.5, 0),
    ],
)
def test_prewarming_settings(
    environ: dict[str, str], adaptive: bool, multiple: float, cap: int
) -> None:
    prewarm = load_settings(environ).controller_settings().prewarm
    assert (prewarm.adaptive, prewarm.ceiling_multiple, prewarm.ceiling_cap) == (
        adaptive,
        multiple,
        cap,
    )


@pytest.mark.parametrize(
    ("var", "value", "said"),
    [
        ("NRC_PREWARM_POLICY", "dynamic", "static or adaptive"),
        ("NRC_PREWARM_CEILING_MULTIPLE", "0.5", "a number between 1 and 1000"),
        ("NRC_PREWARM_CEILING_CAP", "-1", "an integer, at least 0"),
    ],
)
def test_prewarming_settings_refused(var: str, value: str, said: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({var: value})
    assert said in str(info.value) and var in str(info.value)


def test_where_we_differ_from_poseidon_is_a_setting() -> None:
    default = load_settings({}).execution_settings()
    assert (default.broken_as_exit_zero, default.signal_loss_window_s) == (False, 0.5)
    poseidon = load_settings(
        {"NRC_EXEC_BROKEN_END": "EXIT0", "NRC_EXEC_SIGNAL_LOSS_WINDOW": "1s"}
    ).execution_settings()
    assert (poseidon.broken_as_exit_zero, poseidon.signal_loss_window_s) == (True, 1.0)
    assert problems_of({"NRC_EXEC_BROKEN_END": "zero"}) == [
        'NRC_EXEC_BROKEN_END: must be error or exit0 (any case) (got "zero")'
    ]
