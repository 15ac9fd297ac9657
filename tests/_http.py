"""A real HTTP server on 127.0.0.1 for the tests that talk to one (indexes, downloads, the fleet's index server):
one way to start it on a free port, serve from a thread and close it, whatever handler the test brings."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def local_server(handler: Callable[..., Any]) -> Iterator[str]:
    """Serve ``handler`` (a ``BaseHTTPRequestHandler`` class or a factory of one) on 127.0.0.1 at a free port;
    yields ``http://127.0.0.1:PORT`` and shuts the server down on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
