"""The Dockerfile and .dockerignore, checked without a Docker engine: what the
build copies exists and is sent, what it must not see is left out, the image
runs the installed command as a non-root user on the default port, and its
HEALTHCHECK works against a real controller."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from typing import Any

import pytest

from controller.cli import build_parser
from controller.config import load_settings, variables
from tests.deploy.support import (
    REPO,
    Instruction,
    build_context,
    dockerfile,
    dockerignore_patterns,
    exec_form,
    final_stage,
    image_env,
    in_build_context,
    key_values,
)
from tests.support.ports import free_port

PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
INSTRUCTIONS = dockerfile()
FINAL = final_stage(INSTRUCTIONS)


def only(keyword: str, instructions: list[Instruction] = FINAL) -> Instruction:
    found = [i for i in instructions if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword} in the final stage, found {len(found)}"
    return found[0]


def copies() -> list[tuple[list[str], list[str]]]:
    """(flags, sources) of every COPY/ADD; the destination is dropped."""
    out = []
    for i in INSTRUCTIONS:
        if i.keyword in ("COPY", "ADD"):
            words = exec_form(i.args) if i.args.startswith("[") else shlex.split(i.args)
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            out.append((flags, paths[:-1]))
    return out


def test_both_stages_build_on_the_same_official_slim_python_image() -> None:
    args = key_values(
        " ".join(i.args for i in INSTRUCTIONS if i.stage == -1 and i.keyword == "ARG")
    )
    bases = [i.args.split()[0] for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert len(bases) >= 2, "multi-stage: a build stage and the final image"
    images = {re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base) for base in bases}
    assert len(images) == 1, images  # the copied virtualenv links to this interpreter
    image = images.pop()
    match = re.fullmatch(r"python:3\.(\d+)(?:\.\d+)?-slim(?:-\w+)?", image)
    assert match, f"{image}: not an official python:<version>-slim image"
    oldest = re.fullmatch(r">=3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert oldest and int(match.group(1)) >= int(oldest.group(1))


def test_every_copied_source_exists_and_is_in_the_build_context() -> None:
    context = build_context()
    sources = [path for flags, paths in copies() if not flags for path in paths]
    assert sources, "nothing is copied from the build context"
    for source in sources:
        path = REPO / source
        assert path.exists(), f"COPY {source}: no such file in the repository"
        if path.is_dir():
            assert any(f.startswith(source.rstrip("/") + "/") for f in context), (
                f"COPY {source}: .dockerignore leaves none of it in the build context"
            )
        else:
            assert source in context, f"COPY {source}: .dockerignore leaves it out"


def test_the_build_context_holds_what_pip_install_needs() -> None:
    context = build_context()
    copied = {path.rstrip("/") for flags, paths in copies() if not flags for path in paths}
    # pyproject.toml itself, the readme it names, and every package it finds.
    assert "pyproject.toml" in copied
    assert PYPROJECT["project"]["readme"] in copied
    for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        assert package in copied, f"package {pattern} is not copied"
        for source in (REPO / package).rglob("*.py"):
            assert source.relative_to(REPO).as_posix() in context, source


@pytest.mark.parametrize(
    "path",
    [
        "tests/test_cli.py",
        "tests/deploy/test_dockerfile.py",
        ".venv/bin/python",
        ".git/HEAD",
        ".mypy_cache/CACHEDIR.TAG",
        ".pytest_cache/README.md",
        ".ruff_cache/CACHEDIR.TAG",
        ".hypothesis/examples/x",
        "controller/__pycache__/cli.cpython-311.pyc",
        "controller/api/__pycache__/app.cpython-311.pyc",
        "nomad_runner_controller.egg-info/PKG-INFO",
        "bench/results/x.json",
        "deploy/compose.yaml",
        "Dockerfile",
    ],
)
def test_dockerignore_keeps_tests_venv_and_caches_out(path: str) -> None:
    assert not in_build_context(path, dockerignore_patterns())


def test_nothing_but_the_package_sources_reaches_the_build() -> None:
    packages = tuple(
        pattern.rstrip("*") + "/"
        for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    )
    outside = sorted(
        f for f in build_context() if not f.startswith(packages) or not f.endswith(".py")
    )
    assert outside == ["README.md", "pyproject.toml"]


def test_final_stage_has_no_compilers_caches_or_sources() -> None:
    for i in FINAL:
        if i.keyword == "RUN":
            assert not re.search(r"\b(apt-get|apt|apk|pip|gcc|make)\b", i.args), i.args
        if i.keyword in ("COPY", "ADD"):
            assert i.args.startswith("--from="), f"the final stage copies only from the build: {i}"
    build_env = key_values(
        " ".join(i.args for i in INSTRUCTIONS if i.stage == 0 and i.keyword == "ENV")
    )
    assert build_env.get("PIP_NO_CACHE_DIR") == "1"  # no pip cache even in the copied venv


def test_entrypoint_is_the_console_script_the_package_installs() -> None:
    entrypoint = exec_form(only("ENTRYPOINT").args)
    assert entrypoint == ["nomad-runner-controller"]
    scripts = PYPROJECT["project"]["scripts"]
    assert entrypoint[0] in scripts
    installed = {ep.name: ep for ep in entry_points(group="console_scripts")}
    assert installed[entrypoint[0]].value == scripts[entrypoint[0]]
    assert callable(installed[entrypoint[0]].load())
    command = exec_form(only("CMD").args)
    assert command == ["run"]
    assert build_parser().parse_args(command).command == "run"


def test_image_environment_is_a_valid_configuration() -> None:
    env = image_env()
    assert env["NRC_API_HOST"] == "0.0.0.0"
    assert env["NRC_LOG_FORMAT"] == "json"
    ours = {k: v for k, v in env.items() if k.startswith(("NRC_", "NOMAD_"))}
    assert set(ours) <= set(variables())
    settings = load_settings(ours)
    assert (settings.api_host, settings.log_format) == ("0.0.0.0", "json")


def test_expose_is_the_default_api_port() -> None:
    assert only("EXPOSE").args.split() == [str(load_settings({}).api_port)] == ["7200"]


def test_runs_as_a_non_root_user() -> None:
    users = [i.args for i in FINAL if i.keyword == "USER"]
    assert users, "no USER: the container would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in ("", "0", "root") and group not in ("0", "root")
    creates = " ".join(i.args for i in FINAL if i.keyword == "RUN")
    if user.isdigit():
        assert f"--uid {user}" in creates, "the numeric user exists in the image"


def test_oci_labels_name_the_image_and_its_version() -> None:
    labels = key_values(" ".join(i.args for i in FINAL if i.keyword == "LABEL"))
    for key in ("title", "description", "version", "revision"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    version = key_values(" ".join(i.args for i in FINAL if i.keyword == "ARG" and "=" in i.args))
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert version["VERSION"] == PYPROJECT["project"]["version"]


def healthcheck_command() -> list[str]:
    match = re.fullmatch(r"((?:--\S+\s+)*)CMD\s+(\[.*\])", only("HEALTHCHECK").args)
    assert match, "HEALTHCHECK [options] CMD [exec form]"
    return exec_form(match.group(2))


def test_healthcheck_needs_nothing_but_python() -> None:
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"]
    assert "/healthz" in command[2]
    modules = {
        alias.name.partition(".")[0]
        for node in ast.walk(ast.parse(command[2]))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert modules and modules <= set(sys.stdlib_module_names), modules


def run_healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = healthcheck_command()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NRC_", "NOMAD_"))}
    return subprocess.run(
        [sys.executable, *command[1:]],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=15,
    )


def test_healthcheck_passes_against_a_running_controller(dev_controller: str) -> None:
    port = dev_controller.rsplit(":", 1)[1]
    # As in the image (NRC_API_HOST=0.0.0.0), and with the API on one address.
    for host in ("0.0.0.0", "127.0.0.1"):
        result = run_healthcheck({"NRC_API_HOST": host, "NRC_API_PORT": port})
        assert result.returncode == 0, result.stderr


def test_healthcheck_fails_when_nothing_answers() -> None:
    result = run_healthcheck({"NRC_API_HOST": "0.0.0.0", "NRC_API_PORT": str(free_port())})
    assert result.returncode != 0
    assert "Connection refused" in result.stderr or "URLError" in result.stderr
