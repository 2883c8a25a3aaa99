"""Run llama.cpp's own convert_hf_to_gguf.py on a tiny checkpoint written by scripts/tiny_glm5.py.

Usage (with the runtime env's python, which has torch/transformers/safetensors):
    python tests/patches/convert_tiny_gguf.py LLAMA_CPP_DIR HF_DIR OUT.gguf OUTTYPE

The converter runs unmodified, with its own gguf-py (NO_LOCAL_GGUF must be unset), except for one
shim: llama.cpp identifies a BPE pre-tokenizer by hashing the token ids of a fixed text, and a
tokenizer trained on four sentences matches no known model, so `get_vocab_base_pre` is made to
answer "gpt-2" (a byte-level BPE like ours). It changes only the tokenizer.ggml.pre string in the
GGUF; no tensor goes through it. This file is a test tool, not part of the served stack.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    llama_cpp, hf_dir, out, outtype = argv
    if "NO_LOCAL_GGUF" in os.environ:
        print("error: unset NO_LOCAL_GGUF: the converter must use its own gguf-py", file=sys.stderr)
        return 2
    sys.path.insert(0, llama_cpp)
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", outtype]
    import convert_hf_to_gguf  # noqa: PLC0415  (path set above)
    from conversion.base import TextModel  # noqa: PLC0415

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    convert_hf_to_gguf.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
