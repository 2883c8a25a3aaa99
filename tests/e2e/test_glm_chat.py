"""support.glm5_chat on the tiny checkpoint: vLLM 0.23.0's real GLM parsers accept it.

The H200 `tools` step serves this HF folder with --tool-call-parser glm47 --reasoning-parser
glm45; here (CPU, no engine) vLLM's own tokenizer loader reads it, both parsers build on it (the
reasoning parser refuses a vocabulary without <think>/</think>), the GLM-4.7-style template renders
a tools prompt, and the glm47 parser turns GLM's tool-call text into a call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import glm5_chat, tiny_glm5

pytestmark = pytest.mark.runtime
TESTS = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys
from vllm.platforms import current_platform
current_platform.device_type = "cpu"
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager
tok = get_tokenizer(sys.argv[1])
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
tp = ToolParserManager.get_tool_parser("glm47")(tok)
rp = ReasoningParserManager.get_reasoning_parser("glm45")(tok, chat_template_kwargs={})
prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools,
                                 add_generation_prompt=True, tokenize=False)
req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
out = tp.extract_tool_calls(
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", req)
print(json.dumps({"len": len(tok), "tool_start_id": tp.tool_call_start_token_id,
    "reasoning": type(rp).__name__, "prompt": prompt, "called": out.tools_called,
    "calls": [[c.function.name, c.function.arguments] for c in out.tool_calls]}))
"""


def test_vllm_parsers_accept_the_tiny_glm_folder(tmp_path: Path) -> None:
    hf = tiny_glm5.write_model_dir(tmp_path / "hf", tiny_glm5.config(3, 0, bos=False))
    ids = glm5_chat.add_chat_tokens(hf)
    assert tuple(ids) == glm5_chat.CHAT_TOKENS and len(set(ids.values())) == len(ids)
    assert glm5_chat.add_chat_tokens(hf) == ids  # idempotent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"CUDA_VISIBLE_DEVICES": "", "VLLM_LOGGING_LEVEL": "WARNING"}
    res = subprocess.run([sys.executable, "-c", CHILD, str(hf)], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["tool_start_id"] == ids["<tool_call>"]
    assert got["len"] == max(ids.values()) + 1
    assert got["reasoning"] == "DeepSeekV3ReasoningWithThinkingParser"
    assert got["prompt"].startswith("[gMASK]<sop><|system|>\n# Tools\n")
    assert '"name": "get_weather"' in got["prompt"]
    assert got["prompt"].endswith("<|user|>hi<|assistant|><think>")
    assert got["called"] is True and got["calls"] == [["get_weather", '{"city": "Paris"}']]


def test_token_ids_past_vocab_size_refused(tmp_path: Path) -> None:
    cfg = tiny_glm5.config(3, 0) | {"vocab_size": 400}
    hf = tiny_glm5.write_model_dir(tmp_path / "hf", cfg)
    with pytest.raises(ValueError, match=r"token ids up to \d+ exceed vocab_size 400"):
        glm5_chat.add_chat_tokens(hf)
