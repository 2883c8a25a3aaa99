"""Sparse absorbed-MLA attention over top-k selected KV rows (DeepSeek DSA, GLM-5), in Triton.

Algorithm: FlashAttention-style online softmax (https://arxiv.org/abs/2205.14135) over the K rows
each query token selected (DeepSeek-V3.2 DSA, https://arxiv.org/abs/2512.02556). MLA is absorbed:
one shared 576-value KV row per token (512 latent + 64 rope); V is its first 512 values.

    out[t, h] = softmax_k(scale * q[t, h] . kv[idx[t, k]]) @ kv[idx[t, k], :512]

Layouts:
    q         [T, H, 576]  fp16/bf16, last dim contiguous
    kv_cache  [num_blocks, block_size, 576] same dtype (vLLM paged MLA cache, any block size),
              last dim contiguous; addressed by global slot = block * block_size + offset
    indices   [T, K] int32 global slots (after vLLM's triton_convert_req_index_to_global_index);
              -1 (or any id outside the cache) = empty
    out       [T, H, 512]  q's dtype

Semantics match vLLM 0.23.0's FlashMLA sparse path: a repeated index is a separate key each time
it appears (no deduplication, as FlashMLA and its reference ``reference_mla_sparse_prefill``);
a row without valid indices gives zeros (never NaN).

Two strategies, picked from (T, H, K) and the device's SM count only, so a CUDA graph captured
for one shape replays the same grid:
    decode   grid (head blocks x splits x T): each program gathers K/splits rows once for all heads
             of its head block, writes a partial (normalised out, log2-sum-exp) to the workspace;
             ``_combine_kernel`` merges the splits. Used while T * head_blocks is too small to
             fill the GPU.
    prefill  grid (head blocks x T), one pass over all K rows, output written directly.
Both use tl.dot for q.k^T ([BLOCK_H, 576] x [576, BLOCK_N]) and p.v ([BLOCK_H, BLOCK_N] x
[BLOCK_N, 512]) with fp32 accumulation. The loop is latency-bound (few rows per step, register-
limited occupancy), so two kernel forms trade registers for independent work in flight (chosen per
shape in ``_configs.py`` from H200 measurements, benchmarks/RESULTS.md):
    ``_sparse_mla_fwd_kernel``          one 512-column latent dot and accumulator
    ``_sparse_mla_fwd_chunked_kernel``  four independent 128-column dots and accumulators
each with an optional software-prefetched gather (rows of step i+1 and indices of step i+2 in
flight while step i computes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._capability import device_info
from ._configs import DECODE_PROGRAMS_PER_SM, AttnConfig, attn_config

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE
LOG2E = 1.4426950408889634


@triton.jit
def _gather_rows(
    kv_ptr, b_idx, num_slots, kv_block_size, stride_kvb, stride_kvs,
    D_LATENT: tl.constexpr, D_ROPE: tl.constexpr,
):  # fmt: skip
    """Gather the KV rows of BLOCK_N slot ids: (valid [N], latent [N, D_LATENT], rope [N, D_ROPE]);
    ids < 0 or >= num_slots are invalid and load zeros without touching memory."""
    m_valid = (b_idx >= 0) & (b_idx < num_slots)
    b_slot = tl.where(m_valid, b_idx, 0).to(tl.int64)
    p_row = kv_ptr + (b_slot // kv_block_size) * stride_kvb + (b_slot % kv_block_size) * stride_kvs
    o_dl = tl.arange(0, D_LATENT)
    o_dr = tl.arange(0, D_ROPE)
    # [BLOCK_N, D_LATENT] doubles as K (latent part) and V; [BLOCK_N, D_ROPE]
    b_kv = tl.load(p_row[:, None] + o_dl[None, :], mask=m_valid[:, None], other=0.0)
    b_kr = tl.load(p_row[:, None] + D_LATENT + o_dr[None, :], mask=m_valid[:, None], other=0.0)
    return m_valid, b_kv, b_kr


@triton.jit
def _sparse_mla_fwd_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    scale_log2,
    num_slots,
    kv_block_size,
    stride_qt,
    stride_qh,
    stride_kvb,
    stride_kvs,
    stride_it,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    TOPK: tl.constexpr,
    SPLITS: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_LATENT: tl.constexpr,
    D_ROPE: tl.constexpr,
    DOT_F32: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    tl.static_assert(BLOCK_H >= 16)
    tl.static_assert(TOPK % SPLITS == 0)
    pid = tl.program_id(0)
    i_hb = pid % HEAD_BLOCKS
    i_s = (pid // HEAD_BLOCKS) % SPLITS
    i_t = pid // (HEAD_BLOCKS * SPLITS)
    i_t64 = i_t.to(tl.int64)

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < NUM_HEADS
    o_dl = tl.arange(0, D_LATENT)
    o_dr = tl.arange(0, D_ROPE)

    # [BLOCK_H, D_LATENT], [BLOCK_H, D_ROPE]
    p_q = q_ptr + i_t64 * stride_qt + o_h[:, None].to(tl.int64) * stride_qh
    b_q_nope = tl.load(p_q + o_dl[None, :], mask=m_h[:, None], other=0.0)
    b_q_rope = tl.load(p_q + D_LATENT + o_dr[None, :], mask=m_h[:, None], other=0.0)
    if DOT_F32:
        b_q_nope = b_q_nope.to(tl.float32)
        b_q_rope = b_q_rope.to(tl.float32)

    b_m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_H], tl.float32)
    b_acc = tl.zeros([BLOCK_H, D_LATENT], tl.float32)

    K_PER_SPLIT: tl.constexpr = TOPK // SPLITS
    k_start = i_s * K_PER_SPLIT
    k_end = k_start + K_PER_SPLIT
    o_n = tl.arange(0, BLOCK_N)
    p_idx = idx_ptr + i_t64 * stride_it
    if PREFETCH:
        # Software pipeline: rows of step i+1 and indices of step i+2 are in flight while step i
        # computes, so neither the index load nor the row gather is on the critical path.
        b_idx = tl.load(p_idx + k_start + o_n, mask=k_start + o_n < k_end, other=-1)
        m_valid, b_kv, b_kr = _gather_rows(
            kv_ptr, b_idx, num_slots, kv_block_size, stride_kvb, stride_kvs, D_LATENT, D_ROPE
        )
        o_k1 = k_start + BLOCK_N + o_n
        b_idx_next = tl.load(p_idx + o_k1, mask=o_k1 < k_end, other=-1)
    for k0 in range(0, K_PER_SPLIT, BLOCK_N):
        if PREFETCH:
            m_cur, b_kv_cur, b_kr_cur = m_valid, b_kv, b_kr
            o_k2 = k_start + k0 + 2 * BLOCK_N + o_n
            b_idx_next2 = tl.load(p_idx + o_k2, mask=o_k2 < k_end, other=-1)
            m_valid, b_kv, b_kr = _gather_rows(
                kv_ptr, b_idx_next, num_slots, kv_block_size, stride_kvb, stride_kvs,
                D_LATENT, D_ROPE,
            )  # fmt: skip
            b_idx_next = b_idx_next2
        else:
            o_k = k_start + k0 + o_n
            # [BLOCK_N] global slot ids; invalid ones (-1, out of range) are masked.
            b_idx_cur = tl.load(p_idx + o_k, mask=o_k < k_end, other=-1)
            m_cur, b_kv_cur, b_kr_cur = _gather_rows(
                kv_ptr, b_idx_cur, num_slots, kv_block_size, stride_kvb, stride_kvs,
                D_LATENT, D_ROPE,
            )  # fmt: skip
        b_pv_dtype = b_kv_cur.dtype
        if DOT_F32:
            b_kv_cur = b_kv_cur.to(tl.float32)
            b_kr_cur = b_kr_cur.to(tl.float32)

        # [BLOCK_H, BLOCK_N] logits in log2 units
        b_s = tl.dot(b_q_nope, tl.trans(b_kv_cur))
        b_s = tl.dot(b_q_rope, tl.trans(b_kr_cur), b_s)
        b_s = tl.where(m_cur[None, :], b_s * scale_log2, float("-inf"))

        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
        b_p = tl.exp2(b_s - b_m_use[:, None])
        b_alpha = tl.exp2(b_m - b_m_use)
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        b_acc = b_acc * b_alpha[:, None]
        b_acc = tl.dot(b_p.to(b_pv_dtype).to(b_kv_cur.dtype), b_kv_cur, b_acc)
        b_m = b_m_new

    b_has = b_l > 0.0
    b_out = b_acc / tl.where(b_has, b_l, 1.0)[:, None]
    if SPLITS == 1:
        # [BLOCK_H, D_LATENT]
        p_o = out_ptr + i_t64 * stride_ot + o_h[:, None].to(tl.int64) * stride_oh + o_dl[None, :]
        tl.store(p_o, b_out.to(out_ptr.dtype.element_ty), mask=m_h[:, None])
    else:
        i_row = (i_t64 * SPLITS + i_s) * NUM_HEADS
        p_po = part_o_ptr + (i_row + o_h[:, None]) * D_LATENT + o_dl[None, :]
        tl.store(p_po, b_out, mask=m_h[:, None])
        b_lse = tl.where(b_has, b_m + tl.log2(tl.where(b_has, b_l, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + i_row + o_h, b_lse, mask=m_h)


@triton.jit
def _gather_rows_4(
    kv_ptr, b_idx, num_slots, kv_block_size, stride_kvb, stride_kvs,
    D_LATENT: tl.constexpr, D_ROPE: tl.constexpr,
):  # fmt: skip
    """As ``_gather_rows`` with the latent part as four [N, D_LATENT/4] column chunks."""
    DC: tl.constexpr = D_LATENT // 4
    m_valid = (b_idx >= 0) & (b_idx < num_slots)
    b_slot = tl.where(m_valid, b_idx, 0).to(tl.int64)
    p_row = kv_ptr + (b_slot // kv_block_size) * stride_kvb + (b_slot % kv_block_size) * stride_kvs
    p_c = p_row[:, None] + tl.arange(0, DC)[None, :]
    m_c = m_valid[:, None]
    b_k0 = tl.load(p_c, mask=m_c, other=0.0)
    b_k1 = tl.load(p_c + DC, mask=m_c, other=0.0)
    b_k2 = tl.load(p_c + 2 * DC, mask=m_c, other=0.0)
    b_k3 = tl.load(p_c + 3 * DC, mask=m_c, other=0.0)
    b_kr = tl.load(p_row[:, None] + D_LATENT + tl.arange(0, D_ROPE)[None, :], mask=m_c, other=0.0)
    return m_valid, b_k0, b_k1, b_k2, b_k3, b_kr


@triton.jit
def _sparse_mla_fwd_chunked_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    scale_log2,
    num_slots,
    kv_block_size,
    stride_qt,
    stride_qh,
    stride_kvb,
    stride_kvs,
    stride_it,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    TOPK: tl.constexpr,
    SPLITS: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_LATENT: tl.constexpr,
    D_ROPE: tl.constexpr,
    DOT_F32: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """Same contract as ``_sparse_mla_fwd_kernel``; the 512 latent columns are handled as four
    independent 128-column dots (q.k^T partial sums and p.v accumulators), which gives the
    scheduler four independent MMA chains instead of one long one (the loop is latency-bound)."""
    tl.static_assert(BLOCK_H >= 16)
    tl.static_assert(TOPK % SPLITS == 0)
    tl.static_assert(D_LATENT % 4 == 0)
    DC: tl.constexpr = D_LATENT // 4
    pid = tl.program_id(0)
    i_hb = pid % HEAD_BLOCKS
    i_s = (pid // HEAD_BLOCKS) % SPLITS
    i_t = pid // (HEAD_BLOCKS * SPLITS)
    i_t64 = i_t.to(tl.int64)

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < NUM_HEADS
    o_dc = tl.arange(0, DC)
    o_dr = tl.arange(0, D_ROPE)
    # [BLOCK_H, DC] x4, [BLOCK_H, D_ROPE]
    p_q = q_ptr + i_t64 * stride_qt + o_h[:, None].to(tl.int64) * stride_qh + o_dc[None, :]
    b_q0 = tl.load(p_q, mask=m_h[:, None], other=0.0)
    b_q1 = tl.load(p_q + DC, mask=m_h[:, None], other=0.0)
    b_q2 = tl.load(p_q + 2 * DC, mask=m_h[:, None], other=0.0)
    b_q3 = tl.load(p_q + 3 * DC, mask=m_h[:, None], other=0.0)
    p_qr = q_ptr + i_t64 * stride_qt + o_h[:, None].to(tl.int64) * stride_qh + D_LATENT
    b_qr = tl.load(p_qr + o_dr[None, :], mask=m_h[:, None], other=0.0)
    if DOT_F32:
        b_q0 = b_q0.to(tl.float32)
        b_q1 = b_q1.to(tl.float32)
        b_q2 = b_q2.to(tl.float32)
        b_q3 = b_q3.to(tl.float32)
        b_qr = b_qr.to(tl.float32)

    b_m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_H], tl.float32)
    b_a0 = tl.zeros([BLOCK_H, DC], tl.float32)
    b_a1 = tl.zeros([BLOCK_H, DC], tl.float32)
    b_a2 = tl.zeros([BLOCK_H, DC], tl.float32)
    b_a3 = tl.zeros([BLOCK_H, DC], tl.float32)

    K_PER_SPLIT: tl.constexpr = TOPK // SPLITS
    k_start = i_s * K_PER_SPLIT
    k_end = k_start + K_PER_SPLIT
    o_n = tl.arange(0, BLOCK_N)
    p_idx = idx_ptr + i_t64 * stride_it
    if PREFETCH:
        b_idx = tl.load(p_idx + k_start + o_n, mask=k_start + o_n < k_end, other=-1)
        m_valid, b_k0, b_k1, b_k2, b_k3, b_kr = _gather_rows_4(
            kv_ptr, b_idx, num_slots, kv_block_size, stride_kvb, stride_kvs, D_LATENT, D_ROPE
        )
        o_k1 = k_start + BLOCK_N + o_n
        b_idx_next = tl.load(p_idx + o_k1, mask=o_k1 < k_end, other=-1)
    for k0 in range(0, K_PER_SPLIT, BLOCK_N):
        if PREFETCH:
            m_cur, c_k0, c_k1, c_k2, c_k3, c_kr = m_valid, b_k0, b_k1, b_k2, b_k3, b_kr
            o_k2 = k_start + k0 + 2 * BLOCK_N + o_n
            b_idx_next2 = tl.load(p_idx + o_k2, mask=o_k2 < k_end, other=-1)
            m_valid, b_k0, b_k1, b_k2, b_k3, b_kr = _gather_rows_4(
                kv_ptr, b_idx_next, num_slots, kv_block_size, stride_kvb, stride_kvs,
                D_LATENT, D_ROPE,
            )  # fmt: skip
            b_idx_next = b_idx_next2
        else:
            o_k = k_start + k0 + o_n
            b_idx_cur = tl.load(p_idx + o_k, mask=o_k < k_end, other=-1)
            m_cur, c_k0, c_k1, c_k2, c_k3, c_kr = _gather_rows_4(
                kv_ptr, b_idx_cur, num_slots, kv_block_size, stride_kvb, stride_kvs,
                D_LATENT, D_ROPE,
            )  # fmt: skip
        b_pv_dtype = c_k0.dtype
        if DOT_F32:
            c_k0 = c_k0.to(tl.float32)
            c_k1 = c_k1.to(tl.float32)
            c_k2 = c_k2.to(tl.float32)
            c_k3 = c_k3.to(tl.float32)
            c_kr = c_kr.to(tl.float32)
        # [BLOCK_H, BLOCK_N] logits in log2 units: five independent partial dots
        b_s01 = tl.dot(b_q0, tl.trans(c_k0)) + tl.dot(b_q1, tl.trans(c_k1))
        b_s23 = tl.dot(b_q2, tl.trans(c_k2)) + tl.dot(b_q3, tl.trans(c_k3))
        b_s = (b_s01 + b_s23) + tl.dot(b_qr, tl.trans(c_kr))
        b_s = tl.where(m_cur[None, :], b_s * scale_log2, float("-inf"))

        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
        b_p = tl.exp2(b_s - b_m_use[:, None])
        b_alpha = tl.exp2(b_m - b_m_use)
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        b_p = b_p.to(b_pv_dtype).to(c_k0.dtype)
        b_a0 = tl.dot(b_p, c_k0, b_a0 * b_alpha[:, None])
        b_a1 = tl.dot(b_p, c_k1, b_a1 * b_alpha[:, None])
        b_a2 = tl.dot(b_p, c_k2, b_a2 * b_alpha[:, None])
        b_a3 = tl.dot(b_p, c_k3, b_a3 * b_alpha[:, None])
        b_m = b_m_new

    b_has = b_l > 0.0
    b_inv = 1.0 / tl.where(b_has, b_l, 1.0)
    if SPLITS == 1:
        # [BLOCK_H, DC] x4
        p_o = out_ptr + i_t64 * stride_ot + o_h[:, None].to(tl.int64) * stride_oh + o_dc[None, :]
        o_ty = out_ptr.dtype.element_ty
        tl.store(p_o, (b_a0 * b_inv[:, None]).to(o_ty), mask=m_h[:, None])
        tl.store(p_o + DC, (b_a1 * b_inv[:, None]).to(o_ty), mask=m_h[:, None])
        tl.store(p_o + 2 * DC, (b_a2 * b_inv[:, None]).to(o_ty), mask=m_h[:, None])
        tl.store(p_o + 3 * DC, (b_a3 * b_inv[:, None]).to(o_ty), mask=m_h[:, None])
    else:
        i_row = (i_t64 * SPLITS + i_s) * NUM_HEADS
        p_po = part_o_ptr + (i_row + o_h[:, None]) * D_LATENT + o_dc[None, :]
        tl.store(p_po, b_a0 * b_inv[:, None], mask=m_h[:, None])
        tl.store(p_po + DC, b_a1 * b_inv[:, None], mask=m_h[:, None])
        tl.store(p_po + 2 * DC, b_a2 * b_inv[:, None], mask=m_h[:, None])
        tl.store(p_po + 3 * DC, b_a3 * b_inv[:, None], mask=m_h[:, None])
        b_lse = tl.where(b_has, b_m + tl.log2(tl.where(b_has, b_l, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + i_row + o_h, b_lse, mask=m_h)


@triton.jit
def _combine_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    SPLITS: tl.constexpr,
    D_LATENT: tl.constexpr,
):
    pid = tl.program_id(0)
    i_t = (pid // NUM_HEADS).to(tl.int64)
    i_h = pid % NUM_HEADS
    o_s = tl.arange(0, SPLITS)
    o_d = tl.arange(0, D_LATENT)
    # [SPLITS] log2-sum-exp of each split (-inf = split had no valid row)
    b_lse = tl.load(part_lse_ptr + (i_t * SPLITS + o_s) * NUM_HEADS + i_h)
    b_max = tl.max(b_lse, axis=0)
    b_max = tl.where(b_max == float("-inf"), 0.0, b_max)
    b_w = tl.exp2(b_lse - b_max)
    b_den = tl.sum(b_w, axis=0)
    b_acc = tl.zeros([D_LATENT], tl.float32)
    # [CHUNK, D_LATENT] partial tiles: independent loads, few dependent round trips
    CHUNK: tl.constexpr = 16 if SPLITS > 16 else SPLITS
    for s0 in range(0, SPLITS, CHUNK):
        o_c = s0 + tl.arange(0, CHUNK)
        i_rows = (i_t * SPLITS + o_c) * NUM_HEADS + i_h
        b_wc = tl.exp2(tl.load(part_lse_ptr + i_rows) - b_max)
        b_tile = tl.load(part_o_ptr + i_rows[:, None] * D_LATENT + o_d[None, :])
        b_acc += tl.sum(b_wc[:, None] * b_tile, axis=0)
    b_out = b_acc / tl.where(b_den > 0.0, b_den, 1.0)
    p_o = out_ptr + i_t * stride_ot + i_h * stride_oh + o_d
    tl.store(p_o, b_out.to(out_ptr.dtype.element_ty))


# ----------------------------------------------------------------------------------------------
# Launch planning and workspace
# ----------------------------------------------------------------------------------------------


def _pow2_floor(x: int) -> int:
    return 1 << (max(x, 1).bit_length() - 1)


def plan(
    num_tokens: int, num_heads: int, topk: int, num_sms: int
) -> tuple[bool, AttnConfig, int, int]:
    """(use_split, config, head_blocks, splits) for a shape; depends on shapes and SM count only."""
    cfg = attn_config(num_heads, prefill=False)
    head_blocks = triton.cdiv(num_heads, cfg.block_h)
    target = DECODE_PROGRAMS_PER_SM * num_sms
    max_splits = max(topk // cfg.block_n, 1)
    splits = 1
    while (
        splits * 2 <= max_splits
        and num_tokens * head_blocks * splits * 2 <= target
        and topk % (splits * 2 * cfg.block_n) == 0
    ):
        splits *= 2
    if splits > 1:
        return True, cfg, head_blocks, splits
    cfg = attn_config(num_heads, prefill=True)
    return False, cfg, triton.cdiv(num_heads, cfg.block_h), 1


class SparseMLAWorkspace:
    """Preallocated split-K partials for ``sparse_mla_attention`` (allocate once per layer/impl).

    Holds ``part_o`` [R, H, 512] fp32 (per split, softmax-normalised partial outputs) and
    ``part_lse`` [R, H] fp32 (their log2-sum-exp), with R = the largest tokens x splits any
    T <= max_tokens uses on ``device``; R is bounded by the decode target of 4 programs per SM,
    not by max_tokens (H=64 on a 132-SM H200: R=264, 35 MB; H=8: R=528, 8.7 MB). ``dtype`` is
    accepted for interface symmetry; the partials are always fp32.
    """

    def __init__(
        self,
        max_tokens: int,
        num_heads: int,
        topk: int,
        device: torch.device | str,
        dtype: torch.dtype = torch.float16,
    ) -> None:
        if max_tokens < 1 or num_heads < 1 or topk < 1:
            raise ValueError(
                f"max_tokens, num_heads, topk must be >= 1, got {max_tokens}, {num_heads}, {topk}"
            )
        self.device = torch.device(device)
        self.max_tokens = max_tokens
        self.num_heads = num_heads
        self.topk = topk
        self.dtype = dtype
        num_sms = device_info(self.device).num_sms
        rows = 0
        t = 1
        while t <= max_tokens:
            use_split, _, _, splits = plan(t, num_heads, topk, num_sms)
            if not use_split:
                break
            rows = max(rows, t * splits)
            t += 1
        self.rows = rows
        self.part_o = torch.empty((max(rows, 1), num_heads, D_LATENT), dtype=torch.float32,
                                  device=self.device)  # fmt: skip
        self.part_lse = torch.empty((max(rows, 1), num_heads), dtype=torch.float32,
                                    device=self.device)  # fmt: skip


def make_workspace(
    max_tokens: int,
    num_heads: int,
    topk: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float16,
) -> SparseMLAWorkspace:
    """Same as ``SparseMLAWorkspace(...)``."""
    return SparseMLAWorkspace(max_tokens, num_heads, topk, device, dtype)


def _check(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor) -> None:
    if q.dim() != 3 or q.shape[-1] != D_QK:
        raise ValueError(f"q must be [T, H, {D_QK}], got {tuple(q.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q must be float16 or bfloat16, got {q.dtype}")
    if kv_cache.dtype != q.dtype:
        raise TypeError(f"kv_cache dtype {kv_cache.dtype} differs from q dtype {q.dtype}")
    if kv_cache.dim() == 4 and kv_cache.shape[2] == 1:
        pass
    elif kv_cache.dim() != 3 or kv_cache.shape[-1] != D_QK:
        raise ValueError(
            f"kv_cache must be [num_blocks, block_size, {D_QK}], got {tuple(kv_cache.shape)}"
        )
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"indices must be [T={q.shape[0]}, K], got {tuple(indices.shape)}")
    if indices.dtype != torch.int32:
        raise TypeError(f"indices must be int32, got {indices.dtype}")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1 or indices.stride(-1) != 1:
        raise ValueError("q, kv_cache and indices need a contiguous last dimension")
    if not (q.device == kv_cache.device == indices.device):
        raise ValueError("q, kv_cache and indices must be on one device")


def sparse_mla_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    workspace: SparseMLAWorkspace | None = None,
) -> torch.Tensor:
    """Sparse MLA attention; see the module docstring for the computation and layouts.

    Args:
        q: [T, H, 576] fp16/bf16 (512 latent + 64 rope), last dim contiguous.
        kv_cache: [num_blocks, block_size, 576] (or [num_blocks, block_size, 1, 576]), q's dtype.
        indices: [T, K] int32 global slot ids, -1 = empty. K must be a multiple of 16.
        scale: softmax scale applied to the full 576-value dot product.
        out: optional [T, H, 512] in q's dtype (written fully; any prior content ignored).
        workspace: optional ``SparseMLAWorkspace``; with it the call allocates nothing.

    Returns ``out``. Raises ValueError/TypeError on bad shapes, dtypes or devices. No host sync:
    safe inside CUDA-graph capture.
    """
    _check(q, kv_cache, indices)
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(2)
    num_tokens, num_heads, _ = q.shape
    topk = indices.shape[1]
    if topk % 16 != 0:
        raise ValueError(f"top-k width must be a multiple of 16, got {topk}")
    if out is None:
        out = torch.empty((num_tokens, num_heads, D_LATENT), dtype=q.dtype, device=q.device)
    elif out.shape != (num_tokens, num_heads, D_LATENT) or out.dtype != q.dtype:
        raise ValueError(
            f"out must be [{num_tokens}, {num_heads}, {D_LATENT}] {q.dtype}, "
            f"got {tuple(out.shape)} {out.dtype}"
        )
    elif out.stride(-1) != 1:
        raise ValueError("out needs a contiguous last dimension")
    if num_tokens == 0:
        return out

    info = device_info(q.device)
    use_split, cfg, head_blocks, splits = plan(num_tokens, num_heads, topk, info.num_sms)
    _launch(q, kv_cache, indices, scale, out, workspace, cfg, head_blocks, splits)
    return out


def _launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    workspace: SparseMLAWorkspace | None,
    cfg: AttnConfig,
    head_blocks: int,
    splits: int,
) -> None:
    """Launch with an explicit plan (the benchmark sweeps configs through this)."""
    num_tokens, num_heads, _ = q.shape
    topk = indices.shape[1]
    use_split = splits > 1
    if use_split:
        if workspace is None:
            part_o = torch.empty((num_tokens * splits, num_heads, D_LATENT), dtype=torch.float32,
                                 device=q.device)  # fmt: skip
            part_lse = torch.empty((num_tokens * splits, num_heads), dtype=torch.float32,
                                   device=q.device)  # fmt: skip
        else:
            if workspace.num_heads != num_heads or workspace.rows < num_tokens * splits:
                raise ValueError(
                    f"workspace (max_tokens={workspace.max_tokens}, heads={workspace.num_heads})"
                    f" too small for T={num_tokens}, H={num_heads}, K={topk}"
                )
            part_o, part_lse = workspace.part_o, workspace.part_lse
    else:
        part_o = part_lse = out  # unused by the kernel when SPLITS == 1

    grid = (num_tokens * splits * head_blocks,)
    kernel = _sparse_mla_fwd_chunked_kernel if cfg.chunked else _sparse_mla_fwd_kernel
    kernel[grid](
        q,
        kv_cache,
        indices,
        out,
        part_o,
        part_lse,
        float(scale) * LOG2E,
        kv_cache.shape[0] * kv_cache.shape[1],
        kv_cache.shape[1],
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        indices.stride(0),
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        TOPK=topk,
        SPLITS=splits,
        HEAD_BLOCKS=head_blocks,
        BLOCK_H=cfg.block_h,
        BLOCK_N=cfg.block_n,
        D_LATENT=D_LATENT,
        D_ROPE=D_ROPE,
        # Triton 3.6's interpreter mis-computes bf16 tl.dot (integer-like garbage); on CPU the
        # bf16 operands are upcast to fp32 (exact), so CI checks the same math.
        DOT_F32=q.device.type != "cuda" and q.dtype == torch.bfloat16,
        PREFETCH=cfg.prefetch,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if use_split:
        _combine_kernel[(num_tokens * num_heads,)](
            part_o,
            part_lse,
            out,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            SPLITS=splits,
            D_LATENT=D_LATENT,
            num_warps=4,
        )


__all__ = [
    "SparseMLAWorkspace",
    "make_workspace",
    "plan",
    "sparse_mla_attention",
]
