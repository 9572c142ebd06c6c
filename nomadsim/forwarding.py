"""What a forwarded request's error looks like when it comes back: Nomad's
rule, in one place.

A request that reaches an agent which cannot answer it itself (any server
RPC through a client agent, a write or a consistent read on a follower) is
sent on over RPC through the agent's connection pool. The pool passes an
error made with a code (`NewErrRPCCoded`) through untouched and wraps every
other one as `rpc error: <text>` (helper/pool/pool.go, `ConnPool.RPC`, Nomad
v1.6.2). The agent's HTTP layer then answers (command/agent/http.go, `wrap`):
an error of the HTTP handler itself keeps its status, an RPC-coded one its
code, and of the rest, "RPC errors get wrapped, so manually unwrap by only
looking at their suffix": a text that ends in `Permission denied`, `ACL token
not found` or the job-registration-disabled message becomes 403 with that
text alone, one that ends in the incompatible-filtering message 400, and
everything else 500 with the whole text, prefix included.

So through a client agent an EnforceIndex conflict is
`500 rpc error: Enforcing job modify index 5: job exists with conflicting
job modify index: 6`, while a permission error stays `403 Permission denied`.

Served where it arrived (the leader, or an agent's own HTTP handler), an
error is answered as the simulator states it."""

from __future__ import annotations

from dataclasses import dataclass

from nomadsim.errors import NomadError, Origin

RPC_PREFIX = "rpc error: "

# structs.ErrPermissionDenied, ErrTokenNotFound, ErrJobRegistrationDisabled,
# ErrIncompatibleFiltering, in the order `wrap` tests them.
SUFFIX_RULES: tuple[tuple[str, int], ...] = (
    ("Permission denied", 403),
    ("ACL token not found", 403),
    ("Job registration, dispatch, and scale are disabled by the scheduler configuration", 403),
    ("Filter expression cannot be used with other filter parameters", 400),
)


@dataclass(frozen=True)
class Answer:
    status: int
    text: str


def pool_text(error: NomadError, hops: int = 1) -> str:
    """The error's text as it comes back over `hops` pool hops (ConnPool.RPC
    wraps at each: agent to follower to leader is two)."""
    if error.origin is Origin.PLAIN:
        return RPC_PREFIX * hops + error.text
    return error.text


def answer(error: NomadError, hops: int) -> Answer:
    """The status and text an agent answers for `error`, which came back
    over `hops` RPC pool hops (0: raised where the request arrived)."""
    if hops == 0 or error.origin is not Origin.PLAIN:
        # The handler's own errors and RPC-coded ones keep status and text.
        return Answer(error.status, error.text)
    text = pool_text(error, hops)
    for suffix, status in SUFFIX_RULES:
        if text.endswith(suffix):
            return Answer(status, suffix)
    return Answer(500, text)
