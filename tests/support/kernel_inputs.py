"""Kernel test inputs and tolerances: ONE input maker per kernel and ONE tolerance table, shared by
the CPU (Triton interpreter) cases, the GPU tests and the benchmark's correctness check.

Metric (one, everywhere): an output passes when
    max |out - ref|          <= atol + rtol * max |ref|       (element bound, scaled to the data)
    ||out - ref|| / ||ref||  <= rel                             (relative Frobenius norm)
``ref`` is the fp32 (CPU: fp64-accumulated) torch reference,
``vllm_sparse_mla.kernels.reference``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE = 1.0 / 16  # GLM-5: qk_head_dim ** -0.5 with qk_head_dim = 256
IDX_H, IDX_D = 32, 128  # GLM-5 / DeepSeek-V3.2 indexer: 32 heads of 128


@dataclass(frozen=True)
class Tol:
    atol: float
    rtol: float
    rel: float


# One table, keyed by output dtype (attention: q's dtype; indexer logits: float32).
TOL: dict[torch.dtype, Tol] = {
    torch.float16: Tol(atol=2e-3, rtol=4e-3, rel=2e-3),
    torch.bfloat16: Tol(atol=1e-2, rtol=2e-2, rel=1e-2),
    torch.float32: Tol(atol=1e-2, rtol=1e-4, rel=1e-3),  # fp8 products, fp32 sums
}


def check_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Assert ``out`` matches ``ref`` by the one metric above (NaN anywhere fails)."""
    tol = TOL[dtype or out.dtype]
    o, r = out.double(), ref.double()
    assert not torch.isnan(o).any(), "NaN in output (unwritten or 0/0)"
    assert o.shape == r.shape, (o.shape, r.shape)
    if r.numel() == 0:
        return
    err = (o - r).abs().max().item()
    bound = tol.atol + tol.rtol * r.abs().max().item()
    assert err <= bound, f"max |out - ref| = {err:.3g} > {bound:.3g}"
    den = r.norm().item()
    rel = (o - r).norm().item() / den if den > 0 else (o - r).norm().item()
    assert rel <= tol.rel, f"relative error {rel:.3g} > {tol.rel:.3g}"


def nan_like(shape, dtype, device) -> torch.Tensor:
    """An output buffer poisoned with NaN, so anything the kernel leaves unwritten fails."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def attn_inputs(
    t: int,
    h: int,
    k: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    *,
    num_blocks: int = 4,
    block_size: int = 64,
    pad: float = 0.0,
    tail: int = 0,
    repeat: bool = False,
    oob: bool = False,
    empty_rows: tuple[int, ...] = (),
    valid_counts: list[int] | None = None,
    mtp: int = 1,
    cache_4d: bool = False,
    distinct: bool = True,
    block_pad: int = 0,
    seed: int = 0,
):
    """(q [t, h, 576], kv [num_blocks, block_size, (1,) 576], idx [t, k] int32) for the attention.

    pad: fraction of -1 scattered anywhere; tail: the last ``tail`` entries -1; repeat: one slot
    many times per row; oob: an id beyond the cache (empty); empty_rows: rows of -1 only;
    valid_counts: row r keeps only its first valid_counts[r] entries (vLLM's -1 tails);
    mtp: consecutive groups of ``mtp`` tokens share a request's index set (speculative decode),
    each later token seeing one more key; distinct=False draws ids with replacement (fast, for
    real shapes). Generated on CPU, then moved (same data on every device).
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, 576, generator=g).to(dtype)
    kv = torch.randn(num_blocks, block_size + block_pad, 576, generator=g).to(dtype)
    kv = kv[:, :block_size]  # block_pad > 0: blocks not back to back (a strided cache view)
    n_slots = num_blocks * block_size
    if distinct and k <= n_slots:
        idx = torch.stack([torch.randperm(n_slots, generator=g)[:k] for _ in range(t)])
    else:
        idx = torch.randint(0, n_slots, (t, k), generator=g)
    idx = idx.to(torch.int32)
    if mtp > 1:
        for r in range(t):
            idx[r] = idx[r - r % mtp]
            drop = mtp - 1 - r % mtp  # the last token of a request sees all keys
            if drop:
                idx[r, k - drop :] = -1
    if repeat:
        idx[:, 1::3] = idx[:, 0:1]
    if pad:
        idx[torch.rand(t, k, generator=g) < pad] = -1
    if tail:
        idx[:, k - tail :] = -1
    if oob:
        idx[:, 2] = n_slots + 5
    if valid_counts is not None:
        for r, c in enumerate(valid_counts):
            idx[r, c:] = -1
    for r in empty_rows:
        idx[r] = -1
    if cache_4d:
        kv = kv.unsqueeze(2)
    return q.to(device), kv.to(device), idx.to(device)  # .to keeps a strided view's strides


def fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def ue8m0(shape, g: torch.Generator) -> torch.Tensor:
    """Positive power-of-two scales, as vLLM writes them."""
    return torch.exp2(torch.randint(-3, 2, shape, generator=g).float())


def mqa_inputs(m: int, n: int, ks, ke, device="cpu", seed: int = 1):
    """(q [m, 32, 128] fp8, k [n, 128] fp8, scales [n], weights [m, 32], ks, ke) for mqa_logits."""
    g = torch.Generator().manual_seed(seed)
    q = fp8(torch.randn(m, IDX_H, IDX_D, generator=g) * 2)
    k = fp8(torch.randn(n, IDX_D, generator=g) * 2)
    sc = ue8m0((n,), g)
    w = torch.randn(m, IDX_H, generator=g) * 0.1
    ks = torch.as_tensor(ks, dtype=torch.int32)
    ke = torch.as_tensor(ke, dtype=torch.int32)
    return [x.to(device) for x in (q, k, sc, w, ks, ke)]


def paged_inputs(
    b: int,
    next_n: int,
    ctx,
    n_blocks: int,
    device="cpu",
    *,
    block_size=64,
    pad_tables: bool = False,
    seed=2,
):
    """(q [b, next_n, 32, 128] fp8, cache uint8 [n_blocks, block_size, 1, 132], weights,
    context_lens, block_tables [b, n_blocks // b]) for paged_mqa_logits. pad_tables: the table
    entries past each request's last key -1 (a kernel that reads them faults or reads garbage)."""
    g = torch.Generator().manual_seed(seed)
    d = IDX_D
    q = fp8(torch.randn(b, next_n, IDX_H, d, generator=g))
    vals = fp8(torch.randn(n_blocks, block_size * d, generator=g)).view(torch.uint8)
    scales = ue8m0((n_blocks, block_size), g).view(torch.uint8)
    cache = torch.cat([vals, scales], 1).view(n_blocks, block_size, 1, d + 4)
    max_blocks = n_blocks // b
    bt = torch.randperm(n_blocks, generator=g)[: b * max_blocks].view(b, max_blocks)
    w = torch.randn(b * next_n, IDX_H, generator=g) * 0.1
    ctx = torch.as_tensor(ctx, dtype=torch.int32)
    if pad_tables:
        last = ctx.reshape(b, -1).max(dim=1).values.clamp_min(0)  # keys of each request
        used = (last + block_size - 1) // block_size
        bt[torch.arange(max_blocks)[None, :] >= used[:, None]] = -1
    return [x.to(device) for x in (q, cache, w, ctx, bt.to(torch.int32))]


def topk_logits(m: int, n: int, device="cpu", *, ties: bool = False, neg_inf: float = 0.0, seed=3):
    """[m, n] float32 logits; ties: values on a coarse grid (many equal values); neg_inf: that
    fraction set to -inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g)
    if ties:
        x = (x * 4).round() / 4
    if neg_inf:
        x[torch.rand(m, n, generator=g) < neg_inf] = float("-inf")
    return x.to(device)


def check_topk(out: torch.Tensor, logits: torch.Tensor, topk: int, starts=None, ends=None) -> None:
    """Contract of vLLM's top_k_per_row: per row, the positions (relative to the row start) of
    the min(topk, finite keys in range) largest logits, each once, then -1. Ties may pick any
    of the tied keys, so rows are compared by the multiset of selected values, not positions."""
    m, n = logits.shape
    assert out.shape == (m, topk) and out.dtype == torch.int32
    for r in range(m):
        s = 0 if starts is None else int(starts[r])
        e = n if ends is None else int(ends[r])
        e = max(min(e, n), s)
        row = logits[r, s:e].double()
        finite = row[torch.isfinite(row)]
        want = torch.sort(finite, descending=True).values[:topk]
        got = out[r]
        sel = got[got >= 0].long()
        assert torch.all(got[: sel.numel()] >= 0) and torch.all(got[sel.numel() :] == -1), (
            f"row {r}: -1 must only pad the tail"
        )
        assert sel.numel() == want.numel(), f"row {r}: {sel.numel()} picked, {want.numel()} due"
        assert sel.unique().numel() == sel.numel(), f"row {r}: a position picked twice"
        assert torch.all(sel < e - s), f"row {r}: position outside the row range"
        vals = torch.sort(row[sel], descending=True).values
        assert torch.equal(vals, want), f"row {r}: selected values differ from the top {topk}"
