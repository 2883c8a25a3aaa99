"""Run llama.cpp's convert_hf_to_gguf.py on a tiny checkpoint whose toy tokenizer it cannot hash.

llama.cpp's converter identifies a BPE pre-tokenizer by hashing how the tokenizer splits a fixed
text and refuses unknown hashes. A tiny random test checkpoint carries a toy byte-level BPE
tokenizer, so this wrapper answers `--pre` (default `glm4`, what GLM checkpoints map to) when,
and only when, the converter does not recognise the hash; everything else (hyperparameters,
tensor mapping, kv_b split, expert merge, quantisation, --split-max-tensors) is the converter's
own code. Arguments after `--` go to the converter unchanged.

    python tests/e2e/convert_gguf.py --llama-cpp DIR -- CKPT --outtype q8_0 --outfile OUT.gguf
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

EXAMPLES = """examples:
  python tests/e2e/convert_gguf.py --llama-cpp .vllmstage/llama_cpp -- /tmp/ckpt \\
      --outtype q8_0 --outfile /tmp/gguf/tiny-Q8_0.gguf --split-max-tensors 40
"""

logger = logging.getLogger("convert_gguf")
GLM_SPECIAL = ("[gMASK]", "<|user|>", "<|endoftext|>", "<|observation|>")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--llama-cpp",
        type=Path,
        required=True,
        help="folder holding convert_hf_to_gguf.py, conversion/ and gguf-py/",
    )
    p.add_argument(
        "--pre",
        default="glm4",
        help="tokenizer.ggml.pre to write for an unrecognised tokenizer (default %(default)s)",
    )
    args = p.parse_args(argv)
    script = args.llama_cpp / "convert_hf_to_gguf.py"
    if not script.is_file():
        p.error(f"{script} not found")
    if not rest:
        p.error("give the converter's arguments after --")

    sys.path.insert(0, str(args.llama_cpp))
    import convert_hf_to_gguf as converter  # noqa: PLC0415  (path known only at run time)
    from conversion.base import TextModel  # noqa: PLC0415

    original = TextModel.get_vocab_base_pre

    def vocab_base_pre(self: TextModel, tokenizer: object) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            logger.warning("toy tokenizer: writing tokenizer.ggml.pre=%s", args.pre)
            return args.pre

    TextModel.get_vocab_base_pre = vocab_base_pre  # type: ignore[method-assign]

    # GLM's vocab writer looks up GLM's special tokens; a toy tokenizer without them gets the
    # converter's generic GPT-2 BPE writer instead.
    from conversion.glm import GlmMoeDsaModel  # noqa: PLC0415

    glm_set_vocab = GlmMoeDsaModel.set_vocab

    def set_vocab(self: GlmMoeDsaModel) -> None:
        from transformers import AutoTokenizer  # noqa: PLC0415

        added = AutoTokenizer.from_pretrained(self.dir_model).get_added_vocab()
        if all(t in added for t in GLM_SPECIAL):
            glm_set_vocab(self)
            return
        logger.warning("toy tokenizer without %s: generic GPT-2 vocab", ", ".join(GLM_SPECIAL))
        self._set_vocab_gpt2()

    GlmMoeDsaModel.set_vocab = set_vocab  # type: ignore[method-assign]
    sys.argv = [str(script), *rest]
    converter.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
