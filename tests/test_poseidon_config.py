"""Poseidon's configuration in our terms (controller/poseidon_config.py):
every setting of its configuration.yaml has an entry, each conversion, its
POSEIDON_* variables, the rendered lines, `config --from-poseidon`, and the
warning `run` and `dev` log for each POSEIDON_* variable they find."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import nomadsim
from controller import poseidon_config as pc
from controller import service
from controller.cli import main
from controller.config import load_settings, variables

# The settings Poseidon's configuration.example.yaml has (commented-out ones
# included), section by section.
EXAMPLE_KEYS = [
    *(
        f"server.{k}"
        for k in (
            "address",
            "port",
            "systemdsocketactivation",
            "token",
            "tls.active",
            "tls.cafile",
            "tls.certfile",
            "tls.keyfile",
            "interactivestderr",
            "templatejobfile",
            "loggingfiltertoken",
            "alert.prewarmingpoolthreshold",
            "alert.prewarmingpoolreloadtimeout",
        )
    ),
    *(
        f"nomad.{k}"
        for k in (
            "enabled",
            "address",
            "port",
            "token",
            "tls.active",
            "tls.cafile",
            "tls.certfile",
            "tls.keyfile",
            "namespace",
            "disableforcepull",
            "network.mode",
        )
    ),
    "aws.enabled",
    "aws.endpoint",
    "aws.functions",
    "logger.level",
    *(f"profiling.{k}" for k in ("cpuenabled", "cpufile", "memoryinterval", "memorythreshold")),
    *(
        f"sentry.{k}"
        for k in (
            "dsn",
            "environment",
            "release",
            "debug",
            "enabletracing",
            "tracessamplerate",
            "profilessamplerate",
        )
    ),
    *(f"influxdb.{k}" for k in ("url", "token", "organization", "bucket", "stage")),
]
# Read by Poseidon's code, left out of its example.
CODE_ONLY_KEYS = ["logger.formatter"]

NO_EQUIVALENT = [k for k, t in pc.SETTINGS.items() if isinstance(t, pc.NoEquivalent)]


def nested(settings: dict[str, Any]) -> str:
    """A configuration.yaml setting dotted keys: {"nomad.tls.active": "true"}."""
    document: dict[str, Any] = {}
    for key, value in settings.items():
        *sections, leaf = key.split(".")
        place = document
        for section in sections:
            place = place.setdefault(section, {})
        place[leaf] = value
    return yaml.safe_dump(document)


def assigned(migration: pc.Migration) -> dict[str, str]:
    return migration.variables()


@pytest.fixture(autouse=True)
def _no_poseidon_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the shell running the tests has set, these tests set their own."""
    for name in list(os.environ):
        if name.startswith("POSEIDON_"):
            monkeypatch.delenv(name)


# --- the table -------------------------------------------------------------------


def test_the_table_has_every_setting_of_the_example_and_nothing_else() -> None:
    assert sorted(pc.SETTINGS) == sorted(EXAMPLE_KEYS + CODE_ONLY_KEYS)


def test_the_whole_example_has_no_unknown_key() -> None:
    migration = pc.from_yaml(nested(dict.fromkeys(EXAMPLE_KEYS + CODE_ONLY_KEYS, "1")))
    assert migration.unknown == ()


def test_every_equivalent_is_one_of_our_variables() -> None:
    ours = set(variables())
    for key, found in pc.SETTINGS.items():
        if isinstance(found, pc.Equivalent):
            assert found.variable in ours, key


@pytest.mark.parametrize(
    "reason",
    [
        t.reason
        for t in [*pc.SETTINGS.values(), *pc.FAMILIES.values()]
        if isinstance(t, pc.NoEquivalent)
    ],
)
def test_every_reason_is_one_short_sentence(reason: str) -> None:
    assert len(reason) <= 140 and not reason.endswith(".")
    assert ". " not in reason


