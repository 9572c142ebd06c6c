"""The execution invariant's judge (tests/chaos/executions.py) on answers a
broken controller would give: each is reported (instant: no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.executions import Outcome, command, judge_execution

TOKEN = "t0k3n"


def ran(program: str, code: int, *frames: dict[str, Any], hung: bool = False) -> Outcome:
    out = Outcome(program, code, TOKEN, start=200, connected=True, hung=hung)
    out.frames = [{"type": "start"}, *frames]
    return out


def stdout(text: str) -> dict[str, Any]:
    return {"type": "stdout", "data": text}


GOOD = [
    ran("exit", 3, stdout("code=3\r\n"), {"type": "exit", "data": 3}),
    ran("stdin", 0, stdout(f"{TOKEN}\r\ngot={TOKEN}\r\ncode=0\r\n"), {"type": "exit", "data": 0}),
    ran(
        "stderr",
        1,
        {"type": "stderr", "data": f"err-{TOKEN}\n"},
        stdout(f"out-{TOKEN}\r\ncode=1\r\n"),
        {"type": "exit", "data": 1},
    ),
    ran("timeout", 0, stdout(f"started-{TOKEN}\r\n"), {"type": "timeout"}),
    ran("background", 42, stdout(f"bg-{TOKEN}\r\ncode=42\r\n"), {"type": "exit", "data": 42}),
    ran("disconnect", 0, stdout(f"started-{TOKEN}\r\n")),  # the client left: no frame due
    ran("exit", 0, {"type": "error", "data": "Nomad cut the connection"}),  # told why
]
BAD = [
    # Poseidon's answer to a cut stream: exit 0 for a program that never printed its code
    ran("exit", 3, {"type": "exit", "data": 0}),
    ran("exit", 3, stdout("code=3\r\n"), {"type": "exit", "data": 0}),
    ran("stdin", 0, stdout("code=0\r\n"), {"type": "exit", "data": 0}),  # no echo of stdin
    ran("stderr", 1, stdout(f"out-{TOKEN}\r\ncode=1\r\n"), {"type": "exit", "data": 1}),
    ran("timeout", 0, stdout(f"started-{TOKEN}\r\n"), {"type": "exit", "data": 0}),
    ran("disconnect", 0, stdout(f"started-{TOKEN}\r\n"), {"type": "exit", "data": 0}),
    ran("exit", 3, stdout("code=3\r\n"), {"type": "exit", "data": 3}, {"type": "error"}),
    ran("exit", 3, stdout("code=3\r\n")),  # closed without a terminal frame
    ran("exit", 3, hung=True),
]


@pytest.mark.parametrize("out", GOOD, ids=[f"{o.program}-{len(o.frames)}" for o in GOOD])
def test_answers_as_the_program_ran_pass(out: Outcome) -> None:
    assert judge_execution(out, controller_went=False) == []


@pytest.mark.parametrize("out", BAD, ids=[f"{o.program}-{len(o.frames)}" for o in BAD])
def test_answers_a_broken_controller_gives_are_reported(out: Outcome) -> None:
    assert judge_execution(out, controller_went=False)


def test_no_terminal_frame_is_allowed_only_when_the_controller_went() -> None:
    cut = ran("exit", 3, stdout("code=3\r\n"))
    assert judge_execution(cut, controller_went=True) == []


def test_every_program_prints_the_code_it_exits_with() -> None:
    for program in ("exit", "stdin", "stderr", "timeout", "background", "disconnect"):
        assert "echo code=7; exit 7" in command(program, 7, TOKEN)
