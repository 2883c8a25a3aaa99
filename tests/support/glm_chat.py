"""Give a tiny GLM checkpoint GLM-5's chat tokens and a GLM-4.7-style chat template.

The toy tokenizer of tests/support/tiny_glm5.py has GLM's role tokens but not the tool-call and
thinking tokens that vLLM 0.23.0's glm47 tool parser and glm45 reasoning parser look up in the
vocabulary (`<tool_call>`, `<arg_key>`, `<think>`, ...; the reasoning parser refuses to start
without `<think>`/`</think>`). This adds them as special tokens after the trained ids (still
below the model's vocab_size) and puts the template (default: templates/glm47.jinja, llama.cpp's
GLM-4.7-Flash template) into tokenizer_config.json. Run on the HF folder vLLM reads the tokenizer
from (`--tokenizer`), after conversion: the GGUF keeps the plain tokenizer. Idempotent.

    PYTHONPATH=tests python -m support.glm_chat --hf-dir /tmp/e2e/ckpt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support import cli

EXAMPLES = """example:
  PYTHONPATH=tests python -m support.glm_chat --hf-dir /tmp/e2e/ckpt
"""
TEMPLATE = Path(__file__).with_name("templates") / "glm47.jinja"
TOKENS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>",
]  # fmt: skip


def apply(hf_dir: Path, template: Path = TEMPLATE) -> dict[str, int]:
    """Add TOKENS and the template; returns {token: id}. Raises ValueError past vocab_size."""
    from tokenizers import AddedToken, Tokenizer

    vocab_size = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TOKENS])
    ids = {t: tok.token_to_id(t) for t in TOKENS}
    if max(ids.values()) >= vocab_size:
        raise ValueError(f"token ids up to {max(ids.values())} exceed vocab_size {vocab_size}")
    tok.save(str(hf_dir / "tokenizer.json"))
    cfg_path = hf_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = template.read_text()
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return ids


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, EXAMPLES, prog="python -m support.glm_chat")
    p.add_argument("--hf-dir", type=Path, required=True, help="the checkpoint folder")
    p.add_argument("--template", type=Path, default=TEMPLATE, help="default: %(default)s")
    args = p.parse_args(argv)
    try:
        print(json.dumps(apply(args.hf_dir, args.template)))
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
