"""smoke_test.py's tools, tools_stream and reasoning checks against the loopback stand-in server.

The stand-in (support.fake_openai_server) answers as vLLM does with its parsers on: tool calls
in message.tool_calls or streamed delta.tool_calls, reasoning in its own field; or refuses tools
with vLLM's HTTP 400. Each malformed reply must be one failed check per request with a reason
that says what is wrong; a reply without a tool call passes (random weights rarely call one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import smoke_client
import smoke_test
from support.fake_openai_server import Behaviour, FakeOpenAIServer

KEY = "sk-smoke-parsers-key"
BASE = ["models", "completion", "chat_completion", "chat_stream", "concurrency", "auth"]
ALL = [*BASE, "tools", "tools_stream", "reasoning"]
GOOD_ARGS = '{"city": "Paris", "days": 3}'


@pytest.fixture
def behaviour() -> Behaviour:
    return Behaviour(api_key=KEY)


@pytest.fixture
def server(behaviour: Behaviour) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(behaviour) as srv:
        yield srv
    assert srv.errors == []


def run(capsys, tmp_path: Path, srv: FakeOpenAIServer, *extra: str) -> tuple[int, list[str], dict]:
    report_path = tmp_path / "smoke.json"
    argv = ["--base-url", srv.base_url, "--api-key", KEY, "--json", str(report_path),
            "--timeout", "5", "--requests", "2", "--concurrency", "2", *extra]  # fmt: skip
    rc = smoke_test.main(argv)
    err = capsys.readouterr().err.splitlines()
    return rc, err, json.loads(report_path.read_text())


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {name: check["status"] for name, check in report["checks"].items()}


def detail(report: dict[str, Any], name: str) -> str:
    return report["checks"][name]["detail"]


def failed_only(report: dict, err: list[str], names: list[str]) -> None:
    """Exactly NAMES failed, each with its one error line, everything else passed."""
    assert statuses(report) == {c: "pass" for c in report["checks"]} | {n: "fail" for n in names}
    assert err == [f"error: {n}: {detail(report, n)}" for n in names]
    assert report["passed"] is False


def run_failing(
    capsys, tmp_path: Path, srv: FakeOpenAIServer, names: list[str], *extra: str
) -> dict[str, Any]:
    """run() exits 1 with exactly NAMES failed (failed_only); returns the report."""
    rc, err, report = run(capsys, tmp_path, srv, *extra)
    assert rc == 1
    failed_only(report, err, names)
    return report


def tools_requests(srv: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [b for b in srv.bodies if b.get("tools")]


# -- off by default, harmless when no tool is called --------------------------------------------


def test_default_run_has_no_parser_checks(capsys, tmp_path, server) -> None:
    rc, err, report = run(capsys, tmp_path, server)
    assert (rc, err) == (0, [])
    assert list(report["checks"]) == BASE
    assert tools_requests(server) == []


def test_no_tool_called_passes_and_the_request_declares_the_tool(capsys, tmp_path, server) -> None:
    rc, err, report = run(capsys, tmp_path, server, "--tools", "--reasoning")
    assert (rc, err) == (0, [])
    assert list(report["checks"]) == ALL
    assert statuses(report) == {c: "pass" for c in ALL}
    assert detail(report, "tools") == (
        "accepted, no tool called (finish_reason=length): 'Hello from the fake server.'"
    )
    assert detail(report, "tools_stream").startswith("accepted, no tool called (finish_reason=")
    assert detail(report, "reasoning").startswith("no reasoning content returned")
    sent = tools_requests(server)
    assert [b.get("stream", False) for b in sent] == [False, True]
    for body in sent:
        assert body["tools"] == [smoke_client.TOOL]
        assert body["tool_choice"] == "auto"
        assert body["messages"] == smoke_client.TOOL_MESSAGES
    # 8 base requests (auth sends 2, concurrency 2) + tools, tools_stream, reasoning
    assert report["metrics"]["requests"] == 11
    assert report["metrics"]["errors"] == 0


# -- a tool call, plain and streamed ------------------------------------------------------------


def test_valid_tool_call_plain_and_streamed(capsys, tmp_path, server, behaviour) -> None:
    behaviour.tool_calls = [{"name": "get_weather", "arguments": GOOD_ARGS}]
    behaviour.stream_reasoning_pieces = ["The user", " wants weather."]
    rc, err, report = run(capsys, tmp_path, server, "--tools")
    assert (rc, err) == (0, [])
    assert detail(report, "tools") == (
        '1 tool call(s), finish_reason=tool_calls: get_weather({"city": "Paris", "days": 3})'
    )
    assert detail(report, "tools_stream") == (
        "1 tool call(s) streamed, finish_reason=tool_calls: "
        'get_weather({"city": "Paris", "days": 3})'
    )


def test_two_streamed_calls_rebuild_from_many_pieces(capsys, tmp_path, server, behaviour) -> None:
    behaviour.tool_calls = [
        {"name": "get_weather", "arguments": GOOD_ARGS},
        {"name": "get_weather", "arguments": '{"city": "Île-de-France"}'},
    ]
    behaviour.tool_argument_pieces = 50  # one character a delta
    rc, err, report = run(capsys, tmp_path, server, "--tools")
    assert (rc, err) == (0, [])
    assert detail(report, "tools_stream").endswith(
        'get_weather({"city": "Paris", "days": 3}); get_weather({"city": "Île-de-France"})'
    )


@pytest.mark.parametrize(
    ("name", "arguments", "reason"),
    [
        (
            "get_weather",
            '{"city": "Paris"',
            "arguments are not JSON (Expecting ',' delimiter at 16)",
        ),
        ("get_time", GOOD_ARGS, "names 'get_time', which the request did not declare"),
        ("get_weather", '{"days": 3}', "schema: 'city' is a required property"),
        ("get_weather", '{"city": "Paris", "days": "x"}', "at days: 'x' is not of type 'integer'"),
        (
            "get_weather",
            '{"city": "Paris", "days": 30}',
            "at days: 30 is greater than the maximum of 7",
        ),
        ("get_weather", '{"city": "Paris", "unit": "C"}', "('unit' was unexpected)"),
        ("get_weather", "[1, 2]", "arguments are an array, expected a JSON object"),
        ("get_weather", {"city": "Paris"}, "'arguments' is an object, expected a"),
        ("", GOOD_ARGS, None),
    ],
)
def test_malformed_tool_call_fails_each_mode_with_its_reason(
    capsys, tmp_path, server, behaviour, name: str, arguments: Any, reason: str | None
) -> None:
    behaviour.tool_calls = [{"name": name, "arguments": arguments}]
    report = run_failing(
        capsys, tmp_path, server, ["tools", "tools_stream"], "--tools", "--reasoning"
    )
    plain, streamed = detail(report, "tools"), detail(report, "tools_stream")
    assert plain.startswith(f"POST {server.base_url}/chat/completions (tools): tool call 0")
    assert streamed.startswith(f"POST {server.base_url}/chat/completions (tools, streamed): ")
    if reason is None:  # an empty name: the plain reply says so, the stream has no first name
        assert plain.endswith("tool call 0 has no function name (got a string)")
        assert streamed.endswith("the first delta of tool call 0 carries no function name")
        return
    assert reason in plain
    assert reason in streamed
    assert KEY not in json.dumps(report)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("oops", "message: 'tool_calls' is a string, expected an array"),
        (["oops"], "tool_calls[0] is a string, expected an object"),
        ([{"type": "code", "id": "c", "function": {}}], "has type 'code', expected 'function'"),
        ([{"type": "function", "function": {"name": "get_weather"}}], "[0]: no 'id' member"),
        ([{"id": "c", "type": "function"}], "tool_calls[0]: no 'function' member"),
    ],
)
def test_malformed_tool_calls_array_fails_the_plain_check(
    capsys, tmp_path, server, behaviour, raw: Any, reason: str
) -> None:
    behaviour.raw_tool_calls = raw
    report = run_failing(capsys, tmp_path, server, ["tools"], "--tools")
    assert reason in detail(report, "tools")


@pytest.mark.parametrize(
    ("deltas", "reason"),
    [
        ([[{"function": {"name": "get_weather"}}]], "tool_calls entry: no 'index' member"),
        ([[{"index": -1, "function": {"name": "get_weather"}}]], "tool_calls entry has index -1"),
        ([[{"index": 0, "function": {"arguments": "{}"}}]], "tool call 0 carries no function name"),
        (
            [
                [{"index": 0, "id": "a", "function": {"name": "get_weather", "arguments": "{"}}],
                [{"index": 0, "function": {"name": "now", "arguments": "}"}}],
            ],
            "tool call 0 renamed from 'get_weather' to 'now' mid-stream",
        ),
        (["oops"], "'tool_calls' is a string, expected an array"),
        (
            [[{"index": 0, "function": {"name": "get_weather", "arguments": 7}}]],
            "tool call 0: 'arguments' is a number, expected a string",
        ),
        (
            [[{"index": 0, "id": "a", "function": {"name": "get_weather", "arguments": '{"c":'}}]],
            "arguments are not JSON (Expecting value at 5)",
        ),
    ],
)
def test_malformed_tool_call_deltas_fail_the_streamed_check(
    capsys, tmp_path, server, behaviour, deltas: list[Any], reason: str
) -> None:
    behaviour.raw_tool_call_deltas = deltas
    report = run_failing(capsys, tmp_path, server, ["tools_stream"], "--tools")
    assert reason in detail(report, "tools_stream")


def test_server_without_a_tool_parser_refuses_tools(capsys, tmp_path, server, behaviour) -> None:
    behaviour.tools_refused = True
    report = run_failing(capsys, tmp_path, server, ["tools", "tools_stream"], "--tools")
    refusal = (
        f'HTTP 400 from POST {server.base_url}/chat/completions: "auto" tool choice requires '
        "--enable-auto-tool-choice and --tool-call-parser to be set"
    )
    assert detail(report, "tools") == detail(report, "tools_stream") == refusal


# -- markup left by a parser that is off or wrong ----------------------------------------------

GLM_CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"


def test_unparsed_call_in_a_finished_reply_fails(capsys, tmp_path, server, behaviour) -> None:
    """What glm45 leaves of a GLM-5 call (tests/integration/test_glm5_parsers.py): the XML."""
    behaviour.chat_text = "Let me check." + GLM_CALL
    behaviour.stream_pieces = ["Let me check.", GLM_CALL[:30], GLM_CALL[30:]]
    behaviour.chat_finish_reason = "stop"
    report = run_failing(capsys, tmp_path, server, ["tools", "tools_stream"], "--tools")
    for name in ("tools", "tools_stream"):
        assert detail(report, name).endswith(
            "tool-call markup '<tool_call>' left in content (finish_reason=stop): the server did "
            "not parse the call (GLM-5 needs vllm serve --enable-auto-tool-choice "
            "--tool-call-parser glm47)"
        )


def test_markup_in_a_reply_cut_at_max_tokens_is_not_judged(
    capsys, tmp_path, server, behaviour
) -> None:
    behaviour.chat_text = "noise <tool_call>get_weather<arg_key>ci"
    behaviour.stream_pieces = ["noise ", "<think>", "</think>"]
    rc, err, report = run(capsys, tmp_path, server, "--tools", "--reasoning")
    assert (rc, err) == (0, [])  # finish_reason=length: random weights write such things


# -- reasoning ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_apart_from_content(capsys, tmp_path, server, behaviour, field: str) -> None:
    behaviour.reasoning_field = field
    behaviour.chat_reasoning = "The user wants a greeting."
    behaviour.chat_finish_reason = "stop"
    rc, err, report = run(capsys, tmp_path, server, "--reasoning")
    assert (rc, err) == (0, [])
    assert detail(report, "reasoning") == (
        "reasoning 26 chars apart from content 27 chars (finish_reason=stop): "
        "'The user wants a greeting.'"
    )


@pytest.mark.parametrize(
    ("content", "reasoning", "reason"),
    [
        (
            "Thinking...</think>Hello!",
            None,
            "markup '</think>' left in content (finish_reason=stop)",
        ),
        ("Hello!", "a<think>b", "markup '<think>' left in reasoning content (finish_reason=stop)"),
        ("Hello!", 5, "message: 'reasoning' is a number, expected a string"),
    ],
)
def test_reasoning_not_separated_fails(
    capsys, tmp_path, server, behaviour, content: str, reasoning: Any, reason: str
) -> None:
    behaviour.chat_text = content
    behaviour.chat_reasoning = reasoning
    behaviour.chat_finish_reason = "stop"
    report = run_failing(capsys, tmp_path, server, ["reasoning"], "--reasoning")
    assert reason in detail(report, "reasoning")
