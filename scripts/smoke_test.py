"""Smoke-test an OpenAI-compatible endpoint (vLLM serving GLM-5) with the official openai client.

Checks, in order (each one request unless said otherwise):
  models           GET /v1/models lists the model (default model: the first one listed)
  completion       POST /v1/completions returns non-empty text
  chat_completion  POST /v1/chat/completions returns non-empty text (content, or reasoning
                   content when a reasoning parser put the whole answer there)
  chat_stream      a streamed chat completion arrives in several content chunks, carries a
                   finish_reason and ends with `data: [DONE]`
  concurrency      --requests streamed chat completions, --concurrency at a time, all succeed
  auth             with an API key: GET /v1/models without a key (raw HTTP) and a chat
                   completion with a wrong key (openai client) both get HTTP 401; skipped
                   without a key
When /v1/models fails (server down, wrong key, model not listed) the rest are skipped.

Prints a table (check, result, detail; TTFT p50/p95 over every streamed request, output
tokens/s of the concurrency phase, failed requests) and, with --json, writes the same as a
JSON report (temporary file + fsync + rename). The openai client never retries, so a failure
shows at once; each failure is one `error: <check>: ...` line on stderr.

Exit codes: 0 every check passed (or was skipped for lack of a key); 1 any check failed;
2 usage error.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import secrets
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai

log = logging.getLogger("smoke_test")

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
PROMPT = "The capital of France is"
CHAT_MESSAGES = [{"role": "user", "content": "Say hello in five words."}]
REPORT_VERSION = 1
SINGLE_REQUEST_CHECKS = ("models", "completion", "chat_completion")  # others count their own
EXCERPT = 160  # characters of a response body or text quoted in a message

EXAMPLES = """\
examples:
  # the endpoint deployed by `make deploy` (key from the environment, not the command line)
  VLLM_API_KEY=$(cat key) python scripts/smoke_test.py --base-url http://127.0.0.1:8000/v1
  # more load, a JSON report for automation
  python scripts/smoke_test.py --base-url http://127.0.0.1:8000 --requests 32 --concurrency 8 \\
      --json smoke.json
  # a named model on a server without a key, slow first requests allowed
  python scripts/smoke_test.py --model glm-5 --timeout 300
"""


def _httpx_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(timeout, transport) exception classes of the HTTP library the openai client uses.

    openai 3.x is built on httpx2, 1.x/2.x on httpx; raw stream reads raise its errors unwrapped.
    """
    timeouts: list[type[BaseException]] = []
    transports: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)
        if module is not None:
            timeouts.append(module.TimeoutException)
            transports.append(module.TransportError)
    return tuple(timeouts), tuple(transports)


HTTPX_TIMEOUTS, HTTPX_TRANSPORT_ERRORS = _httpx_errors()


