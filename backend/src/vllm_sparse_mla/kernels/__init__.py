"""Triton kernels for sparse MLA attention and the DSA indexer (imports only torch and triton).

Public API (the vLLM glue in ``vllm_sparse_mla.backend`` codes against these names):
    sparse_mla_attention, SparseMLAWorkspace, make_workspace  (sparse_mla.py)
    mqa_logits, paged_mqa_logits, paged_mqa_logits_metadata, topk_indices  (indexer.py)
``reference`` holds the pure-torch specification of each.
"""

from __future__ import annotations

from .indexer import mqa_logits, paged_mqa_logits, paged_mqa_logits_metadata, topk_indices
from .sparse_mla import SparseMLAWorkspace, make_workspace, sparse_mla_attention

__all__ = [
    "SparseMLAWorkspace",
    "make_workspace",
    "mqa_logits",
    "paged_mqa_logits",
    "paged_mqa_logits_metadata",
    "sparse_mla_attention",
    "topk_indices",
]
