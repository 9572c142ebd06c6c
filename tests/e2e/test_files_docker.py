"""File operations under Docker's exec rules, against the simulator (with
Docker's stdin rule of Nomad <= 1.8 on, its default): a copy that refuses on
a conflict still answers 409 however much input was on its way, and a file
operation given up on leaves no process behind in the runner."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.helpers import wait_until
from tests.support.world import AUTH, World, world_with

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


def test_a_download_given_up_on_leaves_no_process(world: World) -> None:
    """Issue 24 item 8: Nomad stops reading an exec whose client left, so the
    read script's `tail` blocks writing for ever unless it is killed."""
    runner = world.claim()
    alloc = world.alloc_of(runner)["ID"]
    assert world.run(runner, "head -c 30000000 /dev/zero > big").last["data"] == 0
    with requests.get(
        world.url(f"/runners/{runner}/files/raw?path=big"), headers=AUTH, stream=True, timeout=30
    ) as r:
        assert r.status_code == 200
        assert len(next(r.iter_content(65536))) > 0
    wait_until(lambda: not world.processes(alloc), timeout=5)
    assert world.runner_status(runner)[0] == 200
