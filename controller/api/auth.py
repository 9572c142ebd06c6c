"""Token authentication, as Poseidon does it, plus the usual bearer form.

With a token configured, the runner, environment and statistics routes need
`Poseidon-Token: <token>` or `Authorization: Bearer <token>`; anything else is
401. Probes (`/api/v1/health`, `/api/v1/version`, `/healthz`, `/readyz`),
`/metrics` and the API description stay open. Tokens are compared in
constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated

from fastapi import Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from controller.api.errors import ApiError

POSEIDON_HEADER = "Poseidon-Token"
POSEIDON_SCHEME = "poseidonAuthToken"  # Poseidon's name for it
BEARER_SCHEME = "bearerAuth"

poseidon_token = APIKeyHeader(
    name=POSEIDON_HEADER,
    scheme_name=POSEIDON_SCHEME,
    description="The API token, as Poseidon clients send it.",
    auto_error=False,
)
bearer_token = HTTPBearer(
    scheme_name=BEARER_SCHEME,
    description="The same API token as a bearer token.",
    auto_error=False,
)

PoseidonHeader = Annotated[str | None, Security(poseidon_token)]
BearerHeader = Annotated[HTTPAuthorizationCredentials | None, Security(bearer_token)]

SECURITY_SCHEMES = {
    POSEIDON_SCHEME: {
        "type": "apiKey",
        "in": "header",
        "name": POSEIDON_HEADER,
        "description": poseidon_token.model.description,
    },
    BEARER_SCHEME: {
        "type": "http",
        "scheme": "bearer",
        "description": bearer_token.model.description,
    },
}


def _matches(offered: str | None, expected: bytes) -> bool:
    if offered is None:
        return False
    return hmac.compare_digest(offered.encode("utf-8", "surrogateescape"), expected)


def _offers(header: str | None, bearer: str | None, expected: bytes) -> bool:
    # Both are compared, so the time taken does not depend on which matched.
    by_header = _matches(header, expected)
    by_bearer = _matches(bearer, expected)
    return by_header or by_bearer


def headers_offer(headers: Mapping[str, str], token: str) -> bool:
    """Whether request headers carry `token` as Poseidon-Token or Bearer: for
    the WebSocket's upgrade, which does not go through `require_token`."""
    auth = headers.get("authorization", "")
    bearer = auth[7:] if auth[:7].lower() == "bearer " else None
    return _offers(headers.get(POSEIDON_HEADER), bearer, token.encode("utf-8"))


def require_token(token: str) -> Callable[..., Awaitable[None]]:
    """A dependency that lets a request through only with `token`."""
    if not token:
        raise ValueError("api_token must not be empty (None disables authentication)")
    expected = token.encode("utf-8")

    async def authenticate(
        header: PoseidonHeader,
        bearer: BearerHeader,
    ) -> None:
        if not _offers(header, bearer.credentials if bearer else None, expected):
            raise ApiError(
                401,
                "authentication required: send the API token as Poseidon-Token or Bearer",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return authenticate
