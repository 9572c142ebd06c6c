"""Poseidon's configuration in our terms: one table, from each of its settings
to the `NRC_*`/`NOMAD_*` variable that does the same here, or why none does.

Poseidon reads `configuration.yaml`, then `POSEIDON_<PATH>` variables that
override it: the setting's YAML path upper-cased with `_` for `.`
(`nomad.tls.active` is `POSEIDON_NOMAD_TLS_ACTIVE`). `from_yaml` and
`from_environ` turn either into a `Migration` (`migrate` merges several, the
later overriding, as Poseidon's variables override its file); `render` prints
it as `NAME=value` lines followed by comments on what did not carry over;
`startup_warnings` is what `run` and `dev` log for each `POSEIDON_*` variable
they find, since those are never applied.

Pure: no file, no environment, no logging; `config --from-poseidon`
(controller/cli.py) reads the file, controller/service.py logs the warnings.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

import yaml

__all__ = [
    "ENV_PREFIX",
    "FAMILIES",
    "SETTINGS",
    "Assignment",
    "Equivalent",
    "Migration",
    "NoEquivalent",
    "PoseidonConfigError",
    "Rejected",
    "Setting",
    "Source",
    "Unmapped",
    "env_name",
    "from_environ",
    "from_yaml",
    "key_of",
    "migrate",
    "read_environ",
    "read_yaml",
    "render",
    "startup_warnings",
    "target",
]

ENV_PREFIX = "POSEIDON_"

# Every setting given, by Poseidon's dotted key: what a conversion that
# combines several settings (NOMAD_ADDR) reads the others from.
Given = Mapping[str, str]
Convert = Callable[[str, Given], str]


class PoseidonConfigError(Exception):
    """The text is not a Poseidon configuration at all (not YAML, not a
    mapping); `str()` is one line saying where and why."""


@dataclass(frozen=True, slots=True)
class Equivalent:
    """Our variable for a Poseidon setting and how its value converts."""

    variable: str
    convert: Convert
    # The conversion in words (for warnings and docs); "" when the value
    # is taken as it is.
    how: str = ""
    # False: Poseidon cannot read the setting from a variable (it parses no
    # numbers there), so a POSEIDON_* variable for it had no effect.
    read_from_environ: bool = True


@dataclass(frozen=True, slots=True)
class NoEquivalent:
    """Nothing here does what the setting did; `reason` says why, in one sentence."""

    reason: str


Target = Equivalent | NoEquivalent


# --- converting values ---------------------------------------------------------
#
# A converter gets the setting's value as written (YAML scalars are read as
# text, as Poseidon's YAML library hands them to string fields) and every
# setting given; it returns our variable's value or raises one of these.


class _Invalid(ValueError):
    """Poseidon would not take the value either; the message says why."""


class _Unused(Exception):
    """The value has no effect given the rest of the configuration (why in the message)."""


class _Elsewhere(Exception):
    """A setting this one is combined with is invalid; that one is reported."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Go's strconv.Atoi (64 bits: at most 19 digits), and YAML's digit
# separators (the example's `30_000`).
_INTEGER = re.compile(r"[+-]?[0-9][0-9_]{0,24}")
# A short exponent only: 1e999999999 written out would be a billion digits.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,2})?")
# Go's strconv.ParseBool, and the YAML 1.1 words Poseidon's YAML library
# still takes for a bool field.
_TRUE = frozenset({"1", "t", "true", "y", "yes", "on"})
_FALSE = frozenset({"0", "f", "false", "n", "no", "off"})
# logrus.ParseLevel's names → ours.
_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
    "fatal": "ERROR",
    "panic": "ERROR",
}


def _got(value: str) -> str:
    # Only converters of settings that are not secret quote the value.
    return f"got {json.dumps(value, ensure_ascii=False)}"


def _text(value: str, given: Given) -> str:
    """Taken as it is; a line break would end its `NAME=value` line early."""
    if _CONTROL.search(value):
        raise _Invalid("holds a line break or another control character")
    return value


