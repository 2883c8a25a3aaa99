"""llama.cpp's own tools, as independent references for tests: the converter and llama-gguf-split.

The source comes from the llama-cpp-python sdist on PyPI (it vendors llama.cpp). It is fetched and
built once into a cache outside the repo (~/.cache/glm5-sm120/), shared by every clone; a file
lock serialises concurrent first uses. Run as a module (PYTHONPATH=tests) to prepare the cache
ahead of a test run, or to convert a tiny checkpoint:

    python -m support.llama_cpp source        # print the llama.cpp source dir
    python -m support.llama_cpp gguf-split    # build (~5 min on 2 cores) and print the binary
    python -m support.llama_cpp convert [--llama-cpp DIR] [--pre glm4] -- CKPT CONVERTER-ARGS...

`convert` runs llama.cpp's convert_hf_to_gguf.py unmodified, with its own gguf-py (NO_LOCAL_GGUF
is dropped from its environment), in a child process whose PYTHONPATH holds the converter's
folder, except for two shims for a toy tokenizer. (1) llama.cpp identifies a BPE pre-tokenizer by
hashing how the tokenizer splits a fixed text and refuses unknown hashes; a tokenizer trained on
a few sentences matches no known model, so when, and only when, the hash is unknown the answer is
`--pre` (default `glm4`: what llama.cpp maps GLM-4/GLM-5 checkpoints to, so the tiny GGUF carries
the real GLM-5 GGUF's tokenizer.ggml.pre and vLLM's GGUF tokenizer path sees what it will see in
production; `gpt-2` would only be another byte-level BPE that no GLM file has). It changes only
that string; no tensor goes through it. (2) GLM's vocab writer looks up GLM's special tokens; a
toy tokenizer without them gets the converter's generic GPT-2 BPE writer instead. Everything
else (hyperparameters, tensor mapping, kv_b split, expert merge, quantisation,
--split-max-tensors) is the converter's own code.

Exit codes (convert): the converter's; 2 usage (no converter in DIR, no arguments after --).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from support import cli

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
_SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "glm5-sm120" / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def source_dir() -> Path:
    """The vendored llama.cpp tree (convert_hf_to_gguf.py, gguf-py/, tools/gguf-split/ ...)."""
    root = cache_root()
    src = root / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").is_file():
        return src
    with _locked(root):
        if (src / "convert_hf_to_gguf.py").is_file():
            return src
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                 "-d", tmp],
                check=True,
            )  # fmt: skip
            prefix = f"{_SDIST}/vendor/llama.cpp/"
            with tarfile.open(Path(tmp) / f"{_SDIST}.tar.gz") as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                tar.extractall(tmp, members=members, filter="data")
            # rename last: a half-extracted tree is never seen at the final path
            os.replace(Path(tmp) / prefix, src)
    return src


def convert_script() -> Path:
    return source_dir() / "convert_hf_to_gguf.py"


def gguf_split_binary() -> Path:
    """Build only the llama-gguf-split target (CPU, no native tuning) and return its path."""
    root = cache_root()
    binary = root / "bin" / "llama-gguf-split"
    if binary.is_file():
        return binary
    src = source_dir()
    with _locked(root):
        if binary.is_file():
            return binary
        build = root / "build"
        shutil.rmtree(build, ignore_errors=True)
        cmake = shutil.which("cmake") or "cmake"
        subprocess.run(
            [cmake, "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
             "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        subprocess.run(
            [cmake, "--build", str(build), "--target", "llama-gguf-split",
             "-j", str(os.cpu_count() or 2)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        built = next(build.rglob("llama-gguf-split"))
        binary.parent.mkdir(exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        shutil.copy2(built, tmp)
        os.replace(tmp, binary)
        shutil.rmtree(build, ignore_errors=True)
    return binary


GLM_SPECIAL = ("[gMASK]", "<|user|>", "<|endoftext|>", "<|observation|>")
_IN_CHILD = "_convert-in-child"  # the child's subcommand: the converter is importable there
logger = logging.getLogger("support.llama_cpp")


def convert(
    ckpt: Path,
    outfile: Path,
    outtype: str = "q8_0",
    *extra: str,
    llama_cpp: Path | None = None,
    pre: str = "glm4",
) -> subprocess.CompletedProcess[str]:
    """Convert a tiny HF checkpoint with llama.cpp's converter (see the module docstring)."""
    args = [str(ckpt), "--outtype", outtype, "--outfile", str(outfile), *extra]
    return _run_converter(llama_cpp or source_dir(), pre, args, capture=True)


def _run_converter(
    llama_cpp: Path, pre: str, args: list[str], *, capture: bool = False
) -> subprocess.CompletedProcess[str]:
    tests_dir = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    # The caller's PYTHONPATH stays last: on the GPU machine it holds the staged torch/transformers.
    path = [str(llama_cpp), str(tests_dir), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    cmd = [sys.executable, "-m", "support.llama_cpp", _IN_CHILD, pre, *args]
    return subprocess.run(cmd, env=env, check=False, capture_output=capture, text=True)


def _convert_in_child(pre: str, args: list[str]) -> int:
    import convert_hf_to_gguf as converter  # noqa: PLC0415  (on PYTHONPATH in this child only)
    from conversion.base import TextModel  # noqa: PLC0415
    from conversion.glm import GlmMoeDsaModel  # noqa: PLC0415

    original = TextModel.get_vocab_base_pre

    def vocab_base_pre(self: TextModel, tokenizer: object) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            logger.warning("toy tokenizer: writing tokenizer.ggml.pre=%s", pre)
            return pre

    TextModel.get_vocab_base_pre = vocab_base_pre  # type: ignore[method-assign]
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
    sys.argv = [converter.__file__, *args]
    converter.main()
    return 0


EXAMPLES = """examples:
  PYTHONPATH=tests python -m support.llama_cpp source
  PYTHONPATH=tests python -m support.llama_cpp convert --llama-cpp /tmp/e2e/llama_cpp -- \\
      /tmp/ckpt --outtype q8_0 --outfile /tmp/gguf/tiny-Q8_0.gguf --split-max-tensors 40
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [_IN_CHILD]:
        return _convert_in_child(argv[1], argv[2:])
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    p = cli.parser(__doc__, EXAMPLES, prog="python -m support.llama_cpp")
    p.add_argument("what", choices=["source", "gguf-split", "convert"], nargs="?", default="source")
    p.add_argument(
        "--llama-cpp",
        type=Path,
        help="convert: folder holding convert_hf_to_gguf.py, conversion/ and gguf-py/ "
        "(default: the cached source tree)",
    )
    p.add_argument(
        "--pre",
        default="glm4",
        help="convert: tokenizer.ggml.pre for an unrecognised tokenizer (default %(default)s)",
    )
    args = p.parse_args(argv)
    if args.what == "source":
        print(source_dir())
        return 0
    if args.what == "gguf-split":
        print(gguf_split_binary())
        return 0
    llama = args.llama_cpp or source_dir()
    if not (llama / "convert_hf_to_gguf.py").is_file():
        p.error(f"{llama / 'convert_hf_to_gguf.py'} not found")
    if not rest:
        p.error("give the converter's arguments after --")
    return _run_converter(llama, args.pre, rest).returncode


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
