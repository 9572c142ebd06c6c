"""The chaos suite: one test per seed (see conftest.py for which seeds run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.run import REPLAY, ChaosResult, ChaosRun


@pytest.mark.timeout(240)
def test_chaos(chaos_seed: int, tmp_path: Path, chaos_results: list[ChaosResult]) -> None:
    run = ChaosRun(chaos_seed, tmp_path)
    result = run.execute()
    chaos_results.append(result)
    if result.violations:
        pytest.fail(
            "\n".join(
                [
                    f"chaos seed {chaos_seed} broke an invariant; replay: "
                    f"{REPLAY.format(seed=chaos_seed)}",
                    *(f"- {v}" for v in result.violations),
                    f"controller logs: {tmp_path}",
                    run.scenario.describe(),
                ]
            ),
            pytrace=False,
        )
