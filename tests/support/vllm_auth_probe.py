"""Ask vLLM's real OpenAI server app which routes answer without the API key; print JSON.

Run in a child process so that it imports the vllm/ it is meant to (PYTHONPATH picks a patched
copy or, without it, the installed pristine one):

    python -m support.vllm_auth_probe KEY

It builds the app with vLLM's own `make_arg_parser` + `build_app(args, ("generate",))` (the
serving process's code, `--api-key KEY`), then sends every registered route, plus a few path
variants, straight through the ASGI stack: no key, a wrong key, the right key. No engine runs:
`app.state.engine_client` is None, vLLM's render-only case, so /health answers 200 when the
request reaches it. The device type is set to "cpu" only because vLLM's argument defaults ask the
platform for one and this machine has no GPU.

Output (one JSON object on stdout): {"vllm_file": ..., "routes": [[method, path], ...],
"results": {"METHOD PATH": {"none": [status, body], "wrong": [...], "key": [...]}}}.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any

EXTRA = [
    ("GET", "/health/"),  # only the exact paths are open
    ("GET", "//health"),
    ("GET", "/HEALTH"),
    ("GET", "/healthz"),
    ("GET", "/ping/x"),
    ("GET", "/no-such-route"),
    ("OPTIONS", "/v1/models"),  # a plain OPTIONS is no CORS preflight
]


async def call(app: Any, method: str, path: str, headers: dict[str, str]) -> list[Any]:
    """One request through the ASGI app: [status, first 200 bytes of the body] or an error."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    body = b"{}" if method in ("POST", "PUT") else b""
    if body:
        scope["headers"].append((b"content-type", b"application/json"))
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    status: int | None = None
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        await asyncio.wait_for(app(scope, receive, send), timeout=30)
    except Exception as exc:  # a handler without an engine may raise after answering 500
        if status is None:
            return [None, f"{type(exc).__name__}: {exc}"[:200]]
    return [status, b"".join(chunks)[:200].decode("utf-8", "replace")]


async def probe(key: str) -> dict[str, Any]:
    from vllm.platforms import current_platform

    current_platform.device_type = "cpu"

    import vllm
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--api-key", key])
    app = build_app(args, ("generate",))
    app.state.engine_client = None

    routes: list[tuple[str, str]] = []
    for route in app.routes:
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        methods = sorted(getattr(route, "methods", None) or {"GET"})
        for method in methods:
            if method != "HEAD" and (method, path) not in routes:
                routes.append((method, path))
    preflight = {
        "Origin": "http://example.invalid",
        "Access-Control-Request-Method": "POST",
    }
    results: dict[str, dict[str, list[Any]]] = {}
    for method, path in routes + EXTRA:
        results[f"{method} {path}"] = {
            "none": await call(app, method, path, {}),
            "wrong": await call(app, method, path, {"Authorization": "Bearer not-the-key"}),
            "key": await call(app, method, path, {"Authorization": f"Bearer {key}"}),
        }
    results["PREFLIGHT /v1/chat/completions"] = {
        "none": await call(app, "OPTIONS", "/v1/chat/completions", preflight)
    }
    return {"vllm_file": vllm.__file__, "routes": routes, "results": results}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(json.dumps(asyncio.run(probe(argv[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
