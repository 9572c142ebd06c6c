"""`NomadConnection`: where and how to reach Nomad, built once from the settings.

One frozen value — address, ACL token, namespace, region and TLS — handed to
the HTTP client, the event stream and the exec client, so that the three
cannot disagree. TLS is read once, when the value is built: requests'
`verify`/`cert` arguments and the `ssl.SSLContext` the WebSocket client needs
come from the same files. A client certificate may come with its key in a
separate file or as one PEM holding both (NOMAD_CLIENT_CERT alone), as
Nomad's CLI accepts. A named file that does not exist is refused here, with
its setting's name, rather than by a bare OSError on every request later.

`at(address)` is the same connection to another agent (a node's own HTTP
address for an exec): same token, namespace, region and TLS, the configured
scheme.
"""

from __future__ import annotations

import copy
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass(frozen=True)
class NomadConnection:
    """See the module docstring. Holds the token in clear: never log it (its
    repr leaves it out)."""

    address: str = "http://127.0.0.1:4646"
    token: str | None = field(default=None, repr=False)
    namespace: str = "default"
    region: str | None = None
    ca_cert: str | None = None
    client_cert: str | None = None  # alone: one PEM holding certificate and key
    client_key: str | None = None
    verify: bool = True
    # Built from the fields above in __post_init__; not arguments.
    requests_verify: bool | str = field(init=False, repr=False, compare=False)
    requests_cert: str | tuple[str, str] | None = field(init=False, repr=False, compare=False)
    ssl_context: ssl.SSLContext | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", self.address.rstrip("/"))
        for name, path in (
            ("ca_cert", self.ca_cert),
            ("client_cert", self.client_cert),
            ("client_key", self.client_key),
        ):
            if path and not os.path.isfile(path):
                raise ValueError(f"{name} {path!r} is not a file")
        if self.client_key and not self.client_cert:
            raise ValueError("client_key given without client_cert")
        verify: bool | str = self.ca_cert if (self.verify and self.ca_cert) else self.verify
        cert: str | tuple[str, str] | None = None
        if self.client_cert and self.client_key:
            cert = (self.client_cert, self.client_key)
        elif self.client_cert:
            cert = self.client_cert
        object.__setattr__(self, "requests_verify", verify)
        object.__setattr__(self, "requests_cert", cert)
        object.__setattr__(self, "ssl_context", self._ssl() if self.tls else None)

    @property
    def scheme(self) -> str:
        return urlsplit(self.address).scheme or "http"

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Nomad-Token": self.token} if self.token else {}

    def at(self, host_port: str) -> NomadConnection:
        """This connection to the agent at `host_port` (a node's HTTPAddr),
        sharing the TLS built for this one."""
        other = copy.copy(self)
        object.__setattr__(other, "address", f"{self.scheme}://{host_port}")
        return other

    def _ssl(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=self.ca_cert)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"ca_cert {self.ca_cert!r} cannot be loaded: {exc}") from None
        if self.client_cert:
            try:
                # keyfile None: the certificate file holds the key too.
                context.load_cert_chain(self.client_cert, self.client_key)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    f"client_cert {self.client_cert!r} / client_key {self.client_key!r} "
                    f"cannot be loaded: {exc}"
                ) from None
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


log = logging.getLogger(__name__)

# (operation, outcome, status, seconds) of every request to Nomad, HTTP and
# exec alike: the metrics' hook.
RequestHook = Callable[[str, str, str, float], None]


def report_request(
    hook: RequestHook | None, operation: str, outcome: str, status: str, seconds: float
) -> None:
    """Tell the hook about one request; a failing hook never turns a good
    answer into a failure."""
    if hook is None:
        return
    try:
        hook(operation, outcome, status, seconds)
    except Exception:
        log.exception("on_request hook failed for %s", operation)
