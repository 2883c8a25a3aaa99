"""Triton kernels for sparse MLA attention and the DSA indexer (imports only torch and triton).

Public API (the vLLM glue in ``vllm_sparse_mla.backend`` codes against these names):
    sparse_mla_attention, SparseMLAWorkspace, make_workspace  (sparse_mla.py)
    mqa_logits, paged_mqa_logits, paged_mqa_logits_metadata, topk_indices  (indexer.py)
``reference`` holds the pure-torch specification of each.
"""

from __future__ import annotations

import importlib

# name -> submodule. Loaded on first use (PEP 562), so that the torch-free modules (``_dims``,
# ``_configs``) import without torch or triton, e.g. for benchmarks/bench_kernels.py's byte counts.
_EXPORTS = {
    "SparseMLAWorkspace": "sparse_mla",
    "make_workspace": "sparse_mla",
    "sparse_mla_attention": "sparse_mla",
    "mqa_logits": "indexer",
    "paged_mqa_logits": "indexer",
    "paged_mqa_logits_metadata": "indexer",
    "topk_indices": "indexer",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "SparseMLAWorkspace",
    "make_workspace",
    "mqa_logits",
    "paged_mqa_logits",
    "paged_mqa_logits_metadata",
    "sparse_mla_attention",
    "topk_indices",
]
