"""Cross-compile every kernel configuration the launchers can pick on sm_120 (no GPU needed) and
report shared memory, registers, spills and, for the attention kernel, how the row gather is
pipelined, read from the TTGIR triton emits. Used by tests/kernels/test_sm120_fit.py; run
directly to print the table (PYTHONPATH=tests:backend/src):

    $RUNTIME_PY -m support.sm120_fit
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from vllm_sparse_mla.kernels import _configs, fp8_ds_mla, indexer, sparse_mla
from vllm_sparse_mla.kernels._capability import DeviceInfo
from vllm_sparse_mla.kernels._dims import D_LATENT, D_ROPE, FP8_ROW_BYTES

SM120_SHARED_LIMIT = 101376
SM120_SMS = 188  # RTX PRO 6000 Blackwell; the decode split plan depends on the SM count
SM120 = DeviceInfo(capability=(12, 0), num_sms=SM120_SMS, max_shared_mem=SM120_SHARED_LIMIT)
TOPK = 2048


@dataclass
class FitResult:
    name: str
    shared: int
    registers: int
    local: int
    num_warps: int
    ring_depth: int | None = None  # buffers of the row tile's shared ring (None: no main loop)
    loop_full_wait: bool | None = None  # an async_wait {num = 0} inside the main loop
    loop_async_copies: int | None = None  # cp.async ops (async_copy_global_to_local) in the loop
    # 16-bit [block_n, 128] tiles written to shared memory in the loop: fp8 rows' dequantized
    # scale groups on their way to a dot operand (the "f8" read has none)
    loop_tile_allocs: int | None = None
    sass: int = 0  # SASS instructions in the cubin (a static cost proxy: fp8 vs 16-bit rows)
    griddep: tuple[str, ...] = ()  # griddepcontrol ops in the PTX (programmatic dependent launch)


def _cuobjdump() -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _main_loop(ttgir: str) -> str | None:
    """Text of the (single, outermost) scf.for region of a kernel, or None without a loop."""
    start = ttgir.find("scf.for")
    if start < 0:
        return None
    # the region opens with the "{" that ends the scf.for line (types on it hold braces too)
    brace = ttgir.rfind("{", start, ttgir.find("\n", start))
    depth, i = 0, brace
    while i < len(ttgir):
        c = ttgir[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return ttgir[start : i + 1]
        i += 1
    return ttgir[start:]


def pipelining(
    ttgir: str, block_n: int, row: str | None = None
) -> tuple[int | None, bool | None, int | None]:
    """(ring depth of the [*, block_n, 512] row buffer (fp8 rows: the [*, block_n, 32] i32 buffer
    of each scale group; ``row``: another buffer's row type, a regex), full wait in the loop,
    cp.async count)."""
    # fp8_ds_mla rows: each group of 128 latent bytes is gathered as [block_n, 32] int32 words
    # (the "tile" read: all four as [block_n, 4, 32]), or as [block_n, 128] e4m3 ("f8")
    row = row or rf"(?:{D_LATENT}x[a-z0-9]+|(?:4x)?{D_LATENT // 16}xi32|{D_LATENT // 4}xf8E4M3FN)"
    depths = [
        int(m.group(1)) for m in re.finditer(rf"memdesc<(\d+)x{block_n}x{row},[^>]*mutable", ttgir)
    ]
    loop = _main_loop(ttgir)
    if loop is None:
        return (max(depths) if depths else None), None, None
    full_wait = re.search(r"async_wait[^\n]*\{num = 0 : i32\}", loop) is not None
    copies = len(re.findall(r"async_copy_global_to_local", loop))
    return (max(depths) if depths else 1), full_wait, copies


def tile_allocs(ttgir: str, block_n: int) -> int | None:
    """16-bit [block_n, 128] tiles the main loop stores to shared memory (local_alloc)."""
    loop = _main_loop(ttgir)
    if loop is None:
        return None
    tile = rf"memdesc<{block_n}x{D_LATENT // 4}x(?:f16|bf16),"
    return len(re.findall(rf"ttg\.local_alloc[^\n]*-> !ttg\.{tile}", loop))


def compile_for_sm120(
    name: str, fn, args: dict[str, object], constexprs: dict[str, object], num_warps: int,
    num_stages: int, block_n: int | None = None, row: str | None = None,
) -> FitResult:  # fmt: skip
    """args: name -> "*fp16"-style pointer type (16-byte aligned) or an int/float value, which
    gets the runtime's specialisation (int % 16 == 0 -> divisibility 16; == 1 -> constexpr).
    block_n (and row): read the main loop's pipelining of that buffer (``pipelining``)."""
    signature: dict[str, str] = {}
    consts = dict(constexprs)
    attrs = {}
    for i, arg_name in enumerate(fn.arg_names):
        if arg_name in constexprs:
            signature[arg_name] = "constexpr"
            continue
        v = args[arg_name]
        if isinstance(v, str):
            signature[arg_name] = v
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"{arg_name}: unsupported spec {v!r}")
        elif isinstance(v, float):
            signature[arg_name] = "fp32"
        elif v == 1:
            signature[arg_name] = "constexpr"
            consts[arg_name] = 1
        else:
            signature[arg_name] = "i32" if abs(v) < 2**31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    target = GPUTarget("cuda", 120, 32)
    backend = triton.compiler.make_backend(target)
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages})
    compiled = triton.compile(src, target=target, options=options.__dict__)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run(
            [str(_cuobjdump()), "--dump-resource-usage", "-sass", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    local = int(re.search(r"LOCAL:(\d+)", res).group(1))
    out = FitResult(name, int(compiled.metadata.shared), regs, local, num_warps)
    out.sass = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", res, re.M))
    out.griddep = tuple(sorted(set(re.findall(r"griddepcontrol\.(\w+)", compiled.asm["ptx"]))))
    if block_n is not None:
        out.ring_depth, out.loop_full_wait, out.loop_async_copies = pipelining(
            compiled.asm["ttgir"], block_n, row
        )
        out.loop_tile_allocs = tile_allocs(compiled.asm["ttgir"], block_n)
    return out


def attention_plans(info: DeviceInfo = SM120, max_tokens: int = 8192):
    """Distinct (heads, plan) the launcher picks for H 8/16/32/64, top-k 2048, T <= max_tokens.
    SPLITS only sets loop strides and the epilogue, so per config the smallest and largest split
    and the one-pass plan bound the resource use; all three are kept."""
    for h in (8, 16, 32, 64):
        plans = {sparse_mla.plan(t, h, TOPK, info) for t in range(1, max_tokens + 1)}
        split = sorted((p for p in plans if p.splits > 1), key=lambda p: p.splits)
        picked = ([split[0], split[-1]] if split else []) + [p for p in plans if p.splits == 1]
        for p in dict.fromkeys(picked):
            yield h, p


def launched_configs():
    """Yield (name, fn, args, constexprs, num_warps, num_stages, block_n[, row]) for every
    configuration the launchers can pick on sm_120 with GLM-5's shapes, and the paged-logits
    candidates the benchmark sweeps (_configs.PAGED_LOGITS_VARIANTS)."""
    # "fp8": the same plans over fp8_ds_mla cache rows (uint8, 656 B), dequantized in registers
    for dtype, fp8 in (("fp16", False), ("bf16", False), ("fp16", True), ("bf16", True)):
        row = FP8_ROW_BYTES if fp8 else 576
        for h, p in attention_plans():
            cfg = sparse_mla.fp8_plan(p, SM120, dtype == "fp16").cfg if fp8 else p.cfg
            args = {
                "q_ptr": f"*{dtype}", "kv_ptr": "*u8" if fp8 else f"*{dtype}",
                "idx_ptr": "*i32",
                "out_ptr": f"*{dtype}", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32",
                "scale_log2": 0.09, "num_slots": 64 * 4096,
                "stride_qt": h * 576, "stride_qh": 576, "stride_kvb": 64 * row,
                "stride_kvs": row, "stride_it": TOPK, "stride_ot": h * 512, "stride_oh": 512,
            }  # fmt: skip
            consts = dict(
                NUM_HEADS=h, TOPK=TOPK, TOPK_PAD=TOPK, SPLITS=p.splits,
                HEAD_BLOCKS=p.head_blocks, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                D_LATENT=D_LATENT, D_ROPE=D_ROPE, KV_BLOCK=64, FLAT_SLOTS=True, DOT_F32=False,
                **sparse_mla.row_flags(cfg, fp8, SM120.capability),
                PDL=sparse_mla.use_pdl(p.splits, SM120.capability, True),
            )  # fmt: skip
            kind = f"split{p.splits}" if p.splits > 1 else "1pass"
            cache = "fp8 " if fp8 else ""
            yield (
                f"attn {kind} H={h} {cache}{dtype} BH={cfg.block_h} BN={cfg.block_n} "
                f"w{cfg.num_warps} ns{cfg.num_stages}",
                sparse_mla._sparse_mla_kernel, args, consts, cfg.num_warps, cfg.num_stages,
                cfg.block_n,
            )  # fmt: skip
            if p.splits > 1 and dtype == "fp16" and not fp8:
                bd = sparse_mla.combine_block_d(p.splits)
                yield (
                    f"combine H={h} S={p.splits} BD={bd}", sparse_mla._combine_kernel,
                    {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": f"*{dtype}",
                     "stride_ot": h * 512, "stride_oh": 512},
                    dict(NUM_HEADS=h, SPLITS=p.splits,
                         SPLITS_PAD=triton.next_power_of_2(p.splits), D_LATENT=D_LATENT,
                         BLOCK_D=bd, PDL=sparse_mla.use_pdl(p.splits, SM120.capability, True)),
                    4, 2, None,
                )  # fmt: skip
    for dtype in ("fp16", "bf16"):
        yield (
            f"fp8_ds_mla write {dtype}", fp8_ds_mla._write_kernel,
            {"kv_c_ptr": f"*{dtype}", "k_pe_ptr": f"*{dtype}", "slot_ptr": "*i64",
             "cache_ptr": "*u8", "stride_c": 512, "stride_pe": 64, "stride_cb": 64 * 656,
             "stride_cs": 656},
            dict(KV_BLOCK=64, D_LATENT=D_LATENT, D_ROPE=D_ROPE, GROUP=fp8_ds_mla.GROUP,
                 FP8_MAX=fp8_ds_mla.FP8_MAX, FLT_MIN=fp8_ds_mla.FLT_MIN, EXACT_DIV=True),
            4, 1, None,
        )  # fmt: skip
    c = _configs.MQA_LOGITS_CONFIG
    yield (
        f"mqa_logits H=32 D=128 BM={c.block_m} BN={c.block_n}", indexer._mqa_logits_kernel,
        {"q_ptr": "*u8", "k_ptr": "*u8", "k_scale_ptr": "*fp32", "w_ptr": "*fp32",
         "ks_ptr": "*i32", "ke_ptr": "*i32", "out_ptr": "*fp32", "M": 4096, "N": 32768,
         "stride_qm": 32 * 128, "stride_qh": 128, "stride_kn": 128, "stride_wm": 32,
         "stride_om": 32768},
        dict(NUM_HEADS=32, D=128, BLOCK_M=c.block_m, BLOCK_N=c.block_n, CLEAN=False,
             FP8_DOT=True),
        c.num_warps, c.num_stages, None,
    )  # fmt: skip
    yield (
        f"topk_radix K={TOPK} BLOCK={indexer.TOPK_BLOCK}", indexer._topk_radix_kernel,
        {"logits_ptr": "*fp32", "starts_ptr": "*i32", "ends_ptr": "*i32", "out_ptr": "*i32",
         "N": 202752, "stride_lm": 202752, "stride_om": TOPK},
        dict(HAS_STARTS=True, HAS_ENDS=True, TOPK=TOPK, TOPK_PAD=TOPK,
             BLOCK=indexer.TOPK_BLOCK),
        8, 2, None,
    )  # fmt: skip
    # the default for next_n 1, 2, 4; the swept candidates at next_n 1 and 4 (the smallest and
    # largest q tile bound the resource use), their key tile's ring read from the loop
    paged = [(_configs.PAGED_LOGITS_CONFIG, n) for n in (1, 2, 4)]
    paged += [(c, n) for c in _configs.PAGED_LOGITS_VARIANTS for n in (1, 4)]
    for c, next_n in paged:
        tiles = c.tiles_per_program
        yield (
            f"paged_logits H=32 D=128 next_n={next_n} BN={c.block_n} tiles={tiles} "
            f"w{c.num_warps} ns{c.num_stages}",
            indexer._paged_mqa_logits_kernel,
            {"q_ptr": "*u8", "kv_ptr": "*u8", "kv_f32_ptr": "*fp32", "w_ptr": "*fp32",
             "ctx_ptr": "*i32", "bt_ptr": "*i32", "out_ptr": "*fp32", "max_model_len": 202752,
             "max_blocks": 3168, "stride_qb": next_n * 4096, "stride_qj": 4096,
             "stride_qh": 128, "stride_kvblk": 64 * 132, "stride_cb": next_n, "stride_cj": 1,
             "stride_btb": 3168, "stride_wm": 32, "stride_om": 202752},
            dict(NEXT_N=next_n, NEXT_N_PAD=next_n, CTX_1D=False, NUM_HEADS=32, D=128,
                 KV_BLOCK=64, BLOCK_N=c.block_n, TILES_PER_PROGRAM=tiles, CLEAN=False,
                 FP8_DOT=True),
            c.num_warps, c.num_stages, None if tiles == 1 else c.block_n, r"128xi8",
        )  # fmt: skip


def fit_table() -> list[FitResult]:
    return [compile_for_sm120(*spec) for spec in launched_configs()]


def format_table(rows: list[FitResult]) -> str:
    lines = [
        f"kernel config (sm_120, triton {triton.__version__})".ljust(56)
        + f"{'shared B':>9} {'regs':>5} {'spill B':>7} {'ring':>5} {'loop wait0':>10} {'SASS':>5}"
        + " PDL"
    ]
    for r in rows:
        ring = "-" if r.ring_depth is None else str(r.ring_depth)
        wait = "-" if r.loop_full_wait is None else ("YES" if r.loop_full_wait else "no")
        cols = f"{r.shared:9d} {r.registers:5d} {r.local:7d} {ring:>5} {wait:>10} {r.sass:5d}"
        cols += f" {','.join(r.griddep) or '-'}"
        lines.append(f"{r.name:56}{cols}")
    return "\n".join(lines)


def main() -> int:
    print(format_table(fit_table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
