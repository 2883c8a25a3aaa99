"""Helpers imported by the plugin tests: run a fresh interpreter with the plugin importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BACKEND_SRC = REPO / "backend" / "src"


def run_python(
    args: list[str], *, pythonpath: list[Path], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run this interpreter (the runtime venv's) with exactly ``pythonpath`` prepended."""
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
        "VLLM_LOGGING_LEVEL": "WARNING",
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, *args], env=full_env, capture_output=True, text=True, timeout=240
    )


def result_of(proc: subprocess.CompletedProcess[str]) -> dict:
    """The JSON after the ``RESULT `` marker a helper script prints."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1].removeprefix("RESULT "))
