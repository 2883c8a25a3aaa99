"""A loopback OpenAI-compatible HTTP server for testing scripts/smoke_test.py.

Real HTTP/1.1 over a real socket (standard library `ThreadingHTTPServer`), real server-sent
events with chunked transfer encoding, the way vLLM's server streams. It serves
`GET /v1/models`, `POST /v1/completions` and `POST /v1/chat/completions` (streamed or not),
enforces a bearer key when given one, and misbehaves on request: see `Behaviour`.

Used in-process by the tests (`FakeOpenAIServer` is a context manager that serves from a
thread on 127.0.0.1:<ephemeral port>); it also runs standalone for trying the client by hand:

    PYTHONPATH=tests python -m support.fake_openai_server --port 8000 --api-key sk-test
    PYTHONPATH=tests python -m support.fake_openai_server --port 8000 --stream cut
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

StreamMode = Literal["ok", "single_chunk", "cut", "no_done", "no_finish"]


@dataclass
class Behaviour:
    """What the server does; tests change the fields before (or between) requests."""

    models: list[str] = field(default_factory=lambda: ["tiny-glm5"])
    api_key: str | None = None  # when set, every /v1 request needs `Authorization: Bearer <key>`
    accept_any_key: bool = False  # broken auth: any bearer key passes, only a missing one fails
    completion_text: str = " the quick brown fox"
    chat_text: str = "Hello from the fake server."
    chat_reasoning: str | None = None  # the answer's reasoning part, as a reasoning parser sends it
    reasoning_field: str = "reasoning"  # vLLM 0.23.0's name; older servers: reasoning_content
    # Pieces the streamed chat answer is sent in, one SSE event each.
    stream_pieces: list[str] = field(default_factory=lambda: ["Hello", " from", " the", " stream."])
    stream: StreamMode = "ok"
    first_chunk_delay_s: float = 0.0  # before the first streamed content chunk (simulated TTFT)
    chunk_delay_s: float = 0.0  # between streamed chunks
    sleep_s: float = 0.0  # before answering any /v1 request (for client timeouts)
    status_for: dict[str, int] = field(default_factory=dict)  # path -> forced HTTP error status
    fail_chat_requests: set[int] = field(default_factory=set)  # 1-based chat request numbers: 503


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    body: dict[str, Any]

    def setup(self) -> None:
        super().setup()
        # Send each SSE event at once, as uvicorn does (no Nagle delay on small writes).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (stdlib signature)
        pass  # keep test output clean

    # -- helpers -------------------------------------------------------------------------
    def _send_json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str) -> None:
        error = {"message": message, "type": HTTPStatus(status).phrase, "code": status}
        self._send_json(status, {"error": error})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, payload: object | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self._chunk(f"data: {text}\n\n".encode())

    def _authorised(self) -> bool:
        key = self.server.behaviour.api_key
        if key is None:
            return True
        auth = self.headers.get("Authorization") or ""
        if auth == f"Bearer {key}" or (self.server.behaviour.accept_any_key and auth):
            return True
        self._send_json(401, {"error": "Unauthorized"})  # what vLLM's key middleware sends
        return False

    def _read_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _common(self) -> bool:
        """Read, record, authenticate, delay, force errors; False when the request is answered."""
        b = self.server.behaviour
        self.body = self._read_body()  # always, so an early answer leaves the connection clean
        with self.server.lock:
            self.server.requests.append(
                (self.command, self.path, self.headers.get("Authorization"))
            )
        if b.sleep_s and self.server.stopping.wait(b.sleep_s):
            return False
        if not self._authorised():
            return False
        if self.path in b.status_for:
            status = b.status_for[self.path]
            self._send_error(status, f"forced HTTP {status} by the test server")
            return False
        return True

    # -- endpoints -----------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802  (http.server naming)
        if not self._common():
            return
        if self.path == "/v1/models":
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake"}
                for m in self.server.behaviour.models
            ]
            self._send_json(200, {"object": "list", "data": data})
        else:
            self._send_error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802  (http.server naming)
        if not self._common():
            return
        body = self.body
        b = self.server.behaviour
        if body.get("model") not in b.models:
            self._send_error(404, f"The model `{body.get('model')}` does not exist.")
        elif self.path == "/v1/completions":
            self._completion(body)
        elif self.path == "/v1/chat/completions":
            with self.server.lock:
                self.server.chat_count += 1
                number = self.server.chat_count
            if number in b.fail_chat_requests:
                self._send_error(503, f"chat request {number} refused by the test server")
            elif body.get("stream"):
                self._stream(body)
            else:
                self._chat(body)
        else:
            self._send_error(404, f"no route {self.path}")

    def _completion(self, body: dict[str, Any]) -> None:
        text = self.server.behaviour.completion_text
        choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
        self._send_json(
            200,
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [choice],
                "usage": _usage(text),
            },
        )

    def _chat(self, body: dict[str, Any]) -> None:
        text = self.server.behaviour.chat_text
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if self.server.behaviour.chat_reasoning is not None:
            message[self.server.behaviour.reasoning_field] = self.server.behaviour.chat_reasoning
        self._send_json(
            200,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
                "usage": _usage(text),
            },
        )

    def _stream(self, body: dict[str, Any]) -> None:
        b = self.server.behaviour
        server = self.server
        with server.lock:
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            head = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": body["model"],
            }
            pieces = ["".join(b.stream_pieces)] if b.stream == "single_chunk" else b.stream_pieces
            delta0 = {"role": "assistant", "content": ""}
            self._event({**head, "choices": [{"index": 0, "delta": delta0, "finish_reason": None}]})
            if server.stopping.wait(b.first_chunk_delay_s):
                return
            for i, piece in enumerate(pieces):
                if i and server.stopping.wait(b.chunk_delay_s):
                    return
                last = i == len(pieces) - 1
                finish = "length" if last and b.stream != "no_finish" else None
                choice = {"index": 0, "delta": {"content": piece}, "finish_reason": finish}
                self._event({**head, "choices": [choice]})
                if b.stream == "cut" and i == len(pieces) // 2:
                    # Drop the connection mid-body: no terminating zero-length chunk.
                    self.close_connection = True
                    return
            if (body.get("stream_options") or {}).get("include_usage"):
                self._event({**head, "choices": [], "usage": _usage("".join(pieces), len(pieces))})
            if b.stream != "no_done":
                self._event("[DONE]")
            self._chunk(b"")
        finally:
            with server.lock:
                server.in_flight -= 1


def _usage(text: str, tokens: int | None = None) -> dict[str, int]:
    completion = len(text.split()) if tokens is None else tokens
    return {"prompt_tokens": 5, "completion_tokens": completion, "total_tokens": 5 + completion}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, behaviour: Behaviour, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.behaviour = behaviour
        self.lock = threading.Lock()
        self.stopping = threading.Event()  # wakes handlers that sleep
        self.requests: list[tuple[str, str, str | None]] = []
        self.chat_count = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.errors: list[str] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Record instead of printing to stderr, so the tests can see (and assert) them. A client
        # that closes an idle keep-alive connection (ECONNRESET) is normal, not an error.
        if isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            return
        with self.lock:
            self.errors.append(traceback.format_exc())


class FakeOpenAIServer:
    """Serve `Behaviour` on 127.0.0.1 from a background thread while the context is open."""

    def __init__(self, behaviour: Behaviour | None = None, port: int = 0) -> None:
        self.behaviour = behaviour or Behaviour()
        self._server = _Server(self.behaviour, port)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        """(method, path, Authorization header) of every request received, in order."""
        with self._server.lock:
            return list(self._server.requests)

    @property
    def errors(self) -> list[str]:
        """Tracebacks of exceptions raised while handling requests (a client hanging up...)."""
        with self._server.lock:
            return list(self._server.errors)

    @property
    def max_in_flight(self) -> int:
        """The most streamed chat requests that were being answered at the same time."""
        return self._server.max_in_flight

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (%(default)s)")
    p.add_argument("--api-key", help="require this bearer key (default: none)")
    p.add_argument(
        "--stream",
        default="ok",
        choices=["ok", "single_chunk", "cut", "no_done", "no_finish"],
        help="how streamed chat answers end (%(default)s)",
    )
    args = p.parse_args(argv)
    behaviour = Behaviour(api_key=args.api_key, stream=args.stream, chunk_delay_s=0.05)
    with FakeOpenAIServer(behaviour, port=args.port) as server:
        print(f"serving {server.base_url} (Ctrl-C stops)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
