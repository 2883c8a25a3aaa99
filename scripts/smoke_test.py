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
Optional checks (off unless asked for; with random weights they pass too, since no check needs
the model to call a tool):
  tools            (--tools) a chat completion declaring a function tool (tool_choice auto) is
                   accepted (a server without a tool parser answers HTTP 400) and its reply
                   parses; a tool call, if the model made one, names the declared tool and its
                   arguments are a JSON object matching the tool's schema
  tools_stream     (--tools) the same request streamed: the tool-call deltas rebuild into calls
                   that pass the same checks, no error event, finish_reason, `data: [DONE]`
  reasoning        (--reasoning) a chat completion's reasoning, when the server returns one, is
                   a string field apart from content
  In all three, a reply that ended by itself (finish_reason stop or tool_calls) must hold no
  parser markup: GLM's <tool_call>/<arg_key> tags or <think> tags left in the text mean the
  server's tool or reasoning parser is off or the wrong one.
When /v1/models fails (server down, wrong key, model not listed) the rest are skipped.

Prints a table (check, result, detail; TTFT p50/p95 over every streamed request, output
tokens/s of the concurrency phase, failed requests) and, with --json, writes the same as a
JSON report (mode 0600, temporary file + fsync + rename). The openai client never retries, so a
failure shows at once; each failure is one `error: <check>: ...` line on stderr.

Bounded (scripts/smoke_client.py does the work): --timeout bounds each whole request, body and
stream included; every response is size-capped, never redirected and shape-checked (a bad body
is one failed check, and the report is still written); the key, a password in the URL and any
echoed bearer token are redacted from everything printed or saved.

Exit codes: 0 every check passed (or was skipped for lack of a key); 1 any check failed;
2 usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from smoke_client import (
    RedactingFormatter,
    Redactor,
    Report,
    Settings,
    Smoke,
    format_table,
    normalise_base_url,
    percentile,
    run_checks,
    url_password,
    write_report,
)

__all__ = ["main", "normalise_base_url", "percentile"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"

EXAMPLES = """\
examples:
  # the endpoint deployed by `make deploy` (key from the environment, not the command line)
  VLLM_API_KEY=$(cat key) python scripts/smoke_test.py --base-url http://127.0.0.1:8000/v1
  # more load, a JSON report for automation
  python scripts/smoke_test.py --base-url http://127.0.0.1:8000 --requests 32 --concurrency 8 \\
      --json smoke.json
  # a named model on a server without a key, slow first requests allowed
  python scripts/smoke_test.py --model glm-5 --timeout 300
  # also the tool-call (plain and streamed) and reasoning checks of the parsers
  VLLM_API_KEY=$(cat key) python scripts/smoke_test.py --tools --reasoning --max-tokens 256
"""


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
        help="seconds each whole request may take, a stream's body included (default: %(default)s)",
    )
    p.add_argument(
        "--json", type=Path, metavar="FILE", help="also write the report as JSON to FILE"
    )
    p.add_argument(
        "--tools",
        action="store_true",
        help="also run the tools and tools_stream checks (a function-tool request, plain and "
        "streamed; default: off)",
    )
    p.add_argument(
        "--reasoning",
        action="store_true",
        help="also run the reasoning check (reasoning content apart from the answer; default: off)",
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
    redactor = Redactor([args.api_key, url_password(base_url)])
    if args.verbose:
        handler = logging.StreamHandler()
        handler.setFormatter(RedactingFormatter(redactor, "%(name)s: %(message)s"))
        logging.basicConfig(level=logging.DEBUG, handlers=[handler])

    # Settings' fields are the options of the same names (base_url: normalised).
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)}
    settings = Settings(**options | {"base_url": base_url})
    report = Report(
        base_url=redactor.text(base_url),
        model=args.model,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        settings=settings.summary(),
    )
    smoke = Smoke(settings, redactor)
    try:
        run_checks(smoke, report, lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        smoke.close()
    print(redactor.text(format_table(report)))
    if args.json is not None:
        try:
            write_report(redactor.data(report.to_json()), args.json)
        except OSError as exc:
            print(
                f"error: --json: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr
            )
            return 1
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
