"""The smoke test's insides: a bounded HTTP transport, response checks, SSE parsing, the report.

scripts/smoke_test.py is the command line; this module does the work, importable by tests.

The transport (`BoundedTransport`, an httpx2 transport under the official openai client, public
APIs only) bounds every request:
- a deadline for the whole request, body included: when it passes, a timer shuts the request's
  socket down (httpcore's documented `trace` extension hands the socket over at connect time), so
  a server that trickles a byte a second cannot hold the run past --timeout; keep-alive is off so
  every request has its own socket;
- at most MAX_BODY_BYTES of body per request, no Content-Encoding (identity is asked for, so a
  compressed body cannot expand past the cap), no redirect (a 3xx is a failure naming the target);
- no proxy or netrc from the environment (nothing but the endpoint is contacted).
Every body is then checked for the shape the OpenAI API gives it; a bad one is one failed check
with a one-line reason. The optional tool and reasoning checks (`Settings.tools`, `.reasoning`)
also check what vLLM's parsers made of the reply: every tool call names the declared tool and
carries JSON arguments valid under its schema (jsonschema, which vLLM's own dependencies and the
controller's carry), and no parser markup is left in a reply that ended by itself.
Secrets (the key, a password in the URL, any echoed bearer token) are redacted from everything
printed or saved.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import openai
import safe_files

log = logging.getLogger("smoke_test")
_T = TypeVar("_T")

PROMPT = "The capital of France is"
CHAT_MESSAGES = [{"role": "user", "content": "Say hello in five words."}]
REPORT_VERSION = 1
SINGLE_REQUEST_CHECKS = ("models", "completion", "chat_completion", "tools", "reasoning")
# The function tool of the tools checks. A model may answer without calling it (random weights
# do): the checks judge a call only when there is one.
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOL_MESSAGES = [
    {"role": "user", "content": "What is the weather in Paris for the next 3 days? Use the tool."}
]
# The tools checks' request, streamed or not.
TOOL_REQUEST: dict[str, Any] = {"messages": TOOL_MESSAGES, "tools": [TOOL], "tool_choice": "auto"}
# GLM's markers (GLM-4.5 to GLM-5): left in `content`, the server's parser did not take them.
TOOL_MARKUP = ("<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>")
THINK_MARKUP = ("<think>", "</think>")
NATURAL_FINISH = ("stop", "tool_calls")  # a reply that ended by itself, not cut at max_tokens
EXCERPT = 160  # characters of a response body or text quoted in a message
MAX_BODY_BYTES = 8 << 20  # per response; a GLM-5 answer of --max-tokens is a few KiB
MAX_LINE_BYTES = 1 << 20  # per SSE line


def max_stream_events(max_tokens: int) -> int:
    """SSE events a stream of MAX_TOKENS may send: one per token, plus role, usage, [DONE]."""
    return 4 * max_tokens + 64


# -- errors -----------------------------------------------------------------------------------


class CheckFailed(Exception):
    """A check's verdict: the message is the one-line reason."""


class BoundError(httpx2.TransportError):
    """The transport refused a response (too big, redirected, encoded); the message says why."""


class DeadlineExceeded(httpx2.TimeoutException):
    """The whole request took longer than --timeout."""


def _one_line(text: object, limit: int = EXCERPT) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _excerpt(text: str) -> str:
    return repr(_one_line(text, 40))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


# -- secrets ----------------------------------------------------------------------------------

_BEARER = re.compile(r"(?i)\b(bearer)\s+[^\s\"',;]+")
_URL_PASSWORD = re.compile(r"(://[^/\s:@]*:)[^/\s@]*@")


class Redactor:
    """Replaces known secrets, bearer tokens and URL passwords with ***."""

    def __init__(self, known: Iterable[str | None] = ()) -> None:
        self.known = sorted({s for s in known if s and len(s) >= 4}, key=len, reverse=True)

    def add(self, secret: str | None) -> None:
        if secret and len(secret) >= 4 and secret not in self.known:
            self.known = sorted([*self.known, secret], key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self.known:
            value = value.replace(secret, "***")
        value = _BEARER.sub(r"\1 ***", value)
        return _URL_PASSWORD.sub(r"\1***@", value)

    def data(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.data(v) for v in value]
        return value


class RedactingFormatter(logging.Formatter):
    """-v output (tracebacks included) goes through the redactor too."""

    def __init__(self, redactor: Redactor, fmt: str) -> None:
        super().__init__(fmt)
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor.text(super().format(record))


def url_password(url: str) -> str | None:
    return urllib.parse.urlsplit(url).password


def normalise_base_url(url: str) -> str:
    """`http://h:8000`, `http://h:8000/` and `http://h:8000/v1` all give `http://h:8000/v1`.

    A path that does not already end in /v1 gets /v1 appended. Raises ValueError when the URL
    is not http(s)://host[:port][/path].
    """
    parts = urllib.parse.urlsplit(url.strip())
    shown = Redactor([parts.password]).text(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--base-url must look like http://HOST:PORT[/v1], got {shown!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"--base-url takes no query or fragment, got {shown!r}")
    try:
        parts.port  # noqa: B018  (validates the port)
    except ValueError as exc:
        raise ValueError(f"--base-url has a bad port: {shown!r}") from exc
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


# -- the bounded transport --------------------------------------------------------------------


class _Deadline:
    """Shuts a request's socket down when its time is up, waking any blocked read."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                with self._lock:
                    self._sockets.append(sock)
                    late = self.expired
                if late:
                    self._shutdown(sock)

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()

    def error(self, request: httpx2.Request) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"request not finished within {self.seconds:g} s (--timeout)", request=request
        )


class _BoundedStream(httpx2.SyncByteStream):
    def __init__(
        self, inner: httpx2.SyncByteStream, deadline: _Deadline, request: httpx2.Request
    ) -> None:
        self.inner, self.deadline, self.request = inner, deadline, request
        self.received = 0

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self.inner:
                if self.deadline.expired:
                    raise self.deadline.error(self.request)
                self.received += len(chunk)
                if self.received > MAX_BODY_BYTES:
                    raise BoundError(
                        f"response body larger than {MAX_BODY_BYTES >> 20} MiB (cap per request)",
                        request=self.request,
                    )
                yield chunk
            if self.deadline.expired:  # the shutdown ended a read-to-close body early
                raise self.deadline.error(self.request)
        except httpx2.TransportError as exc:
            if self.deadline.expired and not isinstance(exc, DeadlineExceeded | BoundError):
                raise self.deadline.error(self.request) from exc
            raise

    def close(self) -> None:
        self.deadline.cancel()
        self.inner.close()


class BoundedTransport(httpx2.BaseTransport):
    """httpx2's own transport, with a whole-request deadline and the caps in the module doc."""

    def __init__(self, timeout: float, verify: ssl.SSLContext | bool = True) -> None:
        self.timeout = timeout
        self.inner = httpx2.HTTPTransport(
            verify=verify,
            trust_env=False,
            limits=httpx2.Limits(max_keepalive_connections=0),
        )

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        deadline = _Deadline(self.timeout)
        request.headers["Accept-Encoding"] = "identity"
        request.extensions = {
            **request.extensions,
            "trace": deadline.trace,
            "timeout": {"connect": self.timeout, "read": self.timeout,
                        "write": self.timeout, "pool": self.timeout},
        }  # fmt: skip
        try:
            response = self.inner.handle_request(request)
        except httpx2.TransportError as exc:
            deadline.cancel()
            if deadline.expired or isinstance(exc, httpx2.TimeoutException):
                raise deadline.error(request) from exc
            raise
        try:
            self._refuse(request, response)
        except BaseException:
            deadline.cancel()
            response.close()
            raise
        stream = _BoundedStream(response.stream, deadline, request)  # type: ignore[arg-type]
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=stream,
            extensions=response.extensions,
        )

    @staticmethod
    def _refuse(request: httpx2.Request, response: httpx2.Response) -> None:
        if 300 <= response.status_code < 400:
            target = response.headers.get("Location") or "(no Location header)"
            raise BoundError(
                f"HTTP {response.status_code} redirect to {_one_line(target)} (not followed: "
                "point --base-url at the endpoint itself)",
                request=request,
            )
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise BoundError(
                f"response has Content-Encoding {_one_line(encoding, 40)!r} although identity "
                "was asked for",
                request=request,
            )
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise BoundError(
                f"response announces {int(length)} bytes, more than the {MAX_BODY_BYTES >> 20} MiB "
                "cap per request",
                request=request,
            )

    def close(self) -> None:
        self.inner.close()


# -- response shapes --------------------------------------------------------------------------


def _json_body(response: httpx2.Response, where: str) -> Any:
    content = response.content
    try:
        return json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        kind = response.headers.get("Content-Type", "no Content-Type")
        text = content.decode("utf-8", "replace")
        raise CheckFailed(
            f"{where} answered HTTP {response.status_code} with a body that is not JSON "
            f"({_one_line(kind, 40)}): {_excerpt(text) if text.strip() else '(empty body)'}"
        ) from None


def _field(obj: Any, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise CheckFailed(f"{where}: expected a JSON object, got {_json_type(obj)}")
    if key not in obj:
        raise CheckFailed(f"{where}: no {key!r} member")
    value = obj[key]
    if not isinstance(value, types) or isinstance(value, bool) and bool not in _tuple(types):
        names = "/".join(_type_name(t) for t in _tuple(types))
        raise CheckFailed(f"{where}: {key!r} is {_json_type(value)}, expected {names}")
    return value


def _optional(obj: dict[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    if obj.get(key) is None:
        return None
    return _field(obj, key, types, where)


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_name(t: type) -> str:
    return {dict: "an object", list: "an array", str: "a string", int: "an integer"}.get(
        t, t.__name__
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return _type_name(type(value))


def _first_choice(body: Any, where: str) -> dict[str, Any]:
    choices = _field(body, "choices", list, where)
    if not choices:
        raise CheckFailed(f"{where} returned no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise CheckFailed(f"{where}: choices[0] is {_json_type(choice)}, expected an object")
    return choice


def _completion_tokens(body: dict[str, Any], where: str) -> int | None:
    usage = _optional(body, "usage", dict, where)
    return None if usage is None else _optional(usage, "completion_tokens", int, where + " usage")


def reasoning_of(fields: dict[str, Any]) -> str:
    """Text a vLLM reasoning parser moved out of `content` (field name varies by version)."""
    value = fields.get("reasoning_content") or fields.get("reasoning") or ""
    return value if isinstance(value, str) else ""


# -- tool calls and reasoning ------------------------------------------------------------------


def declared_tools() -> dict[str, dict[str, Any]]:
    """Name -> JSON schema of the arguments, for every tool the tools checks declare."""
    return {TOOL["function"]["name"]: TOOL["function"]["parameters"]}


def check_tool_call(index: int, name: Any, arguments: Any, where: str) -> tuple[str, Any]:
    """One parsed call: a declared name and a JSON object valid under that tool's schema.

    Returns (name, arguments as data); raises CheckFailed with the first thing wrong.
    """
    import jsonschema  # only these checks need it

    label = f"{where}: tool call {index}"
    tools = declared_tools()
    if not isinstance(name, str) or not name:
        raise CheckFailed(f"{label} has no function name (got {_json_type(name)})")
    if name not in tools:
        raise CheckFailed(
            f"{label} names {_one_line(name, 40)!r}, which the request did not declare "
            f"(declared: {', '.join(tools)})"
        )
    if not isinstance(arguments, str):
        raise CheckFailed(
            f"{label} ({name}): 'arguments' is {_json_type(arguments)}, expected a JSON string"
        )
    try:
        data = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise CheckFailed(
            f"{label} ({name}): arguments are not JSON ({exc.msg} at {exc.pos}): "
            f"{_excerpt(arguments)}"
        ) from None
    if not isinstance(data, dict):
        raise CheckFailed(
            f"{label} ({name}): arguments are {_json_type(data)}, expected a JSON object"
        )
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(tools[name]).iter_errors(data)
    )
    if error is not None:
        at = "/".join(str(p) for p in error.absolute_path)
        raise CheckFailed(
            f"{label} ({name}): arguments do not match the tool's schema"
            f"{f' at {at}' if at else ''}: {_one_line(error.message, 100)}"
        )
    return name, data


def check_markup(content: str, reasoning: str, finish: str | None, where: str) -> None:
    """A reply that ended by itself keeps no parser markup: GLM's tool-call tags in `content`
    mean the tool parser is off or the wrong one (glm45 misses GLM-5's calls), think tags mean
    the reasoning parser is. A reply cut at max_tokens may hold a half-written call: not judged."""
    if finish not in NATURAL_FINISH:
        return
    for tag in TOOL_MARKUP:
        if tag in content:
            raise CheckFailed(
                f"{where}: tool-call markup {tag!r} left in content (finish_reason={finish}): "
                "the server did not parse the call (GLM-5 needs vllm serve "
                "--enable-auto-tool-choice --tool-call-parser glm47)"
            )
    for tag in THINK_MARKUP:
        if tag in content or (reasoning and tag in reasoning):
            field = "content" if tag in content else "reasoning content"
            raise CheckFailed(
                f"{where}: reasoning markup {tag!r} left in {field} (finish_reason={finish}): "
                "the reasoning was not separated (GLM-5 needs vllm serve --reasoning-parser glm45)"
            )


def _reasoning_field(fields: dict[str, Any], where: str) -> str:
    """The reasoning text of a message or delta; CheckFailed when it is there but not text."""
    for key in ("reasoning_content", "reasoning"):
        value = fields.get(key)
        if value is not None and not isinstance(value, str):
            raise CheckFailed(f"{where}: {key!r} is {_json_type(value)}, expected a string")
    return reasoning_of(fields)


def _describe_calls(calls: list[tuple[str, Any]]) -> str:
    shown = "; ".join(f"{n}({json.dumps(a, ensure_ascii=False)})" for n, a in calls)
    return _one_line(shown, 100)


def _stream_event(payload: str, label: str) -> dict[str, Any]:
    """One SSE data payload as a JSON object; CheckFailed for non-JSON, non-objects and the
    error events a server sends mid-stream."""
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        raise CheckFailed(f"{label} is not JSON: {_excerpt(payload)}") from None
    if not isinstance(event, dict):
        raise CheckFailed(f"{label} is {_json_type(event)}, expected an object")
    if event.get("error"):
        error = event["error"]
        msg = error.get("message", error) if isinstance(error, dict) else error
        raise CheckFailed(f"error event mid-stream: {_one_line(msg)}")
    return event


# -- server-sent events -----------------------------------------------------------------------


def sse_data(chunks: Iterable[bytes], max_events: int) -> Iterator[str]:
    """The payload of every `data:` line of an SSE byte stream; caps line size and event count."""
    buffer = b""
    events = 0
    for chunk in chunks:
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line, buffer = buffer[:end], buffer[end + 1 :]
            text = line.rstrip(b"\r").decode("utf-8", "replace")
            if not text.startswith("data:"):
                continue
            events += 1
            if events > max_events:
                raise CheckFailed(
                    f"stream sent more than {max_events} data events (cap for --max-tokens)"
                )
            yield text[5:].removeprefix(" ")
        if len(buffer) > MAX_LINE_BYTES:
            raise CheckFailed(f"stream sent a line longer than {MAX_LINE_BYTES >> 20} MiB (cap)")
    if buffer.strip().startswith(b"data:"):
        events += 1
        if events <= max_events:
            yield buffer.rstrip(b"\r").decode("utf-8", "replace")[5:].removeprefix(" ")


# -- statistics and the report ----------------------------------------------------------------


def percentile(values: Iterable[float], pct: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    data = sorted(values)
    if not data:
        return None
    rank = (len(data) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    return data[low] + (data[high] - data[low]) * (rank - low)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class StreamResult:
    text: str
    content_chunks: int
    finish_reason: str | None
    done: bool
    ttft_s: float
    duration_s: float
    output_tokens: int


@dataclass
class Check:
    name: str
    status: str = "skip"  # pass | fail | skip
    detail: str = ""
    duration_s: float = 0.0


@dataclass
class Report:
    base_url: str
    model: str | None
    settings: dict[str, Any]
    started_at: str
    checks: dict[str, Check] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    load_output_tokens: int = 0
    load_duration_s: float = 0.0
    requests_total: int = 0
    requests_failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status != "fail" for c in self.checks.values())

    def to_json(self) -> dict[str, Any]:
        p50, p95 = percentile(self.ttft_s, 50), percentile(self.ttft_s, 95)
        tps = self.load_output_tokens / self.load_duration_s if self.load_duration_s > 0 else None
        return {
            "report_version": REPORT_VERSION,
            "passed": self.passed,
            "base_url": self.base_url,
            "model": self.model,
            "started_at": self.started_at,
            "settings": self.settings,
            "checks": {name: _check_json(c) for name, c in self.checks.items()},
            "metrics": {
                "ttft_s": {"p50": _round(p50), "p95": _round(p95), "count": len(self.ttft_s)},
                "output_tokens": self.load_output_tokens,
                "load_duration_s": _round(self.load_duration_s),
                "output_tokens_per_s": _round(tps, 2),
                "requests": self.requests_total,
                "errors": self.requests_failed,
            },
            "errors": self.errors,
        }


def _check_json(check: Check) -> dict[str, Any]:
    data = asdict(check)
    del data["name"]
    data["duration_s"] = _round(check.duration_s)
    return data


def format_table(report: Report) -> str:
    data = report.to_json()
    metrics = data["metrics"]
    rows = [("check", "result", "detail")]
    rows += [(c.name, c.status.upper(), c.detail) for c in report.checks.values()]
    width = max(len(r[0]) for r in rows)
    lines = [f"smoke test of {report.base_url} (model: {report.model or '?'})", ""]
    lines += [f"{a:<{width}}  {b:<6}  {c}" for a, b, c in rows]
    ttft = metrics["ttft_s"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.1f} ms"

    tps = metrics["output_tokens_per_s"]
    counted = [c for c in report.checks.values() if c.status != "skip"]
    passed = sum(c.status == "pass" for c in counted)
    lines += [
        "",
        f"TTFT p50 / p95      {ms(ttft['p50'])} / {ms(ttft['p95'])} "
        f"({ttft['count']} streamed requests)",
        f"output tokens/s     {'-' if tps is None else f'{tps:.1f}'} "
        f"({metrics['output_tokens']} tokens in {metrics['load_duration_s'] or 0:.2f} s, "
        f"concurrency phase)",
        f"errors              {metrics['errors']} of {metrics['requests']} requests failed",
        f"result              {'PASS' if report.passed else 'FAIL'} "
        f"({passed}/{len(counted)} checks passed, {len(report.checks) - len(counted)} skipped)",
    ]
    return "\n".join(lines)


def write_report(data: dict[str, Any], path: Path) -> None:
    """The JSON report, 0600 (it names the endpoint), through the one atomic-write module."""
    text = json.dumps(data, indent=2) + "\n"
    safe_files.write_atomic(path, text.encode(), mode=0o600)


# -- the checks -------------------------------------------------------------------------------


@dataclass
class Settings:
    base_url: str  # normalised, may carry user:password
    api_key: str | None
    model: str | None
    requests: int
    concurrency: int
    max_tokens: int
    timeout: float
    tools: bool = False  # the tools and tools_stream checks
    reasoning: bool = False  # the reasoning check

    def summary(self) -> dict[str, Any]:
        """The report's `settings`: what shapes its figures, and no secret."""
        return {
            "requests": self.requests,
            "concurrency": min(self.concurrency, self.requests),
            "max_tokens": self.max_tokens,
            "timeout_s": self.timeout,
            "api_key_set": bool(self.api_key),
        }


class Smoke:
    """Runs the checks against one endpoint with one openai client (shared by threads)."""

    def __init__(self, settings: Settings, redactor: Redactor) -> None:
        self.s = settings
        self.redactor = redactor
        self.shown_url = redactor.text(settings.base_url)  # what messages name
        self.timeout = settings.timeout
        verify: ssl.SSLContext | bool = True
        if settings.base_url.startswith("http://"):
            # Plain HTTP never negotiates TLS: skip loading the CA store (~0.3 s a client).
            verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.http = httpx2.Client(
            transport=BoundedTransport(self.timeout, verify),
            timeout=self.timeout,
            follow_redirects=False,
            trust_env=False,
        )
        self.client = openai.OpenAI(
            base_url=settings.base_url,
            # Without a key, a placeholder: the client insists on one, a keyless server
            # ignores it, and the client never falls back to OPENAI_API_KEY.
            api_key=settings.api_key or "EMPTY",
            timeout=self.timeout,
            max_retries=0,
            http_client=self.http,
        )
        self.model: str | None = settings.model
        self._lock = threading.Lock()
        self.requests = 0  # requests sent
        self.failed = 0  # requests that did not get the expected answer

    def close(self) -> None:
        self.client.close()
        self.http.close()

    def tally(self, ok: bool, count: int = 1) -> None:
        with self._lock:
            self.requests += count
            self.failed += 0 if ok else count

    # -- failure messages ------------------------------------------------------------------
    def describe(self, exc: BaseException, method: str, path: str) -> str:
        """One line for an exception raised by the client or the HTTP library."""
        where = f"{method} {self.shown_url}{path}"
        for cause in _chain(exc):
            if isinstance(cause, CheckFailed):
                return str(cause)
            if isinstance(cause, DeadlineExceeded):
                return f"timed out after {self.timeout:g} s (--timeout) waiting for {where}"
            if isinstance(cause, BoundError):
                return f"{cause} from {where}"
        if isinstance(exc, openai.APIStatusError):
            body = exc.body  # the JSON `error` member when there is one, else the text
            if isinstance(body, dict) and isinstance(body.get("message"), str):
                body = body["message"]  # OpenAI/vLLM style {"error": {"message": ...}}
            elif isinstance(body, dict | list):
                body = json.dumps(body)
            elif body is None:
                body = ""
            msg = f"HTTP {exc.status_code} from {where}: {_one_line(body) or '(empty body)'}"
            if exc.status_code == 401 and not self.s.api_key:
                msg += " (the endpoint wants an API key: set VLLM_API_KEY or pass --api-key)"
            return msg
        if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
            return f"timed out after {self.timeout:g} s (--timeout) waiting for {where}"
        root = list(_chain(exc))
        if any(isinstance(c, ConnectionRefusedError) for c in root) or any(
            "refused" in str(c).lower() for c in root
        ):
            return f"connection refused by {where}: is the server running on that port?"
        if isinstance(exc, openai.APIConnectionError | httpx2.TransportError):
            cause = root[-1]
            return f"connection error on {where}: {_one_line(cause) or type(cause).__name__}"
        return f"{type(exc).__name__} on {where}: {_one_line(exc)}"

    def _raw(self, call: Callable[[], Any], method: str, path: str) -> Any:
        """A non-streamed call through the openai client; returns the parsed JSON body."""
        try:
            raw = call()
        except (openai.APIError, httpx2.TransportError) as exc:
            raise CheckFailed(self.describe(exc, method, path)) from exc
        return _json_body(raw.http_response, f"{method} {self.shown_url}{path}")

    # -- checks ----------------------------------------------------------------------------
    def check_models(self) -> str:
        where = f"GET {self.shown_url}/models"
        body = self._raw(self.client.models.with_raw_response.list, "GET", "/models")
        data = _field(body, "data", list, where)
        ids = []
        for i, entry in enumerate(data):
            ident = _field(entry, "id", str, f"{where}: data[{i}]")
            if not ident:
                raise CheckFailed(f"{where}: data[{i}] has an empty 'id'")
            ids.append(ident)
        if not ids:
            raise CheckFailed(f"{where} lists no model")
        if self.model is None:
            self.model = ids[0]
        elif self.model not in ids:
            raise CheckFailed(
                f"model {self.model!r} is not listed by {where} "
                f"(listed: {_one_line(', '.join(ids))})"
            )
        return f"{len(ids)} listed; using {self.model!r}"

    def check_completion(self) -> str:
        where = f"POST {self.shown_url}/completions"
        body = self._raw(
            lambda: self.client.completions.with_raw_response.create(
                model=self._model, prompt=PROMPT, max_tokens=self.s.max_tokens
            ),
            "POST",
            "/completions",
        )
        choice = _first_choice(body, where)
        text = _optional(choice, "text", str, f"{where}: choices[0]") or ""
        if not text:
            raise CheckFailed(
                f"empty text from {where} (finish_reason={choice.get('finish_reason')})"
            )
        tokens = _completion_tokens(body, where)
        return f"{tokens if tokens is not None else '?'} tokens: {_excerpt(text)}"

    def check_chat_completion(self) -> str:
        where = f"POST {self.shown_url}/chat/completions"
        body = self._raw(
            lambda: self.client.chat.completions.with_raw_response.create(
                model=self._model, messages=CHAT_MESSAGES, max_tokens=self.s.max_tokens
            ),
            "POST",
            "/chat/completions",
        )
        choice = _first_choice(body, where)
        message = _field(choice, "message", dict, f"{where}: choices[0]")
        text = _optional(message, "content", str, f"{where}: message") or ""
        source = ""
        if not text:
            text = reasoning_of(message)
            source = " (reasoning content)"
        if not text:
            raise CheckFailed(
                f"empty text from {where} (finish_reason={choice.get('finish_reason')})"
            )
        tokens = _completion_tokens(body, where)
        return f"{tokens if tokens is not None else '?'} tokens{source}: {_excerpt(text)}"

    def check_chat_stream(self, report: Report) -> str:
        result = self.stream_chat()
        report.ttft_s.append(result.ttft_s)
        return (
            f"{result.content_chunks} chunks, finish_reason={result.finish_reason}, [DONE]; "
            f"TTFT {result.ttft_s * 1000:.1f} ms: {_excerpt(result.text)}"
        )

    def check_concurrency(self, report: Report) -> str:
        n, c = self.s.requests, min(self.s.concurrency, self.s.requests)

        def one(_: int) -> StreamResult | CheckFailed:
            try:
                return self.stream_chat()
            except CheckFailed as exc:
                return exc

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=c, thread_name_prefix="smoke") as pool:
            outcomes = list(pool.map(one, range(n)))
        wall = time.perf_counter() - start
        ok = [o for o in outcomes if isinstance(o, StreamResult)]
        failed = [o for o in outcomes if isinstance(o, CheckFailed)]
        report.ttft_s.extend(r.ttft_s for r in ok)
        report.load_output_tokens = sum(r.output_tokens for r in ok)
        report.load_duration_s = wall
        if failed:
            raise CheckFailed(
                f"{len(failed)} of {n} streamed requests failed at concurrency {c}; "
                f"first: {failed[0]}"
            )
        return f"{n}/{n} streamed requests ok at concurrency {c} in {wall:.2f} s"

    def check_auth(self) -> str:
        # 1. Raw HTTP, no Authorization header at all (the openai client always sends one),
        # through the same bounded transport.
        url = f"{self.s.base_url}/models"
        shown = f"{self.shown_url}/models"
        try:
            with self.http.stream("GET", url) as resp:
                status = resp.status_code
                resp.read()
        except httpx2.TransportError as exc:
            self.tally(False)
            raise CheckFailed("without a key: " + self.describe(exc, "GET", "/models")) from exc
        self.tally(status == 401)
        if status != 401:
            raise CheckFailed(
                f"GET {shown} without an API key got HTTP {status}, expected 401: "
                "the endpoint does not enforce its key"
            )
        # 2. The official client with a wrong key, on the endpoint that spends GPU time.
        wrong_key = "smoke-test-wrong-key-" + secrets.token_hex(8)
        self.redactor.add(wrong_key)
        try:
            self.client.chat.completions.with_raw_response.create(
                model=self._model,
                messages=CHAT_MESSAGES,
                max_tokens=1,
                extra_headers={"Authorization": f"Bearer {wrong_key}"},
            )
        except openai.AuthenticationError:
            self.tally(True)
            return "no key -> 401 (GET /models), wrong key -> 401 (POST /chat/completions)"
        except (openai.APIError, httpx2.TransportError) as exc:
            self.tally(False)
            raise CheckFailed(
                "wrong key: expected HTTP 401, got "
                + self.describe(exc, "POST", "/chat/completions")
            ) from exc
        self.tally(False)
        raise CheckFailed(
            f"POST {self.shown_url}/chat/completions with a wrong API key succeeded: "
            "the endpoint does not enforce its key"
        )

    # -- tool calls and reasoning -----------------------------------------------------------
    def _reply(self, where: str, **request: Any) -> tuple[str | None, dict[str, Any], str, str]:
        """One non-streamed chat completion: (finish_reason, message, content, reasoning)."""
        body = self._raw(
            lambda: self.client.chat.completions.with_raw_response.create(
                model=self._model, max_tokens=self.s.max_tokens, **request
            ),
            "POST",
            "/chat/completions",
        )
        choice = _first_choice(body, where)
        finish = _optional(choice, "finish_reason", str, f"{where}: choices[0]")
        message = _field(choice, "message", dict, f"{where}: choices[0]")
        content = _optional(message, "content", str, f"{where}: message") or ""
        return finish, message, content, _reasoning_field(message, f"{where}: message")

    def check_tools(self) -> str:
        """A function-tool request is accepted and its reply parses; a call, if made, is valid."""
        where = f"POST {self.shown_url}/chat/completions (tools)"
        finish, message, content, reasoning = self._reply(where, **TOOL_REQUEST)
        raw_calls = _optional(message, "tool_calls", list, f"{where}: message") or []
        calls = []
        for i, call in enumerate(raw_calls):
            label = f"{where}: tool_calls[{i}]"
            if not isinstance(call, dict):
                raise CheckFailed(f"{label} is {_json_type(call)}, expected an object")
            kind = call.get("type", "function")
            if kind != "function":
                raise CheckFailed(f"{label} has type {_one_line(kind, 40)!r}, expected 'function'")
            _field(call, "id", str, label)
            function = _field(call, "function", dict, label)
            calls.append(check_tool_call(i, function.get("name"), function.get("arguments"), where))
        check_markup(content, reasoning, finish, where)
        if calls:
            return f"{len(calls)} tool call(s), finish_reason={finish}: {_describe_calls(calls)}"
        return (
            f"accepted, no tool called (finish_reason={finish}): "
            f"{_excerpt(content or reasoning) if content or reasoning else '(no text)'}"
        )

    def check_tools_stream(self) -> str:
        """The same request streamed: tool-call deltas rebuild into valid calls, [DONE] ends it."""
        return self._tallied(self._stream_tools)

    def _stream_tools(self) -> str:
        where = f"POST {self.shown_url}/chat/completions (tools, streamed)"
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, Any]] = {}

        def on_delta(delta: dict[str, Any], label: str) -> None:
            content.append(_optional(delta, "content", str, label) or "")
            reasoning.append(_reasoning_field(delta, label))
            for tc in _optional(delta, "tool_calls", list, label) or []:
                self._tool_delta(calls, tc, label)

        done, events_seen, finish = self._stream(
            where, TOOL_REQUEST, on_delta, lambda seen: f"{seen} events", name_where=True
        )
        if not done:
            raise CheckFailed(f"stream ended after {events_seen} events without data: [DONE]")
        if finish is None:
            raise CheckFailed("stream ended ([DONE]) without a finish_reason")
        parsed = [
            check_tool_call(i, calls[i]["name"], calls[i]["arguments"], where)
            for i in sorted(calls)
        ]
        text, thought = "".join(content), "".join(reasoning)
        check_markup(text, thought, finish, where)
        if parsed:
            return (
                f"{len(parsed)} tool call(s) streamed, finish_reason={finish}: "
                f"{_describe_calls(parsed)}"
            )
        return (
            f"accepted, no tool called (finish_reason={finish}, {events_seen} events): "
            f"{_excerpt(text or thought) if text or thought else '(no text)'}"
        )

    @staticmethod
    def _tool_delta(calls: dict[int, dict[str, Any]], tc: Any, label: str) -> None:
        """Fold one streamed tool-call delta into CALLS (OpenAI: `index` says which call; the
        first delta of a call carries its id and name, later ones pieces of the arguments)."""
        if not isinstance(tc, dict):
            raise CheckFailed(
                f"{label}: a tool_calls entry is {_json_type(tc)}, expected an object"
            )
        index = _field(tc, "index", int, f"{label}: tool_calls entry")
        if index < 0:
            raise CheckFailed(f"{label}: tool_calls entry has index {index}")
        function = _optional(tc, "function", dict, f"{label}: tool call {index}") or {}
        name = _optional(function, "name", str, f"{label}: tool call {index}")
        pieces = _optional(function, "arguments", str, f"{label}: tool call {index}") or ""
        if index not in calls:
            if not name:
                raise CheckFailed(
                    f"{label}: the first delta of tool call {index} carries no function name"
                )
            calls[index] = {"name": name, "arguments": ""}
        elif name and name != calls[index]["name"]:
            raise CheckFailed(
                f"{label}: tool call {index} renamed from {calls[index]['name']!r} to "
                f"{_one_line(name, 40)!r} mid-stream"
            )
        calls[index]["arguments"] += pieces

    def check_reasoning(self) -> str:
        """With a reasoning parser on, the reply's reasoning is a field apart from the answer."""
        where = f"POST {self.shown_url}/chat/completions (reasoning)"
        finish, _, content, reasoning = self._reply(where, messages=CHAT_MESSAGES)
        check_markup(content, reasoning, finish, where)
        if not reasoning:
            return (
                f"no reasoning content returned (reasoning parser off, or thinking off; "
                f"finish_reason={finish})"
            )
        return (
            f"reasoning {len(reasoning)} chars apart from content {len(content)} chars "
            f"(finish_reason={finish}): {_excerpt(reasoning)}"
        )

    # -- streaming -------------------------------------------------------------------------
    def _tallied(self, step: Callable[[], _T]) -> _T:
        """STEP's result, counted as one request that passed or failed."""
        ok = False
        try:
            result = step()
            ok = True
            return result
        finally:
            self.tally(ok)

    def _stream(
        self,
        where: str,
        request: dict[str, Any],
        on_delta: Callable[[dict[str, Any], str], None],
        progress: Callable[[int], str],
        *,
        in_deadline: bool = False,
        name_where: bool = False,
        on_event: Callable[[dict[str, Any], str], None] | None = None,
    ) -> tuple[bool, int, str | None]:
        """One streamed chat completion of REQUEST, read as raw SSE lines so `[DONE]` can be
        checked.

        ON_EVENT gets each event (a JSON object, not an error) and ON_DELTA each choice's delta,
        with the event's label. Returns (whether [DONE] came, the last event's index, the last
        finish_reason). PROGRESS(index) says how far the stream got, for the error lines
        (IN_DEADLINE: in the --timeout one too); NAME_WHERE puts WHERE before what the events
        raised.
        """
        path = "/chat/completions"
        done, seen, finish = False, 0, None
        try:
            with self.client.chat.completions.with_streaming_response.create(
                model=self._model, max_tokens=self.s.max_tokens, stream=True, **request
            ) as response:
                events = sse_data(
                    response.http_response.iter_bytes(), max_stream_events(self.s.max_tokens)
                )
                for seen, payload in enumerate(events):
                    if payload == "[DONE]":
                        done = True
                        break
                    label = f"stream event {seen}"
                    event = _stream_event(payload, label)
                    if on_event is not None:
                        on_event(event, label)
                    for choice in _optional(event, "choices", list, label) or []:
                        if not isinstance(choice, dict):
                            raise CheckFailed(f"{label}: a choice is {_json_type(choice)}")
                        on_delta(_optional(choice, "delta", dict, label) or {}, label)
                        finish = _optional(choice, "finish_reason", str, label) or finish
        except CheckFailed as exc:
            if not name_where:
                raise
            raise CheckFailed(f"{where}: {exc}") from exc
        except DeadlineExceeded as exc:
            after = f"after {progress(seen)} " if in_deadline else ""
            raise CheckFailed(
                f"stream not finished within {self.timeout:g} s (--timeout) {after}from {where}"
            ) from exc
        except BoundError as exc:
            raise CheckFailed(f"stream refused after {progress(seen)}: {exc}") from exc
        except (openai.APIError, httpx2.TimeoutException) as exc:
            raise CheckFailed(self.describe(exc, "POST", path)) from exc
        except httpx2.TransportError as exc:
            raise CheckFailed(
                f"stream broken after {progress(seen)}: connection closed before [DONE] "
                f"({_one_line(exc) or type(exc).__name__})"
            ) from exc
        return done, seen, finish

    def stream_chat(self) -> StreamResult:
        """One streamed chat completion, timed: TTFT, chunks, tokens."""
        return self._tallied(self._stream_chat)

    def _stream_chat(self) -> StreamResult:
        where = f"POST {self.shown_url}/chat/completions"
        start = time.perf_counter()
        ttft: float | None = None
        pieces: list[str] = []
        usage_tokens: int | None = None

        def on_usage(event: dict[str, Any], label: str) -> None:
            nonlocal usage_tokens
            usage = _optional(event, "usage", dict, label)
            if usage:
                usage_tokens = _optional(usage, "completion_tokens", int, label)

        def on_delta(delta: dict[str, Any], label: str) -> None:
            nonlocal ttft
            piece = _optional(delta, "content", str, label) or reasoning_of(delta)
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - start
                pieces.append(piece)

        request = {"messages": CHAT_MESSAGES, "stream_options": {"include_usage": True}}

        def so_far(_: int) -> str:  # the error lines count content chunks, not events
            return f"{len(pieces)} chunks"

        done, _, finish = self._stream(
            where, request, on_delta, so_far, in_deadline=True, on_event=on_usage
        )
        duration = time.perf_counter() - start
        chunks = len(pieces)
        text = "".join(pieces)
        if not done:
            raise CheckFailed(f"stream ended after {chunks} chunks without data: [DONE]")
        if finish is None:
            raise CheckFailed(
                f"stream ended ([DONE]) after {chunks} chunks without a finish_reason"
            )
        if not text:
            raise CheckFailed(f"empty text from the stream (finish_reason={finish})")
        if chunks < 2:
            raise CheckFailed(
                f"stream arrived in {chunks} content chunk, expected several "
                "(is something buffering the response?)"
            )
        return StreamResult(
            text=text,
            content_chunks=chunks,
            finish_reason=finish,
            done=done,
            ttft_s=ttft if ttft is not None else duration,
            duration_s=duration,
            output_tokens=usage_tokens if usage_tokens is not None else chunks,
        )

    @property
    def _model(self) -> str:
        if self.model is None:
            raise CheckFailed("no model: the models check runs first")
        return self.model


def run_checks(smoke: Smoke, report: Report, emit: Callable[[str], None]) -> None:
    """Run every check in order into REPORT; EMIT gets each (redacted) `error: ...` line."""
    steps: list[tuple[str, Callable[[], str]]] = [
        ("models", smoke.check_models),
        ("completion", smoke.check_completion),
        ("chat_completion", smoke.check_chat_completion),
        ("chat_stream", lambda: smoke.check_chat_stream(report)),
        ("concurrency", lambda: smoke.check_concurrency(report)),
        ("auth", smoke.check_auth),
    ]
    if smoke.s.tools:
        steps += [("tools", smoke.check_tools), ("tools_stream", smoke.check_tools_stream)]
    if smoke.s.reasoning:
        steps.append(("reasoning", smoke.check_reasoning))
    for name, _ in steps:
        report.checks[name] = Check(name)
    for name, step in steps:
        check = report.checks[name]
        if name == "auth" and not smoke.s.api_key:
            check.detail = "no API key configured (--api-key / VLLM_API_KEY)"
            continue
        if name != "models" and report.checks["models"].status != "pass":
            check.detail = "not run: the models check failed"
            continue
        start = time.perf_counter()
        try:
            check.detail = smoke.redactor.text(step())
            check.status = "pass"
        except CheckFailed as exc:
            check.status, check.detail = "fail", smoke.redactor.text(_one_line(exc, 400))
            line = f"error: {name}: {check.detail}"
            report.errors.append(line)
            emit(line)
            log.debug("%s failed", name, exc_info=True)
        check.duration_s = time.perf_counter() - start
        if name in SINGLE_REQUEST_CHECKS:
            smoke.tally(check.status == "pass")
        log.debug("%s: %s in %.3f s", name, check.status, check.duration_s)
    report.model = smoke.model
    report.requests_total, report.requests_failed = smoke.requests, smoke.failed
