"""A loopback HTTP server shaped like vLLM's app for tests/e2e/route_check.py.

Real HTTP/1.1 over a real socket (standard library `ThreadingHTTPServer` on 127.0.0.1, an
ephemeral port). It serves an OpenAPI document listing its routes, and guards them the way the
patched vLLM middleware does (patch 0006): a missing or wrong `Authorization: Bearer KEY` gets 401
before routing, except on /health and /ping. The test breaks that on purpose through
`RouteServer`'s fields: `open_routes` answers without the key (vLLM 0.23.0's unpatched
`/invocations`, say), `accept_any_key` lets any bearer key through, `guard_probes` puts /health
and /ping behind the key too.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support.loopback import send_json

# (method, path template) of the schema; a subset of what vLLM 0.23.0's app registers.
ROUTES: list[tuple[str, str]] = [
    ("GET", "/health"),
    ("GET", "/ping"),
    ("POST", "/ping"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/invocations"),
    ("POST", "/tokenize"),
    ("GET", "/v1/models/{model_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
]
PROBES = {"/health", "/ping"}


@dataclass
class RouteServer:
    """Context manager: `with RouteServer(key) as s: s.base_url`; `s.requests` logs (method, path,
    authorization header or None) of every request."""

    api_key: str
    open_routes: set[tuple[str, str]] = field(default_factory=set)  # (method, filled path)
    accept_any_key: bool = False
    guard_probes: bool = False
    schema_status: int = 200
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def schema(self) -> dict[str, Any]:
        paths: dict[str, dict[str, Any]] = {}
        for method, path in ROUTES:
            paths.setdefault(path, {})[method.lower()] = {"responses": {"200": {}}}
        return {"openapi": "3.1.0", "info": {"title": "route server"}, "paths": paths}

    def answer(self, method: str, path: str, auth: str | None) -> tuple[int, dict[str, Any]]:
        self.requests.append((method, path, auth))
        keyed = auth == f"Bearer {self.api_key}" or (
            self.accept_any_key and (auth or "").startswith("Bearer ")
        )
        exempt = (method, path) in self.open_routes or (path in PROBES and not self.guard_probes)
        if not keyed and not exempt:
            return 401, {"error": "Unauthorized"}
        if path == "/openapi.json" and method == "GET":
            return self.schema_status, self.schema()
        for m, template in ROUTES:
            if m == method and re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path):
                return 200, {"ok": True}
        return 404, {"detail": "Not Found"}

    def __enter__(self) -> RouteServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

            def handle_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, body = server.answer(
                    self.command, self.path, self.headers.get("Authorization")
                )
                send_json(self, status, body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()
