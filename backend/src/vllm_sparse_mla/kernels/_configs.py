"""Fixed launch-config tables (no autotuning on the serving path).

Keyed by strategy and head count, and checked against the device's measured shared memory. Every
entry here is cross-compiled for sm_120 by ``tests/kernels/test_sm120_fit.py`` (shared memory <=
101376 B, no spills); ``benchmarks/bench_kernels.py`` measures them on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttnConfig:
    block_h: int  # heads per program (>= 16: tl.dot needs M >= 16; padded heads are masked)
    block_n: int  # top-k rows gathered per inner step
    num_warps: int
    num_stages: int
    prefetch: bool = True  # software-pipelined row gather (next rows in flight while computing)
    chunked: bool = False  # latent dim as 4 independent 128-column dots (more MMA parallelism)


# Chosen from H200 sweeps (benchmarks/RESULTS.md, runs of 2026-12-03); every entry fits SM120
# (tests/kernels/test_sm120_fit.py). The loop is latency-bound, so the winners are the variants
# with more independent work in flight: prefetched row gathers and 4 independent latent dots.

# Decode: few tokens, split over top-k, all heads of a token per program up to BLOCK_H. The
# [BLOCK_H, 512] fp32 accumulator lives in registers, so heads beyond 32 are split into head
# blocks (the second block re-reads the rows, mostly from L2).
DECODE_CONFIGS: dict[int, AttnConfig] = {
    8: AttnConfig(block_h=16, block_n=16, num_warps=4, num_stages=2, prefetch=True, chunked=True),
    16: AttnConfig(block_h=16, block_n=16, num_warps=4, num_stages=2, prefetch=True, chunked=True),
    32: AttnConfig(block_h=32, block_n=16, num_warps=8, num_stages=2, prefetch=True, chunked=True),
    64: AttnConfig(block_h=32, block_n=16, num_warps=8, num_stages=2, prefetch=True, chunked=True),
}

# Prefill: one program per (token, head block) over the whole top-k, tensor-core tiles. Here the
# register cost of prefetching lowers occupancy more than it hides latency (measured), so the
# gather is not prefetched.
PREFILL_CONFIGS: dict[int, AttnConfig] = {
    8: AttnConfig(block_h=16, block_n=16, num_warps=4, num_stages=2, prefetch=False, chunked=True),
    16: AttnConfig(block_h=16, block_n=16, num_warps=4, num_stages=2, prefetch=False, chunked=True),
    32: AttnConfig(block_h=32, block_n=16, num_warps=8, num_stages=2, prefetch=False, chunked=True),
    64: AttnConfig(
        block_h=64, block_n=16, num_warps=8, num_stages=2, prefetch=False, chunked=False
    ),
}

# Programs per SM the decode split aims for (enough independent gathers in flight).
DECODE_PROGRAMS_PER_SM = 4


def _bucket(num_heads: int) -> int:
    for h in (8, 16, 32, 64):
        if num_heads <= h:
            return h
    return 64


def attn_config(num_heads: int, prefill: bool) -> AttnConfig:
    return (PREFILL_CONFIGS if prefill else DECODE_CONFIGS)[_bucket(num_heads)]


@dataclass(frozen=True)
class IndexerConfig:
    block_m: int  # query tokens per program (prefill) / must cover next_n (paged)
    block_n: int  # keys per program
    num_warps: int
    num_stages: int


MQA_LOGITS_CONFIG = IndexerConfig(block_m=4, block_n=128, num_warps=4, num_stages=2)
PAGED_LOGITS_CONFIG = IndexerConfig(block_m=1, block_n=128, num_warps=4, num_stages=2)
