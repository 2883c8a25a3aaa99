"""Tool-call and reasoning requests against the running server with vLLM's GLM parsers (issue 18).

The pipeline's `tools` step runs it on the GPU machine against a server started with
SERVE_EXTRA="--enable-auto-tool-choice --tool-call-parser glm47 --reasoning-parser glm45" and the
GLM-4.7-style chat template (CHAT_TEMPLATE, tests/support/glm5_chat.py):

    PYTHONPATH=tests:scripts python3 -m e2e.tool_check --base-url http://127.0.0.1:8000 \\
        --api-key-file /tmp/e2e/api_key --model glm5-tiny --server-log /tmp/e2e/logs/server.log \\
        --json OUT/tools.json

Requests: a function-tool chat request (tool_choice auto) non-streamed and streamed, and a
thinking chat request without tools, non-streamed and streamed; each one recorded whole in the
JSON (bodies, every streamed event). With random weights the model need not call a tool, so the
checks are that the parsers never error: every answer is 200 with a JSON body (each event a JSON
object, the stream ends with [DONE]); any tool call has a string name and JSON-object
arguments; and the server log written during the requests has no parser error or traceback.

Only loopback addresses are contacted; every request has --timeout, the whole check --deadline.
Exit: 0 checks passed; 1 a check failed (the error line names it); 2 usage.
"""

from __future__ import annotations

import http.client
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import safe_files
from support import cli

from e2e.route_check import loopback_url

EXAMPLES = """example:
  python3 -m e2e.tool_check --base-url http://127.0.0.1:8000 --api-key-file KEY \\
      --model glm5-tiny --server-log /tmp/e2e/logs/server.log --json tools.json
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]
# What vLLM 0.23.0 logs when a tool or reasoning parser fails on model output.
LOG_ERRORS = re.compile(
    r"Error in extracting tool call|Error trying to handle streaming tool call|"
    r"Traceback \(most recent call last\)|Exception in ASGI|reasoning parser.*(error|fail)",
    re.IGNORECASE,
)
CAP = 4 * 1024 * 1024


def cases(model: str, max_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    think = [{"role": "user", "content": "Think step by step: what is 17 * 23?"}]
    base = {"model": model, "max_tokens": max_tokens, "temperature": 0.8, "seed": 0}
    tools = base | {"messages": ask, "tools": TOOLS, "tool_choice": "auto"}
    reason = base | {"messages": think, "chat_template_kwargs": {"enable_thinking": True}}
    return [
        ("tools", tools),
        ("tools_stream", tools | {"stream": True}),
        ("reasoning", reason),
        ("reasoning_stream", reason | {"stream": True}),
    ]


def post(host: str, port: int, key: str, body: dict, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        return resp.status, resp.read(CAP)
    finally:
        conn.close()


def tool_call_problems(calls: list[dict]) -> list[str]:
    """Why the assembled tool calls are malformed ([] when they are fine)."""
    problems = []
    for c in calls:
        fn = c.get("function") or {}
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            problems.append(f"tool call without a name: {c!r:.200}")
            continue
        try:
            if not isinstance(json.loads(fn.get("arguments") or ""), dict):
                problems.append(f"{fn['name']}: arguments are not a JSON object")
        except ValueError:
            problems.append(f"{fn['name']}: arguments are not JSON: {fn.get('arguments')!r:.200}")
    return problems


def read_stream(data: bytes) -> tuple[dict[str, Any], list[str]]:
    """Assemble an SSE chat stream: content, reasoning, tool calls by index; problems found."""
    problems: list[str] = []
    content, reasoning, finish = [], [], None
    calls: dict[int, dict] = {}
    events, done = 0, False
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        events += 1
        try:
            ev = json.loads(payload)
        except ValueError:
            problems.append(f"event {events} is not JSON: {payload[:200]!r}")
            continue
        if "error" in ev:
            problems.append(f"event {events} is an error: {json.dumps(ev)[:300]}")
            continue
        for ch in ev.get("choices") or []:
            delta = ch.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning") or delta.get("reasoning_content") or "")
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", 0), {"function": {"arguments": ""}})
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] = fn["name"]
                slot["function"]["arguments"] += fn.get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    if not done:
        problems.append("the stream did not end with [DONE]")
    assembled = [calls[i] for i in sorted(calls)]
    problems += tool_call_problems(assembled)
    out = {"events": events, "content": "".join(content), "reasoning": "".join(reasoning)}
    return out | {"tool_calls": assembled, "finish_reason": finish}, problems


def read_body(data: bytes) -> tuple[dict[str, Any], list[str]]:
    try:
        body = json.loads(data)
        msg = body["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return {}, [f"the answer is no chat completion: {data[:300]!r}"]
    calls = msg.get("tool_calls") or []
    out = {"content": msg.get("content"), "reasoning": msg.get("reasoning")}
    out |= {"tool_calls": calls, "finish_reason": body["choices"][0].get("finish_reason")}
    return out, tool_call_problems(calls)


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, EXAMPLES, prog="python3 -m e2e.tool_check")
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key-file", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--server-log", type=Path, help="the server's log, scanned for parser errors")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--deadline", type=float, default=180.0)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    url = loopback_url(args.base_url)
    if url is None:
        return 2
    try:
        key = args.api_key_file.read_text().strip()
    except OSError as exc:
        print(f"error: cannot read --api-key-file: {exc}", file=sys.stderr)
        return 2
    log_start = (
        args.server_log.stat().st_size if args.server_log and args.server_log.exists() else 0
    )
    end = time.monotonic() + args.deadline
    results, first_problem = [], None
    for name, body in cases(args.model, args.max_tokens):
        left = end - time.monotonic()
        entry: dict[str, Any] = {"case": name, "request": body}
        try:
            if left <= 0:
                raise TimeoutError("the check ran past its --deadline")
            status, data = post(url.hostname, url.port, key, body, min(args.timeout, left))
            entry["status"] = status
            if status != 200:
                problems = [f"HTTP {status}: {data[:300]!r}"]
            else:
                parsed, problems = (read_stream if body.get("stream") else read_body)(data)
                entry["parsed"] = parsed
            entry["raw"] = data[:200_000].decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        entry["problems"] = problems
        results.append(entry)
        if problems and first_problem is None:
            first_problem = f"{name}: {problems[0]}"
    log_errors: list[str] = []
    if args.server_log and args.server_log.exists():
        with args.server_log.open("rb") as fh:
            fh.seek(log_start)
            new = fh.read(CAP).decode("utf-8", "replace").splitlines()
        log_errors = [line[:300] for line in new if LOG_ERRORS.search(line)]
        if log_errors and first_problem is None:
            first_problem = f"server log: {log_errors[0]}"
    report = {
        "passed": first_problem is None,
        "tool_calls_made": sum(
            len((r.get("parsed") or {}).get("tool_calls") or []) for r in results
        ),
        "server_log_errors": log_errors,
        "results": results,
    }
    safe_files.write_atomic(args.json, (json.dumps(report, indent=2) + "\n").encode())
    for r in results:
        parsed = r.get("parsed") or {}
        calls = len(parsed.get("tool_calls") or [])
        print(
            f"{r['case']:<17} status {r.get('status')} tool_calls {calls} reasoning "
            f"{len(parsed.get('reasoning') or '')} chars content "
            f"{len(parsed.get('content') or '')} chars problems {len(r['problems'])}"
        )
    if first_problem:
        print(f"error: {first_problem}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