@pytest.mark.parametrize(
    ("key", "variable"),
    [
        ("server.address", "POSEIDON_SERVER_ADDRESS"),
        ("nomad.token", "POSEIDON_NOMAD_TOKEN"),
        ("logger.level", "POSEIDON_LOGGER_LEVEL"),
        ("server.tls.cafile", "POSEIDON_SERVER_TLS_CAFILE"),
        ("server.alert.prewarmingpoolthreshold", "POSEIDON_SERVER_ALERT_PREWARMINGPOOLTHRESHOLD"),
        ("nomad.network.mode", "POSEIDON_NOMAD_NETWORK_MODE"),
    ],
)
def test_poseidons_variable_names(key: str, variable: str) -> None:
    assert pc.env_name(key) == variable
    assert pc.key_of(variable) == key


def test_every_setting_is_named_back_from_its_variable() -> None:
    assert [pc.key_of(pc.env_name(k)) for k in pc.SETTINGS] == list(pc.SETTINGS)


# --- conversions -----------------------------------------------------------------


MAPPINGS = [
    ({"server.address": "0.0.0.0"}, {"NRC_API_HOST": "0.0.0.0"}),
    ({"server.port": "8080"}, {"NRC_API_PORT": "8080"}),
    ({"server.port": "+7_200"}, {"NRC_API_PORT": "7200"}),
    ({"server.token": "0123456789012345"}, {"NRC_API_TOKEN": "0123456789012345"}),
    ({"server.tls.active": "true"}, {"NRC_API_WEBSOCKET_SCHEME": "wss"}),
    ({"server.tls.active": "false"}, {"NRC_API_WEBSOCKET_SCHEME": "ws"}),
    ({"server.interactivestderr": "false"}, {"NRC_EXEC_SEPARATE_STDERR": "false"}),
    ({"server.interactivestderr": "True"}, {"NRC_EXEC_SEPARATE_STDERR": "true"}),
    ({"server.templatejobfile": "./poseidon.hcl"}, {"NRC_TEMPLATE_JOB_FILE": "./poseidon.hcl"}),
    ({"server.alert.prewarmingpoolthreshold": "0.25"}, {"NRC_POOL_ALERT_THRESHOLD": "0.25"}),
    ({"server.alert.prewarmingpoolthreshold": "5e-1"}, {"NRC_POOL_ALERT_THRESHOLD": "0.5"}),
    ({"server.alert.prewarmingpoolthreshold": "0"}, {"NRC_POOL_ALERT_THRESHOLD": "0"}),
    ({"nomad.address": "nomad.example"}, {"NOMAD_ADDR": "http://nomad.example:4646"}),
    ({"nomad.port": "4647"}, {"NOMAD_ADDR": "http://127.0.0.1:4647"}),
    ({"nomad.tls.active": "true"}, {"NOMAD_ADDR": "https://127.0.0.1:4646"}),
    (
        {"nomad.address": "10.0.0.7", "nomad.port": "443", "nomad.tls.active": "true"},
        {"NOMAD_ADDR": "https://10.0.0.7:443"},
    ),
    ({"nomad.address": "::1"}, {"NOMAD_ADDR": "http://[::1]:4646"}),
    ({"nomad.token": "0x1F"}, {"NOMAD_TOKEN": "0x1F"}),  # as written, not a number
    (
        {
            "nomad.tls.active": "true",
            "nomad.tls.cafile": "/etc/nomad/ca.pem",
            "nomad.tls.certfile": "/etc/nomad/cli.pem",
            "nomad.tls.keyfile": "/etc/nomad/cli-key.pem",
        },
        {
            "NOMAD_ADDR": "https://127.0.0.1:4646",
            "NOMAD_CACERT": "/etc/nomad/ca.pem",
            "NOMAD_CLIENT_CERT": "/etc/nomad/cli.pem",
            "NOMAD_CLIENT_KEY": "/etc/nomad/cli-key.pem",
        },
    ),
    ({"nomad.namespace": "poseidon"}, {"NOMAD_NAMESPACE": "poseidon"}),
    ({"nomad.disableforcepull": "true"}, {"NRC_TEMPLATE_FORCE_PULL": "false"}),
    ({"nomad.disableforcepull": "false"}, {"NRC_TEMPLATE_FORCE_PULL": "true"}),
    (
        {"nomad.network.mode": "cni/secure-bridge"},
        {"NRC_TEMPLATE_NETWORK_MODE": "cni/secure-bridge"},
    ),
    ({"logger.level": "TRACE"}, {"NRC_LOG_LEVEL": "DEBUG"}),
    ({"logger.level": "debug"}, {"NRC_LOG_LEVEL": "DEBUG"}),
    ({"logger.level": "Info"}, {"NRC_LOG_LEVEL": "INFO"}),
    ({"logger.level": "WARN"}, {"NRC_LOG_LEVEL": "WARNING"}),
    ({"logger.level": "fatal"}, {"NRC_LOG_LEVEL": "ERROR"}),
    ({"logger.level": "PANIC"}, {"NRC_LOG_LEVEL": "ERROR"}),
    ({"logger.formatter": "JSONFormatter"}, {"NRC_LOG_FORMAT": "json"}),
    ({"logger.formatter": "TextFormatter"}, {"NRC_LOG_FORMAT": "text"}),
]


