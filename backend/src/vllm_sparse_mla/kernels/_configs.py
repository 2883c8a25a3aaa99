"""Launch-config tables (no autotuning on the serving path), sized at run time.

The attention config is keyed by compute capability, head count and strategy ("decode": split
over top-k + combine; "prefill": one pass). Each key lists candidates in order of preference
(best measured first, benchmarks/RESULTS.md); ``attn_config`` takes the first whose shared-memory
estimate fits the device's measured ``max_shared_mem`` (``_capability.device_info``), never a GPU
name. Every config a plan can pick on sm_120 is cross-compiled by
``tests/kernels/test_sm120_fit.py`` (shared memory <= 101376 B, no spills, the row gather
pipelined 2+ deep).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._dims import D_QK


@dataclass(frozen=True)
class AttnConfig:
    block_h: int  # heads per program (>= 16: tl.dot needs M >= 16; padded heads are masked)
    block_n: int  # top-k rows gathered per inner step
    num_warps: int
    num_stages: int  # loop pipeline depth: the row ring holds num_stages - 1 tiles
    max_ctas_per_sm: int = 2  # register-bound residency (from the compile reports)
    # fp8_ds_mla rows only (sparse_mla._sparse_mla_kernel): "group" = four 128-wide dots over the
    # unscaled e4m3 values, "tile" = the [block_n, 512] tile dequantized for the 16-bit dots;
    # the e4m3 decode "cvt" (cvt.rn.f16x2.e4m3x2 on sm_89+) or "bits" (integer bit moves) of
    # int32 words, or "f8" (group read only: e4m3 loads that triton itself converts after the
    # dot operands' shared-memory loads, the logits computed transposed)
    fp8_read: str = "group"
    fp8_decode: str = "cvt"

    def __post_init__(self) -> None:
        ok = self.fp8_read in ("group", "tile") and self.fp8_decode in ("cvt", "bits", "f8")
        if not ok or (self.fp8_decode == "f8" and self.fp8_read != "group"):
            raise ValueError(f"fp8_read/fp8_decode: {self.fp8_read!r}/{self.fp8_decode!r}")

    def shared_bytes(self, elem_bytes: int = 2) -> int:
        """Estimate of the shared memory triton allocates: the row ring, q, the index ring."""
        ring = (self.num_stages - 1) * self.block_n * D_QK * elem_bytes
        q = self.block_h * D_QK * elem_bytes
        return ring + q + self.num_stages * self.block_n * 4 + 1024

    def ctas_per_sm(self, max_shared_mem: int) -> int:
        # per-block opt-in limit = per-SM shared memory - 1 KB on sm_80..sm_120
        fit = (max_shared_mem + 1024) // (self.shared_bytes() + 1024)
        return max(1, min(self.max_ctas_per_sm, fit))


# Measured on the H200 (benchmarks/RESULTS.md, 2026-12-04 run 6, same-run sweep). 4 warps beat 8
# at every BLOCK_H 16 shape timed (H8 decode 32: 32.1 vs 40.5 us, decode 128 93.8 vs 102.4,
# prefill 4096 2530 vs 2776): fewer warps re-read q from shared memory per row tile, the MIO bound
# ncu showed. BLOCK_N 64 (wgmma on sm_90, half the q re-reads per row) needs a ~168 KB ring: it is
# listed first for "prefill" and is taken only where the measured max_shared_mem holds it
# (H200: 232448 B); sm_120 (101376 B) gets the 32-row ring (93 KB).
_H16 = AttnConfig(block_h=16, block_n=32, num_warps=4, num_stages=3)
_H16_WIDE = AttnConfig(block_h=16, block_n=64, num_warps=4, num_stages=3, max_ctas_per_sm=1)
_H16_SMALL = AttnConfig(block_h=16, block_n=16, num_warps=4, num_stages=3)
# sm_90 only (the (9, 16, "prefill") key): the 64-row tile with one row buffer (~94 KB). It beat
# _H16_WIDE in every run that timed both (8 heads, us, H200 run 7 / H100 2026-12-07 / H200
# 2026-12-07d): prefill 4096 2049 / 2113 / 2050 against 2542 / 2640 / 2518, decode 128 85.4 /
# 115.2 / 84.8 against 95.5 / 124.6 / 95.7; 16 heads (run 7) 2111 vs 3004 and 88.1 vs 109.4.
# Not profiled; the likely reason: at ~94 KB two CTAs fit an SM's 228 KB, and one's gather runs
# under the other's wgmma dots in place of a ring. max_ctas_per_sm=1 keeps the split counts those
# runs measured. Not for sm_120: it fits 101376 B there, but ~100 KB per SM holds one CTA, so
# its one row buffer would leave the gather not overlapped at all.
_H16_WIDE_NS2 = AttnConfig(block_h=16, block_n=64, num_warps=4, num_stages=2, max_ctas_per_sm=1)
_H32 = AttnConfig(block_h=32, block_n=32, num_warps=8, num_stages=3)
_H32_WIDE = AttnConfig(block_h=32, block_n=64, num_warps=8, num_stages=3, max_ctas_per_sm=1)
_H32_SMALL = AttnConfig(block_h=32, block_n=16, num_warps=8, num_stages=4)
# 64 heads: one 64-head, 64-row tile (one shared buffer, ~150 KB) measured fastest on the H200 at
# every shape (decode 32 58.3 vs 68.9 us for the 32-row 3-stage tile, decode 128 188 vs 235,
# prefill 4096 4966 vs 6532): the wgmma tile halves the q re-reads, which costs more than the
# missing prefetch ring.
# Over fp8_ds_mla rows these tiles take the "tile" read (H100, 2026-12-07, bench_kernels.py
# --fp8 --sweep, same run): it keeps the wgmma tile's two 16-bit dots, where the "group" read's
# four 128-wide dots cost 1.33-1.53x (64 heads, BH64 BN64: decode 32 64.1 vs 85.2 us, decode 128
# 211.5 vs 298.7, prefill 4096 5380 vs 8256; 16-bit rows 62.2 / 200.4 / 5015). The 16-head mma
# tiles keep "group" (8 heads, BH16 BN64: decode 128 174.7 vs 273.7 tile; BN32 decode 32 46.3
# vs 47.5); the 32-head tiles, not timed over fp8 rows, keep the default "group" too. "cvt" beats
# "bits" everywhere it was timed.
_H64_WIDE = AttnConfig(
    block_h=64, block_n=64, num_warps=8, num_stages=2, max_ctas_per_sm=1, fp8_read="tile"
)
_H64 = AttnConfig(
    block_h=64, block_n=32, num_warps=8, num_stages=3, max_ctas_per_sm=1, fp8_read="tile"
)

# Over fp8_ds_mla rows every 16-head tile launches this one (same splits; ``fp8_config``): the
# e4m3 loads triton converts after the dot operands' shared loads ("f8"), 32 rows, 3 stages.
# Measured on the H200, 2026-12-07 ninth session, bench_kernels.py --fp8 --sweep, 8 heads, same
# run (us; the previous fp8 plan group/cvt on the planned tile / 16-bit rows): decode 1 9.7
# (9.6 / 8.4), decode 32 38.6 (45.7 / 32.3), decode 128 119.9 (177.5 / 95.7), prefill 4096
# 3390 (4983 / 2518). At 64 rows it loses (255 registers: decode 128 252.2); at 64 heads the
# wgmma tiles keep the tile read (f8 there: decode 128 420.9 against 207.6).
FP8_H16 = AttnConfig(block_h=16, block_n=32, num_warps=4, num_stages=3, fp8_decode="f8")


def fp8_config(cfg: AttnConfig, max_shared_mem: int) -> AttnConfig:
    """The config launched over fp8_ds_mla rows in place of ``cfg`` (a 16-bit plan's)."""
    if cfg.block_h == 16 and FP8_H16.shared_bytes() <= max_shared_mem:
        return FP8_H16
    return cfg


# (capability major or None = any, head bucket, strategy) -> candidates, best first. "decode"
# (many splits of few rows) keeps short tiles; "prefill" (and large decode batches, see
# sparse_mla.plan) takes the wide tile where it fits.
ATTN_CONFIGS: dict[tuple[int | None, int, str], tuple[AttnConfig, ...]] = {
    (None, 16, "decode"): (_H16, _H16_SMALL),
    (None, 16, "prefill"): (_H16_WIDE, _H16, _H16_SMALL),
    (9, 16, "prefill"): (_H16_WIDE_NS2, _H16_WIDE, _H16, _H16_SMALL),
    # 32 and 64 heads: one tile over all heads reads each row once where it fits (H200:
    # 232448 B). Where it does not (sm_120: 101376 B), 16-head blocks of the pipelined 32-row
    # tile, each re-reading the rows mostly from L2: at 64 heads on the H200 (RESULTS.md run 7)
    # 4 x BH16 BN32 w4 ns3 took 329 us at decode 128 and 9418 at prefill 4096 against 731 and
    # 21693 for BH32 BN16 w8 ns4, the 32-head tile that fits. 32 heads take the same order by
    # the same mechanism (half the warps re-reading q per row tile), not measured at 32 heads.
    (None, 32, "decode"): (_H32, _H16, _H32_SMALL),
    (None, 32, "prefill"): (_H32_WIDE, _H16, _H32_SMALL),
    (None, 64, "decode"): (_H64_WIDE, _H64, _H16, _H32_SMALL),
    (None, 64, "prefill"): (_H64_WIDE, _H64, _H16, _H32_SMALL),
}

# Fallback when nothing listed fits (a device with very little shared memory).
MIN_ATTN_CONFIG = AttnConfig(block_h=16, block_n=16, num_warps=4, num_stages=2)

MIN_ROWS_PER_SPLIT = 32  # a split shorter than this costs more in partials than it saves
MIN_DECODE_SPLITS = 4  # below this the wide (prefill) tile over up to 2 waves measures faster


def _bucket(num_heads: int) -> int:
    for h in (16, 32):
        if num_heads <= h:
            return h
    return 64


def attn_config(
    num_heads: int, strategy: str, capability: tuple[int, int], max_shared_mem: int
) -> AttnConfig:
    if strategy not in ("decode", "prefill"):
        raise ValueError(f"strategy must be 'decode' or 'prefill', got {strategy!r}")
    key = (capability[0], _bucket(num_heads), strategy)
    cands = ATTN_CONFIGS.get(key) or ATTN_CONFIGS[(None, key[1], strategy)]
    for cfg in cands:
        if cfg.shared_bytes() <= max_shared_mem:
            return cfg
    return MIN_ATTN_CONFIG


@dataclass(frozen=True)
class IndexerConfig:
    block_m: int  # query tokens per program (prefill) / must cover next_n (paged)
    block_n: int  # keys per program (paged: per key tile, tiles_per_program tiles a program)
    num_warps: int
    num_stages: int
    # paged: consecutive key tiles per program, the next tile's block ids prefetched so the key
    # loads can pipeline under the dot (issue 13). 1 (one tile, straight-line) until a GPU run
    # of benchmarks/bench_kernels.py --sweep times 2 and 4 against it.
    tiles_per_program: int = 1


MQA_LOGITS_CONFIG = IndexerConfig(block_m=4, block_n=128, num_warps=4, num_stages=2)
PAGED_LOGITS_CONFIG = IndexerConfig(block_m=1, block_n=128, num_warps=4, num_stages=2)
# The paged-logits candidates benchmarks/bench_kernels.py --sweep times beside the default and
# tests/kernels/test_sm120_fit.py cross-compiles: 2 and 4 key tiles per program (q loaded once per
# program, the next tile's block ids prefetched), at the default 2 stages (one key buffer: the
# next tile's copy is issued after this tile's dot) and at 3 (a 2-deep cp.async ring of key tiles,
# the next tile in flight under this tile's dot; sm_120 TTGIR, triton 3.6).
PAGED_LOGITS_VARIANTS: tuple[IndexerConfig, ...] = tuple(
    replace(PAGED_LOGITS_CONFIG, num_stages=stages, tiles_per_program=tiles)
    for tiles in (2, 4)
    for stages in (2, 3)
)
