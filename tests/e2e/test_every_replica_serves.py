"""Every replica serves (issue 23): two replica processes behind a plain
round-robin balancer, a steady load of claims and of executions whose output
is checked, and each replica restarted in turn with SIGTERM (taken out of the
balancer first, as the job's `shutdown_delay` does). Nothing fails: no claim,
no execution cut or ended by anything but its own exit, no double claim.

The same scenario at full load, and a leader crash (slower by the lock's TTL
plus Nomad's lock delay), are `python -m bench replicas` (bench/b12_replicas.py).
"""

from __future__ import annotations

from bench.b12_replicas import Shape, rolling_restart, scenario

SHAPE = Shape(claim_rate=5.0, executions=4, pool=80, calm_s=1.5)


def test_a_rolling_restart_under_load_fails_nothing() -> None:
    facts = scenario(SHAPE, rolling_restart)
    assert facts["claims_failed"] == 0, facts["claim_failures"]
    assert facts["double_claims"] == 0, facts
    assert facts["executions_bad"] == 0, facts["execution_failures"]
    # The load ran throughout: both restarts happened under it.
    assert facts["executions_ok"] >= SHAPE.executions, facts
    assert facts["claims_ok"] >= SHAPE.claim_rate * (2 * SHAPE.calm_s + facts["act_s"]) * 0.8
