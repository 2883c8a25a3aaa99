"""Which vLLM 0.23.0 parsers fit GLM-5's chat format: glm47 (tools) and glm45 (reasoning).

The completion texts come from GLM's own template (llama.cpp's GLM-4.7-Flash.jinja, the family
GLM-5 uses: support.glm5_chat) rendering an assistant turn, so they are the byte layout the model
is trained to write: `<tool_call>NAME<arg_key>..` with no newline after the name, reasoning
closed by `</think>` after a generation prompt that opened it. The parsers are vLLM 0.23.0's
own, composed as the chat endpoint composes them (ParserManager.get_parser with the names the
service passes as --tool-call-parser / --reasoning-parser, then Parser.parse for a whole reply
and Parser.parse_delta for a stream), over a tokenizer loaded by vLLM's get_tokenizer.

Findings asserted here:
- glm47 parses GLM-5 calls, streamed and not; glm45 misses them when not streamed (its regex
  wants a newline after the name: the call stays in `content` as raw XML) although its streaming
  path, shared with glm47, gets them. So glm45 is wrong for GLM-5 as a tool parser.
- glm45 (the reasoning parser) separates reasoning from the answer with thinking on (the default)
  and passes the reply through with `enable_thinking: false`.
- vLLM 0.23.0's streaming path drops a zero-argument call (`<tool_call>now</tool_call>`) that
  the non-streamed path returns: a known defect, asserted so that a vLLM bump shows the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import glm5_chat, tiny_glm5

pytestmark = pytest.mark.runtime

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "units": {"type": "string", "enum": ["C", "F"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
    },
]
USER = {"role": "user", "content": "Weather in Paris for 3 days?"}
REASONING = "The user wants a forecast; call get_weather."
ANSWER = "Let me check."
CALL_ARGS = {"city": "Paris, Île-de-France", "days": 3, "units": "C"}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from vllm.tokenizers import get_tokenizer

    out = tmp_path_factory.mktemp("glm5-tok")
    tiny_glm5.write_tokenizer(out)
    glm5_chat.add_chat_tokens(out)
    return get_tokenizer(str(out))


def assistant(tool_calls: list[tuple[str, dict]], content: str = ANSWER) -> dict:
    return {
        "role": "assistant",
        "reasoning_content": REASONING,
        "content": content,
        "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": a}} for n, a in tool_calls
        ],
    }


def request(**kwargs: Any) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="glm-5", messages=[USER], tools=TOOLS, **kwargs)


def parser(tokenizer: Any, tool: str | None, reasoning: str | None, req: Any, **kw: Any) -> Any:
    """One Parser as OpenAIServingChat builds it per request."""
    from vllm.parser.parser_manager import ParserManager

    cls = ParserManager.get_parser(
        tool_parser_name=tool, reasoning_parser_name=reasoning, enable_auto_tools=True
    )
    assert cls is not None
    p = cls(tokenizer, req.tools, chat_template_kwargs=kw)
    p.adjust_request(req)
    return p


def delta_messages(tokenizer: Any, p: Any, req: Any, text: str, prompt: str, chunk: int) -> list:
    """Feed text to p.parse_delta `chunk` tokens at a time, as the engine's detokenizer would;
    returns the DeltaMessages that come back (vLLM sends one chunk per non-None message).

    Like vLLM's incremental detokenizer, text ending in half a UTF-8 character is held back
    (that delta carries its token ids and no text) until the character is complete.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    out = []
    sent = ""
    for start in range(0, len(ids), chunk):
        end = min(start + chunk, len(ids))
        upto = tokenizer.decode(ids[:end], skip_special_tokens=False)
        delta = "" if upto.endswith("\ufffd") else upto[len(sent) :]
        sent += delta
        msg = p.parse_delta(
            delta, ids[start:end], req, prompt_token_ids=prompt_ids, finished=end == len(ids)
        )
        if msg is not None:
            out.append(msg)
    assert sent == text  # the deltas covered the whole completion, nothing lost in decoding
    return out


