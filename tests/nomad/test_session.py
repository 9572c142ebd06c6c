"""`DirectSession`: a plain request leaves as requests would send it, with
requests' own connection pool, TLS and failures; what is not plain goes
through the whole session."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from controller.nomad.client import NomadClient
from controller.nomad.connection import NomadConnection
from controller.nomad.errors import NomadUnavailable
from controller.nomad.session import DirectSession
from tests.support.http_stub import address_of, serve_in_thread
from tests.support.tls import mutual_tls

# What the stub heard: (request line, headers in order, body).
Heard = tuple[str, list[tuple[str, str]], bytes]


class Recorder(BaseHTTPRequestHandler):
    """Answers every request 200 with `{"ok": true}`, and `/v1/moved` with a
    307 to `/v1/here`; records what it heard on the server."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        heard: list[Heard] = self.server.heard  # type: ignore[attr-defined]
        heard.append((self.requestline, list(self.headers.items()), body))
        if self.path.startswith("/v1/moved"):
            self.send_response(307)
            self.send_header("Location", "/v1/here")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        answer = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[ThreadingHTTPServer]:
    server = serve_in_thread(Recorder)
    server.heard = []  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()


def direct_session() -> DirectSession:
    """Ours as NomadClient makes it: nothing taken from the environment
    (which only the whole session can honour)."""
    session = DirectSession()
    session.trust_env = False
    return session


def heard(server: ThreadingHTTPServer) -> list[Heard]:
    return server.heard  # type: ignore[attr-defined,no-any-return]


def without_length(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    # A JSON body is encoded without spaces here, so its length differs.
    return [(k, v) for k, v in headers if k.lower() != "content-length"]


def send_both(server: ThreadingHTTPServer, **request: Any) -> tuple[Heard, Heard]:
    """The same request through requests' session and through ours."""
    heard(server).clear()
    whole_session = requests.Session()
    whole_session.trust_env = False
    for session in (whole_session, direct_session()):
        with session:
            session.request(url=f"{address_of(server)}/v1/jobs", timeout=5, **request)
    whole, direct = heard(server)
    return whole, direct


def test_a_plain_get_is_on_the_wire_as_requests_sends_it(stub: ThreadingHTTPServer) -> None:
    whole, direct = send_both(
        stub,
        method="GET",
        params={"filter": 'ID == "1-a b"', "namespace": "default", "gone": None, "n": [1, 2]},
        headers={"X-Nomad-Token": "t0ken", "Accept": None},
    )
    assert direct == whole
    request_line, headers, _ = direct
    assert request_line.startswith("GET /v1/jobs?filter=ID+%3D%3D+%221-a+b%22&namespace=default")
    assert "gone" not in request_line and "n=1&n=2" in request_line
    assert ("X-Nomad-Token", "t0ken") in headers
    assert "Accept" not in dict(headers)  # a header set to None drops the default


@pytest.mark.parametrize("method", ["PUT", "POST", "DELETE"])
def test_a_json_body_and_the_other_methods_as_requests_sends_them(
    stub: ThreadingHTTPServer, method: str
) -> None:
    body = {"Job": {"ID": "1-a", "Meta": {"nrc_used": "true"}}, "EnforceIndex": True}
    whole, direct = send_both(stub, method=method, params={"namespace": "n"}, json=body)
    assert direct[0] == whole[0]
    assert without_length(direct[1]) == without_length(whole[1])
    assert json.loads(direct[2]) == json.loads(whole[2]) == body
    assert dict(direct[1])["Content-Length"] == str(len(direct[2]))
    empty_whole, empty_direct = send_both(stub, method=method)
    assert empty_direct == empty_whole  # Content-Length: 0, as requests sends it


def test_a_redirect_is_followed_as_the_whole_session_follows_it(
    stub: ThreadingHTTPServer,
) -> None:
    with direct_session() as session:
        followed = session.get(f"{address_of(stub)}/v1/moved", timeout=5)
        assert (followed.status_code, followed.url) == (200, f"{address_of(stub)}/v1/here")
        assert followed.json() == {"ok": True}
        kept = session.get(f"{address_of(stub)}/v1/moved", timeout=5, allow_redirects=False)
        assert kept.status_code == 307


def test_only_what_is_not_plain_goes_through_the_whole_session(
    stub: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole_calls: list[dict[str, Any]] = []
    real = requests.Session.request

    def spy(self: requests.Session, *args: Any, **kwargs: Any) -> Any:
        whole_calls.append(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(requests.Session, "request", spy)
    url = f"{address_of(stub)}/v1/jobs"
    hooked: list[int] = []
    with direct_session() as session:
        assert session.get(url, params={"a": "b"}, timeout=5).json() == {"ok": True}
        assert whole_calls == []
        streamed = session.get(url, stream=True, timeout=5)
        assert b"".join(streamed.iter_content(4)) == b'{"ok": true}'
        session.get(f"{url}?already=queried", timeout=5)
        session.post(url, data={"form": "field"}, timeout=5)
        session.get(url, timeout=5, hooks={"response": [lambda r, **_: hooked.append(-1)]})
        assert len(whole_calls) == 4 and hooked == [-1]
        # The session's own hooks are called on the direct path too.
        session.hooks["response"].append(lambda r, **kw: hooked.append(r.status_code))
        session.get(url, timeout=5)
        assert len(whole_calls) == 4 and hooked == [-1, 200]
        session.hooks["response"].clear()
        session.trust_env = True  # proxies, .netrc and CA bundles from the environment
        session.get(url, timeout=5)
    assert len(whole_calls) == 5


def test_transport_failures_are_requests_own() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with direct_session() as session, pytest.raises(requests.ConnectionError):
        session.get(f"http://127.0.0.1:{port}/v1/jobs", timeout=2)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        with direct_session() as session, pytest.raises(requests.ReadTimeout):
            session.get(f"http://127.0.0.1:{silent.getsockname()[1]}/v1/jobs", timeout=0.2)
    finally:
        silent.close()


def test_mutual_tls_through_the_nomad_client(tmp_path: Path) -> None:
    tls = mutual_tls(tmp_path)
    ca_file, cert_file, key_file = tls.ca_file, tls.cert_file, tls.key_file

    class Jobs(Recorder):
        def _answer(self) -> None:
            heard(self.server).append((self.requestline, list(self.headers.items()), b""))  # type: ignore[arg-type]
            answer = b'[{"ID": "1-a", "JobModifyIndex": 3, "Status": "running"}]'
            self.send_response(200)
            self.send_header("X-Nomad-Index", "9")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Jobs)
    server.heard = []  # type: ignore[attr-defined]
    server.socket = tls.server.wrap_socket(server.socket, server_side=True)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    ).start()
    address = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        client = NomadClient(
            NomadConnection(
                address,
                token="secret",
                ca_cert=str(ca_file),
                client_cert=str(cert_file),
                client_key=str(key_file),
            ),
            retry_attempts=1,
        )
        listing = client.list_jobs()
        assert ([j.id for j in listing.jobs], listing.index) == (["1-a"], 9)
        ((request_line, headers, _),) = heard(server)
        assert request_line.startswith("GET /v1/jobs?") and ("X-Nomad-Token", "secret") in headers
        untrusted = NomadClient(NomadConnection(address, ca_cert=str(ca_file)), retry_attempts=1)
        with pytest.raises(NomadUnavailable):  # no client certificate
            untrusted.list_jobs()
        unverified = NomadClient(NomadConnection(address), retry_attempts=1)
        with pytest.raises(NomadUnavailable):  # the system's CAs do not know ours
            unverified.list_jobs()
    finally:
        server.shutdown()
        server.server_close()
