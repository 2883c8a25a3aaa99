"""Pure-torch specification of every kernel in this package (slow; tests and benchmarks only).

Each function computes in float32 from the same inputs the Triton launchers take and returns
what they must return. Contracts follow vLLM 0.23.0:

- ``sparse_mla``: FlashMLA sparse attention as its reference
  (``vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py: reference_mla_sparse_prefill``):
  indices < 0 or >= number of slots are empty; a repeated index is an ordinary key each time it
  appears (FlashMLA does not deduplicate); a row without any valid index gives zeros.
- ``mqa_logits`` / ``paged_mqa_logits``: DeepGEMM ``fp8_fp4_mqa_logits`` /
  ``fp8_fp4_paged_mqa_logits`` (FP8 path) as ``fp8_mqa_logits_torch`` /
  ``fp8_paged_mqa_logits_torch`` in ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py``.
- ``topk_indices``: the CUDA ``top_k_per_row_*`` contract, written independently of
  ``indexer.topk_indices`` (a stable full sort, not torch.topk).

On CPU the attention reference accumulates in float64, on GPUs in float32.
"""

from __future__ import annotations

import torch

from ._dims import D_LATENT, D_QK, D_ROPE

__all__ = ["D_LATENT", "D_QK", "D_ROPE", "mqa_logits", "paged_mqa_logits", "sparse_mla",
           "topk_indices"]  # fmt: skip


def sparse_mla(
    q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse absorbed-MLA attention.

    q [T, H, 576], kv_cache [num_blocks, block_size, 576] (or any [..., 576], read as flat slots),
    indices [T, K] int global slot ids (-1 = empty). Returns (out [T, H, 512] in q's dtype,
    lse [T, H] float32, natural log, -inf for an empty row).
    """
    acc = torch.float64 if q.device.type == "cpu" else torch.float32
    kv = kv_cache.reshape(-1, kv_cache.shape[-1]).to(acc)
    num_slots = kv.shape[0]
    idx = indices.long()
    valid = (idx >= 0) & (idx < num_slots)
    rows = kv[torch.where(valid, idx, 0)]  # [T, K, 576]
    s = torch.einsum("thd,tkd->thk", q.to(acc), rows) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [T, H]
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.einsum("thk,tkd->thd", p, rows[..., :D_LATENT])
    return out.to(q.dtype), lse.float()


def mqa_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
) -> torch.Tensor:
    """Indexer logits, contiguous keys: q [M, H, D] fp8, k [N, D] fp8, k_scale [N] fp32,
    weights [M, H] fp32, key range [ks[m], ke[m]) per row. Returns [M, N] fp32, -inf outside."""
    score = torch.einsum("mhd,nd->mhn", q.float(), k.float())
    logits = (score.relu() * weights.float()[..., None]).sum(dim=1) * k_scale.reshape(1, -1)
    n = torch.arange(k.shape[0], device=q.device)
    mask = (n[None, :] >= cu_seqlen_ks[:, None]) & (n[None, :] < cu_seqlen_ke[:, None])
    return logits.masked_fill(~mask, float("-inf"))


def paged_row_limits(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """Exclusive key limit per logits row [B * next_n], as DeepGEMM reads ``context_lens``:
    [B] = length including the next_n new tokens (row j sees ctx - next_n + j + 1 keys);
    [B, next_n] = per-row limit; [B, 1] = the same limit for every row of the request."""
    if context_lens.dim() == 1:
        j = torch.arange(next_n, device=context_lens.device)
        lim = context_lens.long()[:, None] - next_n + 1 + j[None, :]
    else:
        lim = context_lens.long().expand(batch, next_n)
    return lim.reshape(-1)


def paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_model_len: int,
) -> torch.Tensor:
    """Indexer logits, paged fp8 keys: q [B, next_n, H, D] fp8; kv_cache uint8
    [num_blocks, block_size, 1, D + 4] whose block holds block_size*D fp8 values and then
    block_size fp32 scales; weights [B * next_n, H] fp32; context_lens [B] or [B, next_n] int32;
    block_tables [B, max_blocks] int32. Returns [B * next_n, max_model_len] fp32, -inf past the
    causal limit."""
    b, next_n, h, d = q.shape
    nb, bs = kv_cache.shape[0], kv_cache.shape[1]
    flat = kv_cache.reshape(nb, bs * (d + 4))
    vals = flat[:, : bs * d].contiguous().view(torch.float8_e4m3fn).float().view(nb, bs, d)
    scales = flat[:, bs * d :].contiguous().view(torch.float32).view(nb, bs)
    pos = torch.arange(max_model_len, device=q.device)
    blk = block_tables.long()[:, (pos // bs).clamp_max(block_tables.shape[1] - 1)]  # [B, L]
    keys = vals[blk, pos % bs]  # [B, L, D]
    ksc = scales[blk, pos % bs]  # [B, L]
    score = torch.einsum("bjhd,bld->bjhl", q.float(), keys).relu()
    w = weights.float().view(b, next_n, h, 1)
    logits = (score * w).sum(dim=2) * ksc[:, None, :]  # [B, next_n, L]
    logits = logits.reshape(b * next_n, max_model_len)
    lim = paged_row_limits(context_lens, b, next_n)
    return logits.masked_fill(pos[None, :] >= lim[:, None], float("-inf"))


def topk_indices(
    logits: torch.Tensor,
    topk: int,
    row_starts: torch.Tensor | None = None,
    row_ends: torch.Tensor | None = None,
) -> torch.Tensor:
    """Top-k columns per row of ``logits`` [M, N] inside [row_starts, row_ends) (whole row when
    None), as int32 [M, topk], relative to row_starts, in descending logit order (ties: lower
    column first), -1 for missing/-inf entries. A stable full sort per row."""
    m, n = logits.shape
    lo = torch.zeros(m, dtype=torch.long) if row_starts is None else row_starts.long().cpu()
    hi = torch.full((m,), n, dtype=torch.long) if row_ends is None else row_ends.long().cpu()
    x = logits.detach().double().cpu()
    out = torch.full((m, topk), -1, dtype=torch.int32)
    for r in range(m):
        s, e = int(lo[r]), max(int(lo[r]), min(int(hi[r]), n))
        row = x[r, s:e]
        order = torch.sort(row, descending=True, stable=True).indices
        order = order[torch.isfinite(row[order]) | (row[order] > 0)][:topk]
        out[r, : order.numel()] = order.to(torch.int32)
    return out.to(logits.device)