@pytest.mark.parametrize(("given", "expected"), MAPPINGS)
def test_each_mapping(given: dict[str, str], expected: dict[str, str]) -> None:
    migration = pc.from_yaml(nested(given))
    assert assigned(migration) == expected
    assert (migration.unmapped, migration.unknown, migration.rejected) == ((), (), ())


def test_every_equivalent_is_exercised_above() -> None:
    covered = {key for given, _ in MAPPINGS for key in given}
    equivalents = {k for k, t in pc.SETTINGS.items() if isinstance(t, pc.Equivalent)}
    assert equivalents - covered == set()


def test_yaml_typed_values_convert_as_written() -> None:
    text = (
        "server:\n  port: 7201\n  interactivestderr: no\n"
        "  alert:\n    prewarmingpoolthreshold: .5\n"
    )
    assert assigned(pc.from_yaml(text)) == {
        "NRC_API_PORT": "7201",
        "NRC_EXEC_SEPARATE_STDERR": "false",
        "NRC_POOL_ALERT_THRESHOLD": "0.5",
    }


def test_the_converted_values_are_what_our_settings_accept() -> None:
    text = nested(
        {
            "server.address": "0.0.0.0",
            "server.port": "7300",
            "server.token": "a-platform-token-of-32-characters",
            "server.tls.active": "true",
            "server.interactivestderr": "false",
            "server.alert.prewarmingpoolthreshold": "0.3",
            "nomad.address": "nomad.service.consul",
            "nomad.port": "4646",
            "nomad.token": "nomad-acl-token",
            "nomad.namespace": "poseidon",
            "nomad.disableforcepull": "true",
            "nomad.network.mode": "cni/secure-bridge",
            "logger.level": "TRACE",
            "logger.formatter": "JSONFormatter",
        }
    )
    settings = load_settings(pc.from_yaml(text).variables())
    assert settings.nomad_addr == "http://nomad.service.consul:4646"
    assert (settings.api_host, settings.api_port) == ("0.0.0.0", 7300)
    assert settings.api_auth_token == "a-platform-token-of-32-characters"
    assert settings.api_websocket_scheme == "wss"
    assert settings.exec_separate_stderr is False
    assert settings.pool_alert_threshold == 0.3
    assert settings.nomad_namespace == "poseidon"
    assert settings.template_force_pull is False
    assert settings.template_network_mode == "cni/secure-bridge"
    assert (settings.log_level, settings.log_format) == ("DEBUG", "json")


@pytest.mark.parametrize("level", ["trace", "debug", "info", "warn", "warning", "error", "fatal"])
def test_log_levels_convert_as_our_setting_reads_poseidons_names(level: str) -> None:
    converted = assigned(pc.from_yaml(nested({"logger.level": level})))["NRC_LOG_LEVEL"]
    assert load_settings({"NRC_LOG_LEVEL": level}).log_level == converted


