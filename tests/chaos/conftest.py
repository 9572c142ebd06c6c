"""Which chaos seeds run, and how a failing one is replayed.

- default (CI, `make test`): the fixed seeds in `scenario.CI_SEEDS`;
- `--chaos-seeds=N` (`make chaos SEEDS=N`): seeds 1 … N;
- `--chaos-seed=S` (repeatable): exactly those seeds — the replay command a
  failing run prints;
- `--chaos-mutants`: also run against deliberately broken controllers
  (tests/chaos/test_mutants.py).

A summary line per seed (convergence time, claims, losses, jobs created versus
needed) is printed at the end of the session.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.chaos.run import REPLAY, ChaosResult
from tests.chaos.scenario import CI_SEEDS

RESULTS = pytest.StashKey[list[ChaosResult]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "chaos suite (tests/chaos)")
    group.addoption(
        "--chaos-seeds",
        type=int,
        default=None,
        metavar="N",
        help="run chaos seeds 1..N instead of the fixed CI seeds",
    )
    group.addoption(
        "--chaos-seed",
        type=int,
        action="append",
        default=[],
        metavar="S",
        help="run (replay) chaos seed S; repeatable",
    )
    group.addoption(
        "--chaos-mutants",
        action="store_true",
        default=False,
        help="also run the chaos suite against deliberately broken controllers",
    )


def chaos_seeds(config: pytest.Config) -> list[int]:
    # getoption with a default: when tests/chaos is not among the paths given to
    # pytest, this conftest may load after the command line was parsed.
    chosen: list[int] = list(config.getoption("chaos_seed", default=[]) or [])
    if chosen:
        return chosen
    count = config.getoption("chaos_seeds", default=None)
    if count is not None:
        return list(range(1, int(count) + 1))
    return list(CI_SEEDS)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "chaos_seed" in metafunc.fixturenames:
        seeds = chaos_seeds(metafunc.config)
        metafunc.parametrize("chaos_seed", seeds, ids=[f"seed{s}" for s in seeds])


@pytest.fixture
def chaos_results(request: pytest.FixtureRequest) -> list[ChaosResult]:
    return request.config.stash.setdefault(RESULTS, [])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    callspec = getattr(item, "callspec", None)
    seed = callspec.params.get("chaos_seed") if callspec is not None else None
    if seed is not None and report.failed:
        report.sections.append(("chaos replay", REPLAY.format(seed=seed)))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    results = terminalreporter.config.stash.get(RESULTS, [])
    if not results:
        return
    terminalreporter.section("chaos")
    for result in sorted(results, key=lambda r: r.seed):
        terminalreporter.write_line(result.summary())
    converged = [r for r in results if r.convergence_s is not None]
    if converged:
        slowest = max(converged, key=lambda r: r.convergence_s or 0.0)
        terminalreporter.write_line(
            f"{len(results)} seeds; slowest convergence {slowest.convergence_s:.2f}s "
            f"(seed {slowest.seed}); {sum(r.total_s for r in results):.1f}s of chaos in all"
        )
    for result in results:
        if result.violations:
            terminalreporter.write_line(
                f"FAILED seed {result.seed}: replay with {REPLAY.format(seed=result.seed)}"
            )
