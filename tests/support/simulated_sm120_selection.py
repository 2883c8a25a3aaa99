"""Run vLLM 0.23.0's real attention-backend selection on a simulated SM120 GPU; print JSON.

Used by test_selection.py in a subprocess (the placeholders below must not leak into other
tests). What is simulated, and why (a CPU-only machine cannot load these parts):
- ``vllm._C`` / ``vllm._C_stable_libtorch``: compiled CUDA op libraries that need the NVIDIA
  driver's libcuda; ``vllm.platforms.cuda`` imports them only to register ops. Empty modules.
- the device: ``SimulatedSm120Platform`` is vLLM's own ``CudaPlatformBase`` with
  ``get_device_capability() == 12.0``; selection, priorities and validation are vLLM's code.
- ``flashinfer`` is blocked (import fails), as on the staged H200 test machine where the seed's
  error was reproduced; FLASHINFER_MLA otherwise allocates a CUDA tensor at import.

Prints ``RESULT {json}``: the selection for several requests before and after
``vllm.plugins.load_general_plugins()``, which finds whatever plugin distribution is on the path.
"""

from __future__ import annotations

import json
import sys
import types
from importlib.metadata import entry_points

sys.modules["flashinfer"] = None  # type: ignore[assignment]  # import raises ImportError
for _name in ("vllm._C", "vllm._C_stable_libtorch"):
    sys.modules[_name] = types.ModuleType(_name)

import torch  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.platforms.cuda import CudaPlatformBase  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.selector import _cached_get_attn_backend, get_attn_backend  # noqa: E402


class SimulatedSm120Platform(CudaPlatformBase):
    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(12, 0)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "simulated SM120"


def select(backend: str | None, dtype: str) -> dict[str, str]:
    """vLLM's get_attn_backend for GLM-5's MLA layer (head 576, sparse), as the engine calls it."""
    _cached_get_attn_backend.cache_clear()
    # No --block-size given, as in the service: the selector sees block_size=None.
    config = VllmConfig(
        attention_config=AttentionConfig(backend=AttentionBackendEnum[backend] if backend else None)
    )
    try:
        with set_current_vllm_config(config):
            cls = get_attn_backend(
                576, getattr(torch, dtype), "auto", use_mla=True, use_sparse=True, num_heads=8
            )
    except ValueError as exc:
        return {"error": str(exc)}
    return {"selected": f"{cls.__module__}.{cls.__qualname__}"}


def main() -> int:
    vllm.platforms._current_platform = SimulatedSm120Platform()
    result: dict[str, object] = {
        "auto_fp16_before": select(None, "float16"),
        "custom_fp16_before": select("CUSTOM", "float16"),
    }
    # What every vLLM process does at start (engine core, workers): entry points of the
    # vllm.general_plugins group, from whatever distributions are on the path.
    load_general_plugins()
    result["plugins"] = sorted(ep.name for ep in entry_points(group="vllm.general_plugins"))
    result["custom_fp16"] = select("CUSTOM", "float16")
    result["custom_bf16"] = select("CUSTOM", "bfloat16")
    result["auto_fp16_after"] = select(None, "float16")
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
