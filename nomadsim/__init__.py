"""An in-process HashiCorp Nomad simulator speaking Nomad's real HTTP API.

It is the test bed of the controller and the embedded default of `make run`.
Its parts mirror Nomad's own: `state` (tables, index, blocking queries),
`encode` (Nomad's JSON rules), `scheduler` (evaluations and placement),
`client` (task lifecycle on a node), `driver` (a raw_exec-like task driver
that really runs exec'd commands on this host, without isolation), `drainer`
(drains and migrations), `events` (the event broker), `variables` (variables
and locks), `http` and `alloc_exec` (the routes; `gojson` has Go's error
texts) and `server` (running it). It imports nothing from the controller."""

from nomadsim.core import ORDERINGS, Faults, NomadError, SimConfig, Simulator
from nomadsim.server import SimServer

__all__ = ["ORDERINGS", "Faults", "NomadError", "SimConfig", "SimServer", "Simulator"]
