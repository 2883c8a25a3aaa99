"""fp8_ds_mla (FlashMLA "FP8 with scale", 656-B rows): the Triton write kernel bit-exact against
the pure-torch write (every fp16 value in range, NaN, all-zero groups, range ends, -1 slots), the
row layout read back by hand, and the fp8-row attention against the fp64 reference on the
dequantized cache. CPU: Triton interpreter in one subprocess; GPU: in-process."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from support.fp8_cases import CASES, FP8_ATTN_CASES, POISON  # noqa: E402
from support.kernel_inputs import check_close  # noqa: E402

pytestmark = pytest.mark.runtime(requires=("torch", "triton"))


@pytest.fixture(scope="module")
def fp8_results(tmp_path_factory, kernel_device):
    if kernel_device != "cpu":
        return None
    from kernels.conftest import SUBPROCESS_PATH

    out = tmp_path_factory.mktemp("fp8") / "results.pt"
    path = os.pathsep.join(p for p in (SUBPROCESS_PATH, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, "-m", "support.fp8_cases", str(out)], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


@pytest.fixture
def fp8_case(request, kernel_device, fp8_results):
    name = request.param
    if fp8_results is not None:
        res = fp8_results[name]
        if "error" in res:
            pytest.fail(f"{name} raised under the interpreter: {res['error']}")
        return res
    from support import fp8_cases

    return fp8_cases.run_case(name, kernel_device)


WRITES = [n for n in CASES if n.startswith("write_")]


@pytest.mark.parametrize("fp8_case", WRITES, indirect=True)
def test_write_kernel_bit_exact(fp8_case):
    cache, slots, ref = fp8_case["cache"], fp8_case["slots"], fp8_case["ref"]
    flat = cache.view(-1, 656)
    live = slots >= 0
    got = flat[slots[live].long()]
    bad = (got != ref[live]).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} bytes differ, first (row, byte): {bad[:5].tolist()}"
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[slots[live].long()] = False
    assert torch.all(flat[untouched] == POISON), "a -1 slot or unmapped row was written"


def test_reference_write_layout_by_hand():
    """quantize_rows' bytes read back with struct: little-endian fp32 scales at 512..527 in
    group order, scale = amax / 448 (FLT_MIN floor for an all-zero group), NaN -> 0x7F, the
    group max -> 0x7E (448), rope bytes verbatim."""
    from vllm_sparse_mla.kernels.fp8_ds_mla import FLT_MIN, quantize_rows

    kv = torch.zeros(1, 512, dtype=torch.float16)
    kv[0, 0:128] = 1.0
    kv[0, 128] = -896.0
    kv[0, 129] = float("nan")
    kv[0, 384:] = 0.5
    kv[0, 400] = 3.0
    pe = torch.arange(64, dtype=torch.float16)[None]
    row = bytes(quantize_rows(kv, pe)[0].tolist())
    scales = struct.unpack("<4f", row[512:528])
    assert scales == pytest.approx([1 / 448, 2.0, FLT_MIN / 448, 3 / 448], rel=1e-7)
    assert row[0] == 0x7E and row[128] == 0xFE and row[129] == 0x7F and row[256] == 0
    # 0.5 / (3/448) = 74.67 -> 72 = 1.125 * 2**6 (0x69)
    assert row[400] == 0x7E and row[401] == 0x69
    assert row[528:] == pe.numpy().tobytes()


@pytest.mark.parametrize("fp8_case", [f"attn8_{n}" for n in FP8_ATTN_CASES], indirect=True)
def test_fp8_attention_matches_reference(fp8_case, request):
    name = request.node.callspec.params["fp8_case"].removeprefix("attn8_")
    out, ref, idx = fp8_case["out"], fp8_case["ref"], fp8_case["idx"]
    check_close(out, ref, FP8_ATTN_CASES[name][3])
    for row in range(idx.shape[0]):
        if not (idx[row] >= 0).any():
            assert torch.equal(out[row], torch.zeros_like(out[row])), f"empty row {row} not zero"


@pytest.mark.parametrize("fp8_case", ["swapped_scales"], indirect=True)
def test_reversed_scale_order_is_caught(fp8_case):
    with pytest.raises(AssertionError):
        check_close(fp8_case["out"], fp8_case["ref"], torch.float16)


@pytest.mark.parametrize("fp8_case", ["exact_rows_f16", "exact_rows_bf16"], indirect=True)
def test_exactly_representable_rows_match_the_16bit_kernel(fp8_case):
    """Where the fp8 row loses nothing (e4m3 latent x 2**k scales, rope 300x larger than the
    latent), the fp8-row kernel equals the 16-bit-row kernel to within one 16-bit step of the
    output's largest value: rope is read at full precision, each scale multiplies its own 128
    values. Not bit for bit: the fp8 kernel sums four per-group logit dots in fp32 where the
    16-bit one sums one 512-wide dot (a rope read at e4m3 precision would miss by ~6%)."""
    assert bool(fp8_case["roundtrip"]), "the rows were meant to be exactly representable"
    out8, out16 = fp8_case["out8"].double(), fp8_case["out16"].double()
    assert not torch.isnan(out8).any()
    err, top = (out8 - out16).abs().max().item(), out16.abs().max().item()
    assert err <= top * 2**-10, f"max |fp8 - 16-bit| = {err:.3g}, {err / top:.2e} of the max"
