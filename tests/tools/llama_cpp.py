"""llama.cpp's own tools, as independent references for tests: the converter and llama-gguf-split.

The source comes from the llama-cpp-python sdist on PyPI (it vendors llama.cpp). It is fetched and
built once into a cache outside the repo (~/.cache/glm5-sm120/), shared by every clone; a file
lock serialises concurrent first uses. Run as a script to prepare the cache ahead of a test run:

    python tests/tools/llama_cpp.py source        # print the llama.cpp source dir
    python tests/tools/llama_cpp.py gguf-split    # build (~5 min on 2 cores) and print the binary
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

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


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "source"
    print({"source": source_dir, "gguf-split": gguf_split_binary}[what]())
