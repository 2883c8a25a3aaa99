"""MLA head sizes, defined once: the kernels, ``reference`` and the vLLM backend import them."""

from __future__ import annotations

D_LATENT = 512  # kv_lora_rank: the latent part of q/k, and all of v
D_ROPE = 64  # qk_rope_head_dim
D_QK = D_LATENT + D_ROPE  # 576: one KV-cache row, one absorbed q head

__all__ = ["D_LATENT", "D_QK", "D_ROPE"]
