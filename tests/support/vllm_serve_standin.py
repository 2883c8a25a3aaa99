#!/usr/bin/python3
"""Stand-in for `vllm serve` on a test host without a GPU: answers /health and the OpenAI routes.

Installed as the `vllm` executable the vllm_service unit runs (`vllm serve MODEL --host H --port P
--served-model-name N ...`), so systemd, the unit's hardening, the restart handler and the /health
wait all act on a real process. Like vLLM it reads the model file and the HF config dir before it
listens (so a unit whose sandbox hides them fails to start), writes to its cache root, and guards
/v1 with VLLM_API_KEY. It generates no text: replies are fixed strings marked "stand-in" (a
streamed chat reply comes as server-sent events, as vLLM sends them).
Standard library only (runs on the target's /usr/bin/python3).

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 model or config unreadable, 2 bad arguments.

Example:
    vllm_serve_standin.py serve /srv/glm5/m.gguf --hf-config-path /srv/glm5/hf --port 8000
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import signal
import socketserver
import sys
import time
from pathlib import Path

FINGERPRINT = "vllm-serve-standin"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("model")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--hf-config-path", default=None)
    return p


def _handler(model: str, key: str | None) -> type[http.server.BaseHTTPRequestHandler]:
    created = int(time.time())

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = FINGERPRINT

        def log_message(self, fmt: str, *args: object) -> None:
            sys.stderr.write(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}\n")

        def _send(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            if key is None or self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            if self.path in ("/health", "/ping"):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif not self._authorised():
                return
            elif self.path == "/v1/models":
                card = {"id": model, "object": "model", "created": created, "owned_by": "vllm"}
                self._send(200, {"object": "list", "data": [card]})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            if not self._authorised():
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._send(400, {"error": "invalid JSON"})
                return
            usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
            base = {"id": "standin-1", "created": created, "model": req.get("model", model),
                    "system_fingerprint": FINGERPRINT, "usage": usage}  # fmt: skip
            if self.path == "/v1/chat/completions" and req.get("stream"):
                self._stream(base, bool((req.get("stream_options") or {}).get("include_usage")))
            elif self.path == "/v1/chat/completions":
                msg = {"role": "assistant", "content": "stand-in reply"}
                choice = {"index": 0, "message": msg, "finish_reason": "stop"}
                self._send(200, {**base, "object": "chat.completion", "choices": [choice]})
            elif self.path == "/v1/completions":
                choice = {"index": 0, "text": " stand-in reply", "finish_reason": "stop"}
                self._send(200, {**base, "object": "text_completion", "choices": [choice]})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def _stream(self, base: dict, include_usage: bool) -> None:
            """Server-sent events as vLLM sends them: role, content pieces, finish, usage, [DONE].

            HTTP/1.0 like the rest of this server: the body ends when the connection closes."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            head = {k: v for k, v in base.items() if k != "usage"}
            head["object"] = "chat.completion.chunk"
            deltas = [{"role": "assistant", "content": ""}, {"content": "stand-in"},
                      {"content": " reply"}]  # fmt: skip
            events = [
                {**head, "choices": [{"index": 0, "delta": d,
                                      "finish_reason": "stop" if i == len(deltas) - 1 else None}]}
                for i, d in enumerate(deltas)
            ]  # fmt: skip
            if include_usage:
                events.append({**head, "choices": [], "usage": base["usage"]})
            for event in [*map(json.dumps, events), "[DONE]"]:
                self.wfile.write(f"data: {event}\n\n".encode())
                self.wfile.flush()

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves its own name (getfqdn): on a host without DNS that
        # blocks for seconds before the port opens. vLLM does no such lookup.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_known_args(argv)[0]
    # What vLLM reads before it listens: the GGUF file and the HF config (config.json).
    try:
        with open(args.model, "rb") as f:
            f.read(4)
        if args.hf_config_path:
            (Path(args.hf_config_path) / "config.json").read_bytes()
        cache = Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache/vllm")
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "standin-started").write_text(f"{os.getpid()}\n")
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    name = args.served_model_name or args.model
    server = _Server((args.host, args.port), _handler(name, os.environ.get("VLLM_API_KEY") or None))
    signal.signal(signal.SIGTERM, _stop)
    print(f"{FINGERPRINT}: serving {name} on {args.host}:{args.port}", file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
