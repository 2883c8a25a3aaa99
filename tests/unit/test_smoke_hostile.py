"""scripts/smoke_test.py against a server that attacks it (tests/support/hostile_openai_server.py).

Each case: one failed check with a one-line reason on stderr, exit 1, the --json report still
written (0600, no temp file left), and no secret in anything printed or saved. Wall-clock bounds
here are the behaviour under test (a deadline), with seconds of slack, not performance figures.
"""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import smoke_client
import smoke_test
from support import hostile_openai_server as hostile
from support.hostile_openai_server import HostileOpenAIServer

KEY = "sk-hostile-secret-key-0123"
CHECKS = ["models", "completion", "chat_completion", "chat_stream", "concurrency", "auth"]


@pytest.fixture
def server() -> Iterator[HostileOpenAIServer]:
    with HostileOpenAIServer(api_key=KEY) as srv:
        yield srv


def run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, base_url: str, *extra: str
) -> tuple[int, str, list[str], dict[str, Any], float]:
    report = tmp_path / "smoke.json"
    argv = ["--base-url", base_url, "--api-key", KEY, "--json", str(report)]
    argv += ["--timeout", "3", "--requests", "2", "--concurrency", "2", *extra]
    start = time.monotonic()
    rc = smoke_test.main(argv)
    wall = time.monotonic() - start
    out, err = capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.json"]  # no temp file left
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    saved = report.read_text()
    for text in (out, err, saved):
        assert KEY not in text
    return rc, out, err.splitlines(), json.loads(saved), wall


def failed(report: dict[str, Any]) -> dict[str, str]:
    return {n: c["detail"] for n, c in report["checks"].items() if c["status"] == "fail"}


def assert_one_failure(rc: int, err: list[str], report: dict[str, Any], check: str) -> str:
    """CHECK is the only failure (later checks skipped if it is models); returns its reason."""
    assert rc == 1
    assert list(failed(report)) == [check]
    assert len(err) == 1 and err[0].startswith(f"error: {check}: ")
    assert report["errors"] == err and report["passed"] is False
    reason = report["checks"][check]["detail"]
    assert "\n" not in reason and len(reason) <= 400
    return reason


def one_attack(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    server: HostileOpenAIServer,
    route: str,
    attack: hostile.Attack,
    check: str,
) -> str:
    """ATTACK on ROUTE fails CHECK alone; returns its reason."""
    server.attack(route, attack)
    rc, _, err, report, _ = run(capsys, tmp_path, server.base_url)
    return assert_one_failure(rc, err, report, check)


def test_all_good_baseline(capsys, tmp_path, server) -> None:
    rc, _, err, report, _ = run(capsys, tmp_path, server.base_url)
    assert (rc, err) == (0, [])
    assert {n: c["status"] for n, c in report["checks"].items()} == dict.fromkeys(CHECKS, "pass")


# -- deadline ---------------------------------------------------------------------------------


def test_byte_a_second_models_response_is_cut_at_the_deadline(capsys, tmp_path, server) -> None:
    server.attack("GET /v1/models", hostile.trickle(hostile.models_response(b'{"data": []}')))
    rc, _, err, report, wall = run(capsys, tmp_path, server.base_url)
    reason = assert_one_failure(rc, err, report, "models")
    assert reason == f"timed out after 3 s (--timeout) waiting for GET {server.base_url}/models"
    assert 2.5 < wall < 5.5  # one whole request's deadline (3 s), not one read's


def test_byte_a_second_stream_is_cut_at_the_deadline(capsys, tmp_path, server) -> None:
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
    stream = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + event * 100

    def fast_head_slow_body(h: hostile.Handler) -> None:
        h.raw(stream[:60])
        hostile.trickle(stream[60:], 0.5)(h)

    server.attack("STREAM /v1/chat/completions", fast_head_slow_body)
    rc, _, err, report, wall = run(capsys, tmp_path, server.base_url, "--requests", "1")
    assert rc == 1
    assert set(failed(report)) == {"chat_stream", "concurrency"}
    assert report["checks"]["chat_stream"]["detail"] == (
        "stream not finished within 3 s (--timeout) after 0 chunks from POST "
        f"{server.base_url}/chat/completions"
    )
    assert wall < 2 * 3 + 4  # two streamed requests, 3 s each, plus the quick checks


