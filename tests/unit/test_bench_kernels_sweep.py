"""benchmarks/bench_kernels.py's fp8_ds_mla sweep (issue 19) on the CPU: the variants it times for a
shape are distinct plans, cover every read x decode at the default tile, and each is one the
kernel launcher accepts (AttnConfig validates its fields). The timing itself runs on a GPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.runtime(requires=("torch", "triton"))


@pytest.mark.parametrize(("h", "kind", "t"), [(8, "decode", 32), (64, "decode", 128),
                                               (8, "prefill", 4096)])  # fmt: skip
def test_fp8_sweep_covers_every_read_and_decode(h: int, kind: str, t: int) -> None:
    import bench_kernels as bk
    from vllm_sparse_mla.kernels._capability import DeviceInfo
    from vllm_sparse_mla.kernels.sparse_mla import fp8_plan, plan

    h200 = DeviceInfo(capability=(9, 0), num_sms=132, max_shared_mem=232448)
    default = fp8_plan(plan(t, h, 2048, h200), h200)  # the plan launched over fp8 rows
    variants = bk.fp8_sweep_plans(default, kind, h, t)
    assert default not in variants and len(set(variants)) == len(variants)
    same_tile = {
        (v.cfg.fp8_read, v.cfg.fp8_decode)
        for v in variants
        if (v.cfg.block_h, v.cfg.block_n, v.cfg.num_warps, v.cfg.num_stages)
        == (default.cfg.block_h, default.cfg.block_n, default.cfg.num_warps,
            default.cfg.num_stages)
    }  # fmt: skip
    reads = {(r, d) for r in ("group", "tile") for d in ("cvt", "bits")} | {("group", "f8")}
    assert same_tile | {(default.cfg.fp8_read, default.cfg.fp8_decode)} == reads
    assert all(v.head_blocks * v.cfg.block_h >= h for v in variants)
    bits = next(v for v in variants if (v.cfg.fp8_read, v.cfg.fp8_decode) == ("group", "bits"))
    assert bk._plan_desc(bits, fp8=True).endswith(" group/bits")
    assert "/" not in bk._plan_desc(default)  # 16-bit rows: no fp8 read named


def test_unknown_fp8_read_is_refused() -> None:
    from vllm_sparse_mla.kernels._configs import AttnConfig

    with pytest.raises(ValueError, match="fp8_read/fp8_decode: 'rows'/'cvt'"):
        AttnConfig(16, 32, 4, 3, fp8_read="rows")
    # the e4m3 loads triton converts exist for the group read only
    with pytest.raises(ValueError, match="fp8_read/fp8_decode: 'tile'/'f8'"):
        AttnConfig(16, 32, 4, 3, fp8_read="tile", fp8_decode="f8")


def test_shapes_outside_the_sweep_get_no_variants() -> None:
    import bench_kernels as bk
    from vllm_sparse_mla.kernels.sparse_mla import plan

    assert bk.fp8_sweep_plans(plan(8, 8, 2048, 188), "decode", 8, 8) == []
