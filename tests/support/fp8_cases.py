"""fp8_ds_mla kernel cases: the Triton write kernel against the pure-torch write, and the fp8 row
attention against the fp64 reference on the dequantized cache.

Run in-process on a GPU, or on CPU in a subprocess with TRITON_INTERPRET=1 set before triton is
imported (``PYTHONPATH=tests:backend/src python -m support.fp8_cases OUT.pt``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from support.kernel_cases import PLANS
from support.kernel_inputs import SCALE, attn_inputs, nan_like

F16, BF16 = torch.float16, torch.bfloat16
POISON = 0xAB  # cache bytes no write may touch


def exhaustive_f16(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite fp16 value with |x| <= 448, each group holding a 448 so its scale is exactly
    1.0: the e4m3 rounding of every tie, subnormal and binade edge, unscaled."""
    allbits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(F16)
    vals = allbits[torch.isfinite(allbits) & (allbits.abs() <= 448)]
    per = 127
    n_groups = -(-vals.numel() // per)
    pad = torch.zeros(n_groups * per - vals.numel(), dtype=F16)
    groups = torch.cat([vals, pad]).view(n_groups, per)
    groups = torch.cat([torch.full((n_groups, 1), 448.0, dtype=F16), groups], dim=1)
    n_rows = -(-n_groups // 4)
    extra = torch.zeros(n_rows * 4 - n_groups, 128, dtype=F16)
    kv_c = torch.cat([groups, extra]).view(n_rows, 512)
    g = torch.Generator().manual_seed(5)
    k_pe = torch.randn(n_rows, 64, generator=g).to(F16)
    return kv_c.to(device), k_pe.to(device)


def edge_rows(dtype: torch.dtype, device: str, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rows plus the cases behind "garbage on SM120" reports: an all-zero group (scale
    floor), values at the dtype's range end, tiny groups (subnormal e4m3), NaN, -0.0."""
    g = torch.Generator().manual_seed(6)
    kv_c = (torch.randn(n, 512, generator=g) * 3).to(dtype)
    big = 60000.0 if dtype == F16 else 1e30
    kv_c[1, :128] = 0
    kv_c[2, 128:256] *= big / 12
    kv_c[3, 5] = float("nan")
    kv_c[3, 300] = -float("nan")
    kv_c[4, 256:384] *= 1e-5
    kv_c[5, 384:] = -0.0
    kv_c[6, :] = big
    kv_c[7, 0::2] = -448.0  # exact scale 1.0 groups
    k_pe = torch.randn(n, 64, generator=g).to(dtype)
    k_pe[2] *= 1000
    return kv_c.to(device), k_pe.to(device)


def run_write(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels.fp8_ds_mla import quantize_rows, write_fp8_ds_mla

    if name == "write_f16_exhaustive":
        kv_c, k_pe = exhaustive_f16(device)
    else:
        kv_c, k_pe = edge_rows(F16 if "f16" in name else BF16, device)
    n = kv_c.shape[0]
    block = 16
    nb = -(-2 * n // block)
    cache = torch.full((nb, block, 656), POISON, dtype=torch.uint8, device=device)
    g = torch.Generator().manual_seed(7)
    slots = torch.randperm(nb * block, generator=g)[:n].to(device)
    slots[1::5] = -1  # padded tokens
    write_fp8_ds_mla(kv_c, k_pe, cache, slots)
    return {
        "cache": cache.cpu(),
        "slots": slots.cpu(),
        "ref": quantize_rows(kv_c, k_pe).cpu(),
        "kv_c": kv_c.cpu(),
    }


# name -> (T, H, K, dtype, attn_inputs options, plus "plan" / "scale0" / "big")
FP8_ATTN_CASES: dict[str, tuple[int, int, int, torch.dtype, dict]] = {
    "t1_h8_k64_fp16": (1, 8, 64, F16, {}),
    "t3_h16_k128_bf16_pad_repeat": (3, 16, 128, BF16, {"pad": 0.3, "repeat": True, "tail": 3}),
    "t5_h8_k16_fp16_empty": (5, 8, 16, F16, {"empty_rows": (0, 3)}),
    "t20_h8_k128_fp16_prefill_oob": (20, 8, 128, F16, {"empty_rows": (7,), "oob": True}),
    "t4_h16_k192_bf16_split3": (
        4,
        16,
        192,
        BF16,
        {"valid_counts": [70, 5, 160, 192], "plan": "bn32_s3"},
    ),
    "t3_h8_k64_fp16_block16_scale0": (
        3,
        8,
        64,
        F16,
        {"num_blocks": 16, "block_size": 16, "scale0": True},
    ),
    "t2_h16_k64_bf16_strided_big": (2, 16, 64, BF16, {"block_pad": 5, "big": True}),
    "t2_h16_k64_fp16_big": (2, 16, 64, F16, {"big": True, "pad": 0.2}),
    # the other reads and decodes: scales far from 1 (both ways) and a -1 tail, where a wrong
    # 2**-8 unit or an fp16 overflow in the PV weights would show
    "t4_h16_k192_fp16_big_group_bits": (
        4,
        16,
        192,
        F16,
        {"big": True, "scale0": True, "tail": 5, "plan": "bn32_s3_group_bits"},
    ),
    "t4_h16_k192_bf16_big_tile_bits": (
        4,
        16,
        192,
        BF16,
        {"big": True, "scale0": True, "tail": 5, "plan": "bn32_s3_tile_bits"},
    ),
    "t3_h24_k64_fp16_tile_cvt": (3, 24, 64, F16, {"pad": 0.3, "plan": "bh16x2_bn16_s1_tile_cvt"}),
    # the e4m3 loads triton converts, logits transposed: big/zero-group scales, split partials,
    # repeated indices and a -1 tail; odd heads over two head blocks in one pass
    "t4_h16_k192_bf16_big_group_f8": (
        4,
        16,
        192,
        BF16,
        {"big": True, "scale0": True, "tail": 5, "repeat": True, "plan": "bn32_s3_group_f8"},
    ),
    "t3_h24_k64_fp16_group_f8": (3, 24, 64, F16, {"pad": 0.3, "plan": "bh16x2_bn16_s1_group_f8"}),
}


def fp8_attn_inputs(t, h, k, dtype, device, opts):
    """(q, uint8 fp8_ds_mla cache [nb, bs, 656] (a strided view with block_pad), idx)."""
    from vllm_sparse_mla.kernels.fp8_ds_mla import quantize_rows

    opts = dict(opts)
    scale0, big = opts.pop("scale0", False), opts.pop("big", False)
    block_pad = opts.pop("block_pad", 0)
    q, kv, idx = attn_inputs(t, h, k, dtype, "cpu", **opts)
    nb, bs, _ = kv.shape
    flat = kv.reshape(-1, 576).clone()
    if scale0:  # every other row: one all-zero latent group (scale floor FLT_MIN / 448)
        flat[0::2, 128:256] = 0
    if big:  # latent values far above 448 in a few rows (scales >> 1)
        flat[1::3, :512] *= 2000 if dtype == F16 else 1e6
        q = q / (2000 if dtype == F16 else 1e6)
    rows = quantize_rows(flat[:, :512].contiguous(), flat[:, 512:].contiguous()).view(nb, bs, 656)
    if block_pad:
        buf = torch.zeros(nb, bs + block_pad, 656, dtype=torch.uint8)
        buf[:, :bs] = rows
        rows = buf[:, :bs]
    return q.to(device), rows.to(device), idx.to(device)


def run_fp8_attn(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels import reference as ref
    from vllm_sparse_mla.kernels import sparse_mla_attention
    from vllm_sparse_mla.kernels.fp8_ds_mla import dequantize_rows

    t, h, k, dtype, opts = FP8_ATTN_CASES[name.removeprefix("attn8_")]
    opts = dict(opts)
    plan_name = opts.pop("plan", None)
    q, rows, idx = fp8_attn_inputs(t, h, k, dtype, device, opts)
    out = nan_like((t, h, 512), dtype, device)
    if plan_name is not None:
        from vllm_sparse_mla.kernels._configs import AttnConfig
        from vllm_sparse_mla.kernels.sparse_mla import Plan, _launch

        cfg, hb, splits = PLANS[plan_name]
        _launch(q, rows, idx, SCALE, out, None, Plan(AttnConfig(*cfg), hb, splits))
    else:
        sparse_mla_attention(q, rows, idx, SCALE, out=out)
    deq = dequantize_rows(rows.cpu(), dtype)
    expect, _ = ref.sparse_mla(q.cpu(), deq, idx.cpu(), SCALE)
    return {"out": out.cpu(), "ref": expect, "idx": idx.cpu()}


def run_swapped_scales(name: str, device: str) -> dict[str, torch.Tensor]:
    """The kernel on rows whose 4 scales were written in reverse order (a layout bug): its output
    must NOT match the reference of the correct rows (the test can fail on a layout error)."""
    from vllm_sparse_mla.kernels import reference as ref
    from vllm_sparse_mla.kernels import sparse_mla_attention
    from vllm_sparse_mla.kernels.fp8_ds_mla import dequantize_rows, quantize_rows

    q, kv, idx = attn_inputs(2, 16, 64, F16, "cpu")
    flat = kv.reshape(-1, 576).float()
    flat[:, :512] *= torch.tensor([0.25, 1.0, 4.0, 8.0]).repeat_interleave(128)  # unequal scales
    flat = flat.to(F16)
    rows = quantize_rows(flat[:, :512].contiguous(), flat[:, 512:].contiguous())
    bad = rows.clone()
    bad[:, 512:528] = rows[:, 512:528].view(-1, 4, 4).flip(1).reshape(-1, 16)
    shape = (kv.shape[0], kv.shape[1], 656)
    out = sparse_mla_attention(q.to(device), bad.view(shape).to(device), idx.to(device), SCALE)
    expect, _ = ref.sparse_mla(q, dequantize_rows(rows, F16).view(*shape[:2], 576), idx, SCALE)
    return {"out": out.cpu(), "ref": expect}


def run_exact_rows(name: str, device: str) -> dict[str, torch.Tensor]:
    """Rows the fp8 format holds exactly (latent = e4m3 values x power-of-two scales, rope any
    16-bit value, large): the fp8-row kernel must give what the 16-bit-row kernel gives on the
    same values (rope read at full precision, scales applied per 128 in the right order)."""
    from vllm_sparse_mla.kernels import sparse_mla_attention
    from vllm_sparse_mla.kernels.fp8_ds_mla import dequantize_rows, quantize_rows

    dtype = F16 if "f16" in name else BF16
    q, kv, idx = attn_inputs(3, 16, 64, dtype, "cpu", pad=0.2)
    flat = kv.reshape(-1, 576).float()
    g = torch.Generator().manual_seed(4)
    codes = torch.randint(0, 256, (flat.shape[0], 512), generator=g, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes
    codes[:, 0::128] = 0x7E  # 448 in every group: amax = 448 * 2**k, so scale = 2**k exactly
    pow2 = 2.0 ** torch.randint(-6, 3, (flat.shape[0], 4), generator=g).float()
    e4 = codes.view(torch.float8_e4m3fn).float() * pow2.repeat_interleave(128, dim=1)
    flat[:, :512] = e4
    flat[:, 512:] *= 300.0  # rope far outside e4m3's precision
    flat = flat.to(dtype)
    rows = quantize_rows(flat[:, :512].contiguous(), flat[:, 512:].contiguous())
    exact = dequantize_rows(rows, dtype).to(dtype)
    shape = kv.shape
    out8 = sparse_mla_attention(q.to(device), rows.view(*shape[:2], 656).to(device), idx.to(device),
                                SCALE)  # fmt: skip
    out16 = sparse_mla_attention(q.to(device), exact.view(shape).to(device), idx.to(device), SCALE)
    return {"out8": out8.cpu(), "out16": out16.cpu(),
            "roundtrip": torch.tensor(torch.equal(exact, flat))}  # fmt: skip


CASES: dict[str, Callable[[str, str], dict[str, torch.Tensor]]] = {
    "write_f16_exhaustive": run_write,
    "write_f16_edges": run_write,
    "write_bf16_edges": run_write,
    **{f"attn8_{n}": run_fp8_attn for n in FP8_ATTN_CASES},
    "swapped_scales": run_swapped_scales,
    "exact_rows_f16": run_exact_rows,
    "exact_rows_bf16": run_exact_rows,
}


def run_case(name: str, device: str) -> dict[str, torch.Tensor]:
    return CASES[name](name, device)


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("error: set TRITON_INTERPRET=1 before running the CPU cases", file=sys.stderr)
        return 2
    results = {}
    for name in CASES:
        try:
            results[name] = run_case(name, "cpu")
        except Exception as exc:  # reported per case by the test
            results[name] = {"error": repr(exc)}
    torch.save(results, argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
