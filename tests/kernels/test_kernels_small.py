"""Small-shape kernel checks against reference.py: Triton interpreter on CPU (CI), real
compiler when a GPU is present. -1 padding and tails, valid counts, repeats, empty rows, MTP
token pairs, explicit split/config plans, NaN-prefilled out, fp16/bf16. Tolerances and the
metric: support.kernel_inputs (one table for every kernel test)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.kernel_cases import ATTN_CASES, CASES  # noqa: E402
from support.kernel_inputs import (  # noqa: E402
    check_close,
    check_topk,
    paged_inputs,
    topk_logits,
)

pytestmark = pytest.mark.runtime(requires=("torch", "triton"))


@pytest.mark.parametrize("case_result", [f"attn_{n}" for n in ATTN_CASES], indirect=True)
def test_sparse_mla_matches_reference(case_result, request):
    name = request.node.callspec.params["case_result"].removeprefix("attn_")
    out, ref = case_result["out"], case_result["ref"]
    assert bool(case_result["same_object"]), "the kernel must return the out= tensor"
    check_close(out, ref, ATTN_CASES[name][3])
    opts = ATTN_CASES[name][4]
    empty = list(opts.get("empty_rows", ()))
    empty += [r for r, c in enumerate(opts.get("valid_counts") or []) if c == 0]
    for row in empty:
        assert torch.equal(out[row], torch.zeros_like(out[row])), f"empty row {row} not zero"


@pytest.mark.parametrize(
    "case_result",
    [n for n in CASES if n.startswith(("mqa_", "paged_"))],
    indirect=True,
)
def test_indexer_logits_match_reference(case_result, request):
    name = request.node.callspec.params["case_result"]
    out, ref = case_result["out"], case_result["ref"]
    valid = torch.isfinite(ref)
    assert valid.any() and (~valid).any()
    check_close(out[valid], ref[valid], torch.float32)
    if name.endswith("clean"):
        assert torch.equal(torch.isneginf(out), ~valid), "clean_logits: -inf exactly outside range"
    if "written" in case_result:  # paged: out was NaN-filled
        assert bool(case_result["same_object"]), "the kernel must return the out= tensor"
        written = case_result["written"] if name.endswith("raw") else torch.ones_like(valid)
        assert bool((valid & ~written).sum() == 0), "a valid key outside the written tiles"
        assert torch.equal(~torch.isnan(out), written), "written = the tiles meeting the range"
        assert torch.equal(torch.isneginf(out), written & ~valid), "-inf where masked in them"


@pytest.mark.parametrize("case_result", [n for n in CASES if n.startswith("topk_")], indirect=True)
def test_triton_topk_contract(case_result):
    """The Triton radix top-k (interpreter on CPU): vLLM's contract, ties, -inf, row ranges."""
    r = case_result
    check_topk(r["out"], r["logits"], int(r["k"]), r.get("starts"), r.get("ends"))


TOPK_CASES = {
    "ranges": dict(
        m=6, n=300, k=64, starts=[0, 10, 0, 50, 299, 100], ends=[100, 200, 0, 300, 300, 300]
    ),  # fmt: skip
    "short_rows": dict(m=6, n=40, k=64),
    "ties": dict(m=5, n=500, k=100, ties=True),
    "neg_inf": dict(m=5, n=400, k=128, neg_inf=0.8, ends=[400, 300, 129, 1, 0]),
}


@pytest.mark.parametrize("case", list(TOPK_CASES))
def test_topk_contract(case):
    """indexer.topk_indices' torch path (CPU, no interpreter needed) against the contract, and
    the sort-based reference against the same contract."""
    from vllm_sparse_mla.kernels import reference as ref
    from vllm_sparse_mla.kernels import topk_indices

    c = dict(TOPK_CASES[case])
    m, n, k = c.pop("m"), c.pop("n"), c.pop("k")
    starts, ends = c.pop("starts", None), c.pop("ends", None)
    logits = topk_logits(m, n, **c)
    st = None if starts is None else torch.tensor(starts, dtype=torch.int32)
    en = None if ends is None else torch.tensor(ends, dtype=torch.int32)
    got = topk_indices(logits, k, st, en, impl="torch")
    check_topk(got, logits, k, st, en)
    check_topk(ref.topk_indices(logits, k, st, en), logits, k, st, en)
    assert (got == -1).any() or case == "ties"


