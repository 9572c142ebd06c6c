"""Prewarmer: the adaptive pool size from a history that lives in a Nomad variable."""

from __future__ import annotations

from controller.clock import ManualClock
from controller.prewarm.history import History, from_json, record, to_json
from controller.reconcile.prewarming import HISTORY_ITEM, Prewarmer, PrewarmSettings
from tests.support.fake_nomad import FakeNomad

SETTINGS = PrewarmSettings(adaptive=True, ceiling_multiple=10, ceiling_cap=100)


def make(nomad: FakeNomad | None = None) -> tuple[Prewarmer, FakeNomad, ManualClock]:
    clock = ManualClock()
    nomad = nomad or FakeNomad(clock)
    return Prewarmer(settings=SETTINGS, store=nomad, clock=clock), nomad, clock


def test_without_claims_the_target_is_the_floor_and_nothing_is_written() -> None:
    prewarmer, nomad, _ = make()
    decision = prewarmer.decide(1, floor=5)
    assert decision.target == 5
    assert prewarmer.decision(1) == decision
    assert nomad.variable_writes == []  # nothing changed worth keeping


def test_a_burst_raises_the_target_within_the_ceiling() -> None:
    prewarmer, _, clock = make()
    prewarmer.decide(1, floor=2)
    for n in range(30):
        prewarmer.record_claim(1, f"1-r{n}")
        clock.advance(0.1)
    decision = prewarmer.decide(1, floor=2)
    assert 2 < decision.target <= 20
    assert decision.wake_at is not None and decision.wake_at > clock.now_ns()


def test_the_history_is_written_at_most_once_an_interval() -> None:
    prewarmer, nomad, clock = make()
    prewarmer.decide(1, floor=1)
    prewarmer.record_claim(1, "1-r1")
    prewarmer.decide(1, floor=1)
    assert nomad.variable_writes == ["nomad-runner-controller/prewarm/1"]
    prewarmer.record_claim(1, "1-r2")
    clock.advance(30)
    prewarmer.decide(1, floor=1)
    assert len(nomad.variable_writes) == 1
    clock.advance(31)
    prewarmer.decide(1, floor=1)
    assert len(nomad.variable_writes) == 2
    saved = from_json(nomad.variables["nomad-runner-controller/prewarm/1"][HISTORY_ITEM])
    assert len(saved.claims.recent) == 2


def test_a_new_term_reads_what_the_last_leader_wrote() -> None:
    first, nomad, clock = make()
    first.decide(3, floor=1)
    first.record_claim(3, "3-r3")
    first.record_startup(3, 2_000_000_000)
    first.save_all()
    second = Prewarmer(settings=SETTINGS, store=nomad, clock=clock)
    second.record_claim(3, "3-r4")  # before the read: kept aside, not lost
    second.decide(3, floor=1)
    history = second.history(3)
    assert len(history.claims.recent) == 2
    assert history.startups.samples_ms == (2000,)


def test_unload_rereads_on_the_next_decision() -> None:
    prewarmer, nomad, clock = make()
    prewarmer.decide(4, floor=1)
    prewarmer.unload()
    written = record(History().claims, clock.now_ns())
    nomad.variables["nomad-runner-controller/prewarm/4"] = {
        HISTORY_ITEM: to_json(History(claims=written))
    }
    prewarmer.decide(4, floor=1)
    assert prewarmer.history(4).claims.recent == written.recent


def test_an_unreadable_history_starts_empty_and_the_floor_holds() -> None:
    prewarmer, nomad, _ = make()
    nomad.variables["nomad-runner-controller/prewarm/2"] = {HISTORY_ITEM: "not json"}
    assert prewarmer.decide(2, floor=4).target == 4
    history = prewarmer.history(2)
    assert (history.claims, history.startups) == (History().claims, History().startups)


def test_nomad_unreachable_decides_from_memory_and_reads_again() -> None:
    class Flaky(FakeNomad):
        fail = True

        def get_variable(self, path: str) -> dict[str, str] | None:
            if self.fail:
                raise ConnectionError("down")
            return super().get_variable(path)

    clock = ManualClock()
    nomad = Flaky(clock)
    prewarmer = Prewarmer(settings=SETTINGS, store=nomad, clock=clock)
    assert prewarmer.decide(5, floor=2).target == 2
    prewarmer.record_claim(5, "5-r5")
    nomad.fail = False
    prewarmer.decide(5, floor=2)
    assert len(prewarmer.history(5).claims.recent) == 1


def test_claims_another_replica_made_are_observed_once_and_own_ones_not_again() -> None:
    """Every replica serves claims; the leader keeps the history. It records
    its own claims as made, and the others' as its passes see them: each
    once, and only those of its own term (the last leader saw the older)."""
    prewarmer, _, clock = make()
    before_term = clock.now_ns() - 1
    prewarmer.decide(6, floor=1)
    clock.advance(1)
    prewarmer.record_claim(6, "6-own")
    claimed_at = clock.now_ns()
    seen = {"6-own": claimed_at, "6-other": claimed_at, "6-old": before_term}
    prewarmer.observe_claims(6, seen)
    prewarmer.observe_claims(6, seen)  # the next pass sees the same claims
    assert len(prewarmer.history(6).claims.recent) == 2, "own once, the other once, old never"
    prewarmer.observe_claims(6, {})  # all released
    prewarmer.observe_claims(6, {"6-other": claimed_at + 1})  # a new claim of that id? counted
    assert len(prewarmer.history(6).claims.recent) == 3


def test_claims_made_between_passes_are_all_folded_in() -> None:
    prewarmer, _, _ = make()
    prewarmer.decide(7, floor=1)
    before = prewarmer.history(7)
    for n in range(1000):
        prewarmer.record_claim(7, f"7-r{n}")
    assert prewarmer.history(7).claims.counts == (1000,)
    assert before.claims.recent == ()
