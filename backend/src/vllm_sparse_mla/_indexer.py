"""The DSA indexer's MQA-logits functions handed to vLLM's ``register_mqa_logits_impl`` hook.

Same signatures and semantics as ``fp8_fp4_mqa_logits`` / ``fp8_fp4_paged_mqa_logits`` in
``vllm/utils/deep_gemm.py`` (0.23.0). The Triton kernels are imported on first call, so
registering them at plugin load loads no torch or triton. No vllm import here.
"""

from __future__ import annotations

from typing import Any


def mqa_logits(*args: Any, **kwargs: Any) -> Any:
    """Prefill logits ``[M, N]`` fp32; see ``vllm_sparse_mla.kernels.mqa_logits``."""
    from vllm_sparse_mla.kernels import mqa_logits as impl

    return impl(*args, **kwargs)


def paged_mqa_logits(*args: Any, **kwargs: Any) -> Any:
    """Decode logits ``[B * next_n, max_model_len]`` fp32 over the paged fp8 indexer cache."""
    from vllm_sparse_mla.kernels import paged_mqa_logits as impl

    return impl(*args, **kwargs)
