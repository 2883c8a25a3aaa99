"""Attention metadata and its builder for the sparse Triton MLA backend (vLLM 0.23.0 glue).

The builder keeps every tensor the kernels read at a fixed address (``req_id_per_token`` is a
persistent, zero-filled buffer; the block table and the indexer's top-k buffer are vLLM's own
persistent buffers), so full CUDA graphs of uniform decode batches can be captured and replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionMetadata,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import AttentionSpec


@dataclass
class SparseTritonMLAMetadata(AttentionMetadata):
    """What ``SparseTritonMLAImpl.forward_mqa`` needs for one forward pass."""

    num_reqs: int
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int  # tokens excluding CUDA-graph padding; read by MLAAttention
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32 (the MLA cache's block table)
    req_id_per_token: torch.Tensor  # [num_actual_tokens] int32, request row of each token
    block_size: int = 64
    topk_tokens: int = 2048  # index_topk: width of the indexer's top-k rows


class SparseTritonMLAMetadataBuilder(AttentionMetadataBuilder[SparseTritonMLAMetadata]):
    """Builds :class:`SparseTritonMLAMetadata`; CUDA graphs for uniform (spec-)decode batches."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # Single-token queries (plus speculative tokens) are decodes; the kernels treat every
        # token alike, the threshold only keeps the batch order vLLM's indexer expects.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.topk_tokens = int(vllm_config.model_config.hf_config.index_topk)
        self.req_id_per_token_buffer = torch.zeros(
            (vllm_config.scheduler_config.max_num_batched_tokens,),
            dtype=torch.int32,
            device=device,
        )

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> SparseTritonMLAMetadata:
        cm = common_attn_metadata
        starts = np.asarray(cm.query_start_loc_cpu, dtype=np.int32)
        req_ids = np.repeat(np.arange(starts.shape[0] - 1, dtype=np.int32), np.diff(starts))
        # Zero-fill so rows past the real tokens (CUDA-graph padding) name a valid request.
        self.req_id_per_token_buffer.fill_(0)
        self.req_id_per_token_buffer[: req_ids.shape[0]].copy_(
            torch.from_numpy(req_ids), non_blocking=True
        )
        return SparseTritonMLAMetadata(
            num_reqs=cm.num_reqs,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            num_actual_tokens=cm.num_actual_tokens,
            query_start_loc=cm.query_start_loc,
            slot_mapping=cm.slot_mapping,
            block_table=cm.block_table_tensor,
            req_id_per_token=self.req_id_per_token_buffer[: cm.num_actual_tokens],
            block_size=self.kv_cache_spec.block_size,
            topk_tokens=self.topk_tokens,
        )