def stream(tokenizer: Any, p: Any, req: Any, text: str, prompt: str, chunk: int) -> dict:
    """delta_messages joined: reasoning, content and the tool calls rebuilt from their deltas."""
    out: dict[str, Any] = {"reasoning": "", "content": "", "calls": {}}
    for msg in delta_messages(tokenizer, p, req, text, prompt, chunk):
        out["reasoning"] += msg.reasoning or ""
        out["content"] += msg.content or ""
        for tc in msg.tool_calls or []:
            call = out["calls"].setdefault(tc.index, {"name": None, "arguments": "", "ids": []})
            if tc.id:
                call["ids"].append(tc.id)
            if tc.function and tc.function.name:
                call["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                call["arguments"] += tc.function.arguments
    return out


def test_vllm_0_23_registers_the_glm_parsers() -> None:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    glm45 = ToolParserManager.get_tool_parser("glm45")
    glm47 = ToolParserManager.get_tool_parser("glm47")
    assert (glm45.__name__, glm47.__name__) == ("Glm4MoeModelToolParser", "Glm47MoeModelToolParser")
    assert issubclass(glm47, glm45)  # glm47 only swaps the non-streaming regexes
    reasoning = ReasoningParserManager.get_reasoning_parser("glm45")
    assert reasoning.__name__ == "DeepSeekV3ReasoningWithThinkingParser"
    with pytest.raises(KeyError):
        ReasoningParserManager.get_reasoning_parser("glm47")  # there is no glm47 reasoning parser


def test_glm5_template_writes_calls_without_a_newline_after_the_name(tokenizer: Any) -> None:
    text = glm5_chat.completion_of(
        tokenizer, [USER, assistant([("get_weather", CALL_ARGS)])], TOOLS
    )
    assert text == (
        f"{REASONING}</think>{ANSWER}<tool_call>get_weather"
        "<arg_key>city</arg_key><arg_value>Paris, Île-de-France</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value>"
        "<arg_key>units</arg_key><arg_value>C</arg_value></tool_call>"
    )
    prompt = glm5_chat.render(tokenizer, [USER], TOOLS, add_generation_prompt=True)
    assert prompt.endswith("<|assistant|><think>")  # the completion starts inside <think>
    off = glm5_chat.render(
        tokenizer, [USER], TOOLS, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<|assistant|></think>")
    for tok in glm5_chat.CHAT_TOKENS:  # each marker is one token, as the parsers' id checks need
        assert len(tokenizer.encode(tok, add_special_tokens=False)) == 1, tok


def test_glm47_and_glm45_parse_a_glm5_reply(tokenizer: Any) -> None:
    calls = [("get_weather", CALL_ARGS), ("get_weather", {"city": "Lyon"})]
    text = glm5_chat.completion_of(tokenizer, [USER, assistant(calls)], TOOLS)
    req = request()
    reasoning, content, tool_calls = parser(tokenizer, "glm47", "glm45", req).parse(
        text, req, enable_auto_tools=True
    )
    assert reasoning == REASONING
    assert content == ANSWER
    assert [(c.name, json.loads(c.arguments)) for c in tool_calls] == [
        ("get_weather", CALL_ARGS),
        ("get_weather", {"city": "Lyon"}),
    ]
    # days is an integer in the schema: a JSON number, not the string "3"
    assert json.loads(tool_calls[0].arguments)["days"] == 3


def test_glm45_tool_parser_misses_glm5_calls_when_not_streamed(tokenizer: Any) -> None:
    text = glm5_chat.completion_of(
        tokenizer, [USER, assistant([("get_weather", CALL_ARGS)])], TOOLS
    )
    req = request()
    reasoning, content, tool_calls = parser(tokenizer, "glm45", "glm45", req).parse(
        text, req, enable_auto_tools=True
    )
    assert reasoning == REASONING
    assert not tool_calls
    assert content.startswith(f"{ANSWER}<tool_call>get_weather<arg_key>city</arg_key>")


@pytest.mark.parametrize("tool", ["glm47", "glm45"])
@pytest.mark.parametrize("chunk", [1, 4])
def test_streamed_glm5_reply_delta_by_delta(tokenizer: Any, tool: str, chunk: int) -> None:
    calls = [("get_weather", CALL_ARGS), ("get_weather", {"city": "Lyon"})]
    text = glm5_chat.completion_of(tokenizer, [USER, assistant(calls)], TOOLS)
    prompt = glm5_chat.render(tokenizer, [USER], TOOLS, add_generation_prompt=True)
    req = request(stream=True)
    got = stream(tokenizer, parser(tokenizer, tool, "glm45", req), req, text, prompt, chunk)
    assert got["reasoning"] == REASONING
    assert got["content"] == ANSWER
    assert sorted(got["calls"]) == [0, 1]
    for i, (name, args) in enumerate(calls):
        call = got["calls"][i]
        assert call["name"] == name
        assert json.loads(call["arguments"]) == args
        assert len(call["ids"]) == 1  # one id per call, sent with its name


def test_thinking_off_passes_the_reply_through(tokenizer: Any) -> None:
    req = request(chat_template_kwargs={"enable_thinking": False})
    text = "Paris: sunny."
    p = parser(tokenizer, "glm47", "glm45", req, enable_thinking=False)
    assert p.parse(text, req, enable_auto_tools=True) == (None, text, None)
    prompt = glm5_chat.render(
        tokenizer, [USER], TOOLS, add_generation_prompt=True, enable_thinking=False
    )
    p = parser(tokenizer, "glm47", "glm45", req, enable_thinking=False)
    got = stream(tokenizer, p, req, text, prompt, 1)
    assert (got["reasoning"], got["content"], got["calls"]) == ("", text, {})


def test_reasoning_without_a_tool_call(tokenizer: Any) -> None:
    text = f"{REASONING}</think>Paris: sunny, 21 C."
    req = request()
    assert parser(tokenizer, "glm47", "glm45", req).parse(text, req, enable_auto_tools=True) == (
        REASONING,
        "Paris: sunny, 21 C.",
        None,
    )


def test_vllm_0_23_streaming_drops_zero_argument_calls(tokenizer: Any) -> None:
    """Known defect of 0.23.0's shared GLM streaming path: a call's name is only taken once a
    newline or `<arg_key>` follows it, so `<tool_call>now</tool_call>` never streams. Clients
    that stream get no call where a non-streamed request gets one."""
    text = glm5_chat.completion_of(tokenizer, [USER, assistant([("now", {})], content="")], TOOLS)
    assert text == f"{REASONING}</think><tool_call>now</tool_call>"
    req = request()
    _, _, calls = parser(tokenizer, "glm47", "glm45", req).parse(text, req, enable_auto_tools=True)
    assert [(c.name, c.arguments) for c in calls] == [("now", "{}")]
    prompt = glm5_chat.render(tokenizer, [USER], TOOLS, add_generation_prompt=True)
    req = request(stream=True)
    got = stream(tokenizer, parser(tokenizer, "glm47", "glm45", req), req, text, prompt, 1)
    assert got["reasoning"] == REASONING
    assert got["calls"] == {}


def test_support_cli_adds_tokens_once(tmp_path: Path) -> None:
    tiny_glm5.write_tokenizer(tmp_path)
    before = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert glm5_chat.main([str(tmp_path)]) == 0
    assert glm5_chat.main([str(tmp_path)]) == 0
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    assert data["model"]["vocab"] == before  # existing ids unchanged
    added = [t["content"] for t in data["added_tokens"] if t["content"] in glm5_chat.CHAT_TOKENS]
    assert added == list(glm5_chat.CHAT_TOKENS)
    tok_cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == glm5_chat.chat_template()
    assert glm5_chat.main([str(tmp_path / "missing")]) == 1


def test_every_parser_the_service_role_offers_is_registered(repo: Path) -> None:
    """vllm serve resolves the names only when it starts (its argparser takes any string):
    each non-empty choice of the vllm_service role must name a parser of vLLM 0.23.0."""
    import yaml
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    spec = yaml.safe_load(
        (repo / "playbooks/roles/vllm_service/meta/argument_specs.yml").read_text()
    )
    options = spec["argument_specs"]["main"]["options"]
    tools = [c for c in options["vllm_service_tool_call_parser"]["choices"] if c]
    reasoning = [c for c in options["vllm_service_reasoning_parser"]["choices"] if c]
    assert tools and reasoning
    for name in tools:
        assert ToolParserManager.get_tool_parser(name).__module__.startswith("vllm.tool_parsers.")
    for name in reasoning:
        assert ReasoningParserManager.get_reasoning_parser(name).__module__.startswith("vllm.")


# -- the smoke client on vLLM's own wire format ------------------------------------------------


def vllm_wire(tokenizer: Any, tool: str, text: str) -> tuple[dict, list[str]]:
    """What vLLM 0.23.0's chat endpoint sends for TEXT with these parsers, built with its own
    protocol models as serving.py builds them: the plain reply's JSON body (JSONResponse of
    model_dump()) and the stream's data payloads (model_dump_json(exclude_unset=True) per
    chunk, role first, finish_reason on the last)."""
    import smoke_client
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest,
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
        ChatMessage,
    )
    from vllm.entrypoints.openai.engine.protocol import DeltaMessage, ToolCall, UsageInfo

    tools = [smoke_client.TOOL]  # the smoke client's own tool, so its schema check applies
    req = ChatCompletionRequest(model="glm-5", messages=[USER], tools=tools, tool_choice="auto")
    reasoning, content, calls = parser(tokenizer, tool, "glm45", req).parse(
        text, req, enable_auto_tools=True
    )
    message = ChatMessage(
        role="assistant",
        reasoning=reasoning,
        content=content,
        tool_calls=[ToolCall(id=c.id, function=c) for c in calls or []],
    )
    finish = "tool_calls" if calls else "stop"
    usage = UsageInfo(prompt_tokens=9, completion_tokens=40, total_tokens=49)
    body = ChatCompletionResponse(
        id="chatcmpl-1",
        model="glm-5",
        choices=[ChatCompletionResponseChoice(index=0, message=message, finish_reason=finish)],
        usage=usage,
    ).model_dump(mode="json")

    sreq = ChatCompletionRequest(
        model="glm-5", messages=[USER], tools=tools, tool_choice="auto", stream=True
    )
    prompt = glm5_chat.render(tokenizer, [USER], tools, add_generation_prompt=True)
    msgs = delta_messages(tokenizer, parser(tokenizer, tool, "glm45", sreq), sreq, text, prompt, 1)
    streamed_calls = any(m.tool_calls for m in msgs)
    events = []
    for i, delta in enumerate([DeltaMessage(role="assistant", content=""), *msgs]):
        last = i == len(msgs)
        choice = ChatCompletionResponseStreamChoice(
            index=0,
            delta=delta,
            logprobs=None,
            finish_reason=("tool_calls" if streamed_calls else "stop") if last else None,
        )
        chunk = ChatCompletionStreamResponse(
            id="chatcmpl-1", object="chat.completion.chunk", created=0, model="glm-5",
            choices=[choice],
        )  # fmt: skip
        events.append(chunk.model_dump_json(exclude_unset=True))
    return body, events


def smoke_tools(body: dict, events: list[str], tmp_path: Path) -> dict:
    import smoke_test
    from support.fake_openai_server import Behaviour, FakeOpenAIServer

    behaviour = Behaviour(models=["glm-5"], raw_tools_body=body, raw_tools_events=events)
    report = tmp_path / "smoke.json"
    with FakeOpenAIServer(behaviour) as srv:
        smoke_test.main(["--base-url", srv.base_url, "--tools", "--timeout", "10",
                         "--requests", "1", "--json", str(report)])  # fmt: skip
        assert srv.errors == []
    return json.loads(report.read_text())["checks"]


def smoke_on_a_weather_call(
    tokenizer: Any, tool: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict, dict]:
    """GLM-5's get_weather(Paris, 3 days) through vLLM's TOOL parser, then the smoke client's
    tools checks on that wire: (the chat body, the checks); the client's output swallowed."""
    args = {"city": "Paris", "days": 3}
    text = glm5_chat.completion_of(tokenizer, [USER, assistant([("get_weather", args)])], None)
    body, events = vllm_wire(tokenizer, tool, text)
    checks = smoke_tools(body, events, tmp_path)
    capsys.readouterr()
    return body, checks


def test_smoke_client_reads_vllms_tool_calls_from_glm47(
    tokenizer: Any, tmp_path: Path, capsys
) -> None:
    body, checks = smoke_on_a_weather_call(tokenizer, "glm47", tmp_path, capsys)
    assert body["choices"][0]["message"]["reasoning"] == REASONING  # vLLM 0.23.0's field name
    assert checks["tools"]["status"] == checks["tools_stream"]["status"] == "pass"
    call = 'get_weather({"city": "Paris", "days": 3})'
    assert checks["tools"]["detail"] == f"1 tool call(s), finish_reason=tool_calls: {call}"
    assert checks["tools_stream"]["detail"] == (
        f"1 tool call(s) streamed, finish_reason=tool_calls: {call}"
    )


def test_smoke_client_catches_glm45_leaving_the_call_in_content(
    tokenizer: Any, tmp_path: Path, capsys
) -> None:
    _, checks = smoke_on_a_weather_call(tokenizer, "glm45", tmp_path, capsys)
    assert checks["tools"]["status"] == "fail"
    assert (
        "tool-call markup '<tool_call>' left in content (finish_reason=stop)"
        in (checks["tools"]["detail"])
    )
    assert checks["tools_stream"]["status"] == "pass"  # glm45's streaming path gets the call
