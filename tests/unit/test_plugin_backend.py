"""register() against vLLM's real registry, and the backend's own validation verdicts."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.runtime
torch = pytest.importorskip("torch")  # collected by the controller venv too, which has none

OURS = "vllm_sparse_mla.backend.SparseTritonMLABackend"
GLM5 = {
    "head_size": 576,
    "dtype": torch.float16,
    "kv_cache_dtype": "auto",
    "block_size": 64,
    "use_mla": True,
    "has_sink": False,
    "use_sparse": True,
    "use_mm_prefix": False,
    "use_per_head_quant_scales": False,
    "attn_type": "decoder",
}


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch):
    """The plugin module with its once-per-process flag reset (restored afterwards)."""
    import vllm_sparse_mla

    monkeypatch.setattr(vllm_sparse_mla, "_registered", False)
    return vllm_sparse_mla


def _verdict(capability: tuple[int, int] = (12, 0), **changes) -> list[str]:
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cls = AttentionBackendEnum.CUSTOM.get_class()
    return cls.validate_configuration(
        device_capability=DeviceCapability(*capability), **{**GLM5, **changes}
    )


def test_register_makes_custom_our_backend_and_is_idempotent(plugin) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert plugin.register() is True
    assert AttentionBackendEnum.CUSTOM.get_path() == OURS
    assert plugin.register() is True
    cls = AttentionBackendEnum.CUSTOM.get_class()
    assert (cls.get_name(), cls.is_mla(), cls.is_sparse()) == ("SPARSE_TRITON_MLA", True, True)
    assert cls.get_kv_cache_shape(10, 64, 1, 576) == (10, 64, 576)


def test_register_refuses_another_vllm_version_and_logs_both(plugin, monkeypatch, caplog) -> None:
    monkeypatch.setattr(plugin, "_VLLM_VERSION", "0.22.0")
    with caplog.at_level(logging.ERROR, logger="vllm_sparse_mla"):
        assert plugin.register() is False
    assert "needs vllm==0.22.0 but found vllm 0.23.0" in caplog.text
    assert plugin._registered is False


def test_building_the_backend_refuses_an_unknown_indexer_choice(plugin) -> None:
    from support.plugin import build_impl

    assert plugin.register() is True
    with pytest.raises(ValueError) as err:
        build_impl({"sparse_mla_indexer": "cuda"})
    assert str(err.value) == (
        "additional_config sparse_mla_indexer='cuda' is not one of auto, triton, deepgemm"
    )


@pytest.mark.parametrize(
    ("additional_config", "choice"),
    [({}, "auto"), ({"sparse_mla_indexer": "deepgemm"}, "deepgemm"), ({"other": 1}, "auto")],
)
def test_building_the_backend_reads_the_indexer_choice(plugin, additional_config, choice) -> None:
    from support.plugin import build_impl

    plugin.register()
    assert build_impl(additional_config).indexer == choice


def test_indexer_choice_validates_every_value() -> None:
    from vllm_sparse_mla import indexer_hook

    assert indexer_hook.CHOICES == ("auto", "triton", "deepgemm")
    for choice in indexer_hook.CHOICES:
        assert indexer_hook.indexer_choice({"sparse_mla_indexer": choice}) == choice
    assert indexer_hook.indexer_choice({}) == "auto"
    assert indexer_hook.indexer_choice(object()) == "auto"  # another plugin's config object
    for bad in ("Triton", "", None, 1, ["auto"]):
        with pytest.raises(ValueError, match="is not one of auto, triton, deepgemm"):
            indexer_hook.indexer_choice({"sparse_mla_indexer": bad})


@pytest.mark.parametrize(
    ("capability", "changes"),
    [
        ((12, 0), {}),
        ((12, 0), {"dtype": torch.bfloat16}),
        ((12, 1), {"block_size": None}),
        ((12, 0), {"kv_cache_dtype": "float16"}),
        ((9, 0), {"dtype": torch.bfloat16}),  # the H200 test machine
        ((10, 0), {}),
        ((12, 0), {"kv_cache_dtype": "fp8_ds_mla"}),
        ((12, 0), {"kv_cache_dtype": "fp8_ds_mla", "dtype": torch.bfloat16}),
    ],
)
def test_accepts_glm5_configurations(plugin, capability, changes) -> None:
    plugin.register()
    assert _verdict(capability, **changes) == []


@pytest.mark.parametrize(
    ("capability", "changes", "reasons"),
    [
        ((12, 0), {"dtype": torch.float32}, ["dtype not supported"]),
        ((12, 0), {"head_size": 128}, ["head_size not supported"]),
        ((12, 0), {"block_size": 16}, ["block_size not supported"]),
        *[
            (
                (12, 0),
                {"kv_cache_dtype": fp8},
                [
                    "kv_cache_dtype not supported",
                    f"kv_cache_dtype {fp8} is not read by SPARSE_TRITON_MLA: its fp8 cache is "
                    "FlashMLA's 656-byte rows, --kv-cache-dtype fp8_ds_mla",
                ],
            )
            for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_per_token_head")
        ],
        ((12, 0), {"use_sparse": False}, ["non-sparse not supported"]),
        ((12, 0), {"use_mla": False}, ["non-MLA not supported"]),
        ((8, 9), {}, ["compute capability not supported"]),
        ((11, 0), {}, ["compute capability not supported"]),
        ((12, 0), {"has_sink": True}, ["attention sinks not supported"]),
        (
            (12, 0),
            {"kv_cache_dtype": "bfloat16"},
            ["kv_cache_dtype bfloat16 differs from the model dtype torch.float16"],
        ),
        (
            (8, 0),
            {"dtype": torch.float32, "block_size": 32},
            ["dtype not supported", "block_size not supported", "compute capability not supported"],
        ),
    ],
)
def test_refuses_other_configurations_with_reasons(plugin, capability, changes, reasons) -> None:
    plugin.register()
    assert _verdict(capability, **changes) == reasons


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8_ds_mla"])
def test_cache_shape_matches_vllm_page_size(cache_dtype) -> None:
    """The tensor our get_kv_cache_shape describes holds exactly the bytes vLLM's MLA cache spec
    allocates per block (fp8_ds_mla: 656 B per token, uint8)."""
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    from vllm_sparse_mla.backend import SparseTritonMLABackend

    dtype = torch.float16 if cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=dtype,
                            cache_dtype_str=cache_dtype)  # fmt: skip
    shape = SparseTritonMLABackend.get_kv_cache_shape(3, 64, 1, 576, cache_dtype)
    assert shape == (3, 64, 576 if cache_dtype == "auto" else 656)
    elems = shape[1] * shape[2]
    assert spec.page_size_bytes == elems * torch.empty(0, dtype=dtype).element_size()


def test_impl_refuses_other_fp8_formats() -> None:
    from types import SimpleNamespace

    from vllm_sparse_mla.backend import SparseTritonMLAImpl

    indexer = SimpleNamespace(topk_indices_buffer=torch.zeros(2, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="--kv-cache-dtype fp8_ds_mla"):
        SparseTritonMLAImpl(8, 576, 0.1, 1, None, None, "fp8", None, "decoder", None,
                            indexer=indexer, kv_lora_rank=512)  # fmt: skip


IMPL_WRITE = """
import torch
from types import SimpleNamespace
from vllm_sparse_mla.backend import SparseTritonMLAImpl
from vllm_sparse_mla.kernels.fp8_ds_mla import quantize_rows

