"""File operations under Docker's exec rules, against the simulator (with
Docker's stdin rule of Nomad <= 1.8 on, its default): a copy that refuses on
a conflict still answers 409 however much input was on its way, and a file
operation given up on leaves no process behind in the runner."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.world import World, world_with

FIVE_MIB = 5 * 1024 * 1024


@pytest.fixture
def world(make_sim: Any) -> Iterator[World]:
    with world_with(make_sim) as w:
        yield w


def test_a_large_copy_onto_a_directory_stays_409_under_dockers_stdin_rule(world: World) -> None:
    runner = world.claim()
    assert world.patch_files(runner, {"d/": None}).status_code == 204
    big = bytes(range(256)) * (FIVE_MIB // 256)
    for _ in range(3):
        r = world.patch_files(runner, {"d": big})
        assert r.status_code == 409, r.text
        assert "'d' is a directory" in r.json()["message"]
    assert world.runner_status(runner)[0] == 200
