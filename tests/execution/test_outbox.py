"""The execution's queue to its client: bounded by the output it holds."""

from __future__ import annotations

import asyncio

import pytest

from controller.execution.frames import START
from controller.execution.outbox import Outbox, output_size

pytestmark = pytest.mark.anyio


def out(n: int, stream: str = "stdout") -> dict[str, str]:
    return {"type": stream, "data": "x" * n}


def test_only_output_counts_towards_the_bound() -> None:
    assert output_size(out(5)) == 5
    assert output_size(out(7, "stderr")) == 7
    assert output_size(START) == 0
    assert output_size({"type": "exit", "data": 3}) == 0
    assert output_size(None) == 0


async def test_a_put_waits_while_the_queue_holds_its_bound_of_output() -> None:
    box = Outbox(limit=10)
    await box.put(out(6))
    await box.put(out(6))  # below the bound when it began: taken
    assert box.held == 12
    blocked = asyncio.ensure_future(box.put(out(1)))
    await asyncio.sleep(0.01)
    assert not blocked.done(), "12 characters held, the bound is 10"
    assert box.get_nowait() == out(6)
    await asyncio.wait_for(blocked, 1.0)
    assert box.held == 7


async def test_frames_come_out_in_order_and_a_get_waits_for_one() -> None:
    box = Outbox(limit=100)
    getter = asyncio.ensure_future(box.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    await box.put(START)
    await box.put(out(3))
    await box.put(None)
    assert await asyncio.wait_for(getter, 1.0) == START
    assert not box.empty()
    assert await box.get() == out(3)
    assert await box.get() is None
    assert box.empty() and box.held == 0