# -- size caps --------------------------------------------------------------------------------


def test_endless_stream_hits_the_event_cap(capsys, tmp_path, server) -> None:
    server.attack("STREAM /v1/chat/completions", hostile.endless_events())
    rc, _, err, report, _ = run(capsys, tmp_path, server.base_url, "--max-tokens", "8")
    assert rc == 1
    cap = smoke_client.max_stream_events(8)
    assert report["checks"]["chat_stream"]["detail"] == (
        f"stream sent more than {cap} data events (cap for --max-tokens)"
    )


def test_endless_sse_line_hits_the_line_cap(capsys, tmp_path, server) -> None:
    server.attack("STREAM /v1/chat/completions", hostile.endless_chunked(b"data: " + b"x" * 65536))
    rc, _, err, report, _ = run(capsys, tmp_path, server.base_url)
    assert rc == 1
    assert report["checks"]["chat_stream"]["detail"] == (
        "stream sent a line longer than 1 MiB (cap)"
    )


def test_endless_body_hits_the_byte_cap(capsys, tmp_path, server) -> None:
    flood = hostile.endless_chunked(b"[" * 65536)
    reason = one_attack(capsys, tmp_path, server, "GET /v1/models", flood, "models")
    assert reason == (
        f"response body larger than 8 MiB (cap per request) from GET {server.base_url}/models"
    )


def test_announced_huge_body_refused_before_reading(capsys, tmp_path, server) -> None:
    def announce(h: hostile.Handler) -> None:
        h.raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        h.raw(b"Content-Length: 300000000\r\n\r\n{")

    server.attack("GET /v1/models", announce)
    rc, _, err, report, wall = run(capsys, tmp_path, server.base_url)
    reason = assert_one_failure(rc, err, report, "models")
    assert reason.startswith("response announces 300000000 bytes, more than the 8 MiB cap")
    assert wall < 2.5  # refused at the headers, no deadline needed


def test_compressed_body_refused(capsys, tmp_path, server) -> None:
    gzipped = hostile.gzipped({"data": [{"id": "tiny-glm5"}]})
    reason = one_attack(capsys, tmp_path, server, "GET /v1/models", gzipped, "models")
    assert reason.startswith("response has Content-Encoding 'gzip' although identity was asked")


