"""Browser defences, whatever the token: a web page the operator (or a
developer running `dev`) opens must not drive the API.

- A JSON body only with a JSON content type (415 otherwise): a browser sends
  `text/plain`, form and multipart bodies cross-site without asking first
  (no CORS preflight), but not `application/json`.
- A trusted `Host` (400 otherwise): a page whose name an attacker re-points
  at the API's address (DNS rebinding) still sends its own name as `Host`.
- The execution WebSocket refuses a browser `Origin` not in the allow-list
  (403); browsers always send `Origin` on a WebSocket handshake, platforms'
  server-side clients do not, so a handshake without one is allowed.

The checks are pure functions; `TrustedHost` is the ASGI middleware.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from controller.api.errors import error_response

ANY = "*"


def _host_name(host: str) -> str:
    """The name in a `Host` value, without its port, lower case: `[::1]:80` is `::1`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        return name
    return host


def default_hosts(bind: str) -> frozenset[str] | None:
    """The `Host` values an API bound to `bind` trusts by default: the bind
    address and the loopback names; any, when it binds every address (then
    the token, required there, is the defence)."""
    name = _host_name(bind)
    try:
        if ipaddress.ip_address(name).is_unspecified:
            return None
    except ValueError:
        pass
    return frozenset({name, "localhost", "127.0.0.1", "::1"})


def allowed_hosts(configured: Iterable[str], bind: str) -> frozenset[str] | None:
    """The trusted hosts: the configured ones (`*`: any), else the defaults."""
    names = frozenset(_host_name(h) for h in configured if h.strip())
    if not names:
        return default_hosts(bind)
    return None if ANY in names else names


def host_allowed(host: str | None, allowed: frozenset[str] | None) -> bool:
    if allowed is None:
        return True
    return host is not None and _host_name(host) in allowed


def origin_allowed(origin: str | None, allowed: Iterable[str]) -> bool:
    """No `Origin`: not a browser. Otherwise it must be listed (scheme://host[:port])."""
    if origin is None:
        return True
    wanted = origin.strip().lower().rstrip("/")
    return any(wanted == a.strip().lower().rstrip("/") for a in allowed)


def is_json(content_type: str | None) -> bool:
    """`application/json` or `application/<something>+json`, with parameters."""
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    kind, slash, subtype = media.partition("/")
    return (
        kind == "application" and slash == "/" and (subtype == "json" or subtype.endswith("+json"))
    )


class TrustedHost:
    """ASGI middleware: a request or WebSocket handshake whose `Host` is not
    trusted is refused with 400 before anything else runs."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed is None:
            await self.app(scope, receive, send)
            return
        host = None
        for name, value in scope.get("headers") or ():
            if name == b"host":
                host = value.decode("latin-1")
                break
        if host_allowed(host, self.allowed):
            await self.app(scope, receive, send)
            return
        refusal = error_response(400, "untrusted Host header (NRC_API_ALLOWED_HOSTS)")
        if scope["type"] == "http":
            await refusal(scope, receive, send)
        elif "websocket.http.response" in scope.get("extensions", {}):
            await WebSocket(scope, receive, send).send_denial_response(refusal)
        else:
            await send({"type": "websocket.close", "code": 1008})  # the server answers 403
