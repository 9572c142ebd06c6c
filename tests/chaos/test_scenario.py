"""The scenario generator itself: deterministic, well-formed, and the CI seeds
cover every kind of action (instant: no cluster is started)."""

from __future__ import annotations

from tests.chaos.scenario import (
    CI_SEEDS,
    KINDS,
    OPERATOR,
    DeleteEnv,
    Drain,
    NodeDown,
    NodeUp,
    PutEnv,
    RestartAgent,
    RestartDocker,
    SetFaults,
    Step,
    Undrain,
    generate,
)


def test_a_seed_always_gives_the_same_scenario() -> None:
    for seed in (1, 7, 123):
        assert generate(seed) == generate(seed)
        assert generate(seed).describe() == generate(seed).describe()
    assert generate(1) != generate(2)


def test_the_ci_seeds_cover_every_kind_of_action() -> None:
    covered = set().union(*(generate(seed).kinds() for seed in CI_SEEDS))
    assert covered >= set(KINDS), sorted(set(KINDS) - covered)


def node_disruptions(steps: tuple[Step, ...]) -> list[tuple[int, float, float]]:
    """(node, from, until) of every drain, node down and restart of an agent
    or of Docker (a Docker restart holds its node for an instant)."""
    out: list[tuple[int, float, float]] = []
    began: dict[int, float] = {}
    for step in steps:
        action = step.action
        if isinstance(action, Drain | NodeDown):
            began[action.node] = step.at
        elif isinstance(action, Undrain | NodeUp):
            out.append((action.node, began.pop(action.node), step.at))
        elif isinstance(action, RestartAgent):
            out.append((action.node, step.at, step.at + action.down))
        elif isinstance(action, RestartDocker):
            out.append((action.node, step.at, step.at))
    return out


def test_scenarios_keep_a_node_serving_and_undo_every_disruption() -> None:
    for seed in range(1, 201):
        scenario = generate(seed)
        spans = node_disruptions(scenario.steps_of(OPERATOR))
        for i, (node, start, end) in enumerate(spans):
            # One disruption of a node at a time; at its start (where the
            # most overlap), another node serves.
            same = [s for k, (n, s, e) in enumerate(spans) if n == node and k != i]
            assert not any(start <= s <= end for s in same), (seed, node, start, end)
            held = {n for n, s, e in spans if s <= start <= e}
            assert len(held) < scenario.nodes, (seed, node, start, end)
        unavailable: set[int] = set()
        faults_on: set[str] = set()
        envs = {e.id for e in scenario.envs}
        for step in scenario.steps:
            action = step.action
            if step.actor != OPERATOR:
                continue
            if isinstance(action, Drain | NodeDown):
                assert action.node not in unavailable, (seed, step)
                unavailable.add(action.node)
                assert len(unavailable) < scenario.nodes, (seed, step)
            elif isinstance(action, Undrain | NodeUp):
                unavailable.discard(action.node)
            elif isinstance(action, SetFaults):
                if step.kind == "fault_end":
                    faults_on.discard(action.name)
                else:
                    assert action.name not in faults_on, (seed, step)
                    faults_on.add(action.name)
            elif isinstance(action, DeleteEnv):
                assert action.env_id in envs, (seed, step)
                envs.discard(action.env_id)
            elif isinstance(action, PutEnv):
                assert (action.why == "create") == (action.env.id not in envs), (seed, step)
                envs.add(action.env.id)
        assert not unavailable and not faults_on, seed
        assert envs, seed  # some environment is left to converge
        assert 30 <= len(scenario.steps) <= 90, (seed, len(scenario.steps))
