"""Benchmarks of nomad-runner-controller against the bundled Nomad simulator.

`python -m bench` (or `make bench`) runs them all and writes one JSON file per
benchmark to `bench/results/` plus a table on stdout; `python -m bench claims
memory` runs a selection. They report, they never fail: see
docs/performance.md for what each measures, the latest figures and how to
read them.

The simulator runs in its own process (`bench.simproc`), so the controller's
CPU is never mixed with Nomad's; the controller runs either as the real
service in its own process (`bench.ctlproc`: claims, convergence,
event-to-ready, steady load, memory) or in the benchmark process with no
threads of its own (pass cost), where `time.process_time` is its CPU alone.
The prewarming replay (`prewarm`) needs neither: it runs the policy function
over a claim trace in simulated time (docs/prewarming.md).
"""
