"""Execution ids that name the replica that issued them, signed so that only
the replicas can make one (pure: no I/O, no clock of its own).

With every replica serving the API, a client's `POST /execute` and its
WebSocket connect may reach two replicas behind a plain load balancer. The
issuing replica's `ExecutionStore` stays the only place that makes an id
one-shot and expiring; the id only says where that store is, so the replica
the connect reaches can take the execution from it (`controller.api.replicas`).

An id is three dot-separated parts, all URL-safe:

    <nonce>.<issuer>.<mac>

- `nonce`: 32 hex digits (128 random bits), what made every id unguessable
  before replicas shared them;
- `issuer`: the issuing replica's advertised URL (NRC_API_ADVERTISE_URL),
  base64url without padding;
- `mac`: HMAC-SHA256 over the first two parts with the key the replicas
  share, base64url without padding.

A replica follows an id's issuer only when the MAC is right: an id a client
made up or altered names nobody, and is 404 without any outbound call, so an
id cannot send a replica's request to an address of the client's choosing.

The take between replicas is signed with the same key over the id, the
runner and the sender's wall-clock second (`take_signature`), accepted within
`TAKE_WINDOW_S` of the receiver's clock; replaying a take within that window
gains nothing, since the issuer answers each id once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# The longest id read at all: a URL of 512 characters and the rest fit.
MAX_ID_LENGTH = 1024
# How far the sender's clock may be from the receiver's for a signed take.
TAKE_WINDOW_S = 30.0

_NONCE = re.compile(r"[0-9a-f]{32}")
_B64 = re.compile(r"[A-Za-z0-9_-]+")
# Domain separation: the same key signs ids and takes, never one as the other.
_ID_PURPOSE = b"nrc execution id v1\n"
_TAKE_PURPOSE = b"nrc execution take v1\n"
_DERIVED_PURPOSE = b"nrc replica key v1"


def nonce_of(execution_id: str) -> str:
    """The random part of an id (all of an id that names no replica)."""
    return execution_id.split(".", 1)[0]


def replica_key(secret: str | None, api_token: str | None) -> bytes | None:
    """The key the replicas share: NRC_REPLICA_SECRET, else one derived from
    NRC_API_TOKEN (an HMAC of a fixed label, so a MAC never shows the token
    itself); None without either (ids stay on their replica)."""
    if secret is not None:
        return hashlib.sha256(secret.encode("utf-8")).digest()
    if api_token is not None:
        return hmac.new(api_token.encode("utf-8"), _DERIVED_PURPOSE, hashlib.sha256).digest()
    return None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes | None:
    if not _B64.fullmatch(text):
        return None
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _is_base_url(url: str) -> bool:
    parts = urlsplit(url)
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and parts.path in ("", "/")
        and not parts.query
        and not parts.fragment
        and parts.username is None
    )


@dataclass(frozen=True)
class Signer:
    """This replica's side of the ids: its advertised URL and the shared key."""

    url: str
    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not _is_base_url(self.url):
            raise ValueError(f"not an http(s) base URL: {self.url!r}")
        if len(self.key) < 16:
            raise ValueError("the replica key is shorter than 16 bytes")

    def new_id(self, nonce: str | None = None) -> str:
        """A new id issued here; `nonce` (32 hex digits) only for tests."""
        nonce = nonce if nonce is not None else secrets.token_hex(16)
        if not _NONCE.fullmatch(nonce):
            raise ValueError("the nonce is not 32 hex digits")
        body = f"{nonce}.{_b64(self.url.encode('utf-8'))}"
        return f"{body}.{self._mac(body)}"

    def issuer_of(self, execution_id: str) -> str | None:
        """The issuer's URL when the id is one the replicas signed; else None."""
        if len(execution_id) > MAX_ID_LENGTH:
            return None
        parts = execution_id.split(".")
        if len(parts) != 3 or not _NONCE.fullmatch(parts[0]):
            return None
        if not (_B64.fullmatch(parts[1]) and _B64.fullmatch(parts[2])):
            return None
        body = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(parts[2], self._mac(body)):
            return None
        raw = _unb64(parts[1])
        if raw is None:
            return None
        try:
            url = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        # Signed with our key, so a replica made it; a URL that is no base
        # URL is still refused rather than followed.
        return url if _is_base_url(url) else None

    def is_mine(self, execution_id: str) -> bool:
        return self.issuer_of(execution_id) == self.url

    def take_signature(self, execution_id: str, runner_id: str, at_s: int) -> str:
        """What a replica sends with its take of `execution_id` at wall second `at_s`."""
        message = _TAKE_PURPOSE + f"{execution_id}\n{runner_id}\n{at_s}".encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def take_authentic(
        self, execution_id: str, runner_id: str, at: str, signature: str, now_s: float
    ) -> bool:
        """Whether a take was signed with the shared key within the window of `now_s`."""
        if not re.fullmatch(r"\d{1,12}", at):
            return False
        if abs(now_s - int(at)) > TAKE_WINDOW_S:
            return False
        wanted = self.take_signature(execution_id, runner_id, int(at))
        return hmac.compare_digest(signature.encode("utf-8"), wanted.encode("ascii"))

    def _mac(self, body: str) -> str:
        digest = hmac.new(self.key, _ID_PURPOSE + body.encode("ascii"), hashlib.sha256)
        return _b64(digest.digest())
