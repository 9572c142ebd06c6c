"""What the deploy tests share: where the files are, the real tools (promtool,
prometheus) or a skip that says how to get them, a small Dockerfile and
.dockerignore reader, and the metric series and PromQL selectors the
alert rules and the dashboard name."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram

from controller.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
JOB_FILE = DEPLOY / "nomad" / "nomad-runner-controller.nomad.hcl"
ACL_POLICY = DEPLOY / "nomad" / "acl-policy.hcl"
DASHBOARD = DEPLOY / "grafana" / "dashboard.json"
COMPOSE = DEPLOY / "compose.yaml"

INSTALL_HINT = (
    "apt-get install prometheus (Debian/Ubuntu: provides promtool and the prometheus server)"
)


def require_tool(name: str) -> str:
    """The path of `name`; without it skip, or fail under CI=true (where
    .ci/run installs it, so missing means the CI setup is broken)."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not installed: {INSTALL_HINT}"
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"{message}; CI must run these tests (.ci/run installs it)", pytrace=False)
    pytest.skip(message)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


# --- Dockerfile ---------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, COPY, ...
    args: str  # the rest of the logical line
    stage: int  # index of the FROM it follows; -1 before the first


def dockerfile(path: Path = DOCKERFILE) -> list[Instruction]:
    """The logical lines of a Dockerfile: continuations joined, comments dropped
    (also between continued lines, as Docker does)."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append((pending + stripped).strip())
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    instructions: list[Instruction] = []
    stage = -1
    for text in logical:
        keyword, _, args = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), stage))
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT/CMD/HEALTHCHECK CMD."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(a, str) for a in value), args
    return value


def key_values(args: str) -> dict[str, str]:
    """`K=V K2="v 2"` as ENV and LABEL write them."""
    pairs = {}
    for token in shlex.split(args):
        key, sep, value = token.partition("=")
        assert sep, f"not KEY=VALUE: {token!r} (the legacy `ENV K V` form is not used here)"
        pairs[key] = value
    return pairs


def image_env(instructions: list[Instruction] | None = None) -> dict[str, str]:
    """The ENV of the final stage (what the controller sees in the container)."""
    env: dict[str, str] = {}
    for i in final_stage(instructions or dockerfile()):
        if i.keyword == "ENV":
            env.update(key_values(i.args))
    return env


def dockerignore_patterns(path: Path = DOCKERIGNORE) -> list[tuple[bool, str, re.Pattern[str]]]:
    """(excludes, pattern, regex) per line, in order: the last match decides."""
    patterns = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        patterns.append((not negated, pattern, re.compile(_glob_regex(pattern))))
    return patterns


def _glob_regex(pattern: str) -> str:
    """Docker's pattern syntax (Go filepath.Match plus `**`) as a regex; the
    character classes and escapes it also allows are not used here."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] in "[]\\":
            raise NotImplementedError(f"pattern syntax not handled by this test: {pattern!r}")
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def in_build_context(relative: str, patterns: list[tuple[bool, str, re.Pattern[str]]]) -> bool:
    """Whether Docker sends `relative` (a path under the repository) to the
    build: a pattern matching the path or any of its parent directories
    applies, and the last pattern that applies wins."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for excludes, _, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = excludes
    return not excluded


def build_context(root: Path = REPO) -> set[str]:
    """Every file of `root` that `docker build` would send, by relative path.
    Excluded directories that no `!` pattern reaches into are not entered."""
    patterns = dockerignore_patterns(root / ".dockerignore")
    negations = [pattern for excludes, pattern, _ in patterns if not excludes]
    files: set[str] = set()
    for directory, subdirs, names in os.walk(root):
        base = Path(directory).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        subdirs[:] = [
            d
            for d in subdirs
            if in_build_context(prefix + d, patterns)
            or any(n.startswith(prefix + d + "/") for n in negations)
        ]
        files.update(prefix + n for n in names if in_build_context(prefix + n, patterns))
    return files


# --- metrics and PromQL -----------------------------------------------------------


def metric_series() -> dict[str, frozenset[str]]:
    """Every series name the controller exports with the label names it may
    carry (a histogram's buckets also `le`), plus `instance` and `job`, which
    Prometheus adds when scraping."""
    scrape = frozenset({"instance", "job"})
    series: dict[str, frozenset[str]] = {}
    for metric in vars(Metrics()).values():
        if not isinstance(metric, Counter | Gauge | Histogram):
            continue
        # prometheus_client keeps these on the metric object without a public accessor.
        name, labels = metric._name, frozenset(metric._labelnames) | scrape
        if isinstance(metric, Counter):
            series[name + "_total"] = labels
        elif isinstance(metric, Gauge):
            series[name] = labels
        else:
            series[name + "_bucket"] = labels | {"le"}
            series[name + "_sum"] = labels
            series[name + "_count"] = labels
    return series


@dataclass(frozen=True)
class Selector:
    text: str  # as written, e.g. nrc_runners{state="idle"}
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)


_OUR_SERIES = r"(?:nrc|controller_runtime|workqueue|leader_election)_[a-z_]+"
_SELECTOR = re.compile(rf"\b(?P<metric>{_OUR_SERIES}|up(?=\s*\{{))(?P<braces>\s*\{{[^}}]*\}})?")
_MATCHER = re.compile(
    r'(?P<label>[a-zA-Z_]\w*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"'
)


def selectors(expr: str) -> Iterator[Selector]:
    """The series selectors of a PromQL expression that name our series (and `up`)."""
    for match in _SELECTOR.finditer(expr):
        braces = match.group("braces") or ""
        matchers = tuple(
            (m.group("label"), m.group("op"), m.group("value")) for m in _MATCHER.finditer(braces)
        )
        yield Selector(match.group(0).strip(), match.group("metric"), matchers)


def alert_rules() -> list[dict[str, Any]]:
    groups = load_yaml(PROMETHEUS_DIR / "alerts.yml")["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of the Grafana dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


# Grafana's variables in the dashboard's queries, as a query at "now" over all
# environments would see them.
GRAFANA_VARIABLES = {"$environment": ".*", "$__rate_interval": "1m"}


def grafana_substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr
