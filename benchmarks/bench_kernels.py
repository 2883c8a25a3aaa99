"""Benchmark the sparse MLA and indexer kernels on a CUDA GPU, side by side with the ceilings,
the naive torch reference and, where vLLM 0.23.0 imports, vLLM's own kernels in the same run.

Method (as shared/notes/anchors-h200.md): every call is captured n times in one CUDA graph that
cycles through L input sets whose bytes add up to >= 4x the L2 (L <= 128), so each call is
cold-L2 like a real layer; 2 warm-up replays, 15 timed replays, median / n. Ceilings (device
copy, fp16 matmul) are measured at the start and the end. fp16 (FlashMLA: bf16), top-k 2048.

Columns: ours; naive torch (gather + matmul); vLLM FlashMLA sparse (flash_mla_sparse_fwd, bf16,
heads padded to 64 as vLLM does; with --fp8 also its fp8_ds_mla decode, flash_mla_with_kvcache);
vLLM TRITON_MLA decode over a dense context of 2048 (vLLM's
own split rule); vLLM persistent_topk / top_k_per_row_decode / top_k_per_row_prefill on the
same logits as our top-k. Columns that could not be filled (no vLLM importable, an op missing)
are listed at the end. Needs PYTHONPATH=tests:backend/src (plus vLLM's site for its columns).

Exit: 0 ok (also when skipped: no CUDA GPU, unless --require-gpu), 1 no GPU with --require-gpu,
2 usage.

    PYTHONPATH=tests:backend/src python benchmarks/bench_kernels.py            # full table
    PYTHONPATH=tests:backend/src python benchmarks/bench_kernels.py --quick    # fewer shapes
    PYTHONPATH=tests:backend/src python benchmarks/bench_kernels.py --quick --fp8 --no-indexer
    PYTHONPATH=/tmp/site:tests:backend/src python benchmarks/bench_kernels.py --sweep --json o.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from vllm_sparse_mla.kernels._dims import D_QK, FP8_ROW_BYTES

EXAMPLES = __doc__.split("\n\n")[-1]
TOPK = 2048
ROW_BYTES = D_QK * 2  # a 16-bit cache row
SCALE = 1.0 / 16
SM120_COPY_TBS = 1.79  # RTX PRO 6000 Blackwell, for the on-paper column
MISSING: dict[str, str] = {}  # column -> why it could not be filled


def ceilings(torch) -> tuple[float, float]:
    """(copy TB/s counting read + write, fp16 matmul TFLOP/s), eager back-to-back events."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.float16, device="cuda").normal_()
    b = torch.empty_like(a)
    ts = []
    for _ in range(12):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    copy_tbs = 2 * 2 * n / (statistics.median(ts[2:]) * 1e-3) / 1e12
    del a, b
    m = 8192
    x = torch.randn(m, m, dtype=torch.float16, device="cuda")
    y = torch.randn(m, m, dtype=torch.float16, device="cuda")
    ts = []
    for _ in range(12):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        x @ y
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    mm = 2 * m**3 / (statistics.median(ts[2:]) * 1e-3) / 1e12
    return copy_tbs, mm


def graph_time_us(torch, calls, target_ms=30.0) -> float:
    """calls: list of zero-arg callables (one per input set). Median per-call time in us."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for c in calls:
        c()
    e.record()
    e.synchronize()
    per = s.elapsed_time(e) / len(calls)
    n = max(len(calls), min(1024, int(target_ms / max(per, 1e-3))))
    n = max(1, (n // len(calls)) * len(calls))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls[0]()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        for i in range(n):
            calls[i % len(calls)]()
    graph.replay()
    graph.replay()
    ts = []
    for _ in range(15):
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    del graph
    return statistics.median(ts) * 1e3 / n


def naive_attention(torch, q, kv_flat, idx):
    g = kv_flat[idx.clamp_min(0).long()]  # [T, K, 576]
    s = torch.matmul(q, g.transpose(1, 2)).float() * SCALE  # [T, H, K]
    s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p.half(), g[..., :512])


def load_vllm():
    """vLLM's kernels if importable: dict name -> callable, reasons for the missing ones."""
    ops = {}
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # no vLLM on this host: every vLLM column is missing
        for col in ("flashmla", "triton_mla", "persistent_topk", "topk_decode", "topk_prefill"):
            MISSING[col] = f"vllm not importable ({type(exc).__name__}: {exc})"[:160]
        return ops
    try:
        from vllm.v1.attention.ops.flashmla import (
            flash_mla_sparse_fwd,
            is_flashmla_sparse_supported,
        )

        ok, why = is_flashmla_sparse_supported()
        if ok:
            ops["flashmla"] = flash_mla_sparse_fwd
            # the fp8_ds_mla decode FLASHMLA_SPARSE runs (FlashMLASparseImpl._fp8_flash_mla_kernel)
            from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache, get_mla_metadata

            ops["flashmla_fp8"] = (flash_mla_with_kvcache, get_mla_metadata)
        else:
            MISSING["flashmla"] = f"FlashMLA sparse unsupported here: {why}"
    except Exception as exc:
        MISSING["flashmla"] = repr(exc)[:160]
    try:
        from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

        ops["triton_mla"] = decode_attention_fwd
    except Exception as exc:
        MISSING["triton_mla"] = repr(exc)[:160]
    try:
        import torch
        from vllm import _custom_ops  # noqa: F401  (loads torch.ops._C)

        for name, op in (("persistent_topk", "persistent_topk"),
                         ("topk_decode", "top_k_per_row_decode"),
                         ("topk_prefill", "top_k_per_row_prefill")):  # fmt: skip
            if hasattr(torch.ops._C, op):
                ops[name] = getattr(torch.ops._C, op)
            else:
                MISSING[name] = f"torch.ops._C.{op} missing"
    except Exception as exc:
        for col in ("persistent_topk", "topk_decode", "topk_prefill"):
            MISSING[col] = repr(exc)[:160]
    return ops


def attn_sets(torch, kind, t, h, n_pool_rows, l2_bytes, mtp=1):
    touched = t * TOPK * ROW_BYTES if kind == "decode" else min(t * TOPK, 65536) * ROW_BYTES
    n_sets = max(2, min(128, -(-4 * l2_bytes // touched)))
    sets = []
    for i in range(n_sets):
        q = torch.randn(t, h, 576, device="cuda", dtype=torch.float16)
        if kind == "decode":
            r = t // mtp
            base = torch.randint(0, n_pool_rows - 8192, (r, 1), device="cuda")
            off = torch.argsort(torch.rand(r, 8192, device="cuda"), dim=1)[:, :TOPK]
            idx = (base + off).to(torch.int32).repeat_interleave(mtp, dim=0)
        else:
            base = (i * 65536) % (n_pool_rows - 65536)
            idx = torch.argsort(torch.rand(t, 65536, device="cuda"), dim=1)[:, :TOPK]
            idx = (idx + base).to(torch.int32)
        sets.append((q, idx.contiguous(), torch.empty(t, h, 512, device="cuda", dtype=q.dtype)))
    return sets


def _row(impl, h, kind, t, us, kv_bytes, flop, floor_us, copy_tbs, plan="", **extra):
    return dict(
        impl=impl, heads=h, kind=kind, tokens=t, us=us, kv_tbs=kv_bytes / us / 1e6,
        pct_copy=100 * kv_bytes / us / 1e6 / copy_tbs, tflops=flop / us / 1e6,
        floor_us=floor_us, plan=plan, **extra,
    )  # fmt: skip


def _emit(rows_out, row):
    rows_out.append(row)
    print(json.dumps(row), flush=True)


def attn_shapes(quick):
    shapes = [("decode", b, 1) for b in (1, 8, 32, 128)]
    shapes += [("decode", 2 * b, 2) for b in (1, 32, 128)]  # 2 tokens per request (MTP)
    shapes += [("prefill", t, 1) for t in (1024, 4096, 8192)]
    if quick:
        shapes = [("decode", 1, 1), ("decode", 32, 1), ("decode", 128, 1), ("prefill", 4096, 1)]
    return shapes


def bench_attention(torch, args, copy_tbs, mm_tflops, vllm_ops, rows_out):
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla, sparse_mla_attention
    from vllm_sparse_mla.kernels._capability import device_info
    from vllm_sparse_mla.kernels.sparse_mla import fp8_plan, plan

    info = device_info(torch.device("cuda", 0))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    pool_rows = 2_097_152
    pool = torch.randn(pool_rows // 64, 64, 576, device="cuda", dtype=torch.float16)
    flat = pool.view(-1, 576)
    pool_bf = pool.to(torch.bfloat16).view(-1, 1, 576) if "flashmla" in vllm_ops else None
    pool8 = fp8_pool(torch, pool) if args.fp8 else None
    for h in args.heads:
        ws = make_workspace(8192, h, TOPK, "cuda", torch.float16)
        for kind, t, mtp in attn_shapes(args.quick):
            if time.monotonic() > args.deadline:
                print("attention: time budget spent, skipping the rest", flush=True)
                return
            sets = attn_sets(torch, kind, t, h, pool_rows, l2, mtp)
            kv_bytes = t * TOPK * ROW_BYTES
            flop = 2 * h * TOPK * (576 + 512) * t
            floor_us = max(kv_bytes / (copy_tbs * 1e12), flop / (mm_tflops * 1e12)) * 1e6
            label = kind if mtp == 1 else f"decode-mtp{mtp}"
            common = dict(h=h, kind=label, t=t, kv_bytes=kv_bytes, flop=flop, floor_us=floor_us,
                          copy_tbs=copy_tbs)  # fmt: skip
            p = plan(t, h, TOPK, info)
            calls = [
                partial(sparse_mla_attention, q, pool, i, SCALE, out=o, workspace=ws)
                for q, i, o in sets
            ]
            try:
                us = graph_time_us(torch, calls)
            except Exception as exc:  # one broken shape must not cost the rest of the run
                MISSING[f"ours H={h} {label} {t}"] = repr(exc)[:300]
                del sets
                continue
            _emit(rows_out, _row("ours", us=us, plan=_plan_desc(p), **common))
            if args.sweep and p.splits > 1:  # the same plan, the combine's launch the other way
                default_pdl = sparse_mla.USE_PDL
                sparse_mla.USE_PDL = not default_pdl
                try:
                    name = "variant no PDL" if default_pdl else "variant PDL"
                    _emit(rows_out, _row(name, us=graph_time_us(torch, calls), plan=_plan_desc(p),
                                         **common))  # fmt: skip
                finally:
                    sparse_mla.USE_PDL = default_pdl
            if pool8 is not None:
                c8 = dict(common, kv_bytes=t * TOPK * FP8_ROW_BYTES)
                calls8 = [
                    partial(sparse_mla_attention, q, pool8, i, SCALE, out=o, workspace=ws)
                    for q, i, o in sets
                ]
                p8 = fp8_plan(p, info)  # what sparse_mla_attention launches over fp8 rows
                try:
                    _emit(rows_out, _row("ours fp8_ds_mla", us=graph_time_us(torch, calls8),
                                         plan=_plan_desc(p8, fp8=True), **c8))  # fmt: skip
                except Exception as exc:  # report, keep the 16-bit columns
                    MISSING[f"ours fp8 H={h} {label} {t}"] = repr(exc)[:300]
                if args.sweep:
                    time_variants(torch, args, fp8_sweep_plans(p8, kind, h, t), pool8, sets, ws,
                                  "fp8 variant", c8, rows_out)  # fmt: skip
            if args.sweep:
                time_variants(torch, args, sweep_plans(p, kind, h, t), pool, sets, ws, "variant",
                              common, rows_out)  # fmt: skip
            if not args.no_naive and (kind == "decode" or t <= 1024):
                ncalls = [
                    (lambda q=q, i=i: naive_attention(torch, q, flat, i)) for q, i, _ in sets[:4]
                ]
                nus = graph_time_us(torch, ncalls, target_ms=10)
                _emit(rows_out, _row("naive torch", us=nus, plan="gather+matmul", **common))
            if "flashmla" in vllm_ops:
                fn = vllm_ops["flashmla"]
                fsets = [(q.to(torch.bfloat16), i.view(t, 1, TOPK)) for q, i, _ in sets]

                def flashmla(q, i, fn=fn, h=h, t=t, kvb=pool_bf):
                    qp = q.new_empty((t, 64, 576))  # vLLM's _bf16_flash_mla_kernel padding
                    qp[:, :h] = q
                    return fn(qp, kvb, i, SCALE)[0][:, :h]

                try:
                    fus = graph_time_us(torch, [partial(flashmla, q, i) for q, i in fsets])
                    _emit(rows_out, _row("vLLM FlashMLA sparse (bf16, pad 64)", us=fus,
                                         plan="flash_mla_sparse_fwd", **common))  # fmt: skip
                except Exception as exc:
                    MISSING[f"flashmla H={h} {label} {t}"] = repr(exc)[:160]
                del fsets
            if pool8 is not None and "flashmla_fp8" in vllm_ops and kind == "decode":
                try:
                    fus = bench_flashmla_fp8(torch, vllm_ops["flashmla_fp8"], pool8, sets, h, t,
                                             mtp)  # fmt: skip
                    name = "vLLM FlashMLA sparse fp8_ds_mla (bf16 q, pad 64)"
                    _emit(rows_out, _row(name, us=fus, plan="flash_mla_with_kvcache fp8", **c8))
                except Exception as exc:
                    MISSING[f"flashmla fp8 H={h} {label} {t}"] = repr(exc)[:160]
            if "triton_mla" in vllm_ops and kind == "decode":
                try:
                    tus = bench_triton_mla(torch, vllm_ops["triton_mla"], pool, t, h, info.num_sms)
                    name = "vLLM TRITON_MLA (dense ctx 2048)"
                    desc = "decode_attention_fwd, vLLM splits"
                    _emit(rows_out, _row(name, us=tus, plan=desc, **common))
                except Exception as exc:
                    MISSING[f"triton_mla H={h} {t}"] = repr(exc)[:160]
            del sets
        del ws
    del pool, pool_bf, pool8


def bench_flashmla_fp8(torch, ops, pool8, sets, h, t, mtp) -> float:
    """vLLM 0.23.0's fp8_ds_mla decode as FlashMLASparseImpl._fp8_flash_mla_kernel calls it:
    q bf16 zero-padded to 64 heads per call, [requests, 1 + k, heads, 576], the 656-B rows as
    [blocks, 64, 1, 656] uint8, dummy block table and cache lengths, one scheduler object per
    input set (FlashMLA fills it on the first call). Our pool's rope is fp16 read as bf16: same
    bytes moved."""
    fn, meta_fn = ops
    b = t // mtp
    k8 = pool8.unsqueeze(-2)
    table = torch.zeros((b, 1), dtype=torch.int32, device="cuda")
    lens = torch.full((b,), 8192, dtype=torch.int32, device="cuda")

    def call(q, i, meta):
        qp = q.new_zeros((b, mtp, 64, 576))
        qp[:, :, :h] = q.view(b, mtp, h, 576)
        return fn(q=qp, k_cache=k8, block_table=table, cache_seqlens=lens, head_dim_v=512,
                  tile_scheduler_metadata=meta, is_fp8_kvcache=True,
                  indices=i.view(b, mtp, TOPK), softmax_scale=SCALE)[0]  # fmt: skip

    calls = [partial(call, q.to(torch.bfloat16), i, meta_fn()[0]) for q, i, _ in sets]
    return graph_time_us(torch, calls)


def fp8_pool(torch, pool):
    """The 16-bit pool's rows as fp8_ds_mla rows, written by our write kernel."""
    from vllm_sparse_mla.kernels.fp8_ds_mla import write_fp8_ds_mla

    flat = pool.view(-1, 576)
    out = torch.empty(pool.shape[0], pool.shape[1], FP8_ROW_BYTES, device="cuda",
                      dtype=torch.uint8)  # fmt: skip
    step = 1 << 18
    for s in range(0, flat.shape[0], step):
        rows = flat[s : s + step]
        slots = torch.arange(s, s + rows.shape[0], device="cuda")
        write_fp8_ds_mla(rows[:, :512], rows[:, 512:], out, slots)
    return out


def bench_fp8_write(torch, args, copy_tbs, rows_out):
    """write_fp8_ds_mla for T new tokens into random slots of a 2M-row cache (cold L2)."""
    from vllm_sparse_mla.kernels.fp8_ds_mla import write_fp8_ds_mla

    cache = torch.empty(32768, 64, FP8_ROW_BYTES, device="cuda", dtype=torch.uint8)
    for t in (1, 128, 8192):
        sets = []
        for _ in range(16):
            x = torch.randn(t, 576, device="cuda", dtype=torch.float16)
            slots = torch.randperm(cache.shape[0] * 64, device="cuda")[:t]
            sets.append((x, slots))
        calls = [partial(write_fp8_ds_mla, x[:, :512], x[:, 512:], cache, sl) for x, sl in sets]
        us = graph_time_us(torch, calls)
        moved = t * (ROW_BYTES + FP8_ROW_BYTES)  # read 16-bit, write 656 B
        floor_us = moved / (copy_tbs * 1e12) * 1e6
        row = _row("fp8_ds_mla write", 0, "write", t, us, moved, 0, floor_us, copy_tbs,
                   plan="1 program/token")  # fmt: skip
        _emit(rows_out, row)


def bench_triton_mla(torch, fn, pool, b, h, num_sms):
    """vLLM's TRITON_MLA decode, dense context 2048 (32 pages of 64), vLLM's split rule."""
    nb = pool.shape[0]
    kv4 = pool.view(nb, 64, 1, 576)
    splits = min(max(1, triton_next_pow2(2048 // 512)), 2 * num_sms)
    n_sets = max(2, min(128, -(-4 * 60 * 2**20 // (b * 2048 * ROW_BYTES))))
    calls = []
    one = torch.ones((), dtype=torch.float32, device="cuda")
    for _ in range(n_sets):
        q = torch.randn(b, h, 576, device="cuda", dtype=torch.float16)
        o = torch.empty(b, h, 512, device="cuda", dtype=torch.float16)
        lse = torch.empty(b, h, device="cuda", dtype=torch.float32)
        bt = torch.randint(0, nb, (b, 32), device="cuda", dtype=torch.int32)
        sl = torch.full((b,), 2048, device="cuda", dtype=torch.int32)
        logits = torch.empty(b, h, splits, 513, device="cuda", dtype=torch.float32)
        # scales as device tensors: vLLM's default builds them from CPU, which graph capture refuses
        calls.append(partial(fn, q, kv4, kv4[..., :512], o, lse, bt, sl, logits, splits, SCALE,
                             64, 0.0, one, one, True))  # fmt: skip
    return graph_time_us(torch, calls)


def triton_next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _plan_desc(p, fp8: bool = False) -> str:
    c = p.cfg
    desc = f"S={p.splits} BH={c.block_h} BN={c.block_n} w={c.num_warps} ns={c.num_stages}"
    return f"{desc} {c.fp8_read}/{c.fp8_decode}" if fp8 else desc


def time_variants(torch, args, plans, cache, sets, ws, impl, common, rows_out) -> None:
    """Time each plan over ``cache`` beside the default (rows named ``impl``), until the sweep
    budget is spent; a plan that fails is reported and skipped."""
    from vllm_sparse_mla.kernels.sparse_mla import _launch

    fp8, t = cache.dtype == torch.uint8, sets[0][0].shape[0]
    for p2 in plans:
        if time.monotonic() > args.sweep_deadline:
            break
        if p2.splits > 1 and t * p2.splits > ws.rows:
            continue
        calls = [partial(_launch, q, cache, i, SCALE, o, ws, p2) for q, i, o in sets]
        try:
            us = graph_time_us(torch, calls)
        except Exception as exc:  # report and keep sweeping
            print(f"{impl} {p2} failed: {exc!r}"[:300], flush=True)
            continue
        _emit(rows_out, _row(impl, us=us, plan=_plan_desc(p2, fp8), **common))


def fp8_sweep_plans(p, kind, h, t):
    """fp8_ds_mla read variants for a few shapes: the default plan's tile with each read
    ("group" / "tile") and e4m3 decode ("cvt" / "bits" / "f8"), then other tiles, warps and
    depths (smaller rows leave room for deeper rings) with each read under the "cvt" decode
    (faster than "bits" at every shape of the H100 sweep, 2026-12-07) and the group read under
    "f8" (not timed before 2026-12-07's ninth session)."""
    from dataclasses import replace

    from vllm_sparse_mla.kernels._configs import AttnConfig
    from vllm_sparse_mla.kernels.sparse_mla import Plan

    if (kind, t) not in (("decode", 1), ("decode", 32), ("decode", 128), ("prefill", 4096)):
        return []
    reads = [("group", d) for d in ("cvt", "bits", "f8")] + [("tile", d) for d in ("cvt", "bits")]
    out = [
        Plan(replace(p.cfg, fp8_read=r, fp8_decode=d), p.head_blocks, p.splits)
        for r, d in reads
        if (r, d) != (p.cfg.fp8_read, p.cfg.fp8_decode)
    ]
    c = AttnConfig
    if h <= 16:
        cfgs = [c(16, 32, 4, 3), c(16, 32, 4, 4), c(16, 16, 4, 4), c(16, 64, 4, 3, 1)]
        # the f8 read at 8 warps (f8 BN64 w4 ran out of registers: 255) and at one row buffer
        # (BH16 BN64 ns2 beat the 3-stage tile over 16-bit rows, _configs._H16_WIDE_NS2)
        f8_only = [c(16, 32, 8, 3), c(16, 64, 8, 3, 1), c(16, 64, 8, 2, 1), c(16, 64, 4, 2, 1)]
    else:
        cfgs = [c(64, 64, 8, 2, 1), c(64, 32, 8, 3, 1)]
        f8_only = []
    for cfg in f8_only:
        if replace(cfg, fp8_decode="f8") != p.cfg:
            out.append(Plan(replace(cfg, fp8_decode="f8"), -(-h // cfg.block_h), p.splits))
    for cfg in cfgs:
        for r, d in (("group", "cvt"), ("tile", "cvt"), ("group", "f8")):
            cfg2 = replace(cfg, fp8_read=r, fp8_decode=d)
            if cfg2 != p.cfg:
                out.append(Plan(cfg2, -(-h // cfg.block_h), p.splits))
    return list(dict.fromkeys(out))


def sweep_plans(p, kind, h, t):
    """Alternatives to the default plan for a few shapes: other tiles, warps, depths, splits."""
    from vllm_sparse_mla.kernels._configs import AttnConfig
    from vllm_sparse_mla.kernels.sparse_mla import Plan

    key = (kind, t)
    if key not in (("decode", 1), ("decode", 32), ("decode", 128), ("prefill", 4096)):
        return []
    c = AttnConfig
    if h <= 16:
        cfgs = [c(16, 32, 8, 3), c(16, 64, 8, 3, 1), c(16, 64, 4, 3, 1), c(16, 32, 4, 3),
                c(16, 32, 4, 4), c(16, 64, 4, 2, 1)]  # fmt: skip
    else:  # the H200 tiles, then what fits sm_120's 101376 B (BH32 BN16, 4 x BH16 BN32)
        cfgs = [c(64, 64, 8, 2, 1), c(64, 64, 4, 2, 1), c(64, 32, 8, 3, 1), c(32, 16, 8, 4),
                c(32, 16, 4, 4), c(16, 32, 4, 3), c(32, 32, 4, 2)]  # fmt: skip
    out = [Plan(c, -(-h // c.block_h), p.splits) for c in cfgs if c != p.cfg]
    for s in (p.splits // 2, p.splits * 2):
        if 1 <= s <= 64 and s != p.splits:
            out.append(Plan(p.cfg, p.head_blocks, s))
    return out


def make_paged_cache(torch, b, ctx_len, h=32, d=128, bs=64):
    nb_per = ctx_len // bs
    nb = b * nb_per
    cache = torch.randint(0, 120, (nb, bs, 1, d + 4), dtype=torch.uint8, device="cuda")
    cache.view(nb, bs * (d + 4))[:, bs * d :].view(torch.float32).fill_(1.0)
    q = torch.randn(b, 1, h, d, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(b, h, device="cuda")
    bt = torch.randperm(nb, device="cuda").to(torch.int32).view(b, nb_per)
    ctx = torch.full((b,), ctx_len, device="cuda", dtype=torch.int32)
    out = torch.empty(b, ctx_len, device="cuda")
    return q, cache, w, ctx, bt, out


def topk_agree(torch, got, logits, ends):
    """Do two top-k outputs select the same values (first 4 rows)? True/False."""
    for r in range(min(4, got.shape[0])):
        row = logits[r, : int(ends[r])]
        sel = got[r][got[r] >= 0].long()
        want = torch.topk(row, min(TOPK, row.numel())).values.sort().values
        if sel.numel() != want.numel() or not torch.equal(row[sel].sort().values, want):
            return False
    return True


def paged_plan(cfg) -> str:
    return (f"BN={cfg.block_n} tiles={cfg.tiles_per_program} w={cfg.num_warps} "
            f"ns={cfg.num_stages}")  # fmt: skip


def bench_paged_variants(torch, args, sets, ctx_len, byts, copy_tbs, base, rows_out):
    """Time the paged-logits candidates (_configs.PAGED_LOGITS_VARIANTS: 2 and 4 key tiles per
    program) on the default's inputs; agrees: the -inf pattern and logits of the default, set 0."""
    from vllm_sparse_mla.kernels import paged_mqa_logits
    from vllm_sparse_mla.kernels._configs import PAGED_LOGITS_VARIANTS

    s0 = sets[0]
    want = paged_mqa_logits((s0[0], None), *s0[1:5], None, ctx_len, True)
    for cfg in PAGED_LOGITS_VARIANTS:
        if time.monotonic() > args.sweep_deadline:
            print("indexer sweep: --sweep-budget-s spent, skipping the rest", flush=True)
            return
        vcalls = [partial(paged_mqa_logits, (s[0], None), *s[1:5], None, ctx_len, False,
                          out=s[5], config=cfg) for s in sets]  # fmt: skip
        try:
            vus = graph_time_us(torch, vcalls)
            got = paged_mqa_logits((s0[0], None), *s0[1:5], None, ctx_len, True, config=cfg)
        except Exception as exc:  # report and keep sweeping
            print(f"variant {cfg} failed: {exc!r}"[:300], flush=True)
            continue
        fin = torch.isfinite(want)
        ok = bool(torch.equal(torch.isneginf(got), torch.isneginf(want))) and bool(
            torch.allclose(got[fin], want[fin], rtol=1e-4, atol=1e-2)
        )
        _emit(rows_out, dict(base, impl="variant paged_mqa_logits", op="logits", us=vus,
                             pct_copy=100 * byts / vus / 1e6 / copy_tbs, plan=paged_plan(cfg),
                             agrees=ok))  # fmt: skip


def bench_indexer(torch, args, copy_tbs, vllm_ops, rows_out):
    from vllm_sparse_mla.kernels import mqa_logits, paged_mqa_logits, topk_indices
    from vllm_sparse_mla.kernels._configs import PAGED_LOGITS_CONFIG

    h, d = 32, 128
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    ctxs = (4096, 32768, 131072) if not args.quick else (32768,)
    for ctx_len in ctxs:
        for b in (1, 8, 64):
            if time.monotonic() > args.deadline:
                print("indexer: time budget spent, skipping the rest", flush=True)
                return
            per_set = b * ctx_len * (d + 4)
            n_sets = max(2, min(32, -(-4 * l2 // per_set)))
            sets = [make_paged_cache(torch, b, ctx_len) for _ in range(n_sets)]
            calls = [partial(paged_mqa_logits, (s[0], None), *s[1:5], None, ctx_len, False,
                             out=s[5]) for s in sets]  # fmt: skip
            us = graph_time_us(torch, calls)
            byts = per_set + b * ctx_len * 4
            base = {"kind": f"B={b} ctx={ctx_len}", "batch": b, "ctx": ctx_len}
            _emit(rows_out, dict(base, impl="ours paged_mqa_logits", op="logits", us=us,
                                 pct_copy=100 * byts / us / 1e6 / copy_tbs,
                                 plan=paged_plan(PAGED_LOGITS_CONFIG)))  # fmt: skip
            if args.sweep:
                bench_paged_variants(torch, args, sets, ctx_len, byts, copy_tbs, base, rows_out)
            for s in sets:  # realistic logits for the top-k
                paged_mqa_logits((s[0], None), *s[1:5], None, ctx_len, True, out=s[5])
            outs = [torch.empty(b, TOPK, dtype=torch.int32, device="cuda") for _ in sets]
            for impl in ("triton", "torch"):
                kcalls = [partial(topk_indices, s[5], TOPK, None, s[3], out=o, impl=impl)
                          for s, o in zip(sets, outs, strict=True)]  # fmt: skip
                name = "ours topk (Triton radix)" if impl == "triton" else "topk (torch.topk)"
                try:
                    kus = graph_time_us(torch, kcalls)
                except Exception as exc:
                    MISSING[f"{name} B={b} ctx={ctx_len}"] = repr(exc)[:300]
                    continue
                ok = topk_agree(torch, outs[0], sets[0][5], sets[0][3])
                _emit(rows_out, dict(base, impl=name, op="topk", us=kus, agrees=ok))
            if "persistent_topk" in vllm_ops:
                op = vllm_ops["persistent_topk"]
                wss = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in sets]
                try:
                    pcalls = [partial(op, s[5], s[3], o, wk, TOPK, ctx_len)
                              for s, o, wk in zip(sets, outs, wss, strict=True)]  # fmt: skip
                    pus = graph_time_us(torch, pcalls)
                    ok = topk_agree(torch, outs[0], sets[0][5], sets[0][3])
                    _emit(rows_out, dict(base, impl="vLLM persistent_topk", op="topk", us=pus,
                                         agrees=ok))  # fmt: skip
                except Exception as exc:
                    MISSING[f"persistent_topk B={b} ctx={ctx_len}"] = repr(exc)[:160]
            if "topk_decode" in vllm_ops:
                op = vllm_ops["topk_decode"]
                try:
                    dcalls = [partial(op, s[5], 1, s[3], o, b, s[5].stride(0), s[5].stride(1),
                                      TOPK) for s, o in zip(sets, outs, strict=True)]  # fmt: skip
                    dus = graph_time_us(torch, dcalls)
                    ok = topk_agree(torch, outs[0], sets[0][5], sets[0][3])
                    _emit(rows_out, dict(base, impl="vLLM top_k_per_row_decode", op="topk",
                                         us=dus, agrees=ok))  # fmt: skip
                except Exception as exc:
                    MISSING[f"topk_decode B={b} ctx={ctx_len}"] = repr(exc)[:160]
            if "topk_prefill" in vllm_ops:
                op = vllm_ops["topk_prefill"]
                ks = torch.zeros(b, dtype=torch.int32, device="cuda")
                try:
                    fcalls = [partial(op, s[5], ks, s[3], o, b, s[5].stride(0), s[5].stride(1),
                                      TOPK) for s, o in zip(sets, outs, strict=True)]  # fmt: skip
                    fus = graph_time_us(torch, fcalls)
                    ok = topk_agree(torch, outs[0], sets[0][5], sets[0][3])
                    _emit(rows_out, dict(base, impl="vLLM top_k_per_row_prefill", op="topk",
                                         us=fus, agrees=ok))  # fmt: skip
                except Exception as exc:
                    MISSING[f"topk_prefill B={b} ctx={ctx_len}"] = repr(exc)[:160]
            del sets, outs
    m, n = 1024, 32768
    q = torch.randn(m, h, d, device="cuda").to(torch.float8_e4m3fn)
    k = torch.randn(n, d, device="cuda").to(torch.float8_e4m3fn)
    sc = torch.ones(n, device="cuda")
    w = torch.randn(m, h, device="cuda")
    ke = torch.full((m,), n, device="cuda", dtype=torch.int32)
    ks = torch.zeros(m, device="cuda", dtype=torch.int32)
    out = torch.empty(m, n, device="cuda")
    us = graph_time_us(torch, [lambda: mqa_logits((q, None), (k, sc), w, ks, ke, False, out=out)])
    flop = 2 * m * n * h * d
    _emit(rows_out, {"impl": "ours mqa_logits", "op": "logits", "kind": f"M={m} N={n}", "us": us,
                     "tflops": flop / us / 1e6})  # fmt: skip


def bench_layer(torch, args, vllm_ops, rows_out):
    """One decode layer end to end at H8: indexer logits + top-k + attention (ours throughout;
    and with vLLM's persistent_topk in place of ours where it imports)."""
    from vllm_sparse_mla.kernels import (
        make_workspace,
        paged_mqa_logits,
        sparse_mla_attention,
        topk_indices,
    )

    h = 8
    for ctx_len in (4096, 32768):
        for b in (1, 32):
            n_sets = 4
            # the attention reads rows from a cache of ctx_len tokens per request
            kv = torch.randn(b * ctx_len // 64, 64, 576, device="cuda", dtype=torch.float16)
            ws = make_workspace(64, h, TOPK, "cuda", torch.float16)
            sets = []
            for _ in range(n_sets):
                iq, cache, w, ctx, bt, logits = make_paged_cache(torch, b, ctx_len)
                q = torch.randn(b, h, 576, device="cuda", dtype=torch.float16)
                sets.append((iq, cache, w, ctx, bt, logits, q,
                             torch.empty(b, TOPK, dtype=torch.int32, device="cuda"),
                             torch.empty(b, h, 512, device="cuda", dtype=torch.float16),
                             torch.empty(1 << 20, dtype=torch.uint8, device="cuda")))  # fmt: skip
            base = (torch.arange(b, device="cuda", dtype=torch.int32) * ctx_len)[:, None]

            def layer(s, topk="triton", kv=kv, ws=ws, base=base, ctx_len=ctx_len, b=b):
                iq, cache, w, ctx, bt, logits, q, top, o, wk = s
                paged_mqa_logits((iq, None), cache, w, ctx, bt, None, ctx_len, False, out=logits)
                if topk in ("triton", "torch"):
                    topk_indices(logits, TOPK, None, ctx, out=top, impl=topk)
                elif topk == "persistent_topk":
                    vllm_ops[topk](logits, ctx, top, wk, TOPK, ctx_len)
                else:  # top_k_per_row_decode
                    vllm_ops[topk](logits, 1, ctx, top, b, logits.stride(0), logits.stride(1),
                                   TOPK)  # fmt: skip
                # request-local positions -> global slots (vLLM does this in its own kernel)
                gidx = torch.where(top >= 0, top + base, -1)
                sparse_mla_attention(q, kv, gidx, SCALE, out=o, workspace=ws)

            kind = f"H8 B={b} ctx={ctx_len}"
            variants = [("triton", "ours layer (logits+Triton topk+attn)"),
                        ("torch", "layer, torch.topk")]  # fmt: skip
            variants += [(k, f"layer, vLLM {k}") for k in ("persistent_topk", "topk_decode")
                         if k in vllm_ops]  # fmt: skip
            for topk, name in variants:
                try:
                    us = graph_time_us(torch, [partial(layer, s, topk) for s in sets])
                except Exception as exc:
                    MISSING[f"{name} {kind}"] = repr(exc)[:300]
                    continue
                _emit(rows_out, {"impl": name, "op": "layer", "kind": kind, "us": us})
            del sets, kv, ws


def profile_calls(torch, spec: str) -> None:
    """--profile: a few eager calls per shape, for ncu (no graphs, no timing). Items are
    H:decode:T / H:prefill:T (attention), topk:B:CTX (Triton radix top-k on paged logits) and
    logits:B:CTX (paged indexer logits)."""
    from vllm_sparse_mla.kernels import (
        make_workspace,
        paged_mqa_logits,
        sparse_mla_attention,
        topk_indices,
    )

    pool = torch.randn(2_097_152 // 64, 64, 576, device="cuda", dtype=torch.float16)
    for item in spec.split(","):
        h, kind, t = item.split(":")
        if h in ("topk", "logits"):
            b, ctx_len = int(kind), int(t)
            iq, cache, w, ctx, bt, logits = make_paged_cache(torch, b, ctx_len)
            top = torch.empty(b, TOPK, dtype=torch.int32, device="cuda")
            for _ in range(3):
                paged_mqa_logits((iq, None), cache, w, ctx, bt, None, ctx_len, True, out=logits)
                if h == "topk":
                    topk_indices(logits, TOPK, None, ctx, out=top, impl="triton")
            torch.cuda.synchronize()
            print(f"profiled {item}", flush=True)
            continue
        h, t = int(h), int(t)
        (q, idx, o), *_ = attn_sets(torch, kind, t, h, 2_097_152, 0)
        ws = make_workspace(max(t, 1), h, TOPK, "cuda", torch.float16)
        for _ in range(3):
            sparse_mla_attention(q, pool, idx, SCALE, out=o, workspace=ws)
        torch.cuda.synchronize()
        print(f"profiled H={h} {kind} {t}", flush=True)


def print_table(rows, copy_tbs, mm):
    print(f"\nceilings: copy {copy_tbs:.3f} TB/s (read+write), fp16 matmul {mm:.1f} TFLOP/s")
    print(
        "| H | shape | impl | us/call | % copy BW | TFLOP/s | floor us | SM120 on paper us | plan |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if "heads" not in r:
            continue
        paper = r["us"] * copy_tbs / SM120_COPY_TBS if r["impl"].startswith("ours") else None
        print(
            f"| {r['heads']} | {r['kind']} {r['tokens']} | {r['impl']} | {r['us']:.1f} | "
            f"{r['pct_copy']:.0f}% | {r['tflops']:.1f} | {r['floor_us']:.1f} | "
            f"{'' if paper is None else f'{paper:.1f}'} | {r['plan']} |"
        )
    print("\n| indexer / layer | shape | impl | us/call | extra |")
    print("|---|---|---|---:|---|")
    for r in rows:
        if "heads" in r:
            continue
        extra = f"{r['pct_copy']:.0f}% copy BW" if "pct_copy" in r else ""
        extra += f" {r['tflops']:.0f} TFLOP/s" if "tflops" in r else ""
        extra += f" agrees={r['agrees']}" if "agrees" in r else ""
        extra += f" {r['plan']}" if r.get("plan") else ""
        print(f"| {r['op']} | {r['kind']} | {r['impl']} | {r['us']:.1f} | {extra} |")
    if MISSING:
        print("\ncolumns not filled:")
        for k, v in MISSING.items():
            print(f"- {k}: {v}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="fewer shapes (default: %(default)s)")
    p.add_argument(
        "--sweep",
        action="store_true",
        help="also time config variants (attention plans; paged indexer logits with 2 and 4 "
        "key tiles per program)",
    )
    p.add_argument(
        "--fp8",
        action="store_true",
        help="also time ours over fp8_ds_mla cache rows (656 B) and the fp8 row write",
    )
    p.add_argument("--no-naive", action="store_true", help="skip the naive torch reference")
    p.add_argument("--no-attention", action="store_true", help="skip attention benchmarks")
    p.add_argument("--no-indexer", action="store_true", help="skip indexer benchmarks")
    p.add_argument("--no-layer", action="store_true", help="skip the decode-layer benchmark")
    p.add_argument("--no-vllm", action="store_true", help="do not import vLLM's kernels")
    p.add_argument("--heads", type=int, nargs="+", default=[8, 16, 64], help="%(default)s")
    p.add_argument("--json", type=Path, help="write all rows as JSON here")
    p.add_argument("--require-gpu", action="store_true", help="exit 1 instead of skipping")
    p.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="skip remaining shapes after this many seconds (default: %(default)s)",
    )
    p.add_argument(
        "--sweep-budget-s",
        type=float,
        default=120.0,
        help="stop sweeping variants after this many seconds (default: %(default)s)",
    )
    p.add_argument(
        "--profile",
        metavar="H:KIND:T,...",
        help="only run these shapes eagerly 3x for ncu, e.g. 8:decode:128,8:prefill:1024,"
        "topk:64:32768,logits:64:32768",
    )
    args = p.parse_args(argv)
    args.deadline = time.monotonic() + args.budget_s
    args.sweep_deadline = time.monotonic() + args.sweep_budget_s
    try:
        import torch
    except ImportError:
        print("warning: torch not installed; kernel benchmarks skipped", file=sys.stderr)
        return 1 if args.require_gpu else 0
    if not torch.cuda.is_available():
        print(
            "warning: no CUDA GPU; kernel benchmarks skipped (run on a GPU host)", file=sys.stderr
        )
        return 1 if args.require_gpu else 0
    props = torch.cuda.get_device_properties(0)
    import triton

    print(
        f"device: {props.name}, {props.multi_processor_count} SMs, "
        f"L2 {props.L2_cache_size >> 20} MiB, torch {torch.__version__}, "
        f"triton {triton.__version__}"
    )
    if args.profile:
        profile_calls(torch, args.profile)
        return 0
    if args.no_vllm:
        vllm_ops = {}
        MISSING["vllm"] = "--no-vllm"
    else:
        vllm_ops = load_vllm()
    print(f"vLLM kernels: {sorted(vllm_ops) or 'none'}", flush=True)
    copy_tbs, mm = ceilings(torch)
    print(f"ceilings (start): copy {copy_tbs:.3f} TB/s, fp16 matmul {mm:.1f} TFLOP/s", flush=True)
    rows: list[dict] = []
    t0 = time.monotonic()
    if not args.no_attention:
        bench_attention(torch, args, copy_tbs, mm, vllm_ops, rows)
        if args.fp8:
            bench_fp8_write(torch, args, copy_tbs, rows)
    t1 = time.monotonic()
    if not args.no_indexer:
        bench_indexer(torch, args, copy_tbs, vllm_ops, rows)
    t2 = time.monotonic()
    if not args.no_layer:
        bench_layer(torch, args, vllm_ops, rows)
    copy2, mm2 = ceilings(torch)
    print(f"ceilings (end): copy {copy2:.3f} TB/s, fp16 matmul {mm2:.1f} TFLOP/s")
    print(f"wall: attention {t1 - t0:.0f} s, indexer {t2 - t1:.0f} s, layer "
          f"{time.monotonic() - t2:.0f} s")  # fmt: skip
    if args.json:
        res = {"copy_tbs": [copy_tbs, copy2], "mm_tflops": [mm, mm2], "device": props.name,
               "torch": torch.__version__, "triton": triton.__version__,
               "missing": MISSING}  # fmt: skip
        args.json.write_text(json.dumps(dict(res, rows=rows), indent=1))
    print_table(rows, copy_tbs, mm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
