"""tests/e2e/tool_check.py against the loopback OpenAI stand-in (tests/support/fake_openai_server)
and on hand-made streams: what passes, and each way a parser failure shows."""

from __future__ import annotations

import json
from pathlib import Path

from support.fake_openai_server import Behaviour, FakeOpenAIServer

from e2e import tool_check

KEY = "sk-tools"


def run(tmp_path: Path, server: FakeOpenAIServer, log: Path | None = None) -> tuple[int, dict]:
    (tmp_path / "k").write_text(KEY)
    out = tmp_path / "tools.json"
    argv = ["--base-url", server.root_url, "--api-key-file", str(tmp_path / "k"), "--model",
            "tiny-glm5", "--json", str(out), "--timeout", "10"]  # fmt: skip
    if log is not None:
        argv += ["--server-log", str(log)]
    return tool_check.main(argv), json.loads(out.read_text())


def test_plain_answers_pass_and_every_case_is_recorded(tmp_path: Path, capsys) -> None:
    b = Behaviour(models=["tiny-glm5"], api_key=KEY, chat_reasoning="17*23 = 391")
    with FakeOpenAIServer(b) as server:
        rc, report = run(tmp_path, server)
    assert rc == 0, capsys.readouterr().err
    assert [r["case"] for r in report["results"]] == [
        "tools", "tools_stream", "reasoning", "reasoning_stream",
    ]  # fmt: skip
    assert all(r["status"] == 200 and r["problems"] == [] for r in report["results"])
    assert report["results"][0]["request"]["tools"][0]["function"]["name"] == "get_weather"
    assert report["results"][2]["parsed"]["reasoning"] == "17*23 = 391"
    assert report["results"][1]["parsed"]["content"] == "Hello from the stream."
    assert report["tool_calls_made"] == 0 and report["passed"] is True


def test_cut_stream_fails_naming_the_case(tmp_path: Path, capsys) -> None:
    b = Behaviour(models=["tiny-glm5"], api_key=KEY, stream="no_done")
    with FakeOpenAIServer(b) as server:
        rc, report = run(tmp_path, server)
    assert rc == 1
    assert capsys.readouterr().err == (
        "error: tools_stream: the stream did not end with [DONE]\n"
    )  # fmt: skip
    assert report["passed"] is False


def test_parser_error_logged_during_the_check_fails(tmp_path: Path, capsys, monkeypatch) -> None:
    log = tmp_path / "server.log"
    log.write_text("Traceback (most recent call last): from before the check, not counted\n")
    real_post = tool_check.post

    def post_and_log(*args, **kwargs):  # the server logs a parser failure while answering
        with log.open("a") as fh:
            fh.write("(APIServer pid=1) ERROR glm47: Error in extracting tool call from response\n")
        return real_post(*args, **kwargs)

    monkeypatch.setattr(tool_check, "post", post_and_log)
    with FakeOpenAIServer(Behaviour(models=["tiny-glm5"], api_key=KEY)) as server:
        rc, report = run(tmp_path, server, log)
    assert rc == 1
    assert capsys.readouterr().err == (
        "error: server log: (APIServer pid=1) ERROR glm47: Error in extracting tool call from "
        "response\n"
    )
    assert len(report["server_log_errors"]) == 4  # one per request, none from before


def test_stream_assembly_of_tool_call_deltas() -> None:
    def tc(**fn: str) -> dict:
        return {"tool_calls": [{"index": 0, "function": fn}]}

    events = [
        {"choices": [{"delta": tc(name="get_weather", arguments="")}]},
        {"choices": [{"delta": tc(arguments='{"ci')}]},
        {"choices": [{"delta": tc(arguments='ty": "P"}'), "finish_reason": "tool_calls"}]},
    ]  # fmt: skip
    data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    parsed, problems = tool_check.read_stream(data.encode())
    assert problems == []
    assert parsed["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": '{"city": "P"}'}}
    ]
    assert parsed["finish_reason"] == "tool_calls" and parsed["events"] == 3


def test_malformed_tool_calls_and_events_are_problems() -> None:
    bad = [{"function": {"name": "get_weather", "arguments": "{city: P"}}, {"function": {}}]
    assert tool_check.tool_call_problems(bad) == [
        "get_weather: arguments are not JSON: '{city: P'",
        "tool call without a name: {'function': {}}",
    ]
    parsed, problems = tool_check.read_stream(b"data: {nope\n\ndata: [DONE]\n\n")
    assert problems == ["event 1 is not JSON: '{nope'"]
    _, problems = tool_check.read_body(b"<html>")
    assert problems == ["the answer is no chat completion: b'<html>'"]