@pytest.mark.parametrize("key", NO_EQUIVALENT)
def test_each_setting_without_equivalent_says_why(key: str) -> None:
    migration = pc.from_yaml(nested({key: "some-value"}))
    found = pc.SETTINGS[key]
    assert isinstance(found, pc.NoEquivalent)
    assert migration.unmapped == (pc.Unmapped(key, found.reason),)
    assert (migration.assignments, migration.unknown, migration.rejected) == ((), (), ())


@pytest.mark.parametrize(
    ("key", "value", "family"),
    [
        ("sentry.servername", "host-1", "sentry"),
        ("sentry.samplerate", "0.5", "sentry"),
        ("nomad.network.hostname", "runner", "nomad.network"),
        ("nomad.network.dns", {"servers": ["1.1.1.1"]}, "nomad.network"),
    ],
)
def test_library_sections_take_any_key_without_equivalent(
    key: str, value: Any, family: str
) -> None:
    """Poseidon takes Sentry's client options and Nomad's network block whole."""
    migration = pc.from_yaml(nested({key: value}))
    assert migration.unmapped == (pc.Unmapped(key, pc.FAMILIES[family].reason),)
    assert migration.unknown == ()


def test_unknown_keys_are_reported_once_each_section_included() -> None:
    text = (
        "server:\n  adress: 0.0.0.0\n  tls:\n    enabled: true\nserverr:\n  port: 1\n  token: x\n"
    )
    assert pc.from_yaml(text).unknown == ("server.adress", "server.tls.enabled", "serverr")


@pytest.mark.parametrize(
    ("text", "name", "problem"),
    [
        ("nomad:\n  port: abc\n", "nomad.port", 'not an integer (got "abc")'),
        ("nomad:\n  port: 70000\n", "nomad.port", "not a port between 1 and 65535"),
        ("server:\n  port: 0\n", "server.port", "not a port between 1 and 65535"),
        ("nomad:\n  address: nomad:4646\n", "nomad.address", "the port belongs in nomad.port"),
        ("nomad:\n  address: http://nomad\n", "nomad.address", "not a host name or address"),
        ("nomad:\n  tls:\n    active: maybe\n", "nomad.tls.active", "not true or false"),
        ("logger:\n  level: verbose\n", "logger.level", "not a level Poseidon knows"),
        (
            "server:\n  alert:\n    prewarmingpoolthreshold: half\n",
            "server.alert.prewarmingpoolthreshold",
            "not a number",
        ),
        ("server: 5\n", "server", "a value where Poseidon expects a section"),
        ("nomad:\n  address:\n    host: x\n", "nomad.address", "a section or list where"),
        ("nomad:\n  namespace: a b\n", "nomad.namespace", "not a single word"),
    ],
)
def test_values_poseidon_would_not_take_are_not_converted(
    text: str, name: str, problem: str
) -> None:
    migration = pc.from_yaml(text)
    assert [r.poseidon for r in migration.rejected] == [name]
    assert problem in migration.rejected[0].problem
    assert migration.assignments == ()


def test_an_invalid_part_of_nomads_url_is_reported_once_and_no_url_is_made() -> None:
    migration = pc.from_yaml(nested({"nomad.address": "nomad.example", "nomad.port": "x"}))
    assert migration.variables() == {}
    assert [r.poseidon for r in migration.rejected] == ["nomad.port"]


def test_nomads_tls_files_without_tls_are_ignored_as_poseidon_ignores_them() -> None:
    migration = pc.from_yaml(nested({"nomad.tls.cafile": "./ca.crt", "nomad.port": "4646"}))
    assert migration.variables() == {"NOMAD_ADDR": "http://127.0.0.1:4646"}
    assert migration.rejected == (
        pc.Rejected("nomad.tls.cafile", "Poseidon ignores it unless nomad.tls.active is true"),
    )


def test_a_secrets_bad_value_is_never_quoted() -> None:
    migration = pc.from_yaml('server:\n  token: "first line\\nsecond-secret-line"\n')
    assert migration.rejected == (
        pc.Rejected("server.token", "holds a line break or another control character"),
    )
    assert "second-secret-line" not in pc.render(migration)