def _word(value: str, given: Given) -> str:
    if not value or _CONTROL.search(value) or any(c.isspace() for c in value):
        raise _Invalid(f"not a single word ({_got(value)})")
    return value


def _integer(value: str) -> int:
    text = value.strip()
    if not _INTEGER.fullmatch(text):
        raise _Invalid(f"not an integer ({_got(value)})")
    return int(text.replace("_", ""))


def _port(value: str, given: Given) -> str:
    port = _integer(value)
    if not 1 <= port <= 65535:
        raise _Invalid(f"not a port between 1 and 65535 ({_got(value)})")
    return str(port)


def _truth(value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise _Invalid(f"not true or false ({_got(value)})")


def _boolean(value: str, given: Given) -> str:
    return "true" if _truth(value) else "false"


def _inverted(value: str, given: Given) -> str:
    return "false" if _truth(value) else "true"


def _number(value: str, given: Given) -> str:
    text = value.strip()
    if not _NUMBER.fullmatch(text):
        raise _Invalid(f"not a number ({_got(value)})")
    # Written out without an exponent: our variables take none.
    return format(Decimal(text), "f")


def _log_level(value: str, given: Given) -> str:
    level = _LEVELS.get(value.strip().lower())
    if level is None:
        raise _Invalid(
            f"not a level Poseidon knows (panic, fatal, error, warn, info, debug, trace; "
            f"{_got(value)})"
        )
    return level


def _log_format(value: str, given: Given) -> str:
    # Poseidon writes JSON for exactly this name and text for anything else.
    return "json" if value == "JSONFormatter" else "text"


def _websocket_scheme(value: str, given: Given) -> str:
    return "wss" if _truth(value) else "ws"


def _host(value: str) -> str:
    """A host for a URL: Poseidon joins `address:port` itself, so no scheme or port."""
    host = _word(value, {})
    if "/" in host or "@" in host:
        raise _Invalid(f"not a host name or address ({_got(value)})")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.strip("[]"))
        except ValueError:
            raise _Invalid(
                f"not a host name or address: the port belongs in nomad.port ({_got(value)})"
            ) from None
        return f"[{host.strip('[]')}]"
    return host


# Poseidon's defaults for the parts of its Nomad URL.
_NOMAD_URL_PARTS = (
    ("nomad.address", "127.0.0.1"),
    ("nomad.port", "4646"),
    ("nomad.tls.active", "false"),
)


def _nomad_addr(key: str) -> Convert:
    """NOMAD_ADDR from nomad.address, nomad.port and nomad.tls.active, as
    Poseidon builds its Nomad URL; `key` is the part being converted."""

    def convert(value: str, given: Given) -> str:
        parsed: dict[str, str] = {}
        for part, default in _NOMAD_URL_PARTS:
            text = given.get(part, default)
            try:
                if part == "nomad.address":
                    parsed[part] = _host(text)
                elif part == "nomad.port":
                    parsed[part] = _port(text, given)
                else:
                    parsed[part] = "https" if _truth(text) else "http"
            except _Invalid:
                if part == key:
                    raise
                raise _Elsewhere from None
        return f"{parsed['nomad.tls.active']}://{parsed['nomad.address']}:{parsed['nomad.port']}"

    return convert


def _nomad_tls_file(value: str, given: Given) -> str:
    """Poseidon hands Nomad's client the TLS files only with nomad.tls.active."""
    try:
        active = _truth(given.get("nomad.tls.active", "false"))
    except _Invalid:
        raise _Elsewhere from None
    if not active:
        raise _Unused("Poseidon ignores it unless nomad.tls.active is true")
    return _text(value, given)


# --- the table -----------------------------------------------------------------

