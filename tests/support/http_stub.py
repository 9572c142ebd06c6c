"""A stand-in HTTP server on a thread of its own, for the tests that need an
answer no simulator gives (a proxy's page, a scripted event stream)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve_in_thread(handler: type[BaseHTTPRequestHandler], port: int = 0) -> ThreadingHTTPServer:
    """`handler` served on 127.0.0.1:`port` (0: any free port) until
    `shutdown()`; its address is `address_of(server)`."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    ).start()
    return server


def address_of(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"