@pytest.mark.parametrize(
    "text", ["", "# only comments\n", "---\n", "server:\n", "nomad:\n  token: ~\n  namespace:\n"]
)
def test_empty_files_sections_and_nulls_give_nothing(text: str) -> None:
    assert pc.from_yaml(text) == pc.Migration()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server:\n  port: 7200\n port: 1\n", r"not valid YAML: line 3, column 2: "),
        ("server: [1,\n", r"not valid YAML: line 2, column 1: "),
        ("- server\n- nomad\n", r"not a Poseidon configuration: the top level is not a mapping"),
        ("just text\n", r"not a Poseidon configuration"),
        ("a: 1\n---\nb: 2\n", r"not valid YAML: "),
        ("server:\x00\n", r"not valid YAML: "),
    ],
)
def test_text_that_is_no_configuration_raises_one_line(text: str, message: str) -> None:
    with pytest.raises(pc.PoseidonConfigError) as caught:
        pc.from_yaml(text)
    assert re.match(message, str(caught.value)), str(caught.value)
    assert "\n" not in str(caught.value)


# --- environment variables ---------------------------------------------------------


def test_poseidon_variables_convert_as_the_files_settings() -> None:
    environ = {
        "POSEIDON_SERVER_ADDRESS": "0.0.0.0",
        "POSEIDON_SERVER_TOKEN": "platform-token-0123",
        "POSEIDON_NOMAD_ADDRESS": "nomad.example",
        "POSEIDON_NOMAD_TLS_ACTIVE": "true",
        "POSEIDON_NOMAD_TOKEN": "acl",
        "POSEIDON_LOGGER_LEVEL": "WARN",
        "POSEIDON_AWS_ENABLED": "false",
        "POSEIDON_SENTRY_DSN": "https://key@sentry.example/1",
        "POSEIDON_SERVR_PORT": "1",
        "POSEIDON_NOMAD_NAMESPACE": "",  # empty: unset, as ours
        "poseidon_nomad_port": "1",  # Poseidon's names are upper-case only
        "NRC_API_PORT": "1",  # not Poseidon's
    }
    migration = pc.from_environ(environ)
    assert migration.variables() == {
        "NRC_API_HOST": "0.0.0.0",
        "NRC_API_TOKEN": "platform-token-0123",
        "NOMAD_ADDR": "https://nomad.example:4646",
        "NOMAD_TOKEN": "acl",
        "NRC_LOG_LEVEL": "WARNING",
    }
    assert [a.poseidon for a in migration.assignments][:2] == [
        "POSEIDON_SERVER_ADDRESS",
        "POSEIDON_SERVER_TOKEN",
    ]
    assert [u.poseidon for u in migration.unmapped] == [
        "POSEIDON_AWS_ENABLED",
        "POSEIDON_SENTRY_DSN",
    ]
    assert migration.unknown == ("POSEIDON_SERVR_PORT",)


def test_a_number_poseidon_cannot_read_from_a_variable_is_not_converted() -> None:
    """Poseidon parses no float from the environment: its pool threshold
    variable never had an effect, so the file's value still counts."""
    environ = {"POSEIDON_SERVER_ALERT_PREWARMINGPOOLTHRESHOLD": "0.9"}
    yaml_text = nested({"server.alert.prewarmingpoolthreshold": "0.4"})
    migration = pc.migrate(pc.read_yaml(yaml_text), pc.read_environ(environ))
    assert migration.variables() == {"NRC_POOL_ALERT_THRESHOLD": "0.4"}
    (rejected,) = migration.rejected
    assert rejected.poseidon == "POSEIDON_SERVER_ALERT_PREWARMINGPOOLTHRESHOLD"
    assert "set NRC_POOL_ALERT_THRESHOLD if you meant it" in rejected.problem


