"""Wheel caches for the nspawn test hosts, which reach no package registry by design.

The containers' network is the suite's own bridge: no route out, no resolver (see
nspawn_targets). What a target's venv needs is downloaded here, on the machine that runs the tests,
by pip from its ordinary index, for the target's Python, and bind-mounted read-only into the
container, where pip installs from it with --no-index:

- runtime/: vLLM 0.23.0's own wheel (the pin of requirements/runtime.in, installed --no-deps: the
  patch role needs its files, not torch), and what the merge tool and the smoke client import
  (gguf, openai and their dependencies, at the controller lock's pins);
- controller/: every wheel of requirements/controller.txt, for `make setup` on the target.

Like the base trees, a cache is built once, under a lock, in a temporary directory renamed into
place; its name carries a hash of what it holds (the pins, the target Python), so a pin change
downloads a new one and never mutates the old.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from support.deploy import REPO
from support.nspawn_targets import CACHE, TargetError

CACHE_VERSION = 1
DOWNLOAD_TIMEOUT = 900
CONTROLLER_LOCK = REPO / "requirements/controller.txt"
RUNTIME_IN = REPO / "requirements/runtime.in"
# Imported on the target by scripts/gguf_merge.py (gguf) and scripts/smoke_client.py (openai).
RUNTIME_TOOLS = ("gguf", "openai")
# glibc of the oldest target (Debian 12: 2.36) bounds the manylinux tags a wheel may carry.
GLIBC_MINOR_MAX = 36


def pin(requirements: Path, name: str) -> str:
    """`name==version` as REQUIREMENTS pins it (a missing pin is a broken lock, not a default)."""
    for line in requirements.read_text().splitlines():
        req = line.split("#", 1)[0].strip()
        if req.lower().replace("_", "-").startswith(f"{name.lower()}=="):
            return req
    raise TargetError(f"{requirements.name} pins no {name}")


def vllm_pin() -> str:
    return pin(RUNTIME_IN, "vllm")


def tool_pins() -> list[str]:
    """The pins of what the target's tools import (gguf, openai), from the controller lock."""
    return [pin(CONTROLLER_LOCK, name) for name in RUNTIME_TOOLS]


def _target_args(python: str) -> list[str]:
    tag = python.replace(".", "")
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR_MAX, 16, -1)]
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    args += ["--abi", f"cp{tag}", "--abi", "abi3", "--abi", "none"]
    for platform in [*platforms, "manylinux2014_x86_64", "linux_x86_64", "any"]:
        args += ["--platform", platform]
    return args


def spec(python: str) -> dict[str, object]:
    return {
        "version": CACHE_VERSION,
        "python": python,
        "vllm": vllm_pin(),
        "tools": tool_pins(),
        "controller_lock": hashlib.sha256(CONTROLLER_LOCK.read_bytes()).hexdigest(),
        "glibc_minor_max": GLIBC_MINOR_MAX,
    }


def cache_name(python: str) -> str:
    digest = hashlib.sha256(json.dumps(spec(python), sort_keys=True).encode()).hexdigest()
    return f"nspawn-wheels-py{python}-{digest[:12]}"


def _download(dest: Path, python: str, *what: str, log: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q"]
    cmd += ["--dest", str(dest), *_target_args(python), *what]
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, timeout=DOWNLOAD_TIMEOUT, check=False
        )
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise TargetError(f"pip download (Python {python}) failed, rc={proc.returncode}:\n{tail}")


def wheel_cache(python: str = "3.12") -> Path:
    """The wheel cache for a target running PYTHON (runtime/ and controller/), built once."""
    CACHE.mkdir(parents=True, exist_ok=True)
    final = CACHE / cache_name(python)
    if (final / "spec.json").is_file():
        return final
    with open(CACHE / f"nspawn-wheels-py{python}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "spec.json").is_file():  # another process built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=CACHE))
        try:
            start = time.monotonic()
            log = tmp / "download.log"
            _download(tmp / "runtime", python, "--no-deps", vllm_pin(), log=log)
            _download(tmp / "runtime", python, "-c", str(CONTROLLER_LOCK), *tool_pins(), log=log)
            _download(tmp / "controller", python, "--no-deps", "-r", str(CONTROLLER_LOCK), log=log)
            info = {**spec(python), "build_seconds": round(time.monotonic() - start, 1)}
            info["bytes"] = sum(p.stat().st_size for p in tmp.rglob("*.whl"))
            (tmp / "spec.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide it from the target's service users
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def main() -> int:
    """Build (or find) the caches of the Pythons named: `python -m support.nspawn_wheels 3.12`."""
    for python in sys.argv[1:] or ["3.12"]:
        path = wheel_cache(python)
        print(path, json.loads((path / "spec.json").read_text())["build_seconds"], "s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