# -- malformed bodies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "attack", "check", "reason"),
    [
        ("GET /v1/models", hostile.body(200, b"{not json", "application/json"), "models",
         "GET {u}/models answered HTTP 200 with a body that is not JSON (application/json): "
         "'{not json'"),
        ("GET /v1/models", hostile.body(200, b"<html><b>Welcome</b></html>", "text/html"),
         "models", "GET {u}/models answered HTTP 200 with a body that is not JSON (text/html): "
         "'<html><b>Welcome</b></html>'"),
        ("GET /v1/models", hostile.body(200, b"", "application/json"), "models",
         "GET {u}/models answered HTTP 200 with a body that is not JSON (application/json): "
         "(empty body)"),
        ("GET /v1/models", hostile.json_body({"data": [{"object": "model"}]}), "models",
         "GET {u}/models: data[0]: no 'id' member"),
        ("GET /v1/models", hostile.json_body({"data": [{"id": 7}]}), "models",
         "GET {u}/models: data[0]: 'id' is a number, expected a string"),
        ("GET /v1/models", hostile.json_body({"data": "tiny-glm5"}), "models",
         "GET {u}/models: 'data' is a string, expected an array"),
        ("GET /v1/models", hostile.json_body("tiny-glm5"), "models",
         "GET {u}/models: expected a JSON object, got a string"),
        ("GET /v1/models", hostile.json_body({"data": ["tiny-glm5"]}), "models",
         "GET {u}/models: data[0]: expected a JSON object, got a string"),
        ("POST /v1/completions", hostile.json_body({"choices": "Paris"}), "completion",
         "POST {u}/completions: 'choices' is a string, expected an array"),
        ("POST /v1/completions", hostile.json_body({"choices": [{"text": ["P"]}]}), "completion",
         "POST {u}/completions: choices[0]: 'text' is an array, expected a string"),
        ("POST /v1/completions", hostile.json_body({"choices": [None]}), "completion",
         "POST {u}/completions: choices[0] is null, expected an object"),
        ("POST /v1/completions",
         hostile.json_body({"choices": [{"text": "P"}], "usage": {"completion_tokens": "2"}}),
         "completion", "POST {u}/completions usage: 'completion_tokens' is a string, expected "
         "an integer"),
        ("POST /v1/chat/completions", hostile.json_body({"choices": [{"message": "hi"}]}),
         "chat_completion",
         "POST {u}/chat/completions: choices[0]: 'message' is a string, expected an object"),
        ("POST /v1/chat/completions", hostile.json_body([1, 2]), "chat_completion",
         "POST {u}/chat/completions: expected a JSON object, got an array"),
    ],
)  # fmt: skip
def test_malformed_body_is_one_failed_check(
    capsys, tmp_path, server, route: str, attack, check: str, reason: str
) -> None:
    # the non-streamed chat is attacked; its streamed requests keep a good answer
    server.attack("STREAM /v1/chat/completions", _default_stream)

    def keyed(h: hostile.Handler) -> None:  # the auth check's wrong key still gets its 401
        if h.headers.get("Authorization") != f"Bearer {KEY}":
            h.send_json(401, {"error": "Unauthorized"})
        else:
            attack(h)

    server.attack(route, keyed)
    rc, _, err, report, _ = run(capsys, tmp_path, server.base_url)
    assert assert_one_failure(rc, err, report, check) == reason.replace("{u}", server.base_url)


def _default_stream(h: hostile.Handler) -> None:
    hostile.stream_of(
        {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": "length"}]},
        "[DONE]",
    )(h)


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        (["not json at all", "[DONE]"], "stream event 0 is not JSON: 'not json at all'"),
        (['"a string"', "[DONE]"], "stream event 0 is a string, expected an object"),
        ([{"choices": "x"}, "[DONE]"], "stream event 0: 'choices' is a string, expected an array"),
        ([{"choices": [{"delta": "x"}]}, "[DONE]"],
         "stream event 0: 'delta' is a string, expected an object"),
        ([{"choices": [{"delta": {"content": 5}}]}, "[DONE]"],
         "stream event 0: 'content' is a number, expected a string"),
        ([{"choices": [7]}, "[DONE]"], "stream event 0: a choice is a number"),
        ([{"error": {"message": "engine died"}}], "error event mid-stream: engine died"),
    ],
)  # fmt: skip
def test_malformed_stream_event_is_one_failed_check(
    capsys, tmp_path, server, events: list[object], reason: str
) -> None:
    server.attack("STREAM /v1/chat/completions", hostile.stream_of(*events))
    rc, _, err, report, _ = run(capsys, tmp_path, server.base_url)
    assert rc == 1
    assert set(failed(report)) == {"chat_stream", "concurrency"}
    assert report["checks"]["chat_stream"]["detail"] == reason


# -- redirects --------------------------------------------------------------------------------


def test_redirect_to_another_server_is_not_followed(capsys, tmp_path, server) -> None:
    with HostileOpenAIServer(api_key=None) as elsewhere:
        target = f"{elsewhere.base_url}/models"
        server.attack("GET /v1/models", hostile.redirect(target))
        rc, _, err, report, _ = run(capsys, tmp_path, server.base_url)
        assert elsewhere.seen == []  # never contacted, so never handed the key
    reason = assert_one_failure(rc, err, report, "models")
    assert reason == (
        f"HTTP 302 redirect to {target} (not followed: point --base-url at the endpoint itself) "
        f"from GET {server.base_url}/models"
    )


