"""A loopback OpenAI-compatible server that attacks its client, for scripts/smoke_test.py's tests.

Real HTTP over a real socket on 127.0.0.1 (standard library `ThreadingHTTPServer`). Every route
answers correctly (a keyed /v1/models, completions, chat, a chunked SSE chat stream) unless a test
replaces it: `server.attack("POST /v1/chat/completions", fn)` where `fn(handler)` writes whatever
raw bytes it likes to `handler.wfile` (trickled, endless, mislabelled, redirected, ...). Ready-made
attacks are the functions below; `handler.server.stopping` wakes sleeping ones at shutdown.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from support import loopback

Attack = Callable[["Handler"], None]
MODEL = "tiny-glm5"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (stdlib signature)
        pass

    def raw(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def send_json(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        loopback.send_json(self, status, body, headers)

    def send_bytes(
        self, status: int, data: bytes, kind: str, headers: dict[str, str] | None = None
    ) -> None:
        loopback.send_bytes(self, status, data, kind, headers)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.raw(b"%x\r\n%s\r\n" % (len(data), data))

    def event(self, payload: object) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self.chunk(f"data: {text}\n\n".encode())

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
        route = f"{self.command} {self.path}"
        with self.server.lock:
            self.server.seen.append((route, self.headers.get("Authorization")))
        streamed = f"STREAM {self.path}" if self.body.get("stream") else ""
        attack = self.server.attacks.get(streamed) or self.server.attacks.get(route)
        if attack is not None:
            attack(self)
            self.close_connection = True
            return
        key = self.server.api_key
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self.send_json(401, {"error": "Unauthorized"})
        elif route == "GET /v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif route == "POST /v1/completions":
            choice = {"index": 0, "text": " Paris.", "finish_reason": "length"}
            self.send_json(200, {"choices": [choice], "usage": {"completion_tokens": 2}})
        elif route == "POST /v1/chat/completions" and not self.body.get("stream"):
            message = {"role": "assistant", "content": "Hello there."}
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            self.send_json(200, {"choices": [choice], "usage": {"completion_tokens": 3}})
        elif route == "POST /v1/chat/completions":
            self.start_stream()
            for i, piece in enumerate(["Hello", " there", "."]):
                finish = "length" if i == 2 else None
                self.event({"choices": [{"index": 0, "delta": {"content": piece},
                                         "finish_reason": finish}]})  # fmt: skip
            self.event("[DONE]")
            self.chunk(b"")
        else:
            self.send_json(404, {"error": {"message": f"no route {route}"}})

    do_GET = do_POST = _handle  # noqa: N815  (http.server naming)


class _Server(loopback.LoopbackHTTPServer):
    def __init__(self, api_key: str | None) -> None:
        super().__init__(Handler)
        self.api_key = api_key
        self.attacks: dict[str, Attack] = {}
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str | None]] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client hanging up on an attack is the point


class HostileOpenAIServer(loopback.Running):
    """Serve on 127.0.0.1 from a background thread while the context is open."""

    _server: _Server

    def __init__(self, api_key: str | None = None) -> None:
        super().__init__(_Server(api_key))

    def attack(self, route: str, fn: Attack) -> None:
        self._server.attacks[route] = fn

    @property
    def seen(self) -> list[tuple[str, str | None]]:
        """(route, Authorization header) of every request, in order."""
        with self._server.lock:
            return list(self._server.seen)


# -- ready-made attacks -----------------------------------------------------------------------


def trickle(data: bytes, every_s: float = 1.0) -> Attack:
    """Send DATA (headers and all) one byte every EVERY_S seconds."""

    def attack(h: Handler) -> None:
        for i in range(len(data)):
            if h.server.stopping.wait(every_s if i else 0):
                return
            h.raw(data[i : i + 1])

    return attack


def models_response(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


def body(status: int, data: bytes, kind: str, headers: dict[str, str] | None = None) -> Attack:
    return lambda h: h.send_bytes(status, data, kind, headers)


def json_body(value: object, status: int = 200) -> Attack:
    return lambda h: h.send_json(status, value)


def redirect(location: str, status: int = 302) -> Attack:
    return lambda h: h.send_bytes(status, b"", "text/plain", {"Location": location})


def gzipped(value: object) -> Attack:
    data = gzip.compress(json.dumps(value).encode())
    return body(200, data, "application/json", {"Content-Encoding": "gzip"})


def endless_chunked(piece: bytes) -> Attack:
    """A chunked body that never ends (until the client hangs up or the server stops)."""

    def attack(h: Handler) -> None:
        h.start_stream()
        while not h.server.stopping.is_set():
            h.chunk(piece)

    return attack


def endless_events() -> Attack:
    """A valid chat stream that never sends finish_reason or [DONE]."""
    delta = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
    return endless_chunked(f"data: {json.dumps(delta)}\n\n".encode() * 64)


def stream_of(*events: object) -> Attack:
    def attack(h: Handler) -> None:
        h.start_stream()
        for event in events:
            h.event(event)
        h.chunk(b"")

    return attack


def echo_authorization(status: int = 500) -> Attack:
    """An error body that quotes the request's Authorization header back."""
    return lambda h: h.send_json(
        status, {"error": {"message": f"bad request, got {h.headers.get('Authorization')}"}}
    )
