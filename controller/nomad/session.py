"""`DirectSession`: the requests session python-nomad sends through, cut to
what a call to Nomad's API needs.

A requests `Session` does much per request that the controller never uses:
it merges session and environment settings, cookies and hooks, prepares the
URL (parsing, IDNA, requoting) and the body, extracts cookies from the
answer and looks for redirects. For one small list against the simulator
that came to about 550 µs of the calling process's CPU out of 1.2 ms per
call through python-nomad, beside 0.4 ms for the simulator's own work
(docs/performance.md, "The synchronous client"). The observer's refreshes,
the refill's creations and the claims' reads make several such calls a
claim, on the same interpreter lock as the API.

A plain request (a method, a URL without a query, parameters as a mapping,
headers, a JSON or bytes body; no stream, files, auth, cookies, proxies or
hooks of its own) is therefore prepared here and handed straight to the mounted
adapter's `send`, as `Session.send` would: the connection pool (its size and
blocking), TLS verification and client certificates, timeouts and the
mapping of transport failures to requests' exceptions are requests' own,
and the session's response hooks are called as `Session.send` calls them.
The wire request is the same (the session's default headers merged with the
call's, parameters encoded with `quote_plus` as requests does, `None`
values dropped), except that a JSON body is encoded by orjson, without
spaces. An answer that redirects is not followed here: the request is sent
again through the whole session, which follows it (Nomad's API does not
redirect). Anything else goes through the whole session as before.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlencode

import orjson
import requests
from requests.models import PreparedRequest
from requests.structures import CaseInsensitiveDict

__all__ = ["DirectSession"]

# A URL requests would send as it is (no IDNA, nothing to requote): anything
# else goes through the whole session.
_PLAIN_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9/._~%\-@!$&'()*+,;=:]*)?")


class DirectSession(requests.Session):
    """A session whose plain requests skip the session layer (see the module docstring)."""

    def request(
        self,
        method: str | bytes,
        url: str | bytes,
        params: Any = None,
        data: Any = None,
        headers: Any = None,
        cookies: Any = None,
        files: Any = None,
        auth: Any = None,
        timeout: Any = None,
        allow_redirects: bool = True,
        proxies: Any = None,
        hooks: Any = None,
        stream: bool | None = None,
        verify: Any = None,
        cert: Any = None,
        json: Any = None,
    ) -> requests.Response:
        def whole() -> requests.Response:
            return super(DirectSession, self).request(
                method,
                url,
                params=params,
                data=data,
                headers=headers,
                cookies=cookies,
                files=files,
                auth=auth,
                timeout=timeout,
                allow_redirects=allow_redirects,
                proxies=proxies,
                hooks=hooks,
                stream=stream,
                verify=verify,
                cert=cert,
                json=json,
            )

        if (
            stream
            or cookies
            or files
            or auth
            or proxies
            or hooks
            or self.trust_env
            or self.auth is not None
            or self.cookies
            or self.proxies
        ):
            return whole()
        prepared = self._plain(method, url, params, data, headers, json)
        if prepared is None:
            return whole()
        adapter = self.get_adapter(prepared.url or "")
        # What `Session.send` hands the adapter and the hooks; verify and cert
        # as `Session.merge_environment_settings` without the environment: the
        # call's setting, else the session's.
        settings: dict[str, Any] = {
            "stream": False,
            "timeout": timeout,
            "verify": (self.verify if verify is None else verify) or False,
            "cert": self.cert if cert is None else cert,
            "proxies": {},
        }
        started = time.perf_counter()
        response = adapter.send(prepared, **settings)
        response.elapsed = timedelta(seconds=time.perf_counter() - started)
        # The session's response hooks, as requests' `dispatch_hook` calls
        # them: a hook may replace the response.
        response_hooks: list[Callable[..., object]] = list(self.hooks.get("response") or ())
        for hook in response_hooks:
            replaced = hook(response, **settings)
            if isinstance(replaced, requests.Response):
                response = replaced
        if allow_redirects and response.is_redirect:
            response.close()
            return whole()
        _ = response.content  # read it all, so the connection goes back to the pool
        return response

    def _plain(
        self,
        method: str | bytes,
        url: str | bytes,
        params: Any,
        data: Any,
        headers: Any,
        json: Any,
    ) -> PreparedRequest | None:
        """The request prepared as requests would, or None when it is not plain."""
        if not isinstance(method, str) or not isinstance(url, str) or not _PLAIN_URL.fullmatch(url):
            return None
        if params is not None and not isinstance(params, Mapping):
            return None
        if data is not None and not isinstance(data, bytes):
            return None
        if json is not None and data is not None:
            return None
        merged: CaseInsensitiveDict[str | bytes] = CaseInsensitiveDict(self.headers)
        if headers:
            if not isinstance(headers, Mapping):
                return None
            for name, value in headers.items():
                if value is None:
                    merged.pop(name, None)
                else:
                    merged[name] = value
        body: bytes | None = data
        if json is not None:
            try:
                body = orjson.dumps(json)
            except orjson.JSONEncodeError:
                return None
            merged.setdefault("Content-Type", "application/json")
        if body is not None:
            merged["Content-Length"] = str(len(body))
        elif method.upper() not in ("GET", "HEAD"):
            merged["Content-Length"] = "0"
        query = ""
        if params:
            query = urlencode([(k, v) for k, v in params.items() if v is not None], doseq=True)
        prepared = PreparedRequest()
        prepared.method = method.upper()
        prepared.url = f"{url}?{query}" if query else url
        # Values stay as given (str or bytes), as requests' own preparation keeps them.
        prepared.headers = cast("CaseInsensitiveDict[str]", merged)
        prepared.body = body
        prepared.hooks = {"response": []}
        return prepared