_NOMAD_ADDR_HOW = "http://address:port, https with nomad.tls.active: true"
_TLS_FILE_HOW = "only when nomad.tls.active is true"
_API_TLS = "the API serves plain HTTP; the TLS proxy in front of it takes the certificate and key"
_AWS = "there is no AWS Lambda executor; every runner is a Nomad job"
_CPU_PROFILE = (
    "Go's CPU profiler and profile-guided builds have no counterpart here "
    "(sample a running controller with py-spy instead)"
)
_MEMORY_WATCHDOG = (
    "there is no memory watchdog; watch the allocation's memory in Nomad, "
    "bounded by the controller job's memory limit"
)
_SENTRY = "there is no Sentry client; errors are log lines (NRC_LOG_FORMAT=json for a log shipper)"
_INFLUXDB = "there is no InfluxDB writer; the metrics are Prometheus' at /metrics"

# Every setting of Poseidon's configuration.yaml (and logger.formatter, which
# its code reads but its example leaves out), in the example's order.
SETTINGS: Mapping[str, Target] = {
    "server.address": Equivalent("NRC_API_HOST", _word),
    "server.port": Equivalent("NRC_API_PORT", _port),
    "server.systemdsocketactivation": NoEquivalent(
        "the API binds NRC_API_HOST:NRC_API_PORT itself, without systemd "
        "(for restarts without downtime, run two replicas)"
    ),
    "server.token": Equivalent(
        "NRC_API_TOKEN", _text, "clients keep sending it as Poseidon-Token; 16 characters or more"
    ),
    "server.tls.active": Equivalent(
        "NRC_API_WEBSOCKET_SCHEME",
        _websocket_scheme,
        "true is wss, false ws; the TLS itself is a proxy's in front of the API",
    ),
    "server.tls.cafile": NoEquivalent(
        "Poseidon uses it only for its systemd watchdog's own health check, which we lack"
    ),
    "server.tls.certfile": NoEquivalent(_API_TLS),
    "server.tls.keyfile": NoEquivalent(_API_TLS),
    "server.interactivestderr": Equivalent("NRC_EXEC_SEPARATE_STDERR", _boolean),
    "server.templatejobfile": Equivalent(
        "NRC_TEMPLATE_JOB_FILE", _text, "the same HCL file, parsed by your Nomad"
    ),
    "server.loggingfiltertoken": NoEquivalent(
        "requests are not logged one by one, so there are none to filter out"
    ),
    "server.alert.prewarmingpoolthreshold": Equivalent(
        "NRC_POOL_ALERT_THRESHOLD", _number, read_from_environ=False
    ),
    "server.alert.prewarmingpoolreloadtimeout": NoEquivalent(
        "the reconcile loop keeps refilling the pools, so there is nothing to reload "
        "(the RunnerPoolDepleting alert reports a pool that stays low)"
    ),
    "nomad.enabled": NoEquivalent("Nomad is the only executor and always used"),
    "nomad.address": Equivalent("NOMAD_ADDR", _nomad_addr("nomad.address"), _NOMAD_ADDR_HOW),
    "nomad.port": Equivalent("NOMAD_ADDR", _nomad_addr("nomad.port"), _NOMAD_ADDR_HOW),
    "nomad.token": Equivalent("NOMAD_TOKEN", _text),
    "nomad.tls.active": Equivalent("NOMAD_ADDR", _nomad_addr("nomad.tls.active"), _NOMAD_ADDR_HOW),
    "nomad.tls.cafile": Equivalent("NOMAD_CACERT", _nomad_tls_file, _TLS_FILE_HOW),
    "nomad.tls.certfile": Equivalent("NOMAD_CLIENT_CERT", _nomad_tls_file, _TLS_FILE_HOW),
    "nomad.tls.keyfile": Equivalent("NOMAD_CLIENT_KEY", _nomad_tls_file, _TLS_FILE_HOW),
    "nomad.namespace": Equivalent("NOMAD_NAMESPACE", _word),
    "nomad.disableforcepull": Equivalent("NRC_TEMPLATE_FORCE_PULL", _inverted, "inverted"),
    "nomad.network.mode": Equivalent("NRC_TEMPLATE_NETWORK_MODE", _word),
    "aws.enabled": NoEquivalent(_AWS),
    "aws.endpoint": NoEquivalent(_AWS),
    "aws.functions": NoEquivalent(_AWS),
    "logger.level": Equivalent(
        "NRC_LOG_LEVEL", _log_level, "TRACE is DEBUG, WARN WARNING, FATAL and PANIC ERROR"
    ),
    "logger.formatter": Equivalent(
        "NRC_LOG_FORMAT", _log_format, "JSONFormatter is json, anything else text"
    ),
    "profiling.cpuenabled": NoEquivalent(_CPU_PROFILE),
    "profiling.cpufile": NoEquivalent(_CPU_PROFILE),
    "profiling.memoryinterval": NoEquivalent(_MEMORY_WATCHDOG),
    "profiling.memorythreshold": NoEquivalent(_MEMORY_WATCHDOG),
    "sentry.dsn": NoEquivalent(_SENTRY),
    "sentry.environment": NoEquivalent(_SENTRY),
    "sentry.release": NoEquivalent(_SENTRY),
    "sentry.debug": NoEquivalent(_SENTRY),
    "sentry.enabletracing": NoEquivalent(_SENTRY),
    "sentry.tracessamplerate": NoEquivalent(_SENTRY),
    "sentry.profilessamplerate": NoEquivalent(_SENTRY),
    "influxdb.url": NoEquivalent(_INFLUXDB),
    "influxdb.token": NoEquivalent(_INFLUXDB),
    "influxdb.organization": NoEquivalent(_INFLUXDB),
    "influxdb.bucket": NoEquivalent(_INFLUXDB),
    "influxdb.stage": NoEquivalent(_INFLUXDB),
}