def test_variables_override_the_file_and_combine_with_it() -> None:
    text = nested({"nomad.address": "nomad.example", "nomad.port": "4646", "nomad.token": "file"})
    environ = {"POSEIDON_NOMAD_PORT": "4747", "POSEIDON_NOMAD_TOKEN": "variable"}
    migration = pc.migrate(pc.read_yaml(text), pc.read_environ(environ))
    assert migration.variables() == {
        "NOMAD_ADDR": "http://nomad.example:4747",
        "NOMAD_TOKEN": "variable",
    }
    assert [a.poseidon for a in migration.assignments] == [
        "nomad.address",
        "POSEIDON_NOMAD_PORT",
        "POSEIDON_NOMAD_TOKEN",
    ]


# --- rendering ---------------------------------------------------------------------


def test_render_prints_variables_then_comments() -> None:
    text = (
        "server:\n  token: platform-token-0123\n  systemdsocketactivation: true\n  tpyo: 1\n"
        "nomad:\n  address: nomad.example\n  port: 4647\n  tls:\n    active: true\n"
        "logger:\n  level: loud\n"
    )
    reason = pc.SETTINGS["server.systemdsocketactivation"]
    assert isinstance(reason, pc.NoEquivalent)
    assert pc.render(pc.from_yaml(text)) == (
        "NRC_API_TOKEN=platform-token-0123\n"
        "NOMAD_ADDR=https://nomad.example:4647\n"
        f"# server.systemdsocketactivation: no equivalent: {reason.reason}\n"
        "# server.tpyo: unknown: not a Poseidon setting\n"
        "# logger.level: not converted: not a level Poseidon knows "
        '(panic, fatal, error, warn, info, debug, trace; got "loud")\n'
    )


def test_render_shows_no_value_that_is_not_converted() -> None:
    secrets = {
        "influxdb.token": "influx-secret",
        "sentry.dsn": "https://sentry-secret@sentry.example/1",
        "server.loggingfiltertoken": "filter-secret",
        "aws.endpoint": "wss://aws-secret.example",
        "server.bogus": "bogus-secret",
        "nomad.tls.keyfile": "/keys/unused-secret.pem",
    }
    out = pc.render(pc.from_yaml(nested(secrets)))
    for value in secrets.values():
        assert value not in out


def test_render_of_nothing_says_so() -> None:
    assert pc.render(pc.Migration()) == "# no Poseidon settings given\n"


# --- the command line ----------------------------------------------------------------


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "configuration.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_config_from_poseidon_prints_the_file_and_the_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "server:\n  token: short\nnomad:\n  address: nomad.example\naws:\n  enabled: false\n",
    )
    monkeypatch.setenv("POSEIDON_NOMAD_TOKEN", "nomad-acl-token")
    monkeypatch.setenv("NRC_API_PORT", "not-a-port")  # ours need not be valid to migrate
    assert main(["config", "--from-poseidon", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[:3] == [
        "NRC_API_TOKEN=short",
        "NOMAD_ADDR=http://nomad.example:4646",
        "NOMAD_TOKEN=nomad-acl-token",
    ]
    assert lines[3].startswith("# aws.enabled: no equivalent: ")
    # What `run` would refuse in the converted variables, by our own checks.
    assert lines[4:] == [
        "# not accepted as is: NRC_API_TOKEN: must be a token of 16 or more characters "
        "without whitespace or control characters"
    ]


def test_config_from_poseidon_says_when_run_would_refuse_an_open_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "server:\n  address: 0.0.0.0\n")
    assert main(["config", "--from-poseidon", str(path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(
        "# not accepted as is: NRC_API_TOKEN is not set and the API would listen"
    )


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "No such file or directory"),
        ("server: [\n", "not valid YAML: line 2, column 1: "),
        ("- a list\n", "not a Poseidon configuration"),
        (b"server:\n  token: \xff\n", "not UTF-8 text"),
        ("directory", "Is a directory"),
    ],
)
def test_config_from_poseidon_with_a_bad_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes | None, why: str
) -> None:
    path = tmp_path / "missing.yaml"
    if content == "directory":
        path = tmp_path
    elif content is not None:
        path = write(tmp_path, content)
    assert main(["config", "--from-poseidon", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"nomad-runner-controller: --from-poseidon {path}: {why}"), err
    assert "Traceback" not in err


def test_config_from_poseidon_and_markdown_do_not_go_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["config", "--markdown", "--from-poseidon", str(write(tmp_path, ""))])
    assert caught.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# --- at start-up -------------------------------------------------------------------


