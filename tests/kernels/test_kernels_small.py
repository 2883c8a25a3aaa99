"""Small-shape kernel checks against reference.py: Triton interpreter on CPU (CI), real
compiler when a GPU is present. -1 padding, repeats, empty rows, NaN-prefilled out, fp16/bf16."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernel_cases import ATTN_CASES, CASES  # noqa: E402

pytestmark = pytest.mark.runtime

# One tolerance table (elementwise: |out - ref| <= atol + rtol * |ref|).
TOL = {
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
    torch.float32: {"atol": 1e-2, "rtol": 1e-3},  # indexer logits (fp8 products, fp32 sums)
}


@pytest.mark.parametrize("case_result", [f"attn_{n}" for n in ATTN_CASES], indirect=True)
def test_sparse_mla_matches_reference(case_result, request):
    name = request.node.callspec.params["case_result"].removeprefix("attn_")
    out, ref = case_result["out"], case_result["ref"]
    assert bool(case_result["same_object"]), "the kernel must return the out= tensor"
    assert not torch.isnan(out).any(), "NaN left in out (unwritten or 0/0)"
    torch.testing.assert_close(out, ref, **TOL[ATTN_CASES[name][3]])
    for row in ATTN_CASES[name][4].get("empty_rows", ()):
        assert torch.equal(out[row], torch.zeros_like(out[row])), f"empty row {row} not zero"
    rel = ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12)).item()
    assert rel < (1e-2 if out.dtype == torch.bfloat16 else 1e-3), rel


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
    torch.testing.assert_close(out[valid], ref[valid], **TOL[torch.float32])
    if name.endswith("clean"):
        assert torch.equal(torch.isneginf(out), ~valid), "clean_logits: -inf exactly outside range"


@pytest.mark.parametrize("case_result", ["topk_ranges", "topk_short_rows"], indirect=True)
def test_topk_matches_reference(case_result):
    out, ref = case_result["out"], case_result["ref"]
    assert out.dtype == torch.int32
    assert torch.equal(out, ref)
    assert (out == -1).any(), "rows shorter than top-k must be -1 padded"
