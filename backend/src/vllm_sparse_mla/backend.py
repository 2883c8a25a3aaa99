"""Sparse Triton MLA attention backend for vLLM 0.23.0 (registered as ``CUSTOM``).

GLM-5 / DeepSeek-V3.2 sparse MLA: each query token attends only to the ``index_topk`` cache rows
chosen by the DSA indexer. vLLM hands ``forward_mqa`` the absorbed query ``(ql_nope [T, H, 512],
q_pe [T, H, 64])`` and the MLA cache ``[num_blocks, 64, 576]`` (512 latent + 64 rope per token,
in the model dtype); the output is ``[T, H, 512]`` in the query dtype, which vLLM projects up
with W_UV. The math lives in ``vllm_sparse_mla.kernels`` (torch + triton only).

Accepted configurations: MLA, sparse, head size 576, float16 / bfloat16, kv-cache dtype auto (or
the model dtype spelled out) or ``fp8_ds_mla`` (FlashMLA's 656-byte rows: 512 e4m3 + 4 fp32
scales + 64 rope values in the model dtype, written by our Triton kernel, see
``kernels/fp8_ds_mla.py``), block size 64, compute capability 9.x, 10.x or 12.x.
Other fp8 formats are refused: vLLM 0.23.0 maps ``--kv-cache-dtype fp8`` to fp8_ds_mla only for
the FLASHMLA_SPARSE backend; for CUSTOM it would allocate per-tensor fp8 rows of 576 bytes,
which no kernel here reads, so the error names the flag to use instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.config import get_current_vllm_config
from vllm.config.cache import CacheDType
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionLayer,
    MultipleOf,
    SparseMLAAttentionImpl,
)
from vllm.v1.attention.backends.mla.sparse_utils import (
    triton_convert_req_index_to_global_index,
)

from vllm_sparse_mla import debug_dump, indexer_hook
from vllm_sparse_mla.kernels._dims import D_LATENT, D_QK, FP8_ROW_BYTES
from vllm_sparse_mla.metadata import SparseTritonMLAMetadata, SparseTritonMLAMetadataBuilder

if TYPE_CHECKING:
    from vllm_sparse_mla.kernels import SparseMLAWorkspace

HEAD_SIZE = D_QK  # kv_lora_rank 512 + qk_rope_head_dim 64, defined once in kernels._dims
KV_LORA_RANK = D_LATENT
BLOCK_SIZE = 64
COMPUTE_CAPABILITY_MAJORS = (9, 10, 12)
FP8_DS_MLA = "fp8_ds_mla"
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


class SparseTritonMLABackend(AttentionBackend):
    """The backend class vLLM validates and instantiates; see the module docstring."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [
        "auto",
        "float16",
        "bfloat16",
        FP8_DS_MLA,
    ]

    @staticmethod
    def get_name() -> str:
        return "SPARSE_TRITON_MLA"

    @staticmethod
    def get_impl_cls() -> type[SparseTritonMLAImpl]:
        return SparseTritonMLAImpl

    @staticmethod
    def get_builder_cls() -> type[SparseTritonMLAMetadataBuilder]:
        return SparseTritonMLAMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [BLOCK_SIZE]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [HEAD_SIZE]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return capability.major in COMPUTE_CAPABILITY_MAJORS

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: CacheDType | None,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        # The kernels read cache rows in the query dtype: an explicit kv-cache dtype must be it.
        if kv_cache_dtype in ("float16", "bfloat16") and _DTYPE_NAMES.get(dtype) != kv_cache_dtype:
            return f"kv_cache_dtype {kv_cache_dtype} differs from the model dtype {dtype}"
        if kv_cache_dtype is not None and kv_cache_dtype not in cls.supported_kv_cache_dtypes:
            return _refusal(kv_cache_dtype)
        return None

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,  # 1 for MLA
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        if cache_dtype_str == FP8_DS_MLA:
            return (num_blocks, block_size, FP8_ROW_BYTES)  # uint8, as MLAAttentionSpec sizes it
        return (num_blocks, block_size, head_size)


def _refusal(kv_cache_dtype: str) -> str:
    if "fp8" in kv_cache_dtype:
        return (
            f"kv_cache_dtype {kv_cache_dtype} is not read by SPARSE_TRITON_MLA: its fp8 cache is "
            f"FlashMLA's 656-byte rows, --kv-cache-dtype {FP8_DS_MLA}"
        )
    return f"kv_cache_dtype {kv_cache_dtype} is not supported by SPARSE_TRITON_MLA"


_workspaces: dict[tuple[Any, ...], SparseMLAWorkspace] = {}


