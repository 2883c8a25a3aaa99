"""Kernel-test fixtures: run the shared cases on the GPU in-process, or on CPU through the
Triton interpreter in one subprocess (TRITON_INTERPRET must be set before triton is imported,
and other test modules may already have imported it here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# The subprocess gets pytest's pythonpath (pyproject.toml) through the environment.
SUBPROCESS_PATH = os.pathsep.join(str(ROOT / p) for p in ("tests", "backend/src"))


@pytest.fixture(scope="session")
def kernel_device() -> str:
    torch = pytest.importorskip("torch")
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="session")
def interpreter_results(tmp_path_factory: pytest.TempPathFactory, kernel_device: str):
    """All CPU cases, computed once by ``support.kernel_cases`` under TRITON_INTERPRET=1."""
    if kernel_device != "cpu":
        return None
    import torch

    out = tmp_path_factory.mktemp("interp") / "results.pt"
    path = os.pathsep.join(p for p in (SUBPROCESS_PATH, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-m", "support.kernel_cases", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


@pytest.fixture
def case_result(request, kernel_device, interpreter_results):
    """Outputs of one named case (``request.param``) on the available device."""
    name = request.param
    if interpreter_results is not None:
        res = interpreter_results[name]
        if "error" in res:
            pytest.fail(f"{name} raised under the interpreter: {res['error']}")
        return res
    from support import kernel_cases

    return kernel_cases.run_case(name, kernel_device)