def test_redirect_of_the_keyless_auth_probe_is_a_failure(capsys, tmp_path, server) -> None:
    def redirect_keyless(h: hostile.Handler) -> None:
        if h.headers.get("Authorization"):
            h.send_json(200, {"data": [{"id": "tiny-glm5"}]})
        else:
            hostile.redirect("http://login.example.invalid/")(h)

    server.attack("GET /v1/models", redirect_keyless)
    rc, _, err, report, _ = run(capsys, tmp_path, server.base_url)
    reason = assert_one_failure(rc, err, report, "auth")
    assert reason == (
        "without a key: HTTP 302 redirect to http://login.example.invalid/ (not followed: point "
        f"--base-url at the endpoint itself) from GET {server.base_url}/models"
    )


# -- secrets ----------------------------------------------------------------------------------


def test_echoed_authorization_header_is_redacted(capsys, tmp_path, server) -> None:
    echo = hostile.echo_authorization(500)
    reason = one_attack(capsys, tmp_path, server, "POST /v1/completions", echo, "completion")
    assert reason == (
        f"HTTP 500 from POST {server.base_url}/completions: bad request, got Bearer ***"
    )


def test_echoed_wrong_key_is_redacted_too(capsys, tmp_path, server) -> None:
    def echo_on_wrong_key(h: hostile.Handler) -> None:
        if h.body.get("max_tokens") == 1:  # the auth check's wrong-key request
            hostile.echo_authorization(200)(h)
        else:
            h.send_json(200, {"choices": [{"message": {"content": "hi"}}]})

    server.attack("POST /v1/chat/completions", echo_on_wrong_key)
    server.attack("STREAM /v1/chat/completions", _default_stream)
    rc, out, err, report, _ = run(capsys, tmp_path, server.base_url)
    reason = assert_one_failure(rc, err, report, "auth")
    assert "with a wrong API key succeeded" in reason
    assert "smoke-test-wrong-key-" not in out + "\n".join(err) + json.dumps(report)


def test_password_in_base_url_is_redacted(capsys, tmp_path, server) -> None:
    port = server.root_url.rsplit(":", 1)[1]
    url = f"http://admin:hunter2-pw@127.0.0.1:{port}/v1"
    server.attack("GET /v1/models", hostile.json_body({"data": []}))
    rc, out, err, report, _ = run(capsys, tmp_path, url, "-v")
    shown = f"http://admin:***@127.0.0.1:{port}/v1"
    assert report["base_url"] == shown
    assert (
        assert_one_failure(rc, err[-1:], report, "models") == f"GET {shown}/models lists no model"
    )
    assert out.startswith(f"smoke test of {shown} ")
    for text in (out, "\n".join(err), json.dumps(report)):
        assert "hunter2-pw" not in text


def test_password_redacted_in_usage_errors(capsys) -> None:
    with pytest.raises(SystemExit):
        smoke_test.main(["--base-url", "ftp://u:hunter2-pw@h/v1"])
    err = capsys.readouterr().err
    assert "hunter2-pw" not in err and "ftp://u:***@h/v1" in err


def test_redactor_unit() -> None:
    r = smoke_client.Redactor(["sk-abcdef"])
    assert r.text("key sk-abcdef, auth: Bearer xyz123; http://a:b@h/") == (
        "key ***, auth: Bearer ***; http://a:***@h/"
    )
    assert r.data({"a": ["sk-abcdef", 1], "b": None}) == {"a": ["***", 1], "b": None}


def test_sse_parser_unit() -> None:
    chunks = [b"data: 1\r\n", b"\r\n: comment\n", b"event: x\ndata:2\n\nda", b"ta: 3"]
    assert list(smoke_client.sse_data(chunks, 10)) == ["1", "2", "3"]
    with pytest.raises(smoke_client.CheckFailed, match="more than 2 data events"):
        list(smoke_client.sse_data([b"data: a\ndata: b\ndata: c\n"], 2))
