"""Fixtures of the reconcile tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.one_runner import OneRunner
from tests.support.pool import Pool


@pytest.fixture
def one_runner() -> Iterator[OneRunner]:
    """A controller and API over the in-memory Nomad, one environment (pool 1)."""
    s = OneRunner()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def pool() -> Iterator[Pool]:
    """Observer, Claims and Actor over the in-memory Nomad, nothing in it yet."""
    p = Pool()
    try:
        yield p
    finally:
        p.close()