# Sections Poseidon takes whole from a library type, so any key under them
# is real: Sentry's client options and Nomad's network block.
FAMILIES: Mapping[str, NoEquivalent] = {
    "nomad.network": NoEquivalent(
        "runners' networks get only the mode (NRC_TEMPLATE_NETWORK_MODE) and the "
        "environment's ports, nothing else of Nomad's network block"
    ),
    "sentry": NoEquivalent(_SENTRY),
}

# The sections that hold settings: server, server.tls, nomad, ...
_SECTIONS = frozenset(
    key.rsplit(".", i)[0] for key in SETTINGS for i in range(1, key.count(".") + 1)
)
_RANK = {key: rank for rank, key in enumerate(SETTINGS)}


def target(key: str) -> Target | None:
    """What Poseidon's setting `key` (dotted) is here; None: Poseidon has no such setting."""
    found = SETTINGS.get(key)
    if found is not None:
        return found
    for family, reason in FAMILIES.items():
        if key.startswith(family + "."):
            return reason
    return None


def env_name(key: str) -> str:
    """The variable Poseidon reads `key` from: `nomad.tls.active` → POSEIDON_NOMAD_TLS_ACTIVE."""
    return ENV_PREFIX + key.upper().replace(".", "_")


def key_of(name: str) -> str:
    """`env_name` backwards. Exact, since none of Poseidon's field names has an underscore."""
    return name.removeprefix(ENV_PREFIX).lower().replace("_", ".")


def _rank(key: str) -> tuple[int, str]:
    """Table order; a family's other keys after the family's listed ones."""
    if key in _RANK:
        return _RANK[key], ""
    family = next((f for f in FAMILIES if key.startswith(f + ".")), key)
    listed = [rank for k, rank in _RANK.items() if k.startswith(family + ".")]
    return max(listed, default=len(_RANK)), key


# --- what was given ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """One Poseidon setting as given."""

    key: str  # Poseidon's dotted name: nomad.tls.active
    name: str  # as the operator wrote it: the key, or POSEIDON_NOMAD_TLS_ACTIVE
    value: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """A setting, variable or YAML key that was not converted, and why: its
    value is invalid, or Poseidon itself ignored it."""

    poseidon: str
    problem: str


