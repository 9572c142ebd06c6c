"""Adaptive prewarming: an environment's pool sized from its observed demand.

`history` is what the controller remembers of an environment (its claims,
its runners' start-up latencies and the target it holds), compact enough to
live in Nomad across restarts; `policy` is the pure function from that
history and the clock to the number of idle runners wanted now. Neither does
I/O: the reconciler feeds them (docs/prewarming.md).
"""
