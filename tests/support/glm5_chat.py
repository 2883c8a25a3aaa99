"""GLM-5's chat format for the tiny models: its tool/think tokens and a GLM-4.7-family template.

GLM-5 (and 5.1, 5.2) use GLM-4.7's chat template: tools are declared in a system block, a call
is `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>` with no newline
after the name, and the generation prompt ends in `<think>` (thinking on) or `</think>` (off),
so a completion starts inside the reasoning block and closes it with `</think>`.

The template is `templates/glm47.jinja`: llama.cpp's models/templates/GLM-4.7-Flash.jinja from
the pinned llama.cpp source (support.llama_cpp) with one comment line on top, committed because
the GPU machine has no llama.cpp tree; tests/consistency/test_chat_template.py holds it equal
to llama.cpp's.

`add_chat_tokens(dir)` gives a tiny model folder (support.tiny_glm5) GLM's tool and think tokens,
as special tokens after the trained ids (GLM's published tokenizers list them among their
special tokens), and that template in tokenizer_config.json, so vLLM's glm47 tool parser and
glm45 reasoning parser can be built on it (the reasoning parser refuses a vocabulary without
`<think>`/`</think>`). Existing token ids do not change. Run it on the HF folder vLLM reads the
tokenizer from (`--tokenizer`), after conversion: the GGUF keeps the plain tokenizer.

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
  PYTHONPATH=tests python -m support.glm5_chat /tmp/tiny --template my.jinja

exit codes: 0 tokens and template added (or already there), 1 bad folder or ids past vocab_size
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
TEMPLATE = Path(__file__).with_name("templates") / "glm47.jinja"
LLAMA_CPP_TEMPLATE = "models/templates/GLM-4.7-Flash.jinja"  # what TEMPLATE is a copy of


def chat_template(template: Path = TEMPLATE) -> str:
    return template.read_text()


def add_chat_tokens(model_dir: Path, template: Path = TEMPLATE) -> dict[str, int]:
    """Add CHAT_TOKENS to model_dir's tokenizer.json and put the template into its
    tokenizer_config.json; returns {token: id}. Idempotent: tokens already present keep their ids.

    Raises ValueError when an id would reach the config.json's vocab_size (the embedding has no
    row for it), FileNotFoundError without tokenizer.json.
    """
    from tokenizers import AddedToken, Tokenizer

    path = model_dir / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_TOKENS])
    ids = {t: tok.token_to_id(t) for t in CHAT_TOKENS}
    config = model_dir / "config.json"
    if config.is_file():
        vocab_size = json.loads(config.read_text())["vocab_size"]
        if max(ids.values()) >= vocab_size:
            raise ValueError(f"token ids up to {max(ids.values())} exceed vocab_size {vocab_size}")
    tok.save(str(path))
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    cfg["chat_template"] = chat_template(template)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return ids


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
    p.add_argument("--template", type=Path, default=TEMPLATE, help="default: %(default)s")
    args = p.parse_args(argv)
    if not (args.model_dir / "tokenizer.json").is_file():
        print(f"error: {args.model_dir}: no tokenizer.json", file=sys.stderr)
        return 1
    try:
        ids = add_chat_tokens(args.model_dir, args.template)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"model_dir": str(args.model_dir), "tokens": ids}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
