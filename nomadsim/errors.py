"""The one error type of the simulator's server side."""

from __future__ import annotations

from enum import Enum
from typing import Any


class Origin(Enum):
    """Where Nomad creates an error, which decides what forwarding does to it
    (nomadsim/forwarding.py).

    HTTP: the agent's HTTP handler itself (`CodedError` in command/agent), so
    it is answered by whichever agent received the request, never forwarded.
    CODED: an RPC endpoint's error made with a code (`NewErrRPCCoded`), which
    the connection pool passes through unwrapped. PLAIN: an RPC endpoint's
    error without a code, which the pool wraps as `rpc error: <text>`."""

    HTTP = "http"
    CODED = "coded"
    PLAIN = "plain"


class NomadError(Exception):
    """An error answered the way Nomad answers it: status code and plain text."""

    def __init__(
        self,
        status: int,
        text: str,
        body: Any = None,
        origin: Origin = Origin.HTTP,
        hops: int | None = None,
    ) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.body = body
        self.origin = origin
        # The pool hops the error travels back, when fewer than the request's:
        # an error of a server on the way (no leader), not of the leader.
        self.hops = hops
