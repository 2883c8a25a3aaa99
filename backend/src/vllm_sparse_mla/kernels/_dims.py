"""MLA head sizes, defined once: the kernels, ``reference`` and the vLLM backend import them."""

from __future__ import annotations

D_LATENT = 512  # kv_lora_rank: the latent part of q/k, and all of v
D_ROPE = 64  # qk_rope_head_dim
D_QK = D_LATENT + D_ROPE  # 576: one KV-cache row, one absorbed q head
# fp8_ds_mla row: 512 e4m3 + 4 fp32 scales + 64 16-bit rope values (kernels/fp8_ds_mla.py)
FP8_ROW_BYTES = D_LATENT + 4 * 4 + 2 * D_ROPE  # 656

__all__ = ["D_LATENT", "D_QK", "D_ROPE", "FP8_ROW_BYTES"]
