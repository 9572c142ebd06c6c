"""`environment` names that change how the shell or the loader run the
command, or that are the controller's or Nomad's, are refused (issue 24,
finding 7): 400 naming the variable, before the runner is looked at."""

from __future__ import annotations

import pytest

from controller.execution.command import refused_env_name
from tests.support.api_client import API, Api, error_of

REFUSED = [
    "NRC_EXECUTION_ID",  # would hide the command from the timeout kill
    "NRC_ANYTHING",
    "NOMAD_TOKEN",
    "BASH_ENV",  # sourced by bash, as root when privileged
    "ENV",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "SHELLOPTS",
    "BASHOPTS",
    "PROMPT_COMMAND",
    "BASH_FUNC_ls",
    "IFS",
    "PS4",
    "GCONV_PATH",
]
ALLOWED = ["PATH", "HOME", "LANG", "PYTHONPATH", "CODEOCEAN", "my_var", "ENVIRONMENT", "LDX"]


@pytest.mark.parametrize("name", REFUSED)
def test_refused_names(name: str) -> None:
    assert refused_env_name(name)


@pytest.mark.parametrize("name", ALLOWED)
def test_allowed_names(name: str) -> None:
    assert not refused_env_name(name)


@pytest.mark.parametrize("name", ["NRC_EXECUTION_ID", "BASH_ENV", "LD_PRELOAD", "BASH_FUNC_x"])
def test_execute_answers_400_naming_the_variable(api: Api, name: str) -> None:
    body = {"command": "true", "environment": {"OK": "1", name: "/tmp/x"}}
    status, message, _ = error_of(api.client.post(f"{API}/runners/1-x/execute", json=body))
    assert status == 400
    assert f"'{name}' may not be set" in message


def test_path_is_allowed(api: Api) -> None:
    body = {"command": "true", "environment": {"PATH": "/opt/tool/bin:/usr/bin:/bin"}}
    assert error_of(api.client.post(f"{API}/runners/1-x/execute", json=body))[0] == 410


def test_a_null_environment_is_none(api: Api) -> None:
    """Go decodes `"environment": null` into an empty map: Poseidon takes it."""
    body: dict[str, object] = {"command": "true", "environment": None}
    assert error_of(api.client.post(f"{API}/runners/1-x/execute", json=body))[0] == 410
    body["environment"] = []
    assert error_of(api.client.post(f"{API}/runners/1-x/execute", json=body))[0] == 400
