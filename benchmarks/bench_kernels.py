"""Benchmark the sparse MLA and indexer kernels on a CUDA GPU, side by side with the ceilings.

Method (as shared/notes/anchors-h200.md): every call is captured n times in one CUDA graph that
cycles through L input sets whose KV rows add up to >= 4x the L2 (L <= 128), so each call is
cold-L2 like a real layer; 2 warm-up replays, 15 timed replays, median / n. Ceilings (device
copy, fp16 matmul) are measured in the same run. fp16, top-k 2048.

Exit: 0 ok (also when skipped: no CUDA GPU, unless --require-gpu), 1 no GPU with --require-gpu,
2 usage.

    python benchmarks/bench_kernels.py                 # full table
    python benchmarks/bench_kernels.py --quick         # fewer shapes
    python benchmarks/bench_kernels.py --sweep --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backend" / "src"))

EXAMPLES = __doc__.split("\n\n")[-1]
TOPK = 2048
ROW_BYTES = 576 * 2
SCALE = 1.0 / 16

# vLLM 0.23.0 on the same H200 (anchors-h200.md, 2026-12-03): bf16-cache path (FlashMLA sparse
# prefill kernel, heads padded to 64); vLLM's kernels are not staged in this run.
VLLM_ANCHOR_US = {
    (8, "decode", 1): 62.1, (8, "decode", 8): 67.6, (8, "decode", 32): 69.4,
    (8, "decode", 128): 90.9, (8, "prefill", 1024): 585.8, (8, "prefill", 4096): 2322.0,
    (16, "decode", 1): 61.6, (16, "decode", 8): 67.7, (16, "decode", 32): 69.6,
    (16, "decode", 128): 92.9, (16, "prefill", 1024): 600.1, (16, "prefill", 4096): 2377.5,
    (64, "decode", 1): 60.1, (64, "decode", 8): 64.9, (64, "decode", 32): 65.7,
    (64, "decode", 128): 91.2, (64, "prefill", 1024): 625.8, (64, "prefill", 4096): 2505.1,
}  # fmt: skip


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


def attn_sets(torch, kind, t, h, pool, n_pool_rows, l2_bytes):
    touched = t * TOPK * ROW_BYTES if kind == "decode" else min(t * TOPK, 65536) * ROW_BYTES
    n_sets = max(2, min(128, -(-4 * l2_bytes // touched)))
    sets = []
    for i in range(n_sets):
        q = torch.randn(t, h, 576, device="cuda", dtype=torch.float16)
        if kind == "decode":
            base = torch.randint(0, n_pool_rows - 8192, (t, 1), device="cuda")
            off = torch.argsort(torch.rand(t, 8192, device="cuda"), dim=1)[:, :TOPK]
            idx = (base + off).to(torch.int32)
        else:
            base = (i * 65536) % (n_pool_rows - 65536)
            idx = torch.argsort(torch.rand(t, 65536, device="cuda"), dim=1)[:, :TOPK]
            idx = (idx + base).to(torch.int32)
        sets.append((q, idx, torch.empty(t, h, 512, device="cuda", dtype=torch.float16)))
    return sets


def bench_attention(torch, args, copy_tbs, mm_tflops, rows_out):
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention
    from vllm_sparse_mla.kernels.sparse_mla import _launch, plan

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    pool_rows = 2_097_152
    pool = torch.randn(pool_rows // 64, 64, 576, device="cuda", dtype=torch.float16)
    flat = pool.view(-1, 576)
    heads = (8, 16, 64)
    shapes = [("decode", b) for b in (1, 8, 32, 128)] + [("prefill", t) for t in (1024, 4096)]
    if args.quick:
        shapes = [("decode", 1), ("decode", 32), ("decode", 128), ("prefill", 4096)]
    for h in heads:
        ws = make_workspace(4096, h, TOPK, "cuda", torch.float16)
        for kind, t in shapes:
            sets = attn_sets(torch, kind, t, h, pool, pool_rows, l2)
            kv_bytes = t * TOPK * ROW_BYTES
            flop = 2 * h * TOPK * (576 + 512) * t
            floor_us = max(kv_bytes / (copy_tbs * 1e12), flop / (mm_tflops * 1e12)) * 1e6
            calls = [
                partial(sparse_mla_attention, q, pool, i, SCALE, out=o, workspace=ws)
                for q, i, o in sets
            ]
            us = graph_time_us(torch, calls)
            use_split, cfg, hb, splits = plan(
                t, h, TOPK, torch.cuda.get_device_properties(0).multi_processor_count
            )
            row = {
                "impl": "ours", "heads": h, "kind": kind, "tokens": t, "us": us,
                "kv_tbs": kv_bytes / us / 1e6, "pct_copy": 100 * kv_bytes / us / 1e6 / copy_tbs,
                "tflops": flop / us / 1e6, "floor_us": floor_us,
                "vllm_us": VLLM_ANCHOR_US.get((h, kind, t)),
                "plan": f"{'split' if use_split else 'prefill'} S={splits} BH={cfg.block_h} "
                f"BN={cfg.block_n} w={cfg.num_warps} st={cfg.num_stages}",
            }  # fmt: skip
            rows_out.append(row)
            print(json.dumps(row), flush=True)
            if args.sweep:
                for var in sweep_variants(kind, h, t):
                    if time.monotonic() > args.deadline:
                        print("sweep: time budget spent, skipping the rest", flush=True)
                        break
                    cfg2, splits2 = var
                    hb2 = -(-h // cfg2.block_h)
                    if splits2 > 1 and t * splits2 > ws.rows:
                        continue
                    vcalls = [
                        partial(_launch, q, pool, i, SCALE, o, ws, cfg2, hb2, splits2)
                        for q, i, o in sets
                    ]
                    try:
                        vus = graph_time_us(torch, vcalls)
                    except Exception as exc:  # report and keep sweeping
                        print(f"variant {cfg2} S={splits2} failed: {exc!r}", flush=True)
                        continue
                    vrow = dict(row, impl="variant", us=vus, plan=f"S={splits2} {cfg2}",
                                pct_copy=100 * kv_bytes / vus / 1e6 / copy_tbs,
                                tflops=flop / vus / 1e6)  # fmt: skip
                    rows_out.append(vrow)
                    print(json.dumps(vrow), flush=True)
            if not args.no_naive and not (kind == "prefill" and t > 1024):
                ncalls = [
                    (lambda q=q, i=i: naive_attention(torch, q, flat, i)) for q, i, _ in sets[:4]
                ]
                nus = graph_time_us(torch, ncalls, target_ms=10)
                nrow = dict(row, impl="naive torch", us=nus, plan="gather+matmul",
                            pct_copy=100 * kv_bytes / nus / 1e6 / copy_tbs,
                            tflops=flop / nus / 1e6, kv_tbs=kv_bytes / nus / 1e6)  # fmt: skip
                rows_out.append(nrow)
                print(json.dumps(nrow), flush=True)
            del sets
        del ws
    del pool


def sweep_variants(kind, h, t):
    """Variants of the default plan for h in {8, 64} (decode 1/32/128, prefill 4096): plain vs
    prefetched row gather, monolithic vs 4-chunk latent dots; all fit SM120's shared memory."""
    import dataclasses

    from vllm_sparse_mla.kernels._configs import attn_config
    from vllm_sparse_mla.kernels.sparse_mla import plan

    if h not in (8, 64) or (kind, t) not in (
        ("decode", 1), ("decode", 32), ("decode", 128), ("prefill", 4096)
    ):  # fmt: skip
        return []
    import torch

    _, cfg, _, splits = plan(t, h, TOPK, torch.cuda.get_device_properties(0).multi_processor_count)
    cfg = attn_config(h, prefill=splits == 1)
    out = []
    for prefetch, chunked in ((False, False), (True, True), (False, True), (True, False)):
        c = dataclasses.replace(cfg, prefetch=prefetch, chunked=chunked)
        if c != cfg:
            out.append((c, splits))
    return out