def test_startup_warnings_name_each_variables_equivalent_without_its_value() -> None:
    environ = {
        "POSEIDON_NOMAD_TOKEN": "nomad-secret-value",
        "POSEIDON_INFLUXDB_TOKEN": "influx-secret-value",
        "POSEIDON_NOMAD_PORT": "",
        "POSEIDON_NOPE": "1",
        "NOMAD_TOKEN": "x",
    }
    warnings = pc.startup_warnings(environ)
    assert len(warnings) == 4
    by_name = {w.split(" ", 1)[0]: w for w in warnings}
    assert "is NOMAD_TOKEN here" in by_name["POSEIDON_NOMAD_TOKEN"]
    assert "is NOMAD_ADDR here (http://address:port" in by_name["POSEIDON_NOMAD_PORT"]
    assert "has no equivalent: there is no InfluxDB writer" in by_name["POSEIDON_INFLUXDB_TOKEN"]
    assert "no Poseidon setting either" in by_name["POSEIDON_NOPE"]
    assert all(w.split(" ", 1)[1].startswith("is not applied") for w in warnings)
    assert "secret-value" not in "".join(warnings)


class _Stop(Exception):
    pass


def _poseidon_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "POSEIDON_" in r.getMessage()]


@pytest.fixture
def quiet_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` and `dev` up to where they would start anything: logging left
    to caplog, and the first part they would build stops them."""
    monkeypatch.setattr(service, "configure_logging", lambda *args: None)

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise service._StopBeforeServing("SIGTERM")

    monkeypatch.setattr(service, "build", stop)

    def no_sim(*args: Any, **kwargs: Any) -> Any:
        raise _Stop

    monkeypatch.setattr(nomadsim, "SimServer", no_sim)
    monkeypatch.setenv("POSEIDON_NOMAD_TOKEN", "nomad-secret-value")
    monkeypatch.setenv("POSEIDON_AWS_ENABLED", "true")


@pytest.mark.usefixtures("quiet_start")
def test_run_warns_once_about_each_poseidon_variable(caplog: pytest.LogCaptureFixture) -> None:
    assert service.run(load_settings({})) == 0
    lines = _poseidon_lines(caplog)
    assert [r.levelno for r in lines] == [logging.WARNING] * 2
    assert lines[0].getMessage().startswith("POSEIDON_AWS_ENABLED is not applied: ")
    assert "is NOMAD_TOKEN here" in lines[1].getMessage()
    assert "nomad-secret-value" not in caplog.text


@pytest.mark.usefixtures("quiet_start")
def test_dev_warns_once_about_each_poseidon_variable(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(_Stop):
        service.dev(load_settings({}))
    assert [r.getMessage().split(" ", 1)[0] for r in _poseidon_lines(caplog)] == [
        "POSEIDON_AWS_ENABLED",
        "POSEIDON_NOMAD_TOKEN",
    ]


def test_poseidon_variables_are_not_applied() -> None:
    settings = load_settings({"POSEIDON_NOMAD_TOKEN": "x", "POSEIDON_SERVER_PORT": "8000"})
    assert settings.nomad_token is None and settings.api_port == 7200


# --- the docs ------------------------------------------------------------------------


def test_operations_guide_tables_every_setting() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    section = guide.split("## Migrating from Poseidon", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {k for row in rows for k in re.findall(r"`([a-z][a-z.*]+)`", row.split("|")[1])}
    expected = set(pc.SETTINGS) | {f"{family}.*" for family in pc.FAMILIES}
    assert expected - documented == set()
    for key, found in pc.SETTINGS.items():
        if isinstance(found, pc.Equivalent):
            row = next(r for r in rows if f"`{key}`" in r.split("|")[1])
            assert found.variable in row, key
