"""The command line: `nomad-runner-controller sim` serves until SIGTERM/SIGINT,
`python -m controller` behaves the same, and bad arguments exit 2."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import requests

from controller.cli import build_parser, main
from nomadsim import ORDERINGS
from tests.helpers import wait_until
from tests.support.ports import free_port
from tests.support.processes import ChildProcess, python_module


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.ConnectionError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sim_command_serves_nomad_api_until_signalled(sig: signal.Signals) -> None:
    port = free_port()
    sim = ChildProcess(
        python_module(
            "controller",
            "sim",
            "--port",
            str(port),
            "--nodes",
            "2",
            "--seed",
            "7",
            "--migration-ordering",
            "client",
            "--heartbeat-interval",
            "0.1",
        )
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(f"{base}/v1/status/leader"), timeout=20, interval=0.05)
        assert len(requests.get(f"{base}/v1/nodes", timeout=5).json()) == 2
        faults = requests.get(f"{base}/_sim/faults", timeout=5).json()
        assert faults["migration_ordering"] == "client"
        # An open event stream must not hold up the shutdown.
        stream = requests.get(f"{base}/v1/event/stream", stream=True, timeout=5)
        code = sim.stop(sig, timeout=15)
        stream.close()
    finally:
        sim.kill()
    output = sim.output()  # stdout and stderr
    assert code == 0, output
    assert f"NOMAD_ADDR=http://127.0.0.1:{port}" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["sim", "--nodes", "0"], "must be at least 1"),
        (["sim", "--port", "99999"], "must be between 0 and 65535"),
        (["sim", "--startup-delay", "-1"], "must not be negative"),
        (["sim", "--gc-freeze-interval", "-1"], "must not be negative"),
        (["bogus"], "invalid choice"),
        (["sim", "--migration-ordering", "sideways"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], needle: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controller", *args], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_run_never_loads_the_simulator() -> None:
    """Production's `run` does not import the simulator: importing the command
    line, building its parser and answering `run --help` load no `nomadsim`
    module (only `sim` and `dev` import it). In a fresh interpreter, since this
    one has the simulator loaded already."""
    probe = "\n".join(
        [
            "import contextlib, io, sys",
            "import controller.cli",
            "controller.cli.build_parser()",
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):",
            "    controller.cli.main(['run', '--help'])",
            "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'nomadsim'))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout


def test_sim_help_lists_every_migration_ordering(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    assert "{" + ",".join(ORDERINGS) + "}" in capsys.readouterr().out
    for ordering in ORDERINGS:
        args = build_parser().parse_args(["sim", "--migration-ordering", ordering])
        assert args.migration_ordering == ordering


def test_sim_paces_its_garbage_collector_every_second_unless_told_not_to() -> None:
    """Nomad's Go runtime does not stop for a full walk of its heap; the
    simulator's Python would, for 100-250 ms at 2,000 runners."""
    assert build_parser().parse_args(["sim"]).gc_freeze_interval == 1.0
    assert build_parser().parse_args(["sim", "--gc-freeze-interval", "0"]).gc_freeze_interval == 0


def test_sim_closes_exec_stdin_on_exit_as_docker_unless_told_not_to() -> None:
    assert build_parser().parse_args(["sim"]).docker_stdin_close_on_exit is True
    args = build_parser().parse_args(["sim", "--no-docker-stdin-close-on-exit"])
    assert args.docker_stdin_close_on_exit is False
