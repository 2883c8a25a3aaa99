"""The loopback HTTP plumbing the stand-in servers of tests/ share: one JSON reply, one server on
127.0.0.1 that runs in a background thread while a `with` block is open.

tests/support/vllm_serve_standin.py keeps its own copy of the reply: it is installed alone, as the
`vllm` executable of a test host, and runs on that host's /usr/bin/python3.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


def send_bytes(
    handler: BaseHTTPRequestHandler,
    status: int,
    data: bytes,
    kind: str,
    headers: dict[str, str] | None = None,
) -> None:
    """A whole reply: STATUS, Content-Type KIND, Content-Length, then HEADERS and DATA."""
    handler.send_response(status)
    fields = {"Content-Type": kind, "Content-Length": str(len(data)), **(headers or {})}
    for key, value in fields.items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(data)


def send_json(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: object,
    headers: dict[str, str] | None = None,
) -> None:
    send_bytes(handler, status, json.dumps(body).encode(), "application/json", headers)


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server on 127.0.0.1 (PORT 0: an ephemeral one); `stopping` is set at
    shutdown, to wake handlers that sleep."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), handler)
        self.stopping = threading.Event()


class Running:
    """Serves a `LoopbackHTTPServer` from a daemon thread while the context is open."""

    def __init__(self, server: LoopbackHTTPServer) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        # Bound (port chosen) when SERVER was made, so the addresses are known before serving.
        self.port: int = server.server_address[1]
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root_url}/v1"  # what an OpenAI client is given

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
