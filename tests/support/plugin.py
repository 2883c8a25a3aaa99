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


def build_impl(additional_config: dict | None = None):
    """The backend's attention impl as vLLM builds it for a GLM-5 layer: inside
    ``set_current_vllm_config`` with this ``additional_config`` (CPU device, no model)."""
    from types import SimpleNamespace

    import torch
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm_sparse_mla.backend import SparseTritonMLAImpl

    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"), additional_config=additional_config or {}
    )
    indexer = SimpleNamespace(topk_indices_buffer=torch.zeros(4, 128, dtype=torch.int32))
    with set_current_vllm_config(config):
        return SparseTritonMLAImpl(
            num_heads=8,
            head_size=576,
            scale=0.1,
            num_kv_heads=1,
            alibi_slopes=None,
            sliding_window=None,
            kv_cache_dtype="auto",
            logits_soft_cap=None,
            attn_type="decoder",
            kv_sharing_target_layer_name=None,
            indexer=indexer,
            kv_lora_rank=512,
        )
