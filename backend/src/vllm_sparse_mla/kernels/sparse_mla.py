"""Sparse absorbed-MLA attention over top-k selected KV rows (DeepSeek DSA, GLM-5), in Triton.

Algorithm: FlashAttention-style online softmax (https://arxiv.org/abs/2205.14135) over the K rows
each query token selected (DeepSeek-V3.2 DSA, https://arxiv.org/abs/2512.02556). MLA is absorbed:
one shared 576-value KV row per token (512 latent + 64 rope); V is its first 512 values.

    out[t, h] = softmax_k(scale * q[t, h] . kv[idx[t, k]]) @ kv[idx[t, k], :512]

Layouts:
    q         [T, H, 576]  fp16/bf16, last dim contiguous
    kv_cache  [num_blocks, block_size, 576] same dtype (vLLM paged MLA cache, any block size),
              last dim contiguous; addressed by global slot = block * block_size + offset;
              or uint8 [num_blocks, block_size, 656] fp8_ds_mla rows (FP8_DS_MLA: dequantized
              to q's dtype in registers after the gather, which moves half the bytes)
    indices   [T, K] int32 global slots (after vLLM's triton_convert_req_index_to_global_index);
              -1 (or any id outside the cache) = empty
    out       [T, H, 512]  q's dtype

Semantics match vLLM 0.23.0's FlashMLA sparse path: a repeated index is a separate key each time
it appears (no deduplication, as FlashMLA and its reference ``reference_mla_sparse_prefill``);
a row without valid indices gives zeros (never NaN).

One kernel, ``_sparse_mla_kernel``, serves both strategies; a program owns (token, split, head
block) and walks its tiles of BLOCK_N indices:
    decode   SPLITS > 1: split s takes tiles s, s + S, s + 2S, ... (interleaved, so a -1 tail
             thins every split alike), writes a partial (normalised out, log2-sum-exp) to the
             workspace; ``_combine_kernel`` merges all splits of a (token, head, column block) in
             one load. Splits come from the SM count and the programs resident per SM.
    prefill  SPLITS == 1, output written directly.
The row gather is pipelined: the indices of the next tile are loaded in the current iteration
and carried in the loop, so triton's pipeliner gives the rows a ring of num_stages - 1 shared
buffers filled by cp.async while the current tile computes. Each program first reads its token's
index row once and stops after the last valid index (the per-token valid count: vLLM's -1 tails
cost nothing). Plans depend on shapes and the device only, so CUDA graphs replay fixed grids.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._capability import DeviceInfo, device_info
from ._configs import MIN_DECODE_SPLITS, MIN_ROWS_PER_SPLIT, AttnConfig, attn_config, fp8_config
from ._dims import D_LATENT, D_QK, D_ROPE, FP8_ROW_BYTES
from .fp8_ds_mla import ROPE_OFFSET, SCALE_OFFSET

LOG2E = 1.4426950408889634
# Programmatic dependent launch of the split-K combine (sm_90+): the combine grid is launched
# while the attention grid drains, and waits (griddepcontrol.wait) for its partials, so the
# launch gap between the two kernels leaves the decode step. A module switch so the benchmark
# can time both; the interpreter never takes it (inline PTX).
USE_PDL = True
# fp8_ds_mla row layout, as the write kernel lays it out (fp8_ds_mla.py)
_FP8_SCALES = tl.constexpr(SCALE_OFFSET)
_FP8_ROPE = tl.constexpr(ROPE_OFFSET)


@triton.jit
def _sparse_mla_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    scale_log2,
    num_slots,
    stride_qt,
    stride_qh,
    stride_kvb,
    stride_kvs,
    stride_it,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_PAD: tl.constexpr,
    SPLITS: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_LATENT: tl.constexpr,
    D_ROPE: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    FLAT_SLOTS: tl.constexpr,
    DOT_F32: tl.constexpr,
    FP8_DS_MLA: tl.constexpr = False,
    FP8_TILE: tl.constexpr = False,
    FP8_DECODE: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    tl.static_assert(BLOCK_H >= 16)
    GROUP: tl.constexpr = D_LATENT // 4  # fp8_ds_mla: one fp32 scale per 128 latent values
    # fp8_ds_mla reads: FP8_TILE dequantizes the [BLOCK_N, 512] tile (value x scale, in q's
    # dtype) and runs the 16-bit dots; otherwise ("group") the unscaled e4m3 values feed four
    # 128-wide dots and each scale multiplies its logits and PV weights. FP8_DECODE: 0 byte by
    # byte (any device, the interpreter), 1 cvt.rn.f16x2.e4m3x2 (sm_89+), 2 integer bit moves
    # (any device), which leave every value 2**-8 too small: FP8_UNIT puts it back in the scale;
    # 3 e4m3 loads converted by triton (group read only), after each dot operand's load from
    # shared memory: the 16-bit tile never passes through shared memory. The logits are computed
    # transposed (K x q^T), so no e4m3 operand is transposed in registers, and each group is
    # loaded twice, once per dot operand: a load feeding two operands (two shared layouts) got
    # no cp.async ring from triton 3.6's pipeliner, one load per operand gets a 2-deep ring
    # (sm_90/sm_120 TTGIR). The second read is the same bytes, from L2: the first keeps them
    # there (evict_last), the second lets them go (evict_first; this also keeps the two loads
    # distinct ops). DRAM bytes stay 656 per row; L2-to-SM bytes grow to 1168.
    GROUPED: tl.constexpr = FP8_DS_MLA and not FP8_TILE
    LOGITS_T: tl.constexpr = GROUPED and FP8_DECODE == 3
    KEEP: tl.constexpr = "evict_last" if LOGITS_T else ""
    FP8_UNIT: tl.constexpr = 256.0 if FP8_DECODE == 2 else 1.0
    # fp8_ds_mla: p x scale x FP8_LIFT is cast to 16 bits for the PV dot, and the sums are scaled
    # back at the end. With scale = amax / 448 that is <= 0.57 amax (no fp16 overflow for any
    # fp16 amax) and keeps small groups' weights out of fp16's subnormal range. (The decode's
    # 2**-8 already sits in the scale as FP8_UNIT.)
    FP8_LIFT: tl.constexpr = 256.0 / FP8_UNIT
    pid = tl.program_id(0)
    i_hb = pid % HEAD_BLOCKS
    i_s = (pid // HEAD_BLOCKS) % SPLITS
    i_t = pid // (HEAD_BLOCKS * SPLITS)
    i_t64 = i_t.to(tl.int64)
    p_idx = idx_ptr + i_t64 * stride_it

    # Valid count: one past the last index >= 0 of the token's row; this split's share of the
    # tiles before it (tile g belongs to split g % SPLITS).
    o_k = tl.arange(0, TOPK_PAD)
    b_row = tl.load(p_idx + o_k, mask=o_k < TOPK, other=-1)
    n_valid = tl.max(tl.where(b_row >= 0, o_k + 1, 0), axis=0)
    n_tiles = tl.cdiv(n_valid, BLOCK_N)
    n_mine = tl.cdiv(tl.maximum(n_tiles - i_s, 0), SPLITS)

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < NUM_HEADS
    o_dl = tl.arange(0, D_LATENT)
    o_dr = tl.arange(0, D_ROPE)
    o_n = tl.arange(0, BLOCK_N)
    o_gd = tl.arange(0, GROUP)

    # [BLOCK_H, D_LATENT] (fp8 rows: 4 x [BLOCK_H, GROUP], one per scale group), [BLOCK_H, D_ROPE]
    p_q = q_ptr + i_t64 * stride_qt + o_h[:, None].to(tl.int64) * stride_qh
    if GROUPED:
        b_q0 = _load_q(p_q + 0 * GROUP + o_gd[None, :], m_h, DOT_F32)
        b_q1 = _load_q(p_q + 1 * GROUP + o_gd[None, :], m_h, DOT_F32)
        b_q2 = _load_q(p_q + 2 * GROUP + o_gd[None, :], m_h, DOT_F32)
        b_q3 = _load_q(p_q + 3 * GROUP + o_gd[None, :], m_h, DOT_F32)
        b_acc0 = tl.zeros([BLOCK_H, GROUP], tl.float32)
        b_acc1 = tl.zeros([BLOCK_H, GROUP], tl.float32)
        b_acc2 = tl.zeros([BLOCK_H, GROUP], tl.float32)
        b_acc3 = tl.zeros([BLOCK_H, GROUP], tl.float32)
    else:
        b_q_nope = _load_q(p_q + o_dl[None, :], m_h, DOT_F32)
        b_acc = tl.zeros([BLOCK_H, D_LATENT], tl.float32)
    b_q_rope = _load_q(p_q + D_LATENT + o_dr[None, :], m_h, DOT_F32)

    b_m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_H], tl.float32)

    # [BLOCK_N] slot ids of this split's first tile; the loop carries the next tile's ids.
    k_first = i_s * BLOCK_N
    b_idx = tl.load(p_idx + k_first + o_n, mask=k_first + o_n < TOPK, other=-1)
    for j in range(0, n_mine):
        m_valid = (b_idx >= 0) & (b_idx < num_slots)
        b_slot = tl.where(m_valid, b_idx, 0)
        if FLAT_SLOTS:  # blocks back to back: slot * row stride (no division on the hot path)
            p_row = kv_ptr + b_slot.to(tl.int64) * stride_kvs
        else:  # KV_BLOCK is a power of two: shift and mask
            b_blk = (b_slot // KV_BLOCK).to(tl.int64)
            p_row = kv_ptr + b_blk * stride_kvb + (b_slot % KV_BLOCK) * stride_kvs
        # [BLOCK_N, D_LATENT] is K's latent part and V; [BLOCK_N, D_ROPE] K's rope part
        if FP8_DS_MLA:  # 656-B rows: e4m3 latent in 4 groups of 128, each with an fp32 scale
            # The e4m3 values themselves (exact in 16 bits) feed the dots; each group's scale
            # multiplies its [BLOCK_H, BLOCK_N] logits and its PV weights, never the
            # [BLOCK_N, 512] tile. Gathered as int32 words: the pipeliner gives word loads a
            # cp.async ring (it left a byte load synchronous).
            p_w = p_row.to(tl.pointer_type(tl.int32))
            p_sc = (p_row + _FP8_SCALES).to(tl.pointer_type(tl.float32))
            b_sc = tl.load(p_sc[:, None] + tl.arange(0, 4)[None, :], mask=m_valid[:, None],
                           other=0.0) * FP8_UNIT  # fmt: skip
            if FP8_TILE:
                b_kv = _e4m3_tile(p_w, b_sc, m_valid, GROUP, FP8_DECODE, b_q_nope.dtype)
            else:
                b_k0, b_k1, b_k2, b_k3 = _e4m3_groups(p_w, m_valid, GROUP, FP8_DECODE, b_q0.dtype,
                                                      KEEP)  # fmt: skip
                b_sc02, b_sc13 = tl.split(tl.reshape(b_sc, [BLOCK_N, 2, 2]))
                b_sc0, b_sc2 = tl.split(b_sc02)
                b_sc1, b_sc3 = tl.split(b_sc13)
            # rope (16-bit) follows the 4 fp32 scales
            p_kr = (p_row + _FP8_ROPE).to(tl.pointer_type(q_ptr.dtype.element_ty))
            b_kr = tl.load(p_kr[:, None] + o_dr[None, :], mask=m_valid[:, None], other=0.0)
        else:
            b_kv = tl.load(p_row[:, None] + o_dl[None, :], mask=m_valid[:, None], other=0.0)
            b_kr = tl.load(p_row[:, None] + D_LATENT + o_dr[None, :], mask=m_valid[:, None],
                           other=0.0)  # fmt: skip
        # next tile's ids, loaded now so the pipeliner can issue the next gather early
        k_next = (i_s + (j + 1) * SPLITS) * BLOCK_N
        b_idx = tl.load(p_idx + k_next + o_n, mask=k_next + o_n < TOPK, other=-1)

        b_pv_dtype = b_kr.dtype
        if DOT_F32:
            b_kr = b_kr.to(tl.float32)
        # [BLOCK_H, BLOCK_N] logits in log2 units
        if LOGITS_T:  # [BLOCK_N, BLOCK_H]
            b_st = tl.dot(b_k0, tl.trans(b_q0)) * b_sc0[:, None]
            b_st += tl.dot(b_k1, tl.trans(b_q1)) * b_sc1[:, None]
            b_st += tl.dot(b_k2, tl.trans(b_q2)) * b_sc2[:, None]
            b_st += tl.dot(b_k3, tl.trans(b_q3)) * b_sc3[:, None]
            b_st = tl.dot(b_kr, tl.trans(b_q_rope), b_st)
            b_s = tl.trans(b_st)
        elif GROUPED:
            b_s = tl.dot(b_q0, tl.trans(b_k0)) * b_sc0[None, :]
            b_s += tl.dot(b_q1, tl.trans(b_k1)) * b_sc1[None, :]
            b_s += tl.dot(b_q2, tl.trans(b_k2)) * b_sc2[None, :]
            b_s += tl.dot(b_q3, tl.trans(b_k3)) * b_sc3[None, :]
        else:
            if DOT_F32:
                b_kv = b_kv.to(tl.float32)
            b_s = tl.dot(b_q_nope, tl.trans(b_kv))
        if not LOGITS_T:
            b_s = tl.dot(b_q_rope, tl.trans(b_kr), b_s)
        b_s = tl.where(m_valid[None, :], b_s * scale_log2, float("-inf"))

        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        b_m_use = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
        b_p = tl.exp2(b_s - b_m_use[:, None])
        b_alpha = tl.exp2(b_m - b_m_use)
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        if GROUPED:
            b_p = b_p * FP8_LIFT
            if LOGITS_T:  # the PV operand's own copy of the row bytes (see LOGITS_T)
                b_k0, b_k1, b_k2, b_k3 = _e4m3_groups(p_w, m_valid, GROUP, FP8_DECODE, b_q0.dtype,
                                                      "evict_first")  # fmt: skip
            b_acc0 = _pv_group(b_p, b_sc0, b_k0, b_acc0, b_alpha, b_pv_dtype)
            b_acc1 = _pv_group(b_p, b_sc1, b_k1, b_acc1, b_alpha, b_pv_dtype)
            b_acc2 = _pv_group(b_p, b_sc2, b_k2, b_acc2, b_alpha, b_pv_dtype)
            b_acc3 = _pv_group(b_p, b_sc3, b_k3, b_acc3, b_alpha, b_pv_dtype)
        else:
            b_acc = b_acc * b_alpha[:, None]
            b_acc = tl.dot(b_p.to(b_pv_dtype).to(b_kv.dtype), b_kv, b_acc)
        b_m = b_m_new

    if PDL:  # the combine may launch now: it waits for this grid's stores before reading
        gdc_launch_dependents()
    b_has = b_l > 0.0
    b_den = tl.where(b_has, b_l, 1.0)
    if SPLITS == 1:
        p_o = out_ptr + i_t64 * stride_ot + o_h[:, None].to(tl.int64) * stride_oh
    else:
        i_row = (i_t64 * SPLITS + i_s) * NUM_HEADS
        p_o = part_o_ptr + (i_row + o_h[:, None]) * D_LATENT
        b_lse = tl.where(b_has, b_m + tl.log2(b_den), float("-inf"))
        tl.store(part_lse_ptr + i_row + o_h, b_lse, mask=m_h)
    # the output row, or this split's partial (normalised, fp32)
    if GROUPED:
        b_den8 = b_den * FP8_LIFT
        _store_rows(p_o + 0 * GROUP + o_gd[None, :], b_acc0 / b_den8[:, None], m_h)
        _store_rows(p_o + 1 * GROUP + o_gd[None, :], b_acc1 / b_den8[:, None], m_h)
        _store_rows(p_o + 2 * GROUP + o_gd[None, :], b_acc2 / b_den8[:, None], m_h)
        _store_rows(p_o + 3 * GROUP + o_gd[None, :], b_acc3 / b_den8[:, None], m_h)
    else:
        _store_rows(p_o + o_dl[None, :], b_acc / b_den[:, None], m_h)


@triton.jit
def _load_q(p, m_h, DOT_F32: tl.constexpr):
    b = tl.load(p, mask=m_h[:, None], other=0.0)
    if DOT_F32:
        b = b.to(tl.float32)
    return b


@triton.jit
def _store_rows(p, b, m_h):
    tl.store(p, b.to(p.dtype.element_ty), mask=m_h[:, None])


@triton.jit
def _e4m3_words(b_w, DECODE: tl.constexpr):
    """The 4 e4m3 bytes of each int32 word (byte i = latent value 4w + i: little-endian) as fp16
    values: exact for DECODE 0 and 1, exactly 2**-8 of the value for DECODE 2."""
    if DECODE == 1:  # sm_89+: two cvt.rn.f16x2.e4m3x2 per word
        b_0, b_1, b_2, b_3 = tl.inline_asm_elementwise(
            asm="""{
            .reg .b16 lo, hi;
            .reg .b32 a, b;
            mov.b32 {lo, hi}, $4;
            cvt.rn.f16x2.e4m3x2 a, lo;
            cvt.rn.f16x2.e4m3x2 b, hi;
            mov.b32 {$0, $1}, a;
            mov.b32 {$2, $3}, b;
            }""",
            constraints="=h,=h,=h,=h,r",
            args=[b_w],
            dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
            is_pure=True,
            pack=1,
        )
    elif DECODE == 2:
        # e4m3 s.eeee.mmm placed as fp16 s.0eeee.mmm0000000 (sign to bit 15, the rest to bits
        # 7..13) is the same number times 2**(7 - 15), subnormals included: integer ops in place
        # of cvt, whose rate may bound the read (unmeasured; bench_kernels --fp8 --sweep times
        # both). The NaN byte 0x7F reads as the finite 480.
        lo = ((b_w << 8) & -2147450880) | ((b_w << 7) & 0x3F803F80)  # 0x80008000: bytes 0, 2
        hi = (b_w & -2147450880) | ((b_w >> 1) & 0x3F803F80)  # bytes 1, 3
        b_0 = lo.to(tl.int16).to(tl.float16, bitcast=True)
        b_2 = (lo >> 16).to(tl.int16).to(tl.float16, bitcast=True)
        b_1 = hi.to(tl.int16).to(tl.float16, bitcast=True)
        b_3 = (hi >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    else:  # any device and the interpreter: byte by byte
        b_0 = _e4m3_byte(b_w, 0)
        b_1 = _e4m3_byte(b_w, 8)
        b_2 = _e4m3_byte(b_w, 16)
        b_3 = _e4m3_byte(b_w, 24)
    return b_0, b_1, b_2, b_3


@triton.jit
def _interleave(b_0, b_1, b_2, b_3):
    """[..., W] x 4 (byte i of word w) -> [..., W, 4]: value 4w + i."""
    return tl.join(tl.join(b_0, b_2), tl.join(b_1, b_3))


@triton.jit
def _e4m3_groups(p_w, m_valid, GROUP: tl.constexpr, DECODE: tl.constexpr, dtype: tl.constexpr,
                 EVICT: tl.constexpr):  # fmt: skip
    """The four scale groups of the rows (``_e4m3_group`` 0..3)."""
    return (
        _e4m3_group(p_w, 0, m_valid, GROUP, DECODE, dtype, EVICT),
        _e4m3_group(p_w, 1, m_valid, GROUP, DECODE, dtype, EVICT),
        _e4m3_group(p_w, 2, m_valid, GROUP, DECODE, dtype, EVICT),
        _e4m3_group(p_w, 3, m_valid, GROUP, DECODE, dtype, EVICT),
    )


@triton.jit
def _e4m3_group(
    p_w,
    g: tl.constexpr,
    m_valid,
    GROUP: tl.constexpr,
    DECODE: tl.constexpr,
    dtype: tl.constexpr,
    EVICT: tl.constexpr = "",
):
    """[BLOCK_N, GROUP] latent values g * GROUP .. of the rows at int32 pointers ``p_w``: the
    e4m3 values unscaled (times 2**-8 for DECODE 2), exact in fp16 (then ``dtype``; exact in
    bf16 too)."""
    if DECODE == 3:  # the group's GROUP bytes as e4m3
        o_b = g * GROUP + tl.arange(0, GROUP)
        p_b = p_w.to(tl.pointer_type(tl.float8e4nv))
        b_b = tl.load(p_b[:, None] + o_b[None, :], mask=m_valid[:, None], other=0.0,
                      eviction_policy=EVICT)  # fmt: skip
        return b_b.to(dtype)
    o_w = g * (GROUP // 4) + tl.arange(0, GROUP // 4)
    b_w = tl.load(p_w[:, None] + o_w[None, :], mask=m_valid[:, None], other=0)
    b_0, b_1, b_2, b_3 = _e4m3_words(b_w, DECODE)
    return tl.reshape(_interleave(b_0, b_1, b_2, b_3), [b_w.shape[0], GROUP]).to(dtype)


@triton.jit
def _e4m3_tile(p_w, b_sc, m_valid, GROUP: tl.constexpr, DECODE: tl.constexpr, dtype: tl.constexpr):
    """[BLOCK_N, 4 * GROUP] dequantized latent rows (value x its group's scale ``b_sc``
    [BLOCK_N, 4], product in fp32, then ``dtype``)."""
    W: tl.constexpr = GROUP // 4
    o_w = tl.arange(0, 4)[None, :, None] * W + tl.arange(0, W)[None, None, :]
    b_w = tl.load(p_w[:, None, None] + o_w, mask=m_valid[:, None, None], other=0)
    b_0, b_1, b_2, b_3 = _e4m3_words(b_w, DECODE)
    b_s = b_sc[:, :, None]
    b_k = _interleave(
        (b_0.to(tl.float32) * b_s).to(dtype),
        (b_1.to(tl.float32) * b_s).to(dtype),
        (b_2.to(tl.float32) * b_s).to(dtype),
        (b_3.to(tl.float32) * b_s).to(dtype),
    )
    return tl.reshape(b_k, [b_w.shape[0], 4 * GROUP])


@triton.jit
def _e4m3_byte(b_w, shift: tl.constexpr):
    return ((b_w >> shift) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _pv_group(b_p, b_sc, b_k, b_acc, b_alpha, pv_dtype: tl.constexpr):
    """One scale group's PV step: the weights carry the group's per-row scale."""
    b_w = (b_p * b_sc[None, :]).to(pv_dtype).to(b_k.dtype)
    return tl.dot(b_w, b_k, b_acc * b_alpha[:, None])


@triton.jit
def _combine_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    D_LATENT: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program per (token, head, BLOCK_D columns): all SPLITS partials in one load."""
    D_BLOCKS: tl.constexpr = D_LATENT // BLOCK_D
    pid = tl.program_id(0)
    i_d = pid % D_BLOCKS
    i_h = (pid // D_BLOCKS) % NUM_HEADS
    i_t = (pid // (D_BLOCKS * NUM_HEADS)).to(tl.int64)
    o_s = tl.arange(0, SPLITS_PAD)
    m_s = o_s < SPLITS
    i_rows = (i_t * SPLITS + o_s) * NUM_HEADS + i_h
    if PDL:  # launched early (programmatic dependent launch): the partials are not written yet
        gdc_wait()
    # [SPLITS_PAD] log2-sum-exp of each split (-inf = split had no valid row)
    b_lse = tl.load(part_lse_ptr + i_rows, mask=m_s, other=float("-inf"))
    b_max = tl.max(b_lse, axis=0)
    b_max = tl.where(b_max == float("-inf"), 0.0, b_max)
    b_w = tl.exp2(b_lse - b_max)
    b_den = tl.sum(b_w, axis=0)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    # [SPLITS_PAD, BLOCK_D]; empty splits are not read
    m_tile = (m_s & (b_w > 0.0))[:, None]
    b_tile = tl.load(part_o_ptr + i_rows[:, None] * D_LATENT + o_d[None, :], mask=m_tile, other=0.0)
    b_out = tl.sum(b_w[:, None] * b_tile, axis=0) / tl.where(b_den > 0.0, b_den, 1.0)
    p_o = out_ptr + i_t * stride_ot + i_h * stride_oh + o_d
    tl.store(p_o, b_out.to(out_ptr.dtype.element_ty))


# ----------------------------------------------------------------------------------------------
# Launch planning and workspace
# ----------------------------------------------------------------------------------------------


def row_flags(cfg: AttnConfig, fp8: bool, capability: tuple[int, int] | None) -> dict[str, object]:
    """The kernel's row-format constexprs for a config: 16-bit rows get one specialisation;
    fp8_ds_mla rows the config's read and decode, where "cvt" needs sm_89+ (``capability`` None =
    the interpreter: byte by byte) and "bits" runs anywhere. The launcher and the sm_120
    cross-compile (tests/support/sm120_fit.py) both take them from here."""
    if not fp8:
        return {"FP8_DS_MLA": False, "FP8_TILE": False, "FP8_DECODE": 0}
    if cfg.fp8_decode == "bits":
        decode = 2
    elif cfg.fp8_decode == "f8":
        decode = 3
    else:
        decode = 1 if capability is not None and capability >= (8, 9) else 0
    return {"FP8_DS_MLA": True, "FP8_TILE": cfg.fp8_read == "tile", "FP8_DECODE": decode}


@dataclass(frozen=True)
class Plan:
    cfg: AttnConfig
    head_blocks: int
    splits: int  # 1 = one pass (prefill strategy), > 1 = split over top-k + combine

    @property
    def strategy(self) -> str:
        return "decode" if self.splits > 1 else "prefill"


def use_pdl(splits: int, capability: tuple[int, int] | None, enabled: bool | None = None) -> bool:
    """Launch the combine as a programmatic dependent of the attention grid? (split plans on
    sm_90+ while ``enabled``, default USE_PDL; ``capability`` None = the interpreter). The sm_120
    cross-compile takes it from here, enabled, so the PDL build is checked either way."""
    on = USE_PDL if enabled is None else enabled
    return splits > 1 and on and capability is not None and capability >= (9, 0)


def combine_block_d(splits: int) -> int:
    """Columns per combine program: the [SPLITS, BLOCK_D] tile stays <= 4096 fp32 values."""
    return max(32, min(D_LATENT, 4096 // triton.next_power_of_2(splits)))


def plan(num_tokens: int, num_heads: int, topk: int, info: DeviceInfo | int) -> Plan:
    """Launch plan for a shape on a device; depends on shapes and the device only.

    The split count fills one wave: programs resident per SM (from the config's shared memory
    against the device's ``max_shared_mem``) x SMs, over tokens x head blocks, with at least
    MIN_ROWS_PER_SPLIT rows per split, then lowered to the smallest count with the same tiles per
    split. Where that gives fewer than MIN_DECODE_SPLITS, the prefill ("wide") config fills up to
    two waves instead, down to one pass once tokens x head blocks fill them.
    ``info`` may be a bare SM count (then sm_120's 101376 B of shared memory are assumed).
    """
    if isinstance(info, int):
        info = DeviceInfo(capability=(12, 0), num_sms=info, max_shared_mem=101376)
    cap, smem = info.capability, info.max_shared_mem
    work = max(num_tokens, 1)

    def splits_for(cfg: AttnConfig, waves: int) -> tuple[int, int]:
        head_blocks = triton.cdiv(num_heads, cfg.block_h)
        slots = waves * info.num_sms * cfg.ctas_per_sm(smem)
        n_tiles = triton.cdiv(topk, cfg.block_n)
        max_splits = max(1, min(n_tiles, topk // MIN_ROWS_PER_SPLIT))
        splits = max(1, min(max_splits, slots // (work * head_blocks)))
        if splits > 1:  # the fewest splits with the same tiles per split
            splits = triton.cdiv(n_tiles, triton.cdiv(n_tiles, splits))
        return head_blocks, splits

    cfg = attn_config(num_heads, "decode", cap, smem)
    head_blocks, splits = splits_for(cfg, 1)
    if splits >= MIN_DECODE_SPLITS:
        return Plan(cfg, head_blocks, splits)
    cfg = attn_config(num_heads, "prefill", cap, smem)
    head_blocks, splits = splits_for(cfg, 2)
    return Plan(cfg, head_blocks, splits)


class SparseMLAWorkspace:
    """Preallocated split-K partials for ``sparse_mla_attention`` (allocate once per layer/impl).

    Holds ``part_o`` [R, H, 512] fp32 (per split, softmax-normalised partial outputs) and
    ``part_lse`` [R, H] fp32 (their log2-sum-exp), with R = the largest tokens x splits any
    T <= max_tokens uses on ``device``; R is bounded by one wave of programs, not by max_tokens
    (H200, H=8: R <= 264, 4.3 MB). ``dtype`` is accepted for interface symmetry; the partials
    are always fp32.
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
        info = device_info(self.device)
        rows = 0
        for t in range(1, max_tokens + 1):
            p = plan(t, num_heads, topk, info)
            if p.splits == 1:
                break
            rows = max(rows, t * p.splits)
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
    row = FP8_ROW_BYTES if kv_cache.dtype == torch.uint8 else D_QK  # uint8 = fp8_ds_mla rows
    if kv_cache.dtype not in (q.dtype, torch.uint8):
        raise TypeError(
            f"kv_cache dtype {kv_cache.dtype} is neither q's dtype {q.dtype} nor uint8 (fp8_ds_mla)"
        )
    if kv_cache.dim() == 4 and kv_cache.shape[2] == 1 and kv_cache.shape[3] == row:
        pass
    elif kv_cache.dim() != 3 or kv_cache.shape[-1] != row:
        raise ValueError(
            f"kv_cache must be [num_blocks, block_size, {row}], got {tuple(kv_cache.shape)}"
        )
    if row == FP8_ROW_BYTES and (kv_cache.stride(-2) % 4 or kv_cache.stride(0) % 4):
        raise ValueError("fp8_ds_mla rows must start 4-byte aligned (fp32 scales)")
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
        kv_cache: [num_blocks, block_size, 576] (or [num_blocks, block_size, 1, 576]), q's dtype;
            or uint8 [num_blocks, block_size, 656] ``fp8_ds_mla`` rows (see fp8_ds_mla.py), whose
            rope part is in q's dtype.
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
    if topk % 16 != 0 or topk == 0:
        raise ValueError(f"top-k width must be a positive multiple of 16, got {topk}")
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
    p = plan(num_tokens, num_heads, topk, info)
    if kv_cache.dtype == torch.uint8:
        p = fp8_plan(p, info, q.dtype == torch.float16)
    _launch(q, kv_cache, indices, scale, out, workspace, p)
    return out


def fp8_plan(p: Plan, info: DeviceInfo, fp16_q: bool = True) -> Plan:
    """The plan launched over fp8_ds_mla rows: the 16-bit plan's splits and head blocks, its tile
    swapped where the fp8 read measured faster on another (``_configs.fp8_config``; measured
    with fp16 q only, so bf16 q keeps the 16-bit plan's tile). The splits stay, so a workspace
    sized by the 16-bit plans holds."""
    if not fp16_q:
        return p
    return replace(p, cfg=fp8_config(p.cfg, info.max_shared_mem))


def _launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    workspace: SparseMLAWorkspace | None,
    p: Plan,
) -> None:
    """Launch with an explicit plan (tests and the benchmark sweep configs through this)."""
    num_tokens, num_heads, _ = q.shape
    topk = indices.shape[1]
    cfg, splits = p.cfg, p.splits
    if p.head_blocks * cfg.block_h < num_heads:
        raise ValueError(f"plan covers {p.head_blocks * cfg.block_h} heads, q has {num_heads}")
    if splits > 1:
        if workspace is None:
            part_o = torch.empty((num_tokens * splits, num_heads, D_LATENT), dtype=torch.float32,
                                 device=q.device)  # fmt: skip
            part_lse = torch.empty((num_tokens * splits, num_heads), dtype=torch.float32,
                                   device=q.device)  # fmt: skip
        else:
            if workspace.num_heads != num_heads or workspace.rows < num_tokens * splits:
                raise ValueError(
                    f"workspace (max_tokens={workspace.max_tokens}, heads={workspace.num_heads},"
                    f" rows={workspace.rows}) too small for T={num_tokens}, H={num_heads},"
                    f" K={topk}, splits={splits}"
                )
            part_o, part_lse = workspace.part_o, workspace.part_lse
    else:
        part_o = part_lse = out  # unused by the kernel when SPLITS == 1

    fp8 = kv_cache.dtype == torch.uint8
    cap = device_info(q.device).capability if q.device.type == "cuda" else None
    pdl = use_pdl(splits, cap)
    block_size = kv_cache.shape[1]
    if block_size & (block_size - 1):
        raise ValueError(f"kv_cache block size must be a power of two, got {block_size}")
    grid = (num_tokens * splits * p.head_blocks,)
    _sparse_mla_kernel[grid](
        q,
        kv_cache,
        indices,
        out,
        part_o,
        part_lse,
        float(scale) * LOG2E,
        kv_cache.shape[0] * kv_cache.shape[1],
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        indices.stride(0),
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        TOPK=topk,
        TOPK_PAD=triton.next_power_of_2(topk),
        SPLITS=splits,
        HEAD_BLOCKS=p.head_blocks,
        BLOCK_H=cfg.block_h,
        BLOCK_N=cfg.block_n,
        D_LATENT=D_LATENT,
        D_ROPE=D_ROPE,
        KV_BLOCK=block_size,
        FLAT_SLOTS=kv_cache.stride(0) == block_size * kv_cache.stride(1),
        # Triton 3.6's interpreter mis-computes bf16 tl.dot (integer-like garbage); on CPU the
        # bf16 operands are upcast to fp32 (exact), so CI checks the same math.
        DOT_F32=q.device.type != "cuda" and q.dtype == torch.bfloat16,
        **row_flags(cfg, fp8, cap),
        PDL=pdl,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if splits > 1:
        block_d = combine_block_d(splits)
        pdl_kw = {"launch_pdl": True} if pdl else {}
        _combine_kernel[(num_tokens * num_heads * (D_LATENT // block_d),)](
            part_o,
            part_lse,
            out,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            SPLITS=splits,
            SPLITS_PAD=triton.next_power_of_2(splits),
            D_LATENT=D_LATENT,
            BLOCK_D=block_d,
            PDL=pdl,
            num_warps=4,
            **pdl_kw,
        )


__all__ = [
    "Plan",
    "SparseMLAWorkspace",
    "fp8_plan",
    "make_workspace",
    "plan",
    "sparse_mla_attention",
]