def bench_indexer(torch, copy_tbs, rows_out):
    from vllm_sparse_mla.kernels import mqa_logits, paged_mqa_logits, topk_indices

    h, d, bs = 32, 128, 64
    for b, ctx_len in ((64, 32768), (8, 32768)):
        nb_per = ctx_len // bs
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        per_set = b * ctx_len * (d + 4)
        n_sets = max(2, min(32, -(-4 * l2 // per_set)))
        sets = []
        for _ in range(n_sets):
            nb = b * nb_per
            cache = torch.randint(0, 120, (nb, bs, 1, d + 4), dtype=torch.uint8, device="cuda")
            cache.view(nb, bs * (d + 4))[:, bs * d :].view(torch.float32).fill_(1.0)
            q = torch.randn(b, 1, h, d, device="cuda").to(torch.float8_e4m3fn)
            w = torch.randn(b, h, device="cuda")
            bt = torch.arange(nb, device="cuda", dtype=torch.int32).view(b, nb_per)
            ctx = torch.full((b,), ctx_len, device="cuda", dtype=torch.int32)
            out = torch.empty(b, ctx_len, device="cuda")
            sets.append((q, cache, w, ctx, bt, out))
        calls = [
            partial(paged_mqa_logits, (s[0], None), *s[1:5], None, ctx_len, False, out=s[5])
            for s in sets
        ]
        us = graph_time_us(torch, calls)
        byts = per_set + b * ctx_len * 4
        row = {"impl": "ours", "kind": f"paged_logits B={b} ctx={ctx_len}", "us": us,
               "pct_copy": 100 * byts / us / 1e6 / copy_tbs}  # fmt: skip
        rows_out.append(row)
        print(json.dumps(row), flush=True)
        kcalls = [(lambda s=s: topk_indices(s[5], TOPK, None, s[3])) for s in sets]
        us = graph_time_us(torch, kcalls)
        row = {"impl": "topk (torch.topk)", "kind": f"topk B={b} N={ctx_len}", "us": us}
        rows_out.append(row)
        print(json.dumps(row), flush=True)
        del sets
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
    row = {"impl": "ours", "kind": f"mqa_logits M={m} N={n}", "us": us, "tflops": flop / us / 1e6,
           "pct_copy": 100 * (m * n * 4 + n * (d + 4)) / us / 1e6 / copy_tbs}  # fmt: skip
    rows_out.append(row)
    print(json.dumps(row), flush=True)


def print_table(rows, copy_tbs, mm):
    print(f"\nceilings: copy {copy_tbs:.3f} TB/s (read+write), fp16 matmul {mm:.1f} TFLOP/s")
    print(
        "| H | shape | impl | us/call | % copy BW | TFLOP/s | floor us | vLLM 0.23.0 us* | plan |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if "heads" not in r:
            continue
        v = r.get("vllm_us")
        print(
            f"| {r['heads']} | {r['kind']} {r['tokens']} | {r['impl']} | {r['us']:.1f} | "
            f"{r['pct_copy']:.0f}% | {r['tflops']:.1f} | {r['floor_us']:.1f} | "
            f"{'' if v is None else v} | {r['plan']} |"
        )
    for r in rows:
        if "heads" in r:
            continue
        extra = f" {r['pct_copy']:.0f}% copy BW" if "pct_copy" in r else ""
        extra += f" {r['tflops']:.0f} TFLOP/s" if "tflops" in r else ""
        print(f"| indexer | {r['kind']} | {r['impl']} | {r['us']:.1f} |{extra} |")
    print("* vLLM column: anchors-h200.md (bf16 FlashMLA sparse path, heads padded), not rerun.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="fewer shapes (default: %(default)s)")
    p.add_argument("--sweep", action="store_true", help="also time config variants")
    p.add_argument("--no-naive", action="store_true", help="skip the naive torch reference")
    p.add_argument("--no-indexer", action="store_true", help="skip indexer benchmarks")
    p.add_argument("--json", type=Path, help="write all rows as JSON here")
    p.add_argument("--require-gpu", action="store_true", help="exit 1 instead of skipping")
    p.add_argument(
        "--sweep-budget-s",
        type=float,
        default=150.0,
        help="stop sweeping variants after this many seconds (default: %(default)s)",
    )
    args = p.parse_args(argv)
    args.deadline = time.monotonic() + args.sweep_budget_s
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
    print(
        f"device: {props.name}, {props.multi_processor_count} SMs, "
        f"L2 {props.L2_cache_size >> 20} MiB, torch {torch.__version__}"
    )
    copy_tbs, mm = ceilings(torch)
    print(f"ceilings (start): copy {copy_tbs:.3f} TB/s, fp16 matmul {mm:.1f} TFLOP/s", flush=True)
    rows: list[dict] = []
    bench_attention(torch, args, copy_tbs, mm, rows)
    if not args.no_indexer:
        bench_indexer(torch, copy_tbs, rows)
    copy2, mm2 = ceilings(torch)
    print(f"ceilings (end): copy {copy2:.3f} TB/s, fp16 matmul {mm2:.1f} TFLOP/s")
    if args.json:
        res = {"copy_tbs": [copy_tbs, copy2], "mm_tflops": [mm, mm2], "device": props.name}
        args.json.write_text(json.dumps(dict(res, rows=rows), indent=1))
    print_table(rows, copy_tbs, mm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
