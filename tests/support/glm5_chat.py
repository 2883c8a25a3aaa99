"""GLM-5's chat format for parser tests: its tool/think tokens and a real GLM-4.7-family template.

GLM-5 (and 5.1, 5.2) use GLM-4.7's chat template: tools are declared in a system block, a call
is `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>` with no newline
after the name, and the generation prompt ends in `<think>` (thinking on) or `</think>` (off),
so a completion starts inside the reasoning block and closes it with `</think>`. The template
used here is llama.cpp's models/templates/GLM-4.7-Flash.jinja from the pinned llama.cpp source
(support.llama_cpp), not a copy written for the tests.

`add_chat_tokens(dir)` gives a tiny model folder (support.tiny_glm5) GLM's tool and think tokens
and that template (chat_template.jinja, which transformers and vLLM read), so vLLM's glm47 tool
parser and glm45 reasoning parser can be built on it: the reasoning parser refuses a tokenizer
without `<think>`/`</think>`. Existing token ids do not change: the tokens are appended.

    PYTHONPATH=tests python -m support.glm5_chat /tmp/e2e/ckpt   # after support.tiny_glm5
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from support import cli

EXAMPLES = """examples:
  PYTHONPATH=tests python -m support.tiny_glm5 --out /tmp/tiny --serve
  PYTHONPATH=tests python -m support.glm5_chat /tmp/tiny
"""

# GLM's single-token markers for reasoning and tool calls (GLM-4.5 to GLM-5 share them).
CHAT_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
)
TEMPLATE_NAME = "GLM-4.7-Flash.jinja"


def chat_template() -> str:
    """The GLM-4.7-family chat template from llama.cpp's tree (fetched once, then cached)."""
    from support import llama_cpp

    return (llama_cpp.source_dir() / "models" / "templates" / TEMPLATE_NAME).read_text()


def add_chat_tokens(model_dir: Path, template: str | None = None) -> Path:
    """Append CHAT_TOKENS to model_dir's tokenizer.json and write chat_template.jinja.

    Added, not special, tokens: decoded text keeps them whatever skip_special_tokens says, and
    the parsers look for them in the text. Idempotent: tokens already present are kept as they are.
    """
    from tokenizers import AddedToken, Tokenizer

    path = model_dir / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    vocab = tok.get_vocab(with_added_tokens=True)
    missing = [t for t in CHAT_TOKENS if t not in vocab]
    if missing:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in missing])
        tok.save(str(path))
    (model_dir / "chat_template.jinja").write_text(template or chat_template())
    return model_dir


def render(tokenizer: Any, messages: list[dict], tools: list[dict] | None, **kwargs: Any) -> str:
    """The template's text for messages (tokenizer: any HF tokenizer with apply_chat_template)."""
    return tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=chat_template(), tokenize=False, **kwargs
    )


def completion_of(tokenizer: Any, messages: list[dict], tools: list[dict] | None) -> str:
    """What the model writes for messages[-1] (an assistant turn): the template's rendering of
    the whole conversation minus the generation prompt of the conversation before it.

    This is the byte layout GLM-5 is trained to emit, taken from the template rather than
    typed into a test.
    """
    if messages[-1]["role"] != "assistant":
        raise ValueError("the last message must be the assistant turn to render")
    prompt = render(tokenizer, messages[:-1], tools, add_generation_prompt=True)
    full = render(tokenizer, messages, tools)
    if not full.startswith(prompt):
        raise ValueError("the template's history does not extend its generation prompt")
    return full[len(prompt) :]


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, EXAMPLES, prog="python -m support.glm5_chat")
    p.add_argument("model_dir", type=Path, help="a folder with tokenizer.json (support.tiny_glm5)")
    args = p.parse_args(argv)
    if not (args.model_dir / "tokenizer.json").is_file():
        print(f"error: {args.model_dir}: no tokenizer.json", file=sys.stderr)
        return 1
    add_chat_tokens(args.model_dir)
    print(json.dumps({"model_dir": str(args.model_dir), "tokens": list(CHAT_TOKENS)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
