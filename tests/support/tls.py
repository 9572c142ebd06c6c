"""Mutual TLS for stand-in servers: a CA of the test's own (trustme), a
server context that requires a client certificate, and the files a
`NomadConnection` takes (the CA, a client certificate and its key)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class MutualTls:
    server: ssl.SSLContext  # serves 127.0.0.1, requires a client certificate
    ca_file: Path
    cert_file: Path
    key_file: Path


def mutual_tls(directory: Path) -> MutualTls:
    """A CA, the server's context and the client's files in `directory`."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "c.pem", "k.pem"))
    ca.cert_pem.write_to_path(str(ca_file))
    client = ca.issue_cert("nomad-runner-controller")
    client.cert_chain_pems[0].write_to_path(str(cert_file))
    client.private_key_pem.write_to_path(str(key_file))
    return MutualTls(server, ca_file, cert_file, key_file)
