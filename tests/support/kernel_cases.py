"""Kernel test cases: inputs (support.kernel_inputs), kernel call and reference for each case.

Run in-process on a GPU, or on CPU in a subprocess with TRITON_INTERPRET=1 set before triton is
imported (``PYTHONPATH=tests:backend/src python -m support.kernel_cases OUT.pt``), which
saves every case's outputs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from support.kernel_inputs import (
    SCALE,
    attn_inputs,
    mqa_inputs,
    nan_like,
    paged_inputs,
    topk_logits,
)

F16, BF16 = torch.float16, torch.bfloat16

# Explicit plans (config, head blocks, splits) for the non-default paths: non-dividing splits,
# sm_120's 32/64-head plans (16-head blocks of the 32-row ring; the 3-deep 16-row ring of 32-head
# blocks after it), one 64-head tile (H200).
PLANS = {
    "bn32_s3": ((16, 32, 4, 3), 1, 3),
    "bh16x4_bn32_s2": ((16, 32, 4, 3), 4, 2),
    "bh16x3_bn32_s1": ((16, 32, 4, 3), 3, 1),
    "bn16_s1": ((16, 16, 4, 3), 1, 1),
    "bh32_bn16_ns4_s2": ((32, 16, 8, 4), 2, 2),
    "bh64_bn32_s1": ((64, 32, 8, 3), 1, 1),
    # fp8_ds_mla reads (AttnConfig's fp8_read / fp8_decode): on CPU "cvt" decodes byte by byte
    "bn32_s3_group_bits": ((16, 32, 4, 3, 2, "group", "bits"), 1, 3),
    "bn32_s3_tile_bits": ((16, 32, 4, 3, 2, "tile", "bits"), 1, 3),
    "bh16x2_bn16_s1_tile_cvt": ((16, 16, 4, 3, 2, "tile", "cvt"), 2, 1),
    "bn32_s3_group_f8": ((16, 32, 4, 3, 2, "group", "f8"), 1, 3),
    "bh16x2_bn16_s1_group_f8": ((16, 16, 4, 3, 2, "group", "f8"), 2, 1),
}

# name -> (T, H, K, dtype, options for attn_inputs, plus "workspace" / "plan")
ATTN_CASES: dict[str, tuple[int, int, int, torch.dtype, dict]] = {
    "t1_h8_k64_fp16": (1, 8, 64, F16, {}),
    "t1_h16_k256_bf16_pad": (1, 16, 256, BF16, {"pad": 0.3, "tail": 3}),
    "t3_h16_k128_fp16_repeat": (3, 16, 128, F16, {"repeat": True}),
    "t3_h8_k48_bf16_pad": (3, 8, 48, BF16, {"pad": 0.25, "tail": 3}),
    "t5_h8_k16_fp16_empty": (5, 8, 16, F16, {"empty_rows": (0, 3)}),
    "t2_h12_k64_fp16_oddheads": (2, 12, 64, F16, {"pad": 0.2}),
    "t20_h16_k64_bf16_prefill": (20, 16, 64, BF16, {"pad": 0.25, "repeat": True, "tail": 3}),
    "t20_h8_k128_fp16_prefill_oob": (20, 8, 128, F16, {"empty_rows": (7,), "oob": True}),
    "t3_h8_k64_fp16_ws_4d": (3, 8, 64, F16, {"workspace": True, "cache_4d": True}),
    "t2_h16_k32_bf16_empty_all": (2, 16, 32, BF16, {"empty_rows": (0, 1)}),
    # valid count: rows end early at odd places (inside a tile, at a tile edge, at 1, at 0)
    "t5_h8_k256_fp16_counts": (5, 8, 256, F16, {"valid_counts": [1, 33, 64, 200, 0]}),
    "t4_h16_k192_fp16_counts_split": (
        4,
        16,
        192,
        F16,
        {"valid_counts": [70, 5, 160, 192], "plan": "bn32_s3"},
    ),  # fmt: skip
    # MTP: 2 query tokens per request sharing an index set, the first one key short
    "t4_h8_k128_bf16_mtp2": (4, 8, 128, BF16, {"mtp": 2, "pad": 0.1, "workspace": True}),
    "t3_h8_k128_fp16_split3": (3, 8, 128, F16, {"pad": 0.2, "plan": "bn32_s3"}),
    "t4_h16_k96_bf16_1pass_bn16": (4, 16, 96, BF16, {"pad": 0.2, "plan": "bn16_s1"}),
    "t2_h40_k64_fp16_bh32_ns4": (2, 40, 64, F16, {"pad": 0.2, "plan": "bh32_bn16_ns4_s2"}),
    "t2_h64_k64_fp16_bh64": (2, 64, 64, F16, {"tail": 10, "plan": "bh64_bn32_s1"}),
    "t2_h64_k96_fp16_bh16x4_split": (2, 64, 96, F16, {"pad": 0.2, "plan": "bh16x4_bn32_s2"}),
    "t3_h40_k64_bf16_bh16x3": (3, 40, 64, BF16, {"repeat": True, "plan": "bh16x3_bn32_s1"}),
    # cache layouts: 16-token blocks; blocks not back to back (strided view of a bigger buffer)
    "t3_h8_k64_fp16_block16": (3, 8, 64, F16, {"num_blocks": 16, "block_size": 16, "pad": 0.1}),
    "t2_h16_k64_bf16_strided_cache": (2, 16, 64, BF16, {"block_pad": 5, "tail": 7}),
}


def run_attn(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention
    from vllm_sparse_mla.kernels import reference as ref

    t, h, k, dtype, opts = ATTN_CASES[name.removeprefix("attn_")]
    opts = dict(opts)
    use_ws = opts.pop("workspace", False)
    plan_name = opts.pop("plan", None)
    q, kv, idx = attn_inputs(t, h, k, dtype, device, **opts)
    out = nan_like((t, h, 512), dtype, device)
    if plan_name is not None:  # explicit plan, as the benchmark's sweep launches them
        from vllm_sparse_mla.kernels._configs import AttnConfig
        from vllm_sparse_mla.kernels.sparse_mla import Plan, _launch

        cfg, hb, splits = PLANS[plan_name]
        kvs = kv.squeeze(2) if kv.dim() == 4 else kv
        _launch(q, kvs, idx, SCALE, out, None, Plan(AttnConfig(*cfg), hb, splits))
        res = out
    else:
        ws = make_workspace(8, h, k, device, dtype) if use_ws else None
        res = sparse_mla_attention(q, kv, idx, SCALE, out=out, workspace=ws)
    expect, _ = ref.sparse_mla(q, kv.squeeze(2) if kv.dim() == 4 else kv, idx, SCALE)
    return {"out": out.cpu(), "ref": expect.cpu(), "same_object": torch.tensor(res is out)}


MQA_KS = [0, 10, 0, 50, 299, 120, 0]
MQA_KE = [100, 200, 0, 300, 300, 121, 257]


def run_mqa(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels import mqa_logits
    from vllm_sparse_mla.kernels import reference as ref

    q, k, sc, w, ks, ke = mqa_inputs(7, 300, MQA_KS, MQA_KE, device)
    out = mqa_logits((q, None), (k, sc), w, ks, ke, clean_logits=name.endswith("clean"))
    return {"out": out.cpu(), "ref": ref.mqa_logits(q, k, sc, w, ks, ke).cpu()}


# paged_..._t<k>_...: k key tiles per program (IndexerConfig.tiles_per_program) over longer
# contexts: 300, 517 and 129 keys end inside a program's 2nd/3rd tile and inside a tile (tiles of
# 128 keys, max_model_len 700 cuts the last one), 0 keys writes nothing; -1 past each request's
# blocks in the table.
PAGED_TILE_CTX = [300, 0, 517, 129]
PAGED_TILE_MAX_LEN = 700


def paged_written(ctx: torch.Tensor, b: int, next_n: int, max_len: int, block_n: int):
    """[b * next_n, max_len] bool: what clean_logits=False must write (and nothing else): every
    key tile (block_n keys) of a request up to the one holding its largest row limit."""
    from vllm_sparse_mla.kernels import reference as ref

    lim = ref.paged_row_limits(ctx.cpu(), b, next_n).view(b, next_n).clamp(0, max_len)
    end = ((lim.max(dim=1).values + block_n - 1) // block_n * block_n).clamp_max(max_len)
    cols = torch.arange(max_len)[None, :] < end[:, None]  # [b, max_len]
    return cols.repeat_interleave(next_n, dim=0)


def run_paged(name: str, device: str) -> dict[str, torch.Tensor]:
    from dataclasses import replace

    from vllm_sparse_mla.kernels import paged_mqa_logits, paged_mqa_logits_metadata
    from vllm_sparse_mla.kernels import reference as ref
    from vllm_sparse_mla.kernels._configs import PAGED_LOGITS_CONFIG

    # paged_n<k>_...: next_n = k query rows per request (1 + speculative tokens, causal)
    parts = name.split("_")
    next_n = int(parts[1].removeprefix("n"))
    tiles = next((int(p[1:]) for p in parts[2:] if p[0] == "t" and p[1:].isdigit()), None)
    cfg = replace(PAGED_LOGITS_CONFIG, tiles_per_program=tiles or 1)
    if tiles is None:
        ctx, n_blocks, max_len, pad = torch.tensor([5, 128, 70]), 9, 200, False
    else:
        ctx, n_blocks, max_len, pad = torch.tensor(PAGED_TILE_CTX), 44, PAGED_TILE_MAX_LEN, True
    b = ctx.shape[0]
    if "ctx2d" in name:
        ctx = torch.stack([ctx - (next_n - 1 - j) for j in range(next_n)], 1)
    q, cache, w, ctx, bt = paged_inputs(b, next_n, ctx.to(torch.int32), n_blocks, device,
                                        pad_tables=pad)  # fmt: skip
    meta = paged_mqa_logits_metadata(ctx, 64, 4)
    clean = name.endswith("clean")
    out = nan_like((b * next_n, max_len), torch.float32, device)
    res = paged_mqa_logits((q, None), cache, w, ctx, bt, meta, max_len, clean_logits=clean,
                           out=out, config=cfg)  # fmt: skip
    block_n = max(cfg.block_n, cache.shape[1])
    return {
        "out": out.cpu(),
        "ref": ref.paged_mqa_logits(q, cache, w, ctx, bt, max_len).cpu(),
        "written": paged_written(ctx, b, next_n, max_len, block_n),
        "same_object": torch.tensor(res is out),
    }


# Triton radix top-k: name -> (M, N, topk, topk_logits options, row starts, row ends)
TOPK_CASES: dict[str, tuple] = {
    "ranges": (6, 300, 64, {}, [0, 10, 0, 50, 299, 100], [100, 200, 0, 300, 300, 300]),
    "short_rows": (6, 40, 64, {}, None, None),
    "ties": (5, 5000, 100, {"ties": True}, None, None),  # the threshold bin holds many ties
    "neg_inf": (5, 400, 128, {"neg_inf": 0.8}, None, [400, 300, 129, 1, 0]),
    "multi_block": (2, 9000, 2048, {}, [0, 100], [9000, 8190]),  # rows span several steps
}


def run_topk(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels import topk_indices

    m, n, k, opts, st, en = TOPK_CASES[name.removeprefix("topk_")]
    logits = topk_logits(m, n, device, **opts)
    starts = None if st is None else torch.tensor(st, dtype=torch.int32, device=device)
    ends = None if en is None else torch.tensor(en, dtype=torch.int32, device=device)
    out = torch.full((m, k), 12345, dtype=torch.int32, device=device)  # poisoned
    topk_indices(logits, k, starts, ends, out=out, impl="triton")
    res = {"out": out.cpu(), "logits": logits.cpu(), "k": torch.tensor(k)}
    if starts is not None:
        res["starts"] = starts.cpu()
    if ends is not None:
        res["ends"] = ends.cpu()
    return res


CASES: dict[str, Callable[[str, str], dict[str, torch.Tensor]]] = {
    **{f"attn_{n}": run_attn for n in ATTN_CASES},
    "mqa_clean": run_mqa,
    "mqa_raw": run_mqa,
    "paged_n1_clean": run_paged,
    "paged_n1_raw": run_paged,
    "paged_n2_clean": run_paged,
    "paged_n2_ctx2d_clean": run_paged,
    "paged_n3_clean": run_paged,  # MTP k=2: 3 rows per request (NEXT_N_PAD 4, one row masked)
    "paged_n4_clean": run_paged,  # MTP k=3
    "paged_n4_ctx2d_raw": run_paged,
    "paged_n2_t1_raw": run_paged,  # the long contexts at the default one tile per program
    "paged_n1_t2_raw": run_paged,
    "paged_n1_t3_clean": run_paged,
    "paged_n2_t2_clean": run_paged,  # MTP k=1
    "paged_n3_t3_raw": run_paged,  # MTP k=2 (NEXT_N_PAD 4)
    "paged_n2_ctx2d_t3_raw": run_paged,
    "paged_n4_ctx2d_t2_clean": run_paged,
    **{f"topk_{n}": run_topk for n in TOPK_CASES},
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
