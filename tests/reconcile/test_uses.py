"""A runner's uses as tokens: ended exactly once on every path, handed on
explicitly, and the registry's counts and list of what is in flight."""

from __future__ import annotations

import pytest

from controller.reconcile.uses import InFlight, Uses

pytestmark = pytest.mark.anyio


def registry() -> tuple[Uses, list[str]]:
    ended: list[str] = []
    return Uses(on_end=ended.append), ended


def test_a_use_ends_once_however_often_it_is_ended() -> None:
    uses, ended = registry()
    use = uses.begin("7-a", "execution")
    assert uses.count("7-a") == 1 and not use.ended
    use.end()
    use.end()
    with use:
        pass
    assert ended == ["7-a"] and uses.count("7-a") == 0 and use.ended


def test_with_ends_it_on_an_error_too() -> None:
    uses, ended = registry()
    with pytest.raises(RuntimeError), uses.begin("7-a", "copy"):
        raise RuntimeError("the copy failed")
    assert ended == ["7-a"] and uses.in_flight() == ()


async def test_async_with_ends_it() -> None:
    uses, ended = registry()
    async with uses.begin("7-a", "execution"):
        assert uses.count("7-a") == 1
    assert ended == ["7-a"]


def test_a_use_handed_on_is_ended_by_its_new_owner_only() -> None:
    uses, ended = registry()
    with uses.begin("7-a", "download") as use:
        later = use.hand_on()
    assert ended == [] and uses.count("7-a") == 1, "leaving the block does not end it"
    assert use.ended and not later.ended
    later.end()
    assert ended == ["7-a"] and uses.count("7-a") == 0
    with pytest.raises(RuntimeError, match="has ended"):
        later.hand_on()


def test_the_registry_counts_per_runner_and_lists_what_is_in_flight() -> None:
    uses, _ = registry()
    first = uses.begin("7-a", "execution")
    uses.begin("7-a", "list")
    uses.begin("7-b", "copy")
    assert (uses.count("7-a"), uses.count("7-b"), uses.count("7-c")) == (2, 1, 0)
    first.end()
    assert uses.in_flight() == (InFlight("7-a", "list"), InFlight("7-b", "copy"))
    assert uses.busy("7-a") and not uses.busy("7-c")


def test_a_use_still_counts_while_its_end_is_recorded() -> None:
    """The runner's activity is stamped before the use stops counting: a
    reader in between never sees it idle with its old activity time."""
    seen: list[int] = []
    uses: Uses
    uses = Uses(on_end=lambda runner_id: seen.append(uses.count(runner_id)))
    uses.begin("7-a", "execution").end()
    assert seen == [1]
