"""Kernel test cases: inputs, kernel call and reference for each named case.

Run in-process on a GPU, or on CPU in a subprocess with TRITON_INTERPRET=1 set before triton is
imported (``python tests/kernels/kernel_cases.py OUT.pt``), which saves every case's outputs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

_SRC = Path(__file__).resolve().parents[2] / "backend" / "src"
if str(_SRC) not in sys.path:  # pragma: no cover - pytest's pythonpath already has it
    sys.path.insert(0, str(_SRC))

import torch  # noqa: E402

SCALE = 1.0 / 16  # GLM-5: qk_head_dim ** -0.5 with qk_head_dim = 256
NUM_BLOCKS, BLOCK_SIZE = 4, 64  # 256 slots: repeats across tokens are common
F16, BF16 = torch.float16, torch.bfloat16

# name -> (T, H, K, dtype, options)
ATTN_CASES: dict[str, tuple[int, int, int, torch.dtype, dict]] = {
    "t1_h8_k64_fp16": (1, 8, 64, F16, {}),
    "t1_h16_k256_bf16_pad": (1, 16, 256, BF16, {"pad": 0.3}),
    "t3_h16_k128_fp16_repeat": (3, 16, 128, F16, {"repeat": True}),
    "t3_h8_k48_bf16_pad": (3, 8, 48, BF16, {"pad": 0.25}),
    "t5_h8_k16_fp16_empty": (5, 8, 16, F16, {"empty_rows": (0, 3)}),
    "t2_h12_k64_fp16_oddheads": (2, 12, 64, F16, {"pad": 0.2}),
    "t20_h16_k64_bf16_prefill": (20, 16, 64, BF16, {"pad": 0.25, "repeat": True}),
    "t20_h8_k128_fp16_prefill_oob": (20, 8, 128, F16, {"empty_rows": (7,), "oob": True}),
    "t3_h8_k64_fp16_ws_4d": (3, 8, 64, F16, {"workspace": True, "cache_4d": True}),
    "t2_h16_k32_bf16_empty_all": (2, 16, 32, BF16, {"empty_rows": (0, 1)}),
    "t3_h8_k128_fp16_noprefetch_split": (3, 8, 128, F16, {"pad": 0.2, "plan": (False, 4)}),
    "t4_h16_k96_bf16_noprefetch_1pass": (4, 16, 96, BF16, {"pad": 0.2, "plan": (False, 1)}),
}


def make_attn_inputs(t, h, k, dtype, opts, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, 576, generator=g).to(dtype)
    kv = torch.randn(NUM_BLOCKS, BLOCK_SIZE, 576, generator=g).to(dtype)
    n_slots = NUM_BLOCKS * BLOCK_SIZE
    # distinct per row unless told to repeat
    idx = torch.stack([torch.randperm(n_slots, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    if opts.get("repeat"):
        idx[:, 1::3] = idx[:, 0:1]  # one slot many times per row
    if "pad" in opts:
        idx[torch.rand(t, k, generator=g) < opts["pad"]] = -1
        idx[:, -3:] = -1  # a -1 tail too
    if opts.get("oob"):
        idx[:, 2] = n_slots + 5  # beyond the cache: treated as empty
    for r in opts.get("empty_rows", ()):
        idx[r] = -1
    if opts.get("cache_4d"):
        kv = kv.unsqueeze(2)
    return q.to(device), kv.to(device), idx.to(device)


def run_attn(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention
    from vllm_sparse_mla.kernels import reference as ref

    t, h, k, dtype, opts = ATTN_CASES[name.removeprefix("attn_")]
    q, kv, idx = make_attn_inputs(t, h, k, dtype, opts, device)
    out = torch.full((t, h, 512), float("nan"), dtype=dtype, device=device)
    ws = make_workspace(8, h, k, device, dtype) if opts.get("workspace") else None
    if "plan" in opts:  # explicit config (the non-default gather path), as the benchmark does
        from vllm_sparse_mla.kernels._configs import AttnConfig
        from vllm_sparse_mla.kernels.sparse_mla import _launch

        prefetch, splits = opts["plan"]
        _launch(q, kv, idx, SCALE, out, None, AttnConfig(16, 32, 4, 2, prefetch), 1, splits)
        res = out
    else:
        res = sparse_mla_attention(q, kv, idx, SCALE, out=out, workspace=ws)
    expect, _ = ref.sparse_mla(q, kv.squeeze(2) if kv.dim() == 4 else kv, idx, SCALE)
    return {"out": out.cpu(), "ref": expect.cpu(), "same_object": torch.tensor(res is out)}


# Indexer: GLM-5 / DeepSeek-V3.2 indexer has 32 heads of 128.
IDX_H, IDX_D = 32, 128


def _fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def _ue8m0(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.exp2(torch.randint(-3, 2, (n,), generator=g).float())


def run_mqa(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels import mqa_logits
    from vllm_sparse_mla.kernels import reference as ref

    clean = name.endswith("clean")
    g = torch.Generator().manual_seed(1)
    m, n = 7, 300
    q = _fp8(torch.randn(m, IDX_H, IDX_D, generator=g) * 2)
    k = _fp8(torch.randn(n, IDX_D, generator=g) * 2)
    sc = _ue8m0(n, g)
    w = torch.randn(m, IDX_H, generator=g) * 0.1
    ks = torch.tensor([0, 10, 0, 50, 299, 120, 0], dtype=torch.int32)
    ke = torch.tensor([100, 200, 0, 300, 300, 121, 257], dtype=torch.int32)
    args = [x.to(device) for x in (q, k, sc, w, ks, ke)]
    q, k, sc, w, ks, ke = args
    out = mqa_logits((q, None), (k, sc), w, ks, ke, clean_logits=clean)
    return {"out": out.cpu(), "ref": ref.mqa_logits(q, k, sc, w, ks, ke).cpu()}


def make_paged(b, next_n, ctx, n_blocks, g, device):
    bs, d = BLOCK_SIZE, IDX_D
    q = _fp8(torch.randn(b, next_n, IDX_H, d, generator=g))
    vals = _fp8(torch.randn(n_blocks, bs * d, generator=g)).view(torch.uint8)
    scales = _ue8m0(n_blocks * bs, g).view(n_blocks, bs).view(torch.uint8)
    cache = torch.cat([vals, scales], 1).view(n_blocks, bs, 1, d + 4)
    max_blocks = n_blocks // b
    bt = torch.randperm(n_blocks, generator=g)[: b * max_blocks].view(b, max_blocks)
    w = torch.randn(b * next_n, IDX_H, generator=g) * 0.1
    return [x.to(device) for x in (q, cache, w, ctx, bt.to(torch.int32))]


def run_paged(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels import paged_mqa_logits, paged_mqa_logits_metadata
    from vllm_sparse_mla.kernels import reference as ref

    g = torch.Generator().manual_seed(2)
    next_n = 2 if "n2" in name else 1
    ctx = torch.tensor([5, 128, 70], dtype=torch.int32)
    if "ctx2d" in name:
        ctx = torch.stack([ctx - (next_n - 1 - j) for j in range(next_n)], 1).to(torch.int32)
    q, cache, w, ctx, bt = make_paged(3, next_n, ctx, 9, g, device)
    meta = paged_mqa_logits_metadata(ctx, BLOCK_SIZE, 4)
    max_len = 200
    clean = name.endswith("clean")
    out = paged_mqa_logits((q, None), cache, w, ctx, bt, meta, max_len, clean_logits=clean)
    return {"out": out.cpu(), "ref": ref.paged_mqa_logits(q, cache, w, ctx, bt, max_len).cpu()}


def run_topk(name: str, device: str) -> dict[str, torch.Tensor]:
    from vllm_sparse_mla.kernels import reference as ref
    from vllm_sparse_mla.kernels import topk_indices

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 300, generator=g).to(device)
    starts = torch.tensor([0, 10, 0, 50, 299, 100], dtype=torch.int32, device=device)
    ends = torch.tensor([100, 200, 0, 300, 300, 300], dtype=torch.int32, device=device)
    if name == "topk_ranges":
        got = topk_indices(logits, 64, starts, ends)
        expect = ref.topk_indices(logits, 64, starts, ends)
    else:  # whole rows, k > N
        got = topk_indices(logits[:, :40], 64)
        expect = ref.topk_indices(logits[:, :40], 64)
    return {"out": got.cpu(), "ref": expect.cpu()}


CASES: dict[str, Callable[[str, str], dict[str, torch.Tensor]]] = {
    **{f"attn_{n}": run_attn for n in ATTN_CASES},
    "mqa_clean": run_mqa,
    "mqa_raw": run_mqa,
    "paged_n1_clean": run_paged,
    "paged_n1_raw": run_paged,
    "paged_n2_clean": run_paged,
    "paged_n2_ctx2d_clean": run_paged,
    "topk_ranges": run_topk,
    "topk_short_rows": run_topk,
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