@dataclass(frozen=True, slots=True)
class Source:
    """What one configuration (a file, an environment) gives."""

    settings: tuple[Setting, ...] = ()
    unknown: tuple[str, ...] = ()  # names Poseidon has no setting for
    rejected: tuple[Rejected, ...] = ()


# YAML's nulls: the setting is left at Poseidon's default, as if not written.
_NULLS = frozenset({"", "~", "null", "Null", "NULL"})


def read_yaml(text: str) -> Source:
    """The settings of a configuration.yaml. Raises PoseidonConfigError when
    the text is not YAML or not a mapping of sections."""
    try:
        # BaseLoader keeps every scalar as written (a token of digits stays
        # text) and constructs nothing but strings, lists and mappings.
        document = yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as exc:
        raise PoseidonConfigError(_yaml_problem(exc)) from None
    if document is None or (isinstance(document, str) and document in _NULLS):
        return Source()  # empty, or only comments: Poseidon's defaults
    if not isinstance(document, dict):
        raise PoseidonConfigError("not a Poseidon configuration: the top level is not a mapping")
    settings: list[Setting] = []
    unknown: list[str] = []
    rejected: list[Rejected] = []
    _walk(document, "", settings, unknown, rejected)
    return Source(tuple(settings), tuple(unknown), tuple(rejected))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error (pyyaml's own message spans several)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"not valid YAML: line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return f"not valid YAML: {' '.join(str(exc).split())}"


def _walk(
    mapping: dict[str, object],
    prefix: str,
    settings: list[Setting],
    unknown: list[str],
    rejected: list[Rejected],
) -> None:
    for name, value in mapping.items():
        key = prefix + name
        if key in SETTINGS:
            _leaf(key, value, settings, rejected)
        elif target(key) is not None:  # a family's key: no equivalent, whatever its shape
            if not (isinstance(value, str) and value in _NULLS):
                settings.append(Setting(key, key, value if isinstance(value, str) else ""))
        elif key in _SECTIONS:
            if isinstance(value, dict):
                _walk(value, key + ".", settings, unknown, rejected)
            elif not (isinstance(value, str) and value in _NULLS):
                rejected.append(Rejected(key, "a value where Poseidon expects a section"))
        else:
            # Not walked into: one line for a misspelt section, not one per key.
            unknown.append(key)


def _leaf(key: str, value: object, settings: list[Setting], rejected: list[Rejected]) -> None:
    if isinstance(value, str):
        if value not in _NULLS:
            settings.append(Setting(key, key, value))
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        # Poseidon's own variable form of a list (aws.functions): space-separated.
        settings.append(Setting(key, key, " ".join(value)))
    else:
        rejected.append(Rejected(key, "a section or list where Poseidon expects a value"))


def read_environ(environ: Mapping[str, str]) -> Source:
    """The POSEIDON_* variables of `environ`. Empty ones count as unset, as ours do."""
    settings: list[Setting] = []
    unknown: list[str] = []
    rejected: list[Rejected] = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or not environ[name]:
            continue
        key = key_of(name)
        found = target(key)
        if found is None:
            unknown.append(name)
        elif isinstance(found, Equivalent) and not found.read_from_environ:
            rejected.append(Rejected(name, _not_from_environ(found)))
        else:
            settings.append(Setting(key, name, environ[name]))
    return Source(tuple(settings), tuple(unknown), tuple(rejected))


def _not_from_environ(found: Equivalent) -> str:
    return (
        "Poseidon does not read it from the environment (it parses no numbers there), so it "
        f"had no effect; set {found.variable} if you meant it"
    )


# --- the migration -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assignment:
    """A Poseidon setting and the variable it becomes here."""

    poseidon: str  # as given: nomad.token or POSEIDON_NOMAD_TOKEN
    value: str  # Poseidon's value
    variable: str
    converted: str  # our variable's value


@dataclass(frozen=True, slots=True)
class Unmapped:
    """A Poseidon setting nothing here does, and why."""

    poseidon: str
    reason: str


@dataclass(frozen=True, slots=True)
class Migration:
    assignments: tuple[Assignment, ...] = ()
    unmapped: tuple[Unmapped, ...] = ()
    unknown: tuple[str, ...] = ()  # names that are no Poseidon setting (typos?)
    rejected: tuple[Rejected, ...] = ()

    def variables(self) -> dict[str, str]:
        """Our variables with their values, each once (NOMAD_ADDR comes from
        up to three settings, always with the same value)."""
        return {a.variable: a.converted for a in self.assignments}


def migrate(*sources: Source) -> Migration:
    """The sources converted together; for a setting given twice the later
    source wins, as Poseidon's variables override its file."""
    chosen: dict[str, Setting] = {}
    unknown: list[str] = []
    rejected: list[Rejected] = []
    for source in sources:
        chosen.update((s.key, s) for s in source.settings)
        unknown += source.unknown
        rejected += source.rejected
    given = {key: s.value for key, s in chosen.items()}
    assignments: list[Assignment] = []
    unmapped: list[Unmapped] = []
    for key in sorted(chosen, key=_rank):
        setting, found = chosen[key], target(key)
        if not isinstance(found, Equivalent):
            reason = found.reason if found is not None else "not a Poseidon setting"
            unmapped.append(Unmapped(setting.name, reason))
            continue
        try:
            converted = found.convert(setting.value, given)
        except _Invalid as exc:
            rejected.append(Rejected(setting.name, str(exc)))
        except _Unused as exc:
            rejected.append(Rejected(setting.name, str(exc)))
        except _Elsewhere:
            pass  # the setting at fault is rejected on its own line
        else:
            assignments.append(Assignment(setting.name, setting.value, found.variable, converted))
    return Migration(tuple(assignments), tuple(unmapped), tuple(unknown), tuple(rejected))


def from_yaml(text: str) -> Migration:
    """A configuration.yaml converted. Raises PoseidonConfigError for text
    that is not a Poseidon configuration."""
    return migrate(read_yaml(text))


def from_environ(environ: Mapping[str, str]) -> Migration:
    """The POSEIDON_* variables of `environ` converted."""
    return migrate(read_environ(environ))


def render(migration: Migration) -> str:
    """`NAME=value` lines (for an env file; tokens as given, since the
    operator asked for them), then a comment line for each setting that did
    not carry over. Values that are not converted are never printed."""
    lines = [f"{name}={value}" for name, value in migration.variables().items()]
    lines += [f"# {u.poseidon}: no equivalent: {u.reason}" for u in migration.unmapped]
    lines += [f"# {name}: unknown: not a Poseidon setting" for name in migration.unknown]
    lines += [f"# {r.poseidon}: not converted: {r.problem}" for r in migration.rejected]
    return "\n".join(lines or ["# no Poseidon settings given"]) + "\n"


# --- at start-up ---------------------------------------------------------------


def startup_warnings(environ: Mapping[str, str]) -> list[str]:
    """One line per POSEIDON_* variable in `environ` (set or empty): it is not
    applied, and what to set instead. Never a value: it may be a token."""
    return [_warning(name) for name in _poseidon_names(environ)]


def _poseidon_names(environ: Iterable[str]) -> list[str]:
    return sorted(name for name in environ if name.startswith(ENV_PREFIX))


def _warning(name: str) -> str:
    key = key_of(name)
    found = target(key)
    if found is None:
        return f"{name} is not applied, and is no Poseidon setting either"
    if isinstance(found, NoEquivalent):
        return f"{name} is not applied: Poseidon's {key} has no equivalent: {found.reason}"
    how = f" ({found.how})" if found.how else ""
    return (
        f"{name} is not applied: Poseidon's {key} is {found.variable} here{how}; "
        "`nomad-runner-controller config --from-poseidon FILE` converts a configuration"
    )
