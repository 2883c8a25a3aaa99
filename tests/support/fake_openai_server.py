"""A loopback OpenAI-compatible HTTP server for testing scripts/smoke_test.py.

Real HTTP/1.1 over a real socket (standard library `ThreadingHTTPServer`), real server-sent
events with chunked transfer encoding, the way vLLM's server streams. It serves
`GET /v1/models`, `POST /v1/completions` and `POST /v1/chat/completions` (streamed or not),
enforces a bearer key when given one, and misbehaves on request: see `Behaviour`. Like vLLM
with its tool and reasoning parsers on, it answers a request that declares tools with the
tool calls it is told to (`message.tool_calls`, or streamed `delta.tool_calls` with the id and
name first and the arguments in pieces) and sends reasoning apart from content, or refuses
tools as vLLM does without --enable-auto-tool-choice.

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
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal

from support.loopback import LoopbackHTTPServer, Running, send_json

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
    # Tool calls made when a request declares tools: {"name": str, "arguments": str} each (any
    # JSON value goes through as given, to test malformed replies).
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_argument_pieces: int = 3  # streamed: the arguments string in this many deltas
    raw_tool_calls: Any = None  # not None: sent verbatim as message.tool_calls
    raw_tool_call_deltas: list[Any] | None = None  # sent verbatim, one delta.tool_calls each
    tools_refused: bool = False  # HTTP 400 as vLLM without --enable-auto-tool-choice
    chat_finish_reason: str | None = None  # None: tool_calls after a call, else length
    # Streamed reasoning, sent before the content pieces in `reasoning_field`.
    stream_reasoning_pieces: list[str] = field(default_factory=list)
    # Replies to a request that declares tools, verbatim: the JSON body of a plain one, the data
    # payloads of a streamed one (then [DONE]). For replaying what vLLM itself serialises.
    raw_tools_body: dict[str, Any] | None = None
    raw_tools_events: list[str] | None = None

    def calls_for(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return self.tool_calls if body.get("tools") else []

    def finish_for(self, body: dict[str, Any]) -> str:
        if self.chat_finish_reason is not None:
            return self.chat_finish_reason
        return "tool_calls" if self.calls_for(body) else "length"


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
        send_json(self, status, body)

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
            self.server.bodies.append(self.body)
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
            elif body.get("tools") and b.tools_refused:
                # vLLM 0.23.0's words (entrypoints/serve/render/serving.py)
                self._send_error(400, '"auto" tool choice requires --enable-auto-tool-choice '
                                 "and --tool-call-parser to be set")  # fmt: skip
            elif body.get("tools") and body.get("stream") and b.raw_tools_events is not None:
                self._replay(b.raw_tools_events)
            elif body.get("tools") and b.raw_tools_body is not None:
                self._send_json(200, b.raw_tools_body)
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
        b = self.server.behaviour
        text = b.chat_text
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if b.chat_reasoning is not None:
            message[b.reasoning_field] = b.chat_reasoning
        calls = [
            {"id": f"chatcmpl-tool-{i}", "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(b.calls_for(body))
        ]  # fmt: skip
        if b.raw_tool_calls is not None and body.get("tools"):
            message["tool_calls"] = b.raw_tool_calls
        elif calls:
            message["tool_calls"] = calls
        self._send_json(
            200,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": b.finish_for(body)}],
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
            deltas = [{b.reasoning_field: r} for r in b.stream_reasoning_pieces]
            deltas += [{"content": piece} for piece in pieces]
            deltas += [{"tool_calls": d} for d in self._tool_deltas(body)]
            delta0 = {"role": "assistant", "content": ""}
            self._event({**head, "choices": [{"index": 0, "delta": delta0, "finish_reason": None}]})
            if server.stopping.wait(b.first_chunk_delay_s):
                return
            for i, delta in enumerate(deltas):
                if i and server.stopping.wait(b.chunk_delay_s):
                    return
                last = i == len(deltas) - 1
                finish = b.finish_for(body) if last and b.stream != "no_finish" else None
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                self._event({**head, "choices": [choice]})
                if b.stream == "cut" and i == len(deltas) // 2:
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

    def _replay(self, payloads: list[str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for payload in [*payloads, "[DONE]"]:
            self._event(payload)
        self._chunk(b"")

    def _tool_deltas(self, body: dict[str, Any]) -> list[Any]:
        """delta.tool_calls lists as vLLM streams them: id, type and name first, then pieces."""
        b = self.server.behaviour
        if not body.get("tools"):
            return []
        if b.raw_tool_call_deltas is not None:
            return b.raw_tool_call_deltas
        out: list[Any] = []
        for i, call in enumerate(b.tool_calls):
            head = {"index": i, "id": f"chatcmpl-tool-{i}", "type": "function",
                    "function": {"name": call["name"], "arguments": ""}}  # fmt: skip
            out.append([head])
            args = call["arguments"]
            if not isinstance(args, str):  # malformed on purpose: one delta, as given
                out.append([{"index": i, "function": {"arguments": args}}])
                continue
            step = max(1, -(-len(args) // max(1, b.tool_argument_pieces)))
            for start in range(0, len(args), step):
                piece = args[start : start + step]
                out.append([{"index": i, "function": {"arguments": piece}}])
        return out


def _usage(text: str, tokens: int | None = None) -> dict[str, int]:
    completion = len(text.split()) if tokens is None else tokens
    return {"prompt_tokens": 5, "completion_tokens": completion, "total_tokens": 5 + completion}


class _Server(LoopbackHTTPServer):
    def __init__(self, behaviour: Behaviour, port: int) -> None:
        super().__init__(_Handler, port)
        self.behaviour = behaviour
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str | None]] = []
        self.bodies: list[dict[str, Any]] = []
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


class FakeOpenAIServer(Running):
    """Serve `Behaviour` on 127.0.0.1 from a background thread while the context is open."""

    _server: _Server

    def __init__(self, behaviour: Behaviour | None = None, port: int = 0) -> None:
        self.behaviour = behaviour or Behaviour()
        super().__init__(_Server(self.behaviour, port))

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        """(method, path, Authorization header) of every request received, in order."""
        with self._server.lock:
            return list(self._server.requests)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON body of every request received, in order ({} for a GET)."""
        with self._server.lock:
            return list(self._server.bodies)

    @property
    def errors(self) -> list[str]:
        """Tracebacks of exceptions raised while handling requests (a client hanging up...)."""
        with self._server.lock:
            return list(self._server.errors)

    @property
    def max_in_flight(self) -> int:
        """The most streamed chat requests that were being answered at the same time."""
        return self._server.max_in_flight


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