class CheckFailed(Exception):
    """A check's verdict: the message is the one-line reason."""


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


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def percentile(values: Iterable[float], pct: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    data = sorted(values)
    if not data:
        return None
    rank = (len(data) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    return data[low] + (data[high] - data[low]) * (rank - low)


def normalise_base_url(url: str) -> str:
    """`http://h:8000`, `http://h:8000/` and `http://h:8000/v1` all give `http://h:8000/v1`.

    A path that does not already end in /v1 gets /v1 appended. Raises ValueError when the URL
    is not http(s)://host[:port][/path].
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--base-url must look like http://HOST:PORT[/v1], got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"--base-url takes no query or fragment, got {url!r}")
    try:
        parts.port  # noqa: B018  (validates the port)
    except ValueError as exc:
        raise ValueError(f"--base-url has a bad port: {url!r}") from exc
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _one_line(text: object, limit: int = EXCERPT) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _excerpt(text: str) -> str:
    return repr(_one_line(text, 40))


class Smoke:
    """Runs the checks against one endpoint with one openai client (shared by threads)."""

    def __init__(self, args: argparse.Namespace, base_url: str) -> None:
        self.args = args
        self.base_url = base_url
        self.timeout: float = args.timeout
        http_client = None
        if base_url.startswith("http://"):
            # Plain HTTP never negotiates TLS: skip loading the CA store (~0.3 s a client).
            http_client = openai.DefaultHttpxClient(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        self.client = openai.OpenAI(
            base_url=base_url,
            # Without a key, a placeholder: the client insists on one, a keyless server
            # ignores it, and the client never falls back to OPENAI_API_KEY.
            api_key=args.api_key or "EMPTY",
            timeout=self.timeout,
            max_retries=0,
            http_client=http_client,
        )
        self.model: str | None = args.model
        self._lock = threading.Lock()
        self.requests = 0  # requests sent
        self.failed = 0  # requests that did not get the expected answer

    def tally(self, ok: bool, count: int = 1) -> None:
        with self._lock:
            self.requests += count
            self.failed += 0 if ok else count

    # -- failure messages ------------------------------------------------------------------
    def describe(self, exc: BaseException, method: str, path: str) -> str:
        """One line for an exception raised by the client or the HTTP library."""
        where = f"{method} {self.base_url}{path}"
        if isinstance(exc, openai.APIStatusError):
            body = exc.body  # the JSON `error` member when there is one, else the text
            if isinstance(body, dict) and isinstance(body.get("message"), str):
                body = body["message"]  # OpenAI/vLLM style {"error": {"message": ...}}
            elif isinstance(body, dict | list):
                body = json.dumps(body)
            elif body is None:
                body = ""
            msg = f"HTTP {exc.status_code} from {where}: {_one_line(body) or '(empty body)'}"
            if exc.status_code == 401 and not self.args.api_key:
                msg += " (the endpoint wants an API key: set VLLM_API_KEY or pass --api-key)"
            return msg
        if isinstance(exc, (openai.APITimeoutError, *HTTPX_TIMEOUTS)):
            return f"timed out after {self.timeout:g} s (--timeout) waiting for {where}"
        if isinstance(exc, openai.APIConnectionError):
            cause = _root_cause(exc)
            if isinstance(cause, ConnectionRefusedError) or "refused" in str(cause).lower():
                return f"connection refused by {where}: is the server running on that port?"
            return f"connection error on {where}: {_one_line(cause) or type(cause).__name__}"
        if isinstance(exc, HTTPX_TRANSPORT_ERRORS):
            return f"connection error on {where}: {_one_line(exc) or type(exc).__name__}"
        return f"{type(exc).__name__} on {where}: {_one_line(exc)}"

    # -- checks ----------------------------------------------------------------------------
    def check_models(self) -> str:
        try:
            page = self.client.models.list()
        except openai.APIError as exc:
            raise CheckFailed(self.describe(exc, "GET", "/models")) from exc
        ids = [m.id for m in page.data]
        if not ids:
            raise CheckFailed(f"GET {self.base_url}/models lists no model")
        if self.model is None:
            self.model = ids[0]
        elif self.model not in ids:
            raise CheckFailed(
                f"model {self.model!r} is not listed by GET {self.base_url}/models "
                f"(listed: {', '.join(ids)})"
            )
        return f"{len(ids)} listed; using {self.model!r}"

    def check_completion(self) -> str:
        try:
            resp = self.client.completions.create(
                model=self._model, prompt=PROMPT, max_tokens=self.args.max_tokens
            )
        except openai.APIError as exc:
            raise CheckFailed(self.describe(exc, "POST", "/completions")) from exc
        if not resp.choices:
            raise CheckFailed(f"POST {self.base_url}/completions returned no choices")
        choice = resp.choices[0]
        if not choice.text:
            raise CheckFailed(
                f"empty text from POST {self.base_url}/completions "
                f"(finish_reason={choice.finish_reason})"
            )
        tokens = resp.usage.completion_tokens if resp.usage else None
        return f"{tokens if tokens is not None else '?'} tokens: {_excerpt(choice.text)}"

    def check_chat_completion(self) -> str:
        try:
            resp = self.client.chat.completions.create(
                model=self._model, messages=CHAT_MESSAGES, max_tokens=self.args.max_tokens
            )
        except openai.APIError as exc:
            raise CheckFailed(self.describe(exc, "POST", "/chat/completions")) from exc
        if not resp.choices:
            raise CheckFailed(f"POST {self.base_url}/chat/completions returned no choices")
        choice = resp.choices[0]
        text = choice.message.content or ""
        source = ""
        if not text:
            text = _reasoning(choice.message.model_dump())
            source = " (reasoning content)"
        if not text:
            raise CheckFailed(
                f"empty text from POST {self.base_url}/chat/completions "
                f"(finish_reason={choice.finish_reason})"
            )
        tokens = resp.usage.completion_tokens if resp.usage else None
        return f"{tokens if tokens is not None else '?'} tokens{source}: {_excerpt(text)}"

    def check_chat_stream(self, report: Report) -> str:
        result = self.stream_chat()
        report.ttft_s.append(result.ttft_s)
        return (
            f"{result.content_chunks} chunks, finish_reason={result.finish_reason}, [DONE]; "
            f"TTFT {result.ttft_s * 1000:.1f} ms: {_excerpt(result.text)}"
        )

    def check_concurrency(self, report: Report) -> str:
        n, c = self.args.requests, min(self.args.concurrency, self.args.requests)
        outcomes: list[StreamResult | CheckFailed] = []

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

    def check_auth(self, report: Report) -> str:
        # 1. Raw HTTP, no Authorization header at all (the openai client always sends one).
        url = f"{self.base_url}/models"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:  # noqa: S310
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            self.tally(False)
            raise CheckFailed(f"GET {url} without a key failed: {_one_line(reason)}") from exc
        self.tally(status == 401)
        if status != 401:
            raise CheckFailed(
                f"GET {url} without an API key got HTTP {status}, expected 401: "
                "the endpoint does not enforce its key"
            )
        # 2. The official client with a wrong key, on the endpoint that spends GPU time.
        wrong = {"Authorization": "Bearer smoke-test-wrong-key-" + secrets.token_hex(8)}
        try:
            self.client.chat.completions.create(
                model=self._model, messages=CHAT_MESSAGES, max_tokens=1, extra_headers=wrong
            )
        except openai.AuthenticationError:
            self.tally(True)
            return "no key -> 401 (GET /models), wrong key -> 401 (POST /chat/completions)"
        except openai.APIError as exc:
            self.tally(False)
            raise CheckFailed(
                "wrong key: expected HTTP 401, got "
                + self.describe(exc, "POST", "/chat/completions")
            ) from exc
        self.tally(False)
        raise CheckFailed(
            f"POST {self.base_url}/chat/completions with a wrong API key succeeded: "
            "the endpoint does not enforce its key"
        )

    # -- streaming -------------------------------------------------------------------------
    def stream_chat(self) -> StreamResult:
        """One streamed chat completion, read as raw SSE lines so `[DONE]` can be checked."""
        ok = False
        try:
            result = self._stream_chat()
            ok = True
            return result
        finally:
            self.tally(ok)

    def _stream_chat(self) -> StreamResult:
        path = "/chat/completions"
        start = time.perf_counter()
        ttft: float | None = None
        pieces: list[str] = []
        chunks = 0
        finish: str | None = None
        usage_tokens: int | None = None
        done = False
        try:
            with self.client.chat.completions.with_streaming_response.create(
                model=self._model,
                messages=CHAT_MESSAGES,
                max_tokens=self.args.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            ) as response:
                for payload in _sse_data(response.iter_lines()):
                    if payload == "[DONE]":
                        done = True
                        break
                    event = json.loads(payload)
                    if isinstance(event, dict) and event.get("error"):
                        error = event["error"]
                        msg = error.get("message", error) if isinstance(error, dict) else error
                        raise CheckFailed(f"error event mid-stream: {_one_line(msg)}")
                    if event.get("usage"):
                        usage_tokens = event["usage"].get("completion_tokens")
                    for choice in event.get("choices") or []:
                        delta = choice.get("delta") or {}
                        piece = delta.get("content") or _reasoning(delta)
                        if piece:
                            if ttft is None:
                                ttft = time.perf_counter() - start
                            chunks += 1
                            pieces.append(piece)
                        finish = choice.get("finish_reason") or finish
        except openai.APIError as exc:
            raise CheckFailed(self.describe(exc, "POST", path)) from exc
        except HTTPX_TIMEOUTS as exc:
            raise CheckFailed(
                f"stream stalled after {chunks} chunks: no data within {self.timeout:g} s "
                f"(--timeout) from POST {self.base_url}{path}"
            ) from exc
        except HTTPX_TRANSPORT_ERRORS as exc:
            raise CheckFailed(
                f"stream broken after {chunks} chunks: connection closed before [DONE] "
                f"({_one_line(exc) or type(exc).__name__})"
            ) from exc
        except json.JSONDecodeError as exc:
            raise CheckFailed(f"stream sent a data line that is not JSON: {exc}") from exc
        duration = time.perf_counter() - start
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
        assert self.model is not None, "the models check runs first"
        return self.model


def _reasoning(fields: dict[str, Any]) -> str:
    """Text a vLLM reasoning parser moved out of `content` (field name varies by version)."""
    return fields.get("reasoning_content") or fields.get("reasoning") or ""


def _sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The payload of every `data:` line of a server-sent event stream."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].removeprefix(" ").rstrip("\r")


def _root_cause(exc: BaseException) -> BaseException:
    seen = exc
    while seen.__cause__ is not None or seen.__context__ is not None:
        nxt = seen.__cause__ or seen.__context__
        assert nxt is not None
        if isinstance(nxt, ConnectionRefusedError):
            return nxt
        seen = nxt
    return seen


def run_checks(smoke: Smoke, report: Report) -> None:
    steps: list[tuple[str, Callable[[], str]]] = [
        ("models", smoke.check_models),
        ("completion", smoke.check_completion),
        ("chat_completion", smoke.check_chat_completion),
        ("chat_stream", lambda: smoke.check_chat_stream(report)),
        ("concurrency", lambda: smoke.check_concurrency(report)),
        ("auth", lambda: smoke.check_auth(report)),
    ]
    for name, _ in steps:
        report.checks[name] = Check(name)
    for name, step in steps:
        check = report.checks[name]
        if name == "auth" and not smoke.args.api_key:
            check.detail = "no API key configured (--api-key / VLLM_API_KEY)"
            continue
        if name != "models" and report.checks["models"].status != "pass":
            check.detail = "not run: the models check failed"
            continue
        start = time.perf_counter()
        try:
            check.detail = step()
            check.status = "pass"
        except CheckFailed as exc:
            check.status, check.detail = "fail", str(exc)
            line = f"error: {name}: {exc}"
            report.errors.append(line)
            print(line, file=sys.stderr, flush=True)
            log.debug("%s failed", name, exc_info=True)
        check.duration_s = time.perf_counter() - start
        if name in SINGLE_REQUEST_CHECKS:
            smoke.tally(check.status == "pass")
        log.debug("%s: %s in %.3f s", name, check.status, check.duration_s)
    report.model = smoke.model
    report.requests_total, report.requests_failed = smoke.requests, smoke.failed


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


def write_json_atomically(data: dict[str, Any], path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smoke_test.py",
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--base-url",
        metavar="URL",
        default=DEFAULT_BASE_URL,
        help="server root or its /v1 URL; /v1 is appended when the path does not end in it "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get("VLLM_API_KEY") or None,
        help="the endpoint's API key; also enables the 401 check (default: $VLLM_API_KEY, "
        "else none; prefer the variable: command lines are visible to other users)",
    )
    p.add_argument(
        "--model", metavar="NAME", help="model to test (default: the first one /v1/models lists)"
    )
    p.add_argument(
        "--requests",
        metavar="N",
        type=_positive_int,
        default=8,
        help="streamed requests in the concurrency check (default: %(default)s)",
    )
    p.add_argument(
        "--concurrency",
        metavar="C",
        type=_positive_int,
        default=4,
        help="requests in flight at once, at most --requests (default: %(default)s)",
    )
    p.add_argument(
        "--max-tokens",
        metavar="T",
        type=int,
        default=32,
        help="max_tokens of every generation, >= 2 so a stream has several chunks "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_float,
        default=60.0,
        help="seconds to wait for a response, or for the next bytes of a stream "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--json", type=Path, metavar="FILE", help="also write the report as JSON to FILE"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug output and tracebacks")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        base_url = normalise_base_url(args.base_url)
    except ValueError as exc:
        parser.error(str(exc))
    if args.max_tokens < 2:
        parser.error(f"--max-tokens must be >= 2, got {args.max_tokens}")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json: directory {args.json.parent} does not exist")
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")

    report = Report(
        base_url=base_url,
        model=args.model,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        settings={
            "requests": args.requests,
            "concurrency": min(args.concurrency, args.requests),
            "max_tokens": args.max_tokens,
            "timeout_s": args.timeout,
            "api_key_set": bool(args.api_key),
        },
    )
    smoke = Smoke(args, base_url)
    try:
        run_checks(smoke, report)
    finally:
        smoke.client.close()
    print(format_table(report))
    if args.json is not None:
        try:
            write_json_atomically(report.to_json(), args.json)
        except OSError as exc:
            print(
                f"error: --json: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr
            )
            return 1
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