def test_check_close_can_fail():
    """The one metric rejects a wrong output, NaN, and a small bias over many elements."""
    ref = torch.randn(4, 8, 512).half()
    for bad in (ref * 1.01, ref.clone().fill_(float("nan")), -ref):
        with pytest.raises(AssertionError):
            check_close(bad, ref)
    check_close(ref.clone(), ref)


def test_paged_logits_rejects_bad_config():
    """The launcher validates the config before launching (CPU tensors: nothing runs)."""
    from dataclasses import replace

    from vllm_sparse_mla.kernels import paged_mqa_logits
    from vllm_sparse_mla.kernels._configs import PAGED_LOGITS_CONFIG

    q, cache, w, ctx, bt = paged_inputs(2, 1, [5, 70], 4)
    with pytest.raises(ValueError, match="tiles_per_program"):
        bad = replace(PAGED_LOGITS_CONFIG, tiles_per_program=0)
        paged_mqa_logits((q, None), cache, w, ctx, bt, None, 128, config=bad)
    with pytest.raises(TypeError, match="IndexerConfig"):
        paged_mqa_logits((q, None), cache, w, ctx, bt, None, 128, config=(1, 128, 4, 2))


def test_topk_auto_rule():
    """auto = the Triton radix top-k up to TOPK_TRITON_MAX_N keys (fp32), torch.topk above."""
    import torch
    from vllm_sparse_mla.kernels.indexer import TOPK_TRITON_MAX_N, topk_impl

    assert topk_impl(4096) == "triton"
    assert topk_impl(TOPK_TRITON_MAX_N) == "triton"
    assert topk_impl(TOPK_TRITON_MAX_N + 1) == "torch"
    assert topk_impl(4096, torch.float16) == "torch"


@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("tokens", [1, 32, 128, 4096])
def test_plans_for_32_and_64_heads_per_device(heads, tokens):
    """sm_120 (101376 B) runs 32/64 heads as 16-head blocks of the pipelined 32-row tile (2.2x the
    32-head 16-row tile on the H200, RESULTS.md run 7); the H200 keeps its one-tile-per-token
    plans."""
    from vllm_sparse_mla.kernels._capability import DeviceInfo
    from vllm_sparse_mla.kernels.sparse_mla import plan

    p = plan(tokens, heads, 2048, 188)  # RTX PRO 6000: 188 SMs, sm_120's shared memory
    cfg = p.cfg
    assert (cfg.block_h, cfg.block_n, cfg.num_warps, cfg.num_stages) == (16, 32, 4, 3)
    assert p.head_blocks == heads // 16
    assert cfg.shared_bytes() <= 101376
    h200 = plan(tokens, heads, 2048, DeviceInfo((9, 0), 132, 232448))
    assert h200.cfg.block_h == heads and h200.head_blocks == 1


@pytest.mark.parametrize("heads", [8, 16])
def test_wide_16_head_tile_per_capability(heads):
    """sm_90 takes the one-buffer 64-row tile for one-pass shapes (it beat the 3-stage tile in
    three runs, _configs._H16_WIDE_NS2); sm_120 keeps its pipelined 32-row tile, and a device
    of another capability with the H200's shared memory keeps the 3-stage wide tile."""
    from vllm_sparse_mla.kernels._capability import DeviceInfo
    from vllm_sparse_mla.kernels.sparse_mla import plan

    def tile(p):
        c = p.cfg
        return (c.block_h, c.block_n, c.num_warps, c.num_stages)

    h200 = DeviceInfo((9, 0), 132, 232448)
    assert tile(plan(4096, heads, 2048, h200)) == (16, 64, 4, 2)
    assert tile(plan(128, heads, 2048, h200)) == (16, 64, 4, 2)
    assert tile(plan(32, heads, 2048, h200)) == (16, 32, 4, 3)  # split decode unchanged
    assert tile(plan(4096, heads, 2048, DeviceInfo((10, 0), 148, 232448))) == (16, 64, 4, 3)
    assert tile(plan(4096, heads, 2048, 188)) == (16, 32, 4, 3)
    # same splits as the 3-stage tile (max_ctas_per_sm=1): workspaces and measured plans hold
    assert plan(128, heads, 2048, h200).splits == 2
