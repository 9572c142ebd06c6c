"""ACL tokens: which requests are let in, and with which capabilities.

ACLs are on when the configuration names a management token (`acl_token`,
every capability) or any other token (`acl_tokens`, each with the namespace
capabilities it grants in every namespace). With ACLs on, every /v1 request
needs a known token; exec also needs `alloc-exec`."""

from __future__ import annotations

from nomadsim.config import SimConfig


class Acl:
    def __init__(self, config: SimConfig) -> None:
        self._config = config

    @property
    def enabled(self) -> bool:
        return self._config.acl_token is not None or bool(self._config.acl_tokens)

    def known(self, token: str | None) -> bool:
        return token is not None and (
            token == self._config.acl_token or token in self._config.acl_tokens
        )

    def allows(self, token: str | None, capability: str) -> bool:
        """Whether the token grants the namespace capability (anything with
        ACLs off or for the management token; nothing for no token)."""
        if not self.enabled or (token is not None and token == self._config.acl_token):
            return True
        return capability in self._config.acl_tokens.get(token or "", ())
