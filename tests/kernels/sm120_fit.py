"""Cross-compile every launched kernel configuration for sm_120 (no GPU needed) and report
shared memory, registers and spills. Used by test_sm120_fit.py; run directly to print the table:

    $RUNTIME_PY tests/kernels/sm120_fit.py
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

SM120_SHARED_LIMIT = 101376
SM120_SMS = 188  # RTX PRO 6000 Blackwell; the decode split plan depends on the SM count

_SRC = Path(__file__).resolve().parents[2] / "backend" / "src"
if str(_SRC) not in sys.path:  # pragma: no cover - pytest's pythonpath already has it
    sys.path.insert(0, str(_SRC))

from vllm_sparse_mla.kernels import _configs, indexer, sparse_mla  # noqa: E402


@dataclass
class FitResult:
    name: str
    shared: int
    registers: int
    local: int
    num_warps: int


def _cuobjdump() -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def compile_for_sm120(
    name: str, fn, args: dict[str, object], constexprs: dict[str, object], num_warps: int,
    num_stages: int,
) -> FitResult:  # fmt: skip
    """args: name -> "*fp16"-style pointer type (16-byte aligned) or an int/float value, which
    gets the runtime's specialisation (int % 16 == 0 -> divisibility 16; == 1 -> constexpr)."""
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
            [str(_cuobjdump()), "--dump-resource-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    local = int(re.search(r"LOCAL:(\d+)", res).group(1))
    return FitResult(name, int(compiled.metadata.shared), regs, local, num_warps)


def launched_configs():
    """Yield (name, fn, args, constexprs, num_warps, num_stages) for every configuration the
    launchers can pick with GLM-5's shapes (H 8/16/32/64, top-k 2048, fp16/bf16)."""
    topk = 2048
    for dtype in ("fp16", "bf16"):
        for h in (8, 16, 32, 64):
            # Distinct plans over every decode/prefill batch size. SPLITS only sets the constant
            # trip count of the K loop, so the largest and smallest split (and prefill) bound the
            # resource use; all three are compiled.
            plans = {sparse_mla.plan(t, h, topk, SM120_SMS) for t in range(1, 1025)}
            split_plans = sorted((p for p in plans if p[0]), key=lambda p: p[3])
            picked = [split_plans[0], split_plans[-1]] if split_plans else []
            picked += [p for p in plans if not p[0]]
            for use_split, cfg, hb, splits in dict.fromkeys(picked):
                args = {
                    "q_ptr": f"*{dtype}", "kv_ptr": f"*{dtype}", "idx_ptr": "*i32",
                    "out_ptr": f"*{dtype}", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32",
                    "scale_log2": 0.09, "num_slots": 64 * 4096, "kv_block_size": 64,
                    "stride_qt": h * 576, "stride_qh": 576, "stride_kvb": 64 * 576,
                    "stride_kvs": 576, "stride_it": topk, "stride_ot": h * 512, "stride_oh": 512,
                }  # fmt: skip
                consts = dict(
                    NUM_HEADS=h, TOPK=topk, SPLITS=splits, HEAD_BLOCKS=hb, BLOCK_H=cfg.block_h,
                    BLOCK_N=cfg.block_n, D_LATENT=512, D_ROPE=64, DOT_F32=False,
                    PREFETCH=cfg.prefetch,
                )  # fmt: skip
                kind = f"split{splits}" if use_split else "prefill"
                fn = (sparse_mla._sparse_mla_fwd_chunked_kernel if cfg.chunked
                      else sparse_mla._sparse_mla_fwd_kernel)  # fmt: skip
                variant = ("chunked" if cfg.chunked else "mono") + ("+pf" if cfg.prefetch else "")
                yield (
                    f"attn {kind} H={h} {dtype} BH={cfg.block_h} BN={cfg.block_n} {variant}",
                    fn, args, consts, cfg.num_warps, cfg.num_stages,
                )  # fmt: skip
                if use_split and splits == split_plans[-1][3] and dtype == "fp16":
                    yield (
                        f"combine H={h} S={splits} {dtype}", sparse_mla._combine_kernel,
                        {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": f"*{dtype}",
                         "stride_ot": h * 512, "stride_oh": 512},
                        dict(NUM_HEADS=h, SPLITS=splits, D_LATENT=512), 4, 2,
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
        c.num_warps, c.num_stages,
    )  # fmt: skip
    c = _configs.PAGED_LOGITS_CONFIG
    for next_n in (1, 2, 4):
        yield (
            f"paged_logits H=32 D=128 next_n={next_n} BN={c.block_n}",
            indexer._paged_mqa_logits_kernel,
            {"q_ptr": "*u8", "kv_ptr": "*u8", "kv_f32_ptr": "*fp32", "w_ptr": "*fp32",
             "ctx_ptr": "*i32", "bt_ptr": "*i32", "out_ptr": "*fp32", "max_model_len": 202752,
             "max_blocks": 3168, "stride_qb": next_n * 4096, "stride_qj": 4096,
             "stride_qh": 128, "stride_kvblk": 64 * 132, "stride_cb": next_n, "stride_cj": 1,
             "stride_btb": 3168, "stride_wm": 32, "stride_om": 202752},
            dict(NEXT_N=next_n, NEXT_N_PAD=next_n, CTX_1D=False, NUM_HEADS=32, D=128,
                 KV_BLOCK=64, BLOCK_N=c.block_n, CLEAN=False, FP8_DOT=True),
            c.num_warps, c.num_stages,
        )  # fmt: skip


def fit_table() -> list[FitResult]:
    return [compile_for_sm120(*spec) for spec in launched_configs()]


def main() -> int:
    rows = fit_table()
    print(f"{'kernel config (sm_120)':58} {'shared B':>9} {'regs':>5} {'spill B':>7} {'warps':>5}")
    for r in rows:
        print(f"{r.name:58} {r.shared:9d} {r.registers:5d} {r.local:7d} {r.num_warps:5d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
