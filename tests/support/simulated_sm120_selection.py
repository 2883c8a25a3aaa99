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
With a model folder as argument it also follows ``vllm serve --additional-config`` (the flag the
vllm_service role renders) through vLLM's own argument parser and ``create_engine_config`` into
the backend's attention impl, built as the model loader builds it (inside
``set_current_vllm_config``), and reports the indexer choice the impl read (or its error).

Usage: simulated_sm120_selection.py [MODEL_DIR]
"""

from __future__ import annotations

import importlib
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


def select(backend: str | None, dtype: str, kv_cache_dtype: str = "auto") -> dict[str, str]:
    """vLLM's get_attn_backend for GLM-5's MLA layer (head 576, sparse), as the engine calls it."""
    _cached_get_attn_backend.cache_clear()
    # No --block-size given, as in the service: the selector sees block_size=None.
    config = VllmConfig(
        attention_config=AttentionConfig(backend=AttentionBackendEnum[backend] if backend else None)
    )
    try:
        with set_current_vllm_config(config):
            cls = get_attn_backend(
                576, getattr(torch, dtype), kv_cache_dtype, use_mla=True, use_sparse=True,
                num_heads=8,
            )  # fmt: skip
    except ValueError as exc:
        return {"error": str(exc)}
    return {"selected": f"{cls.__module__}.{cls.__qualname__}"}


def serve_indexer(model: str, additional_config: str) -> dict[str, object]:
    """`vllm serve MODEL --additional-config JSON` -> the indexer our impl reads from it."""
    from types import SimpleNamespace

    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    argv = [model, "--dtype", "float16", "--max-model-len", "1024", "--attention-backend",
            "CUSTOM", "--additional-config", additional_config]  # fmt: skip
    config = EngineArgs.from_cli_args(parser.parse_args(["--model", *argv])).create_engine_config()
    with set_current_vllm_config(config):
        cls = get_attn_backend(
            576, torch.float16, "auto", use_mla=True, use_sparse=True, num_heads=8
        )
        indexer = SimpleNamespace(topk_indices_buffer=torch.zeros(4, 128, dtype=torch.int32))
        try:
            impl = cls.get_impl_cls()(8, 576, 0.1, 1, None, None, "auto", None, "decoder", None,
                                      indexer=indexer, kv_lora_rank=512)  # fmt: skip
        except ValueError as exc:
            return {"error": str(exc)}
    return {"additional_config": config.additional_config, "indexer": impl.indexer}


def serve_kv_cache_dtype(model: str, kv_cache_dtype: str) -> dict[str, object]:
    """`vllm serve MODEL --attention-backend CUSTOM --kv-cache-dtype X` -> the cache dtype vLLM's
    config holds, the backend selected with it, and the cache shape that backend asks for."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    argv = [model, "--dtype", "float16", "--max-model-len", "1024", "--attention-backend",
            "CUSTOM", "--kv-cache-dtype", kv_cache_dtype]  # fmt: skip
    config = EngineArgs.from_cli_args(parser.parse_args(["--model", *argv])).create_engine_config()
    cache_dtype = config.cache_config.cache_dtype
    with set_current_vllm_config(config):
        try:
            cls = get_attn_backend(
                576, torch.float16, cache_dtype, use_mla=True, use_sparse=True, num_heads=8
            )
        except ValueError as exc:
            return {"cache_dtype": cache_dtype, "error": str(exc)}
    shape = cls.get_kv_cache_shape(2, 64, 1, 576, cache_dtype)
    return {"cache_dtype": cache_dtype, "selected": cls.get_name(), "shape": list(shape)}


def main(argv: list[str]) -> int:
    if argv:
        # On a cold vLLM cache, create_engine_config inspects the model and saves the result
        # through vllm.model_executor.model_loader, whose import chain reaches
        # vllm.vllm_flash_attn when the platform says CUDA, and fails without its CUDA
        # extensions. Import it on the real (CPU) platform first; a warm cache never imports it.
        importlib.import_module("vllm.model_executor.model_loader.weight_utils")
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
    for dtype in ("float16", "bfloat16"):
        for kv in ("fp8_ds_mla", "fp8"):
            result[f"custom_{dtype}_{kv}"] = select("CUSTOM", dtype, kv)
    if argv:
        for value in ("auto", "deepgemm", "cuda"):
            flag = json.dumps({"sparse_mla_indexer": value})
            result[f"serve_indexer_{value}"] = serve_indexer(argv[0], flag)
        for kv in ("fp8_ds_mla", "fp8"):
            result[f"serve_kv_{kv}"] = serve_kv_cache_dtype(argv[0], kv)
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
