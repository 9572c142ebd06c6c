"""The chaos suite against deliberately broken controllers (tests/chaos/mutants.py):
each must be caught, by the invariant its safeguard protects. Off by default
(`--chaos-mutants` turns them on): a mutant costs up to six chaos runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.mutants import LAUNCH, MUTANTS, Mutant
from tests.chaos.run import ChaosRun

SEEDS = (1, 2, 3, 4, 5, 6)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant: Mutant, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("chaos_mutants", default=False):
        pytest.skip("mutants run with --chaos-mutants")
    seen: list[str] = []
    for seed in SEEDS:
        log_dir = tmp_path / f"seed{seed}"
        log_dir.mkdir()
        result = ChaosRun(seed, log_dir, prelude=mutant.patch + LAUNCH).execute()
        seen += result.violations
        if any(mutant.breaks in v for v in result.violations):
            return
    pytest.fail(
        f"mutant {mutant.name} was not caught as {mutant.breaks!r} by seeds {SEEDS}; "
        f"violations seen: {seen[:10]}"
    )
