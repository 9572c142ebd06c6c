"""An in-process HashiCorp Nomad simulator speaking Nomad's real HTTP API.

It is the test bed of the controller and the embedded default of `make run`.
Its parts mirror Nomad's own, and depend on each other as Nomad's do: `state`
(the store: tables, index, blocking queries, the one shared mutable thing),
`scheduler` (evaluations and placement, against the store), `client` (task
lifecycle on a node, watching the store), `drainer` (drains and migrations),
`driver` (a raw_exec-like task driver that really runs exec'd commands on
this host, without isolation), `events` (the event broker), `variables`
(variables and locks), `job_endpoint`, `node_endpoint` and `alloc_endpoint`
(the server's operations), `ports` (host ports of allocations), `acl`
(tokens), `encode` (Nomad's JSON rules) and `presenter` (the store's objects
as the API shows them), `http` and `alloc_exec` (the routes; `gojson` has
Go's error texts), `core` (the wiring) and `server` (running it). It imports
nothing from the controller."""

from nomadsim.config import ORDERINGS, Faults, SimConfig
from nomadsim.core import Simulator
from nomadsim.errors import NomadError
from nomadsim.server import SimServer

__all__ = ["ORDERINGS", "Faults", "NomadError", "SimConfig", "SimServer", "Simulator"]