def _shared_workspace(
    max_tokens: int, num_heads: int, topk: int, device: torch.device, dtype: torch.dtype
) -> SparseMLAWorkspace:
    """One split-K workspace per shape, shared by all layers (they run one after another)."""
    from vllm_sparse_mla.kernels import SparseMLAWorkspace

    key = (max_tokens, num_heads, topk, str(device), dtype)
    if key not in _workspaces:
        _workspaces[key] = SparseMLAWorkspace(max_tokens, num_heads, topk, device, dtype)
    return _workspaces[key]


class SparseTritonMLAImpl(SparseMLAAttentionImpl[SparseTritonMLAMetadata]):
    """Sparse MLA over the indexer's top-k rows: every token goes through ``forward_mqa``."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        # MLA specific arguments
        indexer: Any | None = None,
        **mla_args: Any,
    ) -> None:
        if indexer is None or getattr(indexer, "topk_indices_buffer", None) is None:
            raise ValueError(
                "SPARSE_TRITON_MLA needs the DSA indexer's topk_indices_buffer "
                "(a model with index_topk, e.g. GLM-5 or DeepSeek-V3.2)"
            )
        if head_size != HEAD_SIZE or mla_args.get("kv_lora_rank") != KV_LORA_RANK:
            raise ValueError(
                f"SPARSE_TRITON_MLA supports head_size {HEAD_SIZE} with kv_lora_rank "
                f"{KV_LORA_RANK}, got {head_size} / {mla_args.get('kv_lora_rank')}"
            )
        if self.dcp_world_size > 1:  # set by AttentionImplBase.__new__
            raise ValueError(
                "SPARSE_TRITON_MLA does not return the LSE that decode context "
                "parallelism needs; run without --decode-context-parallel-size"
            )
        if kv_cache_dtype not in SparseTritonMLABackend.supported_kv_cache_dtypes:
            raise ValueError(_refusal(kv_cache_dtype))
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_lora_rank = KV_LORA_RANK
        self.topk_indices_buffer: torch.Tensor = indexer.topk_indices_buffer
        self.dump_topk = debug_dump.target()  # VLLM_SPARSE_MLA_DUMP_TOPK: proofs only
        self.workspace: SparseMLAWorkspace | None = None
        vllm_config = get_current_vllm_config()
        # The explicit indexer choice (--additional-config sparse_mla_indexer): validated here,
        # where a bad value fails the model build that asked for it.
        self.indexer = indexer_hook.indexer_choice(vllm_config.additional_config)
        indexer_hook.apply(self.indexer)
        if torch.cuda.is_available() and vllm_config.model_config is not None:
            # Allocated while the model is built, so vLLM's memory profile counts it before
            # sizing the KV cache; never inside a CUDA-graph capture.
            self.workspace = _shared_workspace(
                vllm_config.scheduler_config.max_num_batched_tokens,
                num_heads,
                self.topk_indices_buffer.shape[1],
                torch.device("cuda", torch.cuda.current_device()),
                vllm_config.model_config.dtype,
            )

    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
    ) -> None:
        if kv_cache_dtype != FP8_DS_MLA:
            super().do_kv_cache_update(
                kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale
            )
            return
        if kv_cache.numel() == 0:
            return
        # Not vLLM's concat_and_cache_mla: its fp16 ds_mla variant computes wrong scales (README
        # "FP8 KV cache"); ours is bit-exact to FlashMLA's rule for fp16 and bf16. k_scale is
        # unused: the row carries its own scales.
        from vllm_sparse_mla.kernels.fp8_ds_mla import write_fp8_ds_mla

        write_fp8_ds_mla(kv_c_normed, k_pe, kv_cache, slot_mapping.flatten())

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: SparseTritonMLAMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        from vllm_sparse_mla.kernels import sparse_mla_attention

        if isinstance(q, tuple):  # (ql_nope [T, H, 512], q_pe [T, H, 64]) -> [T, H, 576]
            q = torch.cat(q, dim=-1)
        num_tokens = q.shape[0]
        if self.dump_topk is not None:
            debug_dump.maybe_dump(
                self.dump_topk,
                str(getattr(layer, "layer_name", id(layer))),
                self.topk_indices_buffer[:num_tokens],
            )
        # Per-request token positions from the indexer ([T, topk], -1 = empty) -> global cache
        # slots, -1 kept.
        indices = triton_convert_req_index_to_global_index(
            attn_metadata.req_id_per_token,
            attn_metadata.block_table,
            self.topk_indices_buffer[:num_tokens],
            BLOCK_SIZE=attn_metadata.block_size,
            NUM_TOPK_TOKENS=self.topk_indices_buffer.shape[1],
        )
        out = sparse_mla_attention(
            q, kv_c_and_k_pe_cache, indices, self.scale, workspace=self.workspace
        )
        return out, None
