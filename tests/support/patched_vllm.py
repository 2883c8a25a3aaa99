"""A patched copy of the installed vLLM for tests: the real series applied to a symlink farm.

The installed vLLM (the runtime env's, pristine) is only read: `patched_site(dest)` mirrors its
package under `dest/vllm` with symlinks, replaces the files the series touches with real copies,
and applies the series with scripts/vllm_patches.py. A child process with PYTHONPATH=dest then
imports the patched vllm/.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import patchset
import vllm_patches


def child_env(*path: Path | None, log_level: str = "WARNING") -> dict[str, str]:
    """The environment of a CPU-only vLLM child process: this one's without its PYTHONPATH, no
    GPU, vLLM logging at LOG_LEVEL, and PYTHONPATH exactly the entries of PATH that are not None
    (a patched site first: its vllm/ is the one the child imports)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"CUDA_VISIBLE_DEVICES": "", "VLLM_LOGGING_LEVEL": log_level}
    entries = [str(p) for p in path if p is not None]
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def run_child(child: Path, *args: Path, out: Path, site: Path, timeout: float = 400) -> dict:
    """Run the CPU-only vLLM child script CHILD ARGS... (OUT among them) against the patched
    SITE; its JSON report at OUT, after checking that it ran, did not crash and imported SITE's
    vllm."""
    res = subprocess.run(
        [sys.executable, str(child), *map(str, args)],
        env=child_env(site, log_level="INFO"), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    data = json.loads(out.read_text())
    assert "crash" not in data, data["crash"]
    assert data["vllm_file"] == str(site / "vllm" / "__init__.py")
    return data


def installed_vllm() -> Path:
    """The directory of the installed `vllm` package (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vllm is not installed in this interpreter")
    return Path(next(iter(spec.submodule_search_locations)))


def patched_site(dest: Path) -> Path:
    """DEST with a patched vllm/ (symlinks except the touched files); returns DEST."""
    src = installed_vllm()
    series = patchset.load_series(patchset.vllm_version(src.parent))
    for root, _dirs, files in os.walk(src):
        if "__pycache__" in root:
            continue
        rel = Path(root).relative_to(src)
        (dest / "vllm" / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            os.symlink(Path(root) / name, dest / "vllm" / rel / name)
    for path in series.files:
        (dest / path).unlink()
        shutil.copy2(src.parent / path, dest / path)
    if vllm_patches.main(["apply", "--site-packages", str(dest)]) != 0:
        raise RuntimeError(f"the series does not apply to the vLLM copy in {dest}")
    return dest


# Patch 0009's log lines when it loads the nextn block of a tiny 3-layer GLM-5 (blk.3, no
# embed_tokens and no head of its own), whichever writer made the file.
TINY_MTP_DRAFT_LOGS = [
    "MTP draft: the GGUF has no nextn.embed_tokens; the draft uses the target model's "
    "embed_tokens (vLLM's MTP proposer shares it)",
    "MTP draft: 28 GGUF tensors loaded into DeepSeekMTP: all of blk.3 and output.weight (the head)",
]
