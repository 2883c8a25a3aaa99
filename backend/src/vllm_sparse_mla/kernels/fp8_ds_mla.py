"""vLLM's ``fp8_ds_mla`` KV-cache rows (FlashMLA "FP8 with scale"): the Triton write kernel, and
the pure-torch specification of the write and the read.

One 656-byte row per token (``vllm/v1/attention/backends/mla/flashmla_sparse.py``, docstring):
    bytes   0..511  512 float8_e4m3fn latent values
    bytes 512..527  4 little-endian float32 scales, scale g for values 128*g .. 128*g + 127
    bytes 528..655  64 rope values, unquantized, in the model dtype (FlashMLA: bf16; our fp16
                    GLM-5 GGUF: fp16, which only our kernels read)
Quantization rule (vLLM 0.23.0 ``concat_and_cache_ds_mla_kernel``, bf16 variant):
    scale_g = max(max |x| over the 128 values, NaN ignored, FLT_MIN) / 448
    q = e4m3(x / scale_g), round to nearest even, saturating at +-448; NaN -> 0x7F.
Dequantized value: float(e4m3 byte) * scale_g.

Why our own write kernel: vLLM 0.23.0's fp16 variant of ``concat_and_cache_ds_mla_kernel``
takes the tile max of the raw fp16 bit patterns (the sm_120 cubin converts with I2F.U16), so the
scales are wrong for fp16 models; see README "FP8 KV cache".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dims import D_LATENT, D_QK, D_ROPE, FP8_ROW_BYTES

ROW_BYTES = FP8_ROW_BYTES  # 656
GROUP = 128  # latent values per scale
N_GROUPS = D_LATENT // GROUP  # 4
SCALE_OFFSET = D_LATENT  # 512: first scale byte
ROPE_OFFSET = D_LATENT + 4 * N_GROUPS  # 528: first rope byte
FP8_MAX = 448.0
FLT_MIN = 1.1754943508222875e-38  # smallest normal float32: the scale floor of all-zero groups
NAN_BYTE = 0x7F  # what cvt.rn.satfinite.e4m3 writes for NaN (sign dropped)

__all__ = ["ROW_BYTES", "dequantize_rows", "quantize_rows", "write_fp8_ds_mla"]


def _check_inputs(kv_c: torch.Tensor, k_pe: torch.Tensor) -> None:
    if kv_c.dim() != 2 or kv_c.shape[1] != D_LATENT:
        raise ValueError(f"kv_c must be [N, {D_LATENT}], got {tuple(kv_c.shape)}")
    if k_pe.dim() != 2 or k_pe.shape != (kv_c.shape[0], D_ROPE):
        raise ValueError(f"k_pe must be [{kv_c.shape[0]}, {D_ROPE}], got {tuple(k_pe.shape)}")
    if kv_c.dtype not in (torch.float16, torch.bfloat16) or k_pe.dtype != kv_c.dtype:
        raise TypeError(f"kv_c/k_pe must be one of float16/bfloat16, got {kv_c.dtype}/{k_pe.dtype}")


def quantize_rows(kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """Pure-torch specification of the write: [N, 512] + [N, 64] -> uint8 [N, 656]."""
    _check_inputs(kv_c, k_pe)
    n = kv_c.shape[0]
    x = kv_c.float().view(n, N_GROUPS, GROUP)
    amax = torch.where(torch.isnan(x), 0.0, x.abs()).amax(dim=-1)  # [N, 4]
    scale = torch.clamp(amax, min=FLT_MIN) / FP8_MAX  # fp32, as the CUDA kernel
    y = (x / scale[..., None]).clamp(-FP8_MAX, FP8_MAX)  # saturating (NaN stays NaN)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)
    q = torch.where(torch.isnan(x), torch.full_like(q, NAN_BYTE), q).view(n, D_LATENT)
    out = torch.empty(n, ROW_BYTES, dtype=torch.uint8, device=kv_c.device)
    out[:, :SCALE_OFFSET] = q
    out[:, SCALE_OFFSET:ROPE_OFFSET] = scale.contiguous().view(torch.uint8).view(n, 16)
    out[:, ROPE_OFFSET:] = k_pe.contiguous().view(torch.uint8).view(n, 2 * D_ROPE)
    return out


def dequantize_rows(rows: torch.Tensor, rope_dtype: torch.dtype) -> torch.Tensor:
    """Read uint8 [..., 656] rows as FlashMLA does: float64 [..., 576] (exact: each value is an
    e4m3 number times an fp32 scale)."""
    if rows.dtype != torch.uint8 or rows.shape[-1] != ROW_BYTES:
        raise ValueError(f"rows must be uint8 [..., {ROW_BYTES}], got {rows.dtype} {rows.shape}")
    lead = rows.shape[:-1]
    r = rows.reshape(-1, ROW_BYTES).contiguous()
    q = r[:, :SCALE_OFFSET].view(torch.float8_e4m3fn).double().view(-1, N_GROUPS, GROUP)
    scale = r[:, SCALE_OFFSET:ROPE_OFFSET].contiguous().view(torch.float32).double()
    nope = (q * scale[..., None]).view(-1, D_LATENT)
    rope = r[:, ROPE_OFFSET:].contiguous().view(rope_dtype).double()
    return torch.cat([nope, rope], dim=-1).view(*lead, D_QK)


@triton.jit
def _e4m3_bits(y):
    """fp32 in [-448, 448] (not NaN) -> e4m3fn byte, round to nearest even, in integer ops.

    Not ``.to(tl.float8e4nv)``: the Triton 3.6 interpreter rounds some values into the wrong
    binade (0x68 for 0x70) and others one step off, so the CPU tests could not be bit-exact;
    integer rounding gives the same bytes on the interpreter and every GPU.
    """
    u = y.to(tl.uint32, bitcast=True)
    sign = (u >> 31) << 7
    a = u & 0x7FFFFFFF
    # normals (|y| >= 2**-6): keep 3 of fp32's 23 mantissa bits, ties to even; a carry out of
    # the mantissa bumps the exponent, as it should; rebias 127 -> 7
    r = a + 0x7FFFF + ((a >> 20) & 1)
    normal = ((r >> 20) - (120 << 3)).to(tl.int32)
    # subnormals: multiples of 2**-9 (8 * 2**-9 = 2**-6 is code 0x08, the smallest normal)
    v = (a.to(tl.float32, bitcast=True)) * 512.0
    t = v.to(tl.int32)
    frac = v - t.to(tl.float32)
    t = t + ((frac > 0.5) | ((frac == 0.5) & ((t & 1) == 1))).to(tl.int32)
    mag = tl.where(a >= 0x3C800000, normal, t)  # 0x3C800000 = 2**-6
    return (mag | sign.to(tl.int32)).to(tl.uint8)


@triton.jit
def _write_kernel(
    kv_c_ptr,
    k_pe_ptr,
    slot_ptr,
    cache_ptr,
    stride_c,
    stride_pe,
    stride_cb,
    stride_cs,
    KV_BLOCK: tl.constexpr,
    D_LATENT: tl.constexpr,
    D_ROPE: tl.constexpr,
    GROUP: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FLT_MIN: tl.constexpr,
    EXACT_DIV: tl.constexpr,
):
    """One program per token: 4 scales, 512 e4m3 bytes, 64 rope values into its 656-B row."""
    N_GROUPS: tl.constexpr = D_LATENT // GROUP
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    if slot >= 0:  # -1 = padded token (CUDA graphs): nothing written
        p_row = cache_ptr + (slot // KV_BLOCK) * stride_cb + (slot % KV_BLOCK) * stride_cs
        o_g = tl.arange(0, N_GROUPS)
        o_v = tl.arange(0, GROUP)
        o_2d = o_g[:, None] * GROUP + o_v[None, :]
        x = tl.load(kv_c_ptr + i * stride_c + o_2d).to(tl.float32)  # [4, 128]
        is_nan = x != x
        amax = tl.max(tl.where(is_nan, 0.0, tl.abs(x)), axis=1)
        scale = tl.maximum(amax, FLT_MIN) / FP8_MAX
        # IEEE division on GPUs, as the CUDA kernel's x / scale (triton's "/" is approximate);
        # the interpreter's numpy "/" already is IEEE
        y = tl.math.div_rn(x, scale[:, None]) if EXACT_DIV else x / scale[:, None]
        y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
        b = tl.where(is_nan, 0x7F, _e4m3_bits(tl.where(is_nan, 0.0, y))).to(tl.uint8)
        tl.store(p_row + o_2d, b)
        tl.store((p_row + D_LATENT).to(tl.pointer_type(tl.float32)) + o_g, scale)
        o_r = tl.arange(0, D_ROPE)
        pe = tl.load(k_pe_ptr + i * stride_pe + o_r)
        tl.store((p_row + D_LATENT + 4 * N_GROUPS).to(tl.pointer_type(pe.dtype)) + o_r, pe)


def write_fp8_ds_mla(
    kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Quantize and write token rows into an ``fp8_ds_mla`` cache (vLLM's do_kv_cache_update).

    kv_c [N, 512], k_pe [N, 64] (or [N, 1, 64]) fp16/bf16; kv_cache uint8 [num_blocks,
    block_size, 656] (power-of-two block size); slot_mapping [M <= N] int32/int64 global slots,
    -1 = skip; rows M.. of kv_c are not read (vLLM's CUDA-graph padding). No host sync.
    """
    if k_pe.dim() == 3:
        k_pe = k_pe.squeeze(1)
    _check_inputs(kv_c, k_pe)
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3 or kv_cache.shape[2] != ROW_BYTES:
        raise ValueError(
            f"kv_cache must be uint8 [num_blocks, block_size, {ROW_BYTES}], "
            f"got {kv_cache.dtype} {tuple(kv_cache.shape)}"
        )
    block_size = kv_cache.shape[1]
    if block_size & (block_size - 1):
        raise ValueError(f"kv_cache block size must be a power of two, got {block_size}")
    # As vLLM's concat_and_cache_mla: slot_mapping's length is the token count; kv_c may hold
    # more rows (padding for CUDA graphs), which are not written.
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] > kv_c.shape[0]:
        raise ValueError(
            f"slot_mapping must be 1-D with <= {kv_c.shape[0]} entries, got {slot_mapping.shape}"
        )
    if kv_c.stride(-1) != 1 or k_pe.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("kv_c, k_pe and kv_cache need a contiguous last dimension")
    if kv_cache.stride(1) % 4 or kv_cache.stride(0) % 4:
        raise ValueError("kv_cache rows must start 4-byte aligned (fp32 scales)")
    n = slot_mapping.shape[0]
    if n == 0:
        return
    _write_kernel[(n,)](
        kv_c,
        k_pe,
        slot_mapping,
        kv_cache,
        kv_c.stride(0),
        k_pe.stride(0),
        kv_cache.stride(0),
        kv_cache.stride(1),
        KV_BLOCK=block_size,
        D_LATENT=D_LATENT,
        D_ROPE=D_ROPE,
        GROUP=GROUP,
        FP8_MAX=FP8_MAX,
        FLT_MIN=FLT_MIN,
        EXACT_DIV=kv_c.device.type == "cuda",
        num_warps=4,
    )
