"""Browser defences, whatever the token: a web page the operator (or a
developer running `dev`) opens must not drive the API.

- A request from a web page is refused (403, `BrowserOrigin`) unless the
  page's origin is in the allow-list: browsers send `Origin` on every
  cross-origin request but a no-cors GET (and on every write, form posts
  included), and `Sec-Fetch-Site` on every request; platforms' server-side
  clients send neither. So bodies are read as JSON whatever their
  Content-Type, as Poseidon reads them: a `text/plain` or form post from a
  page, which a browser sends cross-site without asking first, never gets
  that far.
- A trusted `Host` (400 otherwise): a page whose name an attacker re-points
  at the API's address (DNS rebinding) still sends its own name as `Host`.
- The execution WebSocket refuses a browser `Origin` not in the allow-list
  (403); browsers always send `Origin` on a WebSocket handshake, platforms'
  server-side clients do not, so a handshake without one is allowed.

The checks are pure functions; `TrustedHost` and `BrowserOrigin` are the
ASGI middleware.
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


# The Sec-Fetch-Site values of a request a page of another origin made.
_OTHER_SITES = frozenset({"cross-site", "same-site"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def from_a_page(
    method: str, origin: str | None, fetch_site: str | None, allowed: Iterable[str]
) -> bool:
    """Whether an HTTP request comes from a web page that may not use the API:
    an `Origin` not in `allowed`, or a write a browser marks as another
    site's (`Sec-Fetch-Site`) without naming its origin."""
    if not origin_allowed(origin, allowed):
        return True
    other_site = (fetch_site or "").strip().lower() in _OTHER_SITES
    return origin is None and other_site and method.upper() not in SAFE_METHODS


class BrowserOrigin:
    """ASGI middleware: an HTTP request from a web page (`from_a_page`) is
    refused with 403 before anything else reads it. WebSocket handshakes are
    the execution route's (it answers the same 403)."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = fetch_site = None
        for name, value in scope.get("headers") or ():
            if name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"sec-fetch-site":
                fetch_site = value.decode("latin-1")
        if not from_a_page(scope["method"], origin, fetch_site, self.allowed):
            await self.app(scope, receive, send)
            return
        named = f"Origin {origin}" if origin is not None else "a request of another site"
        refusal = error_response(
            403, f"requests from web pages are refused: {named} is not in NRC_API_ALLOWED_ORIGINS"
        )
        await refusal(scope, receive, send)


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