from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

indexer = SimpleNamespace(topk_indices_buffer=torch.zeros(2, 64, dtype=torch.int32))
with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
    impl = SparseTritonMLAImpl(8, 576, 0.1, 1, None, None, "fp8_ds_mla", None, "decoder", None,
                               indexer=indexer, kv_lora_rank=512)
g = torch.Generator().manual_seed(0)
kv_c = torch.randn(7, 512, generator=g).half()  # 2 rows of CUDA-graph padding past the slots
k_pe = torch.randn(7, 1, 64, generator=g).half()  # as MLAAttention passes it
cache = torch.full((2, 64, 656), 0xAB, dtype=torch.uint8)
slots = torch.tensor([3, -1, 64, 127, 5])
impl.do_kv_cache_update(kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.ones(()))
flat = cache.view(-1, 656)
want = quantize_rows(kv_c[:5], k_pe[:5].squeeze(1))
live = slots >= 0
assert torch.equal(flat[slots[live]], want[live])
rest = torch.ones(128, dtype=torch.bool)
rest[slots[live]] = False
assert torch.all(flat[rest] == 0xAB)
print("OK")
"""


def test_impl_writes_fp8_ds_mla_rows_through_vllms_cache_update_hook(repo) -> None:
    """do_kv_cache_update (what vLLM's MLAAttention calls) with kv_cache_dtype fp8_ds_mla writes
    our rows (Triton interpreter, a subprocess: TRITON_INTERPRET must precede triton's import)."""
    import os
    import subprocess
    import sys

    path = os.pathsep.join(str(repo / p) for p in ("tests", "backend/src"))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, "-c", IMPL_WRITE], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
