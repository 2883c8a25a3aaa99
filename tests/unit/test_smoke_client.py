"""scripts/smoke_test.py against a real loopback OpenAI-compatible server that misbehaves on cue.

Every test starts `FakeOpenAIServer` (real HTTP/1.1 + chunked SSE on 127.0.0.1, ephemeral port)
and calls `smoke_test.main([...])`, then asserts the exit code, the `error:` lines on stderr,
the table on stdout and the JSON report.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import smoke_test
from support.fake_openai_server import Behaviour, FakeOpenAIServer

KEY = "sk-smoke-test-key"
CHECKS = ["models", "completion", "chat_completion", "chat_stream", "concurrency", "auth"]


@pytest.fixture
def behaviour() -> Behaviour:
    # Small delays so streams really arrive in pieces and concurrent requests overlap.
    return Behaviour(api_key=KEY, first_chunk_delay_s=0.03, chunk_delay_s=0.01)


@pytest.fixture
def server(behaviour: Behaviour) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(behaviour) as srv:
        yield srv
    assert srv.errors == []  # no exception escaped a request handler


def run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, base_url: str, *extra: str
) -> tuple[int, str, list[str], dict[str, Any]]:
    """main() with a JSON report; returns (exit code, stdout, stderr lines, report)."""
    report_path = tmp_path / "smoke.json"
    argv = ["--base-url", base_url, "--json", str(report_path), "--timeout", "5", *extra]
    rc = smoke_test.main(argv)
    out, err = capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.json"]  # no temp file left
    return rc, out, err.splitlines(), json.loads(report_path.read_text())


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {name: check["status"] for name, check in report["checks"].items()}


def assert_only_failure(report: dict[str, Any], err: list[str], name: str, message: str) -> None:
    """`name` is the one failed check; its one error line on stderr contains `message`."""
    expected = {c: "pass" for c in CHECKS} | {name: "fail"}
    assert statuses(report) == expected
    assert err == [f"error: {name}: {report['checks'][name]['detail']}"]
    assert message in err[0]
    assert report["errors"] == err
    assert report["passed"] is False


# -- all good ---------------------------------------------------------------------------------


def test_all_checks_pass(capsys, tmp_path, server: FakeOpenAIServer) -> None:
    rc, out, err, report = run(
        capsys, tmp_path, server.base_url, "--api-key", KEY, "--requests", "8", "--concurrency", "4"
    )
    assert rc == 0
    assert err == []
    assert statuses(report) == {c: "pass" for c in CHECKS}
    assert report["passed"] is True
    assert report["report_version"] == 1
    assert report["base_url"] == server.base_url
    assert report["model"] == "tiny-glm5"  # the first listed
    assert report["settings"] == {
        "requests": 8,
        "concurrency": 4,
        "max_tokens": 32,
        "timeout_s": 5.0,
        "api_key_set": True,
    }
    checks = report["checks"]
    assert checks["models"]["detail"] == "1 listed; using 'tiny-glm5'"
    assert checks["completion"]["detail"] == "4 tokens: 'the quick brown fox'"
    assert checks["chat_completion"]["detail"] == "5 tokens: 'Hello from the fake server.'"
    assert checks["chat_stream"]["detail"].startswith("4 chunks, finish_reason=length, [DONE]; ")
    assert checks["chat_stream"]["detail"].endswith(": 'Hello from the stream.'")
    assert checks["concurrency"]["detail"].startswith(
        "8/8 streamed requests ok at concurrency 4 in "
    )
    assert checks["auth"]["detail"] == (
        "no key -> 401 (GET /models), wrong key -> 401 (POST /chat/completions)"
    )
    m = report["metrics"]
    assert m["ttft_s"]["count"] == 9  # chat_stream + 8 concurrent streams
    assert 0.03 <= m["ttft_s"]["p50"] <= m["ttft_s"]["p95"] < 2
    assert m["output_tokens"] == 8 * 4  # usage.completion_tokens of each stream
    assert m["output_tokens_per_s"] == pytest.approx(32 / m["load_duration_s"], rel=1e-3)
    assert m["requests"] == 3 + 1 + 8 + 2
    assert m["errors"] == 0
    assert report["errors"] == []
    # The client really had 4 streams in flight, and sent the key (except on purpose).
    assert server.max_in_flight == 4
    auths = [a for _, _, a in server.requests]
    assert auths.count(f"Bearer {KEY}") == 12
    assert auths.count(None) == 1  # the raw keyless GET /v1/models
    assert sum(1 for a in auths if a and a.startswith("Bearer smoke-test-wrong-key-")) == 1
    # The table: a row per check, then the figures.
    lines = out.splitlines()
    assert lines[0] == f"smoke test of {server.base_url} (model: tiny-glm5)"
    assert lines[2].split() == ["check", "result", "detail"]
    for line, name in zip(lines[3:9], CHECKS, strict=True):
        assert line.split()[:2] == [name, "PASS"]
    assert lines[10].startswith("TTFT p50 / p95      ")
    assert lines[10].endswith(" ms (9 streamed requests)")
    assert lines[11].startswith("output tokens/s     ")
    assert "(32 tokens in " in lines[11]
    assert lines[12] == "errors              0 of 14 requests failed"
    assert lines[13] == "result              PASS (6/6 checks passed, 0 skipped)"


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_base_url_with_or_without_v1(capsys, tmp_path, server, suffix: str) -> None:
    rc, _, err, report = run(capsys, tmp_path, server.root_url + suffix, "--api-key", KEY)
    assert (rc, err) == (0, [])
    assert report["base_url"] == server.base_url


def test_without_key_the_auth_check_is_skipped(capsys, tmp_path, behaviour, server) -> None:
    behaviour.api_key = None
    rc, out, err, report = run(capsys, tmp_path, server.base_url, "--model", "tiny-glm5")
    assert (rc, err) == (0, [])
    assert statuses(report) == {c: "pass" for c in CHECKS[:-1]} | {"auth": "skip"}
    assert report["checks"]["auth"]["detail"] == "no API key configured (--api-key / VLLM_API_KEY)"
    assert report["settings"]["api_key_set"] is False
    assert "result              PASS (5/5 checks passed, 1 skipped)" in out


def test_api_key_from_environment(capsys, tmp_path, server, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    rc, _, err, report = run(capsys, tmp_path, server.base_url)
    assert (rc, err) == (0, [])
    assert report["checks"]["auth"]["status"] == "pass"


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_counts_as_chat_text(capsys, tmp_path, behaviour, server, field: str) -> None:
    behaviour.chat_text, behaviour.chat_reasoning = "", "Let me think about hello."
    behaviour.reasoning_field = field
    rc, _, err, report = run(capsys, tmp_path, server.base_url, "--api-key", KEY)
    assert (rc, err) == (0, [])
    assert report["checks"]["chat_completion"]["detail"] == (
        "0 tokens (reasoning content): 'Let me think about hello.'"
    )


# -- one check fails, the others pass ----------------------------------------------------------

# (what the server does wrong, the failing check, what its error line says ({url}: the server's)).
ONLY_FAILURES = {
    "http_500_on_completions": (
        {"status_for": {"/v1/completions": 500}},
        "completion",
        "HTTP 500 from POST {url}/completions: forced HTTP 500 by the test server",
    ),
    "empty_completion_text": (
        {"completion_text": ""},
        "completion",
        "empty text from POST {url}/completions (finish_reason=length)",
    ),
    "empty_chat_text": (
        {"chat_text": ""},
        "chat_completion",
        "empty text from POST {url}/chat/completions (finish_reason=length)",
    ),
    "key_configured_but_not_enforced": (
        {"api_key": None},  # the server accepts anything
        "auth",
        "GET {url}/models without an API key got HTTP 200, expected 401: "
        "the endpoint does not enforce its key",
    ),
    "keyless_request_refused_but_wrong_key_accepted": (
        {"accept_any_key": True},  # checks that a key is present, not which one
        "auth",
        "POST {url}/chat/completions with a wrong API key succeeded: "
        "the endpoint does not enforce its key",
    ),
}


@pytest.mark.parametrize(("setting", "name", "message"), ONLY_FAILURES.values(), ids=ONLY_FAILURES)
def test_only_failure(
    capsys, tmp_path, behaviour, server, setting: dict[str, Any], name: str, message: str
) -> None:
    for attr, value in setting.items():
        setattr(behaviour, attr, value)
    rc, _, err, report = run(capsys, tmp_path, server.base_url, "--api-key", KEY)
    assert rc == 1
    assert_only_failure(report, err, name, message.format(url=server.base_url))
    assert report["metrics"]["errors"] == 1


# -- authentication ---------------------------------------------------------------------------


def test_key_required_but_not_given(capsys, tmp_path, server) -> None:
    rc, out, err, report = run(capsys, tmp_path, server.base_url)
    assert rc == 1
    assert err == [
        f"error: models: HTTP 401 from GET {server.base_url}/models: Unauthorized "
        "(the endpoint wants an API key: set VLLM_API_KEY or pass --api-key)"
    ]
    assert statuses(report) == {"models": "fail"} | {c: "skip" for c in CHECKS[1:]}
    assert report["checks"]["completion"]["detail"] == "not run: the models check failed"
    assert report["metrics"]["requests"] == report["metrics"]["errors"] == 1
    assert "result              FAIL (0/1 checks passed, 5 skipped)" in out


def test_wrong_key_given(capsys, tmp_path, server) -> None:
    rc, _, err, report = run(capsys, tmp_path, server.base_url, "--api-key", "not-the-key")
    assert rc == 1
    assert err == [f"error: models: HTTP 401 from GET {server.base_url}/models: Unauthorized"]
    assert report["checks"]["models"]["status"] == "fail"


# -- transport failures -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_refused(capsys, tmp_path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    rc, out, err, report = run(capsys, tmp_path, url, "--api-key", KEY)
    assert rc == 1
    assert err == [
        f"error: models: connection refused by GET {url}/models: "
        "is the server running on that port?"
    ]
    assert statuses(report) == {"models": "fail"} | {c: "skip" for c in CHECKS[1:]}
    assert report["model"] is None
    assert report["metrics"]["ttft_s"] == {"p50": None, "p95": None, "count": 0}
    assert report["metrics"]["output_tokens_per_s"] is None
    assert "TTFT p50 / p95      - / - (0 streamed requests)" in out


def test_timeout(capsys, tmp_path, behaviour, server) -> None:
    behaviour.sleep_s = 5
    rc, _, err, report = run(
        capsys, tmp_path, server.base_url, "--api-key", KEY, "--timeout", "0.3"
    )
    assert rc == 1
    assert err == [
        f"error: models: timed out after 0.3 s (--timeout) waiting for GET {server.base_url}/models"
    ]
    assert report["settings"]["timeout_s"] == 0.3
    assert statuses(report)["completion"] == "skip"


def test_stream_stalls_past_timeout(capsys, tmp_path, behaviour, server) -> None:
    behaviour.first_chunk_delay_s = 8
    rc, _, err, report = run(
        capsys, tmp_path, server.base_url, "--api-key", KEY, "--timeout", "1.5", "--requests", "2"
    )
    assert rc == 1
    assert statuses(report) == {c: "pass" for c in CHECKS} | {
        "chat_stream": "fail",
        "concurrency": "fail",
    }
    stall = (
        "stream not finished within 1.5 s (--timeout) after 0 chunks from POST "
        f"{server.base_url}/chat/completions"
    )
    assert err == [
        f"error: chat_stream: {stall}",
        f"error: concurrency: 2 of 2 streamed requests failed at concurrency 2; first: {stall}",
    ]
    assert report["metrics"]["errors"] == 3


# -- the model list ---------------------------------------------------------------------------


def test_model_missing_from_models(capsys, tmp_path, behaviour, server) -> None:
    behaviour.models = ["glm-5", "other"]
    rc, out, err, report = run(
        capsys, tmp_path, server.base_url, "--api-key", KEY, "--model", "tiny-glm5"
    )
    assert rc == 1
    assert err == [
        f"error: models: model 'tiny-glm5' is not listed by GET {server.base_url}/models "
        "(listed: glm-5, other)"
    ]
    assert statuses(report) == {"models": "fail"} | {c: "skip" for c in CHECKS[1:]}
    assert report["model"] == "tiny-glm5"
    assert out.startswith(f"smoke test of {server.base_url} (model: tiny-glm5)\n")


def test_no_model_listed(capsys, tmp_path, behaviour, server) -> None:
    behaviour.models = []
    rc, _, err, _ = run(capsys, tmp_path, server.base_url, "--api-key", KEY)
    assert rc == 1
    assert err == [f"error: models: GET {server.base_url}/models lists no model"]


# -- broken streams ---------------------------------------------------------------------------


def test_stream_in_a_single_chunk(capsys, tmp_path, behaviour, server) -> None:
    behaviour.stream = "single_chunk"
    rc, _, err, report = run(capsys, tmp_path, server.base_url, "--api-key", KEY)
    assert rc == 1
    message = (
        "stream arrived in 1 content chunk, expected several (is something buffering the response?)"
    )
    assert err[0] == f"error: chat_stream: {message}"
    assert err[1] == (
        f"error: concurrency: 8 of 8 streamed requests failed at concurrency 4; first: {message}"
    )
    assert statuses(report)["chat_stream"] == "fail"


def test_stream_cut_midway(capsys, tmp_path, behaviour, server) -> None:
    behaviour.stream = "cut"
    rc, _, err, report = run(capsys, tmp_path, server.base_url, "--api-key", KEY)
    assert rc == 1
    assert err[0].startswith(
        "error: chat_stream: stream broken after 3 chunks: connection closed before [DONE] ("
    )
    assert "incomplete chunked read" in err[0]
    assert report["checks"]["chat_stream"]["status"] == "fail"
    assert report["metrics"]["ttft_s"]["count"] == 0


# The stream's end goes wrong: (what the server does, chat_stream's error line).
STREAM_ENDINGS = {
    "empty_stream": (
        {"stream_pieces": ["", ""]},
        "empty text from the stream (finish_reason=length)",
    ),
    "stream_without_done": (
        {"stream": "no_done"},
        "stream ended after 4 chunks without data: [DONE]",
    ),
    "stream_without_finish_reason": (
        {"stream": "no_finish"},
        "stream ended ([DONE]) after 4 chunks without a finish_reason",
    ),
}


@pytest.mark.parametrize(("setting", "message"), STREAM_ENDINGS.values(), ids=STREAM_ENDINGS)
def test_stream_ending(
    capsys, tmp_path, behaviour, server, setting: dict[str, Any], message: str
) -> None:
    for attr, value in setting.items():
        setattr(behaviour, attr, value)
    rc, _, err, report = run(capsys, tmp_path, server.base_url, "--api-key", KEY)
    assert rc == 1
    assert err[0] == f"error: chat_stream: {message}"
    assert report["checks"]["chat_stream"]["status"] == "fail"


# -- concurrency ------------------------------------------------------------------------------


def test_some_concurrent_requests_fail(capsys, tmp_path, behaviour, server) -> None:
    # Chat requests are numbered by arrival: 1 chat_completion, 2 chat_stream, 3..10 the load.
    behaviour.fail_chat_requests = {4, 9}
    rc, out, err, report = run(
        capsys, tmp_path, server.base_url, "--api-key", KEY, "--requests", "8", "--concurrency", "3"
    )
    assert rc == 1
    assert_only_failure(
        report,
        err,
        "concurrency",
        "2 of 8 streamed requests failed at concurrency 3; first: HTTP 503 from POST "
        f"{server.base_url}/chat/completions: ",
    )
    assert "refused by the test server" in err[0]
    m = report["metrics"]
    assert (m["requests"], m["errors"]) == (14, 2)
    assert m["ttft_s"]["count"] == 1 + 6
    assert m["output_tokens"] == 6 * 4
    assert "errors              2 of 14 requests failed" in out
    assert server.max_in_flight == 3


# -- usage, report file, entry point ----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "argument --requests: must be >= 1, got 0"),
        (["--concurrency", "x"], "argument --concurrency: invalid _positive_int value: 'x'"),
        (["--max-tokens", "1"], "--max-tokens must be >= 2, got 1"),
        (["--timeout", "0"], "argument --timeout: must be > 0, got 0"),
        (["--base-url", "ftp://h/v1"], "--base-url must look like http://HOST:PORT[/v1]"),
        (["--base-url", "127.0.0.1:8000"], "--base-url must look like http://HOST:PORT[/v1]"),
        (["--json", "/nonexistent/dir/r.json"], "--json: directory /nonexistent/dir does not"),
    ],
)
def test_usage_errors_exit_2(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        smoke_test.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1"),
        ("https://gpu01.lan/openai/v1", "https://gpu01.lan/openai/v1"),
        ("http://[::1]:9000/api", "http://[::1]:9000/api/v1"),
    ],
)
def test_normalise_base_url(url: str, expected: str) -> None:
    assert smoke_test.normalise_base_url(url) == expected


def test_percentile() -> None:
    assert smoke_test.percentile([], 50) is None
    assert smoke_test.percentile([0.2], 95) == 0.2
    assert smoke_test.percentile([4, 1, 3, 2], 50) == 2.5
    assert smoke_test.percentile(range(1, 101), 95) == pytest.approx(95.05)


def test_report_replaces_existing_file(capsys, tmp_path, server) -> None:
    (tmp_path / "smoke.json").write_text("old")
    rc, _, _, report = run(capsys, tmp_path, server.base_url, "--api-key", KEY)
    assert rc == 0 and report["passed"] is True


def test_help(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        smoke_test.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert " ".join(out.split()).startswith(
        "usage: smoke_test.py [-h] [--base-url URL] [--api-key KEY] [--model NAME] [--requests N] "
        "[--concurrency C] [--max-tokens T] [--timeout SECONDS] [--json FILE] [--tools] "
        "[--reasoning] [-v]"
    )
    assert "examples:" in out
    assert " ".join(out.split()).count("(default: http://127.0.0.1:8000/v1)") == 1


def test_report_write_failure(capsys, tmp_path, server) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a directory where the report should go: the rename fails
    rc = smoke_test.main(["--base-url", server.base_url, "--api-key", KEY, "--json", str(target)])
    assert rc == 1
    err = capsys.readouterr().err
    # safe_files refuses to replace anything but a regular file
    assert (
        err == f"error: --json: cannot write {target}: {target} exists and is not a regular file\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # temporary file removed


def test_script_entry_point(tmp_path, repo: Path) -> None:
    # The real command line, in a child process: exit status and stderr as a user sees them.
    script = repo / "scripts" / "smoke_test.py"
    url = f"http://127.0.0.1:{_free_port()}"
    down = subprocess.run(
        [sys.executable, script, "--base-url", url, "--json", tmp_path / "r.json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert down.returncode == 1
    assert down.stderr.startswith(f"error: models: connection refused by GET {url}/v1/models")
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is False
