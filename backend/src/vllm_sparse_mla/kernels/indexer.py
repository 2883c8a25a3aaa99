"""DSA "lightning indexer" logits and top-k in Triton: drop-in for vLLM 0.23.0's DeepGEMM calls.

DeepSeek-V3.2 DSA (https://arxiv.org/abs/2512.02556): for query token m and key n,

    logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k_fp8[n])

which equals DeepGEMM's ``sum_h w * relu(q . (k_fp8 * k_scale))`` for the positive (ue8m0)
scales vLLM writes. q and k are fp8 e4m3; products accumulate in fp32 (tl.dot in fp8 on GPUs
with fp8 tensor cores, in fp16 after an exact e4m3 -> fp16 conversion elsewhere).

Layouts (as ``vllm/utils/deep_gemm.py`` documents and ``sparse_attn_indexer.py`` passes them):
    mqa_logits        q ([M, H, D] fp8, None), kv ([N, D] fp8, [N] fp32 scales),
                      weights [M, H] fp32, cu_seqlen_ks/ke [M] int32 -> logits [M, N] fp32
    paged_mqa_logits  q ([B, next_n, H, D] fp8, None), kv_cache [num_blocks, block_size, 1, D+4]
                      uint8 (per block: block_size*D fp8 values, then block_size fp32 scales),
                      weights [B*next_n, H] fp32, context_lens [B] or [B, next_n] int32,
                      block_tables [B, max_blocks] int32 -> logits [B*next_n, max_model_len]
``clean_logits=True`` writes -inf everywhere outside each row's valid key range. With False (what
vLLM passes) only key tiles that intersect a row's range are written (-inf where masked inside
them); the rest is left as allocated, as DeepGEMM does; vLLM's top-k bounds every row by its
range anyway. Fixed grids, no host sync: CUDA-graph safe.

Paged grid: (B, key tiles / tiles_per_program). With tiles_per_program > 1 (``IndexerConfig``)
a program loads q once and loops over its consecutive key tiles, loading the next tile's block
ids in the current iteration (loop-carried), so the key loads' addresses do not depend on a load
of the same iteration and triton's pipeliner can keep the next key tile in flight (cp.async)
under this tile's dot; tiles past the request's range are skipped (or -inf with clean_logits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._capability import device_info
from ._configs import MQA_LOGITS_CONFIG, PAGED_LOGITS_CONFIG, IndexerConfig


@triton.jit
def _to_dot_operand(x, FP8_DOT: tl.constexpr):
    # x: uint8 bits of fp8 e4m3
    x = x.to(tl.float8e4nv, bitcast=True)
    if not FP8_DOT:
        x = x.to(tl.float16)
    return x


@triton.jit
def _mqa_logits_kernel(
    q_ptr,
    k_ptr,
    k_scale_ptr,
    w_ptr,
    ks_ptr,
    ke_ptr,
    out_ptr,
    M,
    N,
    stride_qm,
    stride_qh,
    stride_kn,
    stride_wm,
    stride_om,
    NUM_HEADS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CLEAN: tl.constexpr,
    FP8_DOT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_m = o_m < M
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    b_ks = tl.load(ks_ptr + o_m, mask=m_m, other=0)
    b_ke = tl.load(ke_ptr + o_m, mask=m_m, other=0)
    lo = tl.min(tl.where(m_m & (b_ke > b_ks), b_ks, N), axis=0)
    hi = tl.max(tl.where(m_m, b_ke, 0), axis=0)
    n0 = pid_n * BLOCK_N
    # [BLOCK_M, BLOCK_N]
    p_o = out_ptr + o_m[:, None].to(tl.int64) * stride_om + o_n[None, :]
    m_o = m_m[:, None] & m_n[None, :]
    if (n0 < hi) & (n0 + BLOCK_N > lo):
        ROWS: tl.constexpr = BLOCK_M * NUM_HEADS
        o_r = tl.arange(0, ROWS)
        r_m = pid_m * BLOCK_M + o_r // NUM_HEADS
        r_h = o_r % NUM_HEADS
        m_r = r_m < M
        o_d = tl.arange(0, D)
        # [ROWS, D] query rows (token-major, head-minor)
        p_q = q_ptr + r_m[:, None].to(tl.int64) * stride_qm + r_h[:, None] * stride_qh
        b_q = _to_dot_operand(tl.load(p_q + o_d[None, :], mask=m_r[:, None], other=0), FP8_DOT)
        # [BLOCK_N, D] keys
        p_k = k_ptr + o_n[:, None].to(tl.int64) * stride_kn + o_d[None, :]
        b_k = _to_dot_operand(tl.load(p_k, mask=m_n[:, None], other=0), FP8_DOT)
        # [ROWS, BLOCK_N]
        b_s = tl.dot(b_q, tl.trans(b_k))
        b_w = tl.load(w_ptr + r_m.to(tl.int64) * stride_wm + r_h, mask=m_r, other=0.0)
        b_s = tl.maximum(b_s, 0.0) * b_w[:, None]
        # [BLOCK_M, BLOCK_N]
        b_logit = tl.sum(tl.reshape(b_s, [BLOCK_M, NUM_HEADS, BLOCK_N]), axis=1)
        b_scale = tl.load(k_scale_ptr + o_n, mask=m_n, other=0.0)
        b_logit = b_logit * b_scale[None, :]
        m_valid = (o_n[None, :] >= b_ks[:, None]) & (o_n[None, :] < b_ke[:, None])
        tl.store(p_o, tl.where(m_valid, b_logit, float("-inf")), mask=m_o)
    elif CLEAN:
        tl.store(p_o, tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32), mask=m_o)


@triton.jit
def _paged_q_w(
    q_ptr,
    w_ptr,
    i_b,
    stride_qb,
    stride_qj,
    stride_qh,
    stride_wm,
    NEXT_N: tl.constexpr,
    NEXT_N_PAD: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    D: tl.constexpr,
    FP8_DOT: tl.constexpr,
):
    """The request's query rows as a [NEXT_N_PAD * NUM_HEADS, D] dot operand (token-major,
    head-minor; padded rows 0) and their [NEXT_N_PAD * NUM_HEADS] weights."""
    ROWS: tl.constexpr = NEXT_N_PAD * NUM_HEADS
    o_r = tl.arange(0, ROWS)
    r_j = o_r // NUM_HEADS
    r_h = o_r % NUM_HEADS
    m_r = r_j < NEXT_N
    o_d = tl.arange(0, D)
    # [ROWS, D]
    p_q = q_ptr + i_b * stride_qb + r_j[:, None] * stride_qj + r_h[:, None] * stride_qh
    b_q = _to_dot_operand(tl.load(p_q + o_d[None, :], mask=m_r[:, None], other=0), FP8_DOT)
    b_w = tl.load(w_ptr + (i_b * NEXT_N + r_j) * stride_wm + r_h, mask=m_r, other=0.0)
    return b_q, b_w


@triton.jit
def _paged_block_ids(bt_ptr, i_b, stride_btb, max_blocks, o_n, m_k, KV_BLOCK: tl.constexpr):
    # [BLOCK_N] physical block of each key position (masked lanes: block 0, never read)
    i_lblk = o_n // KV_BLOCK
    m_blk = m_k & (i_lblk < max_blocks)
    return tl.load(bt_ptr + i_b * stride_btb + i_lblk, mask=m_blk, other=0).to(tl.int64)


@triton.jit
def _paged_tile_logits(
    kv_ptr,
    kv_f32_ptr,
    stride_kvblk,
    b_q,
    b_w,
    b_blk,
    o_n,
    m_k,
    NEXT_N_PAD: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    D: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8_DOT: tl.constexpr,
):
    """[NEXT_N_PAD, BLOCK_N] logits of one key tile (before causal masking)."""
    o_d = tl.arange(0, D)
    i_pos = o_n % KV_BLOCK
    # [BLOCK_N, D] fp8 keys, then [BLOCK_N] fp32 scales after the block's values
    p_k = kv_ptr + b_blk[:, None] * stride_kvblk + i_pos[:, None] * D + o_d[None, :]
    b_k = _to_dot_operand(tl.load(p_k, mask=m_k[:, None], other=0), FP8_DOT)
    p_sc = kv_f32_ptr + b_blk * (stride_kvblk // 4) + (KV_BLOCK * D) // 4 + i_pos
    b_scale = tl.load(p_sc, mask=m_k, other=0.0)
    # [ROWS, BLOCK_N]
    b_s = tl.dot(b_q, tl.trans(b_k))
    b_s = tl.maximum(b_s, 0.0) * b_w[:, None]
    b_logit = tl.sum(tl.reshape(b_s, [NEXT_N_PAD, NUM_HEADS, BLOCK_N]), axis=1)
    return b_logit * b_scale[None, :]


@triton.jit
def _paged_mqa_logits_kernel(
    q_ptr,
    kv_ptr,
    kv_f32_ptr,
    w_ptr,
    ctx_ptr,
    bt_ptr,
    out_ptr,
    max_model_len,
    max_blocks,
    stride_qb,
    stride_qj,
    stride_qh,
    stride_kvblk,
    stride_cb,
    stride_cj,
    stride_btb,
    stride_wm,
    stride_om,
    NEXT_N: tl.constexpr,
    NEXT_N_PAD: tl.constexpr,
    CTX_1D: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    D: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    CLEAN: tl.constexpr,
    FP8_DOT: tl.constexpr,
):
    tl.static_assert(BLOCK_N % KV_BLOCK == 0)
    tl.static_assert(TILES_PER_PROGRAM >= 1)
    i_b = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    o_j = tl.arange(0, NEXT_N_PAD)
    m_j = o_j < NEXT_N
    # [NEXT_N_PAD] exclusive key limit of each row of this request
    if CTX_1D:
        b_lim = tl.load(ctx_ptr + i_b * stride_cb) - NEXT_N + 1 + o_j
    else:
        b_lim = tl.load(ctx_ptr + i_b * stride_cb + o_j * stride_cj, mask=m_j, other=0)
    b_lim = tl.where(m_j, tl.minimum(b_lim, max_model_len), 0)
    hi = tl.max(b_lim, axis=0)
    # [NEXT_N_PAD, 1] output rows of this request
    p_row = out_ptr + (i_b * NEXT_N + o_j[:, None]) * stride_om
    # the program's first key; tile t covers [n_start + t * BLOCK_N, + BLOCK_N)
    n_start = pid_n * (TILES_PER_PROGRAM * BLOCK_N)
    o_n = n_start + tl.arange(0, BLOCK_N)
    if TILES_PER_PROGRAM == 1:
        # one tile, straight-line: the launch default until a GPU times the loop below
        m_o = m_j[:, None] & (o_n < max_model_len)[None, :]
        if n_start < hi:
            b_q, b_w = _paged_q_w(
                q_ptr, w_ptr, i_b, stride_qb, stride_qj, stride_qh, stride_wm,
                NEXT_N, NEXT_N_PAD, NUM_HEADS, D, FP8_DOT,
            )  # fmt: skip
            m_k = o_n < hi
            b_blk = _paged_block_ids(bt_ptr, i_b, stride_btb, max_blocks, o_n, m_k, KV_BLOCK)
            b_logit = _paged_tile_logits(
                kv_ptr, kv_f32_ptr, stride_kvblk, b_q, b_w, b_blk, o_n, m_k,
                NEXT_N_PAD, NUM_HEADS, D, KV_BLOCK, BLOCK_N, FP8_DOT,
            )  # fmt: skip
            m_valid = o_n[None, :] < b_lim[:, None]
            tl.store(p_row + o_n[None, :], tl.where(m_valid, b_logit, float("-inf")), mask=m_o)
        elif CLEAN:
            tl.store(p_row + o_n[None, :], tl.full([NEXT_N_PAD, BLOCK_N], float("-inf"),
                     tl.float32), mask=m_o)  # fmt: skip
    else:
        # tiles of this program that intersect the request's key range: 0 .. n_tiles - 1
        n_tiles = tl.where(
            n_start < hi, tl.minimum(tl.cdiv(hi - n_start, BLOCK_N), TILES_PER_PROGRAM), 0
        )
        if n_tiles > 0:
            # loaded once for all the program's tiles
            b_q, b_w = _paged_q_w(
                q_ptr, w_ptr, i_b, stride_qb, stride_qj, stride_qh, stride_wm,
                NEXT_N, NEXT_N_PAD, NUM_HEADS, D, FP8_DOT,
            )  # fmt: skip
            b_blk = _paged_block_ids(bt_ptr, i_b, stride_btb, max_blocks, o_n, o_n < hi, KV_BLOCK)
            for t in tl.range(0, n_tiles):
                m_k = o_n < hi
                b_logit = _paged_tile_logits(
                    kv_ptr, kv_f32_ptr, stride_kvblk, b_q, b_w, b_blk, o_n, m_k,
                    NEXT_N_PAD, NUM_HEADS, D, KV_BLOCK, BLOCK_N, FP8_DOT,
                )  # fmt: skip
                # the next tile's block ids, loaded in this iteration and carried: the key load's
                # addresses never wait on a load of their own iteration, so from num_stages 3 the
                # pipeliner keeps tile t+1's keys in flight (2-deep cp.async ring) under tile t's
                # dot; at 2 stages it has one buffer, refilled after the dot (sm_120 TTGIR, issue
                # 13; the same prefetch the attention gather needed)
                o_next = o_n + BLOCK_N
                m_next = (o_next < hi) & (t + 1 < n_tiles)
                b_blk = _paged_block_ids(bt_ptr, i_b, stride_btb, max_blocks, o_next, m_next,
                                         KV_BLOCK)  # fmt: skip
                m_o = m_j[:, None] & (o_n < max_model_len)[None, :]
                m_valid = o_n[None, :] < b_lim[:, None]
                tl.store(p_row + o_n[None, :], tl.where(m_valid, b_logit, float("-inf")), mask=m_o)
                o_n = o_next
        if CLEAN:
            # the program's tiles past the range (all of them when it starts past it)
            for t in tl.range(n_tiles, TILES_PER_PROGRAM):
                o_c = n_start + t * BLOCK_N + tl.arange(0, BLOCK_N)
                m_o = m_j[:, None] & (o_c < max_model_len)[None, :]
                tl.store(p_row + o_c[None, :], tl.full([NEXT_N_PAD, BLOCK_N], float("-inf"),
                         tl.float32), mask=m_o)  # fmt: skip


def _fp8_dot(device: torch.device) -> bool:
    """fp8 tensor-core dot where the hardware has it (sm_89+); fp16 after conversion otherwise."""
    return device_info(device).capability >= (8, 9)


def _unpack_q(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    if isinstance(q, tuple):
        q, q_scale = q
        if q_scale is not None:
            raise ValueError("FP4 (MXFP4) indexer queries are not supported; pass (q_fp8, None)")
    if q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"indexer q must be float8_e4m3fn, got {q.dtype}")
    if q.stride(-1) != 1:
        raise ValueError("indexer q needs a contiguous last dimension")
    return q


def _check_dim(d: int) -> None:
    if d < 16 or d & (d - 1):
        raise ValueError(f"indexer head dim must be a power of two >= 16, got {d}")


def mqa_logits(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    clean_logits: bool = True,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Indexer logits over contiguous keys (prefill); drop-in for DeepGEMM
    ``fp8_fp4_mqa_logits`` (FP8 path).

    q: ([M, H, D] float8_e4m3fn, None) or the bare tensor; kv: ([N, D] float8_e4m3fn, [N] or
    [N, 1] float32 scales); weights [M, H] float32; cu_seqlen_ks / cu_seqlen_ke [M] int32 (key
    range [ks, ke) of each row). Returns [M, N] float32 (``out`` if given).
    """
    q = _unpack_q(q)
    k, k_scale = kv
    if q.dim() != 3:
        raise ValueError(f"q must be [M, H, D], got {tuple(q.shape)}")
    m, h, d = q.shape
    _check_dim(d)
    if k.dtype != torch.float8_e4m3fn or k.dim() != 2 or k.shape[1] != d or k.stride(1) != 1:
        raise ValueError(f"k must be [N, {d}] float8_e4m3fn (last dim contiguous)")
    n = k.shape[0]
    k_scale = k_scale.reshape(-1)
    if k_scale.dtype != torch.float32 or k_scale.shape[0] != n or k_scale.stride(0) != 1:
        raise ValueError(f"k scales must be [{n}] float32 contiguous")
    if weights.shape != (m, h) or weights.dtype != torch.float32 or weights.stride(1) != 1:
        raise ValueError(f"weights must be [{m}, {h}] float32")
    for name, t in (("cu_seqlen_ks", cu_seqlen_ks), ("cu_seqlen_ke", cu_seqlen_ke)):
        if t.shape != (m,) or t.dtype != torch.int32:
            raise ValueError(f"{name} must be [{m}] int32")
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32, device=q.device)
    elif out.shape != (m, n) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}] float32")
    if m == 0 or n == 0:
        return out
    cfg = MQA_LOGITS_CONFIG
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n))
    _mqa_logits_kernel[grid](
        q.view(torch.uint8),
        k.view(torch.uint8),
        k_scale,
        weights,
        cu_seqlen_ks,
        cu_seqlen_ke,
        out,
        m,
        n,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        weights.stride(0),
        out.stride(0),
        NUM_HEADS=h,
        D=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CLEAN=bool(clean_logits),
        FP8_DOT=_fp8_dot(q.device),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out


def paged_mqa_logits(
    q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor | None,
    max_model_len: int,
    clean_logits: bool = True,
    *,
    out: torch.Tensor | None = None,
    config: IndexerConfig | None = None,
) -> torch.Tensor:
    """Indexer logits over the paged fp8 key cache (decode); drop-in for DeepGEMM
    ``fp8_fp4_paged_mqa_logits`` (FP8 path).

    q: ([B, next_n, H, D] float8_e4m3fn, None) or the bare tensor; kv_cache uint8
    [num_blocks, block_size, 1, D + 4] (or [num_blocks, block_size, D + 4]); weights
    [B * next_n, H] float32; context_lens int32 [B] (row j of a request sees
    ctx - next_n + j + 1 keys), [B, next_n] (per-row limit) or [B, 1]; block_tables
    [B, max_blocks] int32 (entries past a request's context are never read: -1 is fine);
    schedule_metadata is accepted and ignored. ``config``: launch config, default
    ``PAGED_LOGITS_CONFIG`` (tests and the benchmark's sweep pass others). Returns
    [B * next_n, max_model_len] float32 (``out`` if given).
    """
    q = _unpack_q(q)
    if q.dim() != 4:
        raise ValueError(f"q must be [B, next_n, H, D], got {tuple(q.shape)}")
    b, next_n, h, d = q.shape
    _check_dim(d)
    if kv_cache.dtype != torch.uint8:
        raise TypeError(f"kv_cache must be uint8, got {kv_cache.dtype}")
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(2)
    if kv_cache.dim() != 3 or kv_cache.shape[2] != d + 4 or not kv_cache[0].is_contiguous():
        raise ValueError(f"kv_cache must be [num_blocks, block_size, 1, {d + 4}] uint8")
    kv_block = kv_cache.shape[1]
    if kv_cache.stride(0) % 4 != 0 or kv_cache.stride(1) % 4 != 0:
        raise ValueError("kv_cache strides must be multiples of 4 bytes")
    if weights.shape != (b * next_n, h) or weights.dtype != torch.float32 or weights.stride(1) != 1:
        raise ValueError(f"weights must be [{b * next_n}, {h}] float32")
    if context_lens.dtype != torch.int32 or context_lens.shape[0] != b:
        raise ValueError(f"context_lens must be int32 [{b}] or [{b}, next_n]")
    ctx_1d = context_lens.dim() == 1
    if not ctx_1d and context_lens.shape[1] not in (1, next_n):
        raise ValueError(f"context_lens must be [{b}], [{b}, 1] or [{b}, {next_n}]")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] < b:
        raise ValueError(f"block_tables must be int32 [{b}, max_blocks]")
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables needs a contiguous last dimension")
    rows = b * next_n
    if out is None:
        out = torch.empty((rows, max_model_len), dtype=torch.float32, device=q.device)
    elif out.shape != (rows, max_model_len) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out must be [{rows}, {max_model_len}] float32")
    if rows == 0:
        return out
    cfg = PAGED_LOGITS_CONFIG if config is None else config
    if not isinstance(cfg, IndexerConfig):
        raise TypeError(f"config must be an IndexerConfig, got {type(cfg).__name__}")
    if cfg.tiles_per_program < 1:
        raise ValueError(f"config.tiles_per_program must be >= 1, got {cfg.tiles_per_program}")
    block_n = max(cfg.block_n, kv_block)
    # fp32 alias of the same bytes, for the scales (needs 4-byte aligned strides, checked above)
    kv_f32 = kv_cache.view(torch.float32)
    tiles = cfg.tiles_per_program
    grid = (b, triton.cdiv(triton.cdiv(max_model_len, block_n), tiles))
    _paged_mqa_logits_kernel[grid](
        q.view(torch.uint8),
        kv_cache,
        kv_f32,
        weights,
        context_lens,
        block_tables,
        out,
        max_model_len,
        block_tables.shape[1],
        q.stride(0),
        q.stride(1),
        q.stride(2),
        kv_cache.stride(0),
        context_lens.stride(0),
        0 if ctx_1d or context_lens.shape[1] == 1 else context_lens.stride(1),
        block_tables.stride(0),
        weights.stride(0),
        out.stride(0),
        NEXT_N=next_n,
        NEXT_N_PAD=triton.next_power_of_2(next_n),
        CTX_1D=ctx_1d,
        NUM_HEADS=h,
        D=d,
        KV_BLOCK=kv_block,
        BLOCK_N=block_n,
        TILES_PER_PROGRAM=tiles,
        CLEAN=bool(clean_logits),
        FP8_DOT=_fp8_dot(q.device),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out


def paged_mqa_logits_metadata(
    context_lens: torch.Tensor, block_size: int, num_sms: int
) -> torch.Tensor:
    """Stand-in for DeepGEMM ``get_paged_mqa_logits_metadata``: ``paged_mqa_logits`` schedules
    with a fixed grid and ignores it. Returns an int32 [num_sms + 1, 2] zero tensor."""
    return torch.zeros((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)


@triton.jit
def _order_key(x):
    """fp32 -> uint32 with the same order (radix-select key)."""
    u = x.to(tl.uint32, bitcast=True)
    return tl.where((u >> 31) != 0, u ^ 0xFFFFFFFF, u | 0x80000000)


@triton.jit
def _topk_radix_kernel(
    logits_ptr,
    starts_ptr,
    ends_ptr,
    out_ptr,
    N,
    stride_lm,
    stride_om,
    HAS_STARTS: tl.constexpr,
    HAS_ENDS: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row: radix select of the TOPK-th largest key (4 passes of 8 bits:
    histogram of the keys under the current prefix, threshold bin by suffix count), then one
    compaction pass writing positions (relative to the row start, unordered) and -1 padding.
    -inf and NaN are never selected."""
    i_m = tl.program_id(0).to(tl.int64)
    lo = 0
    hi = N
    if HAS_STARTS:
        lo = tl.load(starts_ptr + i_m)
    if HAS_ENDS:
        hi = tl.minimum(tl.load(ends_ptr + i_m), N)
    hi = tl.maximum(hi, lo)
    p_row = logits_ptr + i_m * stride_lm
    p_out = out_ptr + i_m * stride_om
    o = tl.arange(0, BLOCK)
    o_b = tl.arange(0, 256)
    prefix = tl.zeros([], tl.uint32)
    rem = tl.full([], TOPK, tl.int32)
    n_valid = tl.zeros([], tl.int32)
    for PASS in tl.static_range(4):
        SHIFT = 24 - 8 * PASS
        b_hist = tl.zeros([256], tl.int32)
        for c in range(lo, hi, BLOCK):
            offs = c + o
            x = tl.load(p_row + offs, mask=offs < hi, other=float("-inf"))
            key = _order_key(x)
            m = (offs < hi) & (x > float("-inf")) & (x == x)
            if PASS > 0:
                m = m & ((key >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
            b_hist += tl.histogram(((key >> SHIFT) & 255).to(tl.int32), 256, mask=m)
        total = tl.sum(b_hist, axis=0)
        if PASS == 0:
            n_valid = total
        suffix = total - tl.cumsum(b_hist, axis=0) + b_hist  # keys in bins >= b
        b = tl.maximum(tl.max(tl.where(suffix >= rem, o_b, -1), axis=0), 0)
        rem = rem - tl.sum(tl.where(o_b > b, b_hist, 0), axis=0)
        prefix = prefix | (b.to(tl.uint32) << SHIFT)
    # prefix: key of the TOPK-th largest; rem: how many keys equal to it are taken
    sel_all = n_valid <= TOPK
    pick_eq = n_valid > TOPK
    n_gt = tl.zeros([], tl.int32)
    n_eq = tl.zeros([], tl.int32)
    base_eq = TOPK - rem
    for c in range(lo, hi, BLOCK):
        offs = c + o
        x = tl.load(p_row + offs, mask=offs < hi, other=float("-inf"))
        key = _order_key(x)
        m = (offs < hi) & (x > float("-inf")) & (x == x)
        gt = m & (sel_all | (key > prefix))
        eq = m & pick_eq & (key == prefix)
        gt_i = gt.to(tl.int32)
        eq_i = eq.to(tl.int32)
        pos = (offs - lo).to(tl.int32)
        tl.store(p_out + n_gt + tl.cumsum(gt_i, axis=0) - 1, pos, mask=gt)
        r_eq = n_eq + tl.cumsum(eq_i, axis=0) - 1
        tl.store(p_out + base_eq + r_eq, pos, mask=eq & (r_eq < rem))
        n_gt += tl.sum(gt_i, axis=0)
        n_eq += tl.sum(eq_i, axis=0)
    n_sel = tl.minimum(n_valid, TOPK)
    o_k = tl.arange(0, TOPK_PAD)
    tl.store(p_out + o_k, tl.full([TOPK_PAD], -1, tl.int32), mask=(o_k >= n_sel) & (o_k < TOPK))


TOPK_BLOCK = 4096  # logits per step of the radix top-k
# One program per row walks the row 5 times, so its time grows with N and not with the batch
# (H200 run 6: 18 us at N 4096 for any batch, 125 us at 32768, 510 us at 131072; torch.topk 53-60,
# 72-115, 82-235 us): ours up to 8192 keys, torch.topk above.
TOPK_TRITON_MAX_N = 8192


def topk_impl(n: int, dtype: torch.dtype = torch.float32) -> str:
    """The ``impl`` that ``topk_indices(impl="auto")`` uses for rows of ``n`` keys."""
    return "triton" if dtype == torch.float32 and n <= TOPK_TRITON_MAX_N else "torch"


def topk_indices(
    logits: torch.Tensor,
    topk: int,
    row_starts: torch.Tensor | None = None,
    row_ends: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Top-k key positions per logits row, vLLM's ``top_k_per_row_*`` contract.

    logits [M, N] float32; keys considered: [row_starts[m], row_ends[m]) (whole row when None).
    Returns int32 [M, topk] (``out`` if given): positions relative to row_starts of the topk
    largest finite logits, -1 where the row has fewer than topk valid keys (-inf never counts).
    For paged decode pass row_ends = each row's key limit. No host sync (CUDA-graph safe).
    impl: "triton" (radix select, ``_topk_radix_kernel``; positions unordered), "torch"
    (torch.topk; descending order), "auto" = ``topk_impl(N)``: the Triton kernel on rows of at
    most TOPK_TRITON_MAX_N keys, torch.topk above (H200, benchmarks/RESULTS.md run 6).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [M, N], got {tuple(logits.shape)}")
    if impl not in ("auto", "triton", "torch"):
        raise ValueError(f"impl must be 'auto', 'triton' or 'torch', got {impl!r}")
    m, n = logits.shape
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if out is None:
        out = torch.empty((m, topk), dtype=torch.int32, device=logits.device)
    elif out.shape != (m, topk) or out.dtype != torch.int32 or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {topk}] int32")
    for name, t in (("row_starts", row_starts), ("row_ends", row_ends)):
        if t is not None and (t.dtype != torch.int32 or t.numel() != m):
            raise ValueError(f"{name} must be int32 with {m} entries")
    if impl == "auto":
        # CPU tensors (no interpreter on the serving path) and strided rows stay on torch
        fits = logits.device.type == "cuda" and logits.stride(1) == 1
        impl = topk_impl(n, logits.dtype) if fits else "torch"
    if impl == "triton":
        if logits.dtype != torch.float32 or logits.stride(1) != 1:
            raise TypeError("the Triton top-k needs float32 logits with a contiguous last dim")
        if m == 0:
            return out
        _topk_radix_kernel[(m,)](
            logits,
            logits if row_starts is None else row_starts.reshape(-1).contiguous(),
            logits if row_ends is None else row_ends.reshape(-1).contiguous(),
            out,
            n,
            logits.stride(0),
            out.stride(0),
            HAS_STARTS=row_starts is not None,
            HAS_ENDS=row_ends is not None,
            TOPK=topk,
            TOPK_PAD=triton.next_power_of_2(topk),
            BLOCK=TOPK_BLOCK,
            num_warps=8,
        )
        return out
    neg = float("-inf")
    col = torch.arange(n, device=logits.device, dtype=torch.int32)[None, :]
    masked = logits
    if row_starts is not None:
        masked = masked.masked_fill(col < row_starts.reshape(-1, 1), neg)
    if row_ends is not None:
        masked = masked.masked_fill(col >= row_ends.reshape(-1, 1), neg)
    k = min(topk, n)
    vals, idx = torch.topk(masked, k, dim=-1)
    idx = idx.to(torch.int32)
    if row_starts is not None:
        idx = idx - row_starts.reshape(-1, 1).to(torch.int32)
    out[:, :k] = torch.where(vals == neg, -1, idx)
    if k < topk:
        out[:, k:] = -1
    return out
