"""Every launched kernel configuration compiles for sm_120 (cross-compiled, no GPU needed) within
SM120's 101376 bytes of shared memory per block, without register spills, and with the attention
row gather pipelined (a 2+ deep shared ring, no full async_wait inside the main loop), read from
the TTGIR. Prints the table."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from support.sm120_fit import (  # noqa: E402
    SM120_SHARED_LIMIT,
    fit_table,
    format_table,
    pipelining,
    tile_allocs,
)

pytestmark = pytest.mark.runtime(requires=("triton",))


def test_every_launched_config_fits_sm120(capsys):
    rows = fit_table()
    with capsys.disabled():
        print("\n" + format_table(rows))
    too_big = [r.name for r in rows if r.shared > SM120_SHARED_LIMIT]
    spills = [r.name for r in rows if r.local != 0]
    assert not too_big, f"shared memory over {SM120_SHARED_LIMIT} B: {too_big}"
    assert not spills, f"register spills: {spills}"
    attn = [r for r in rows if r.name.startswith("attn")]
    assert any(r.name.startswith("attn split") for r in attn)
    assert any(r.name.startswith("attn 1pass") for r in attn)
    fp8 = [r for r in attn if " fp8 " in r.name]
    assert len(fp8) * 2 == len(attn), "every attention plan also cross-compiled over fp8 rows"
    assert any(r.name.startswith("fp8_ds_mla write") for r in rows)
    # split plans: the combine is a programmatic dependent launch (sparse_mla.use_pdl): the
    # attention grid signals it, the combine waits for the partials before reading them
    combine = [r for r in rows if r.name.startswith("combine")]
    assert combine and all(r.griddep == ("wait",) for r in combine), [r.griddep for r in combine]
    split = [r for r in attn if r.name.startswith("attn split")]
    assert all(r.griddep == ("launch_dependents",) for r in split), [r.griddep for r in split]
    assert all(r.griddep == () for r in attn if r.name.startswith("attn 1pass"))
    # every sm_120 plan over fp8 rows is a 16-head tile; with fp16 q it is launched as the "f8"
    # read (fp8_plan): no dequantized 16-bit tile passes through shared memory in its loop
    # (group/cvt stores one [rows, 128] tile per scale group and step, the traffic that made it
    # 1.5x slower on the H200); bf16 q keeps group/cvt (f8 not timed with bf16)
    assert all(r.sass > 0 for r in attn), "no SASS read from the cubins"
    assert all(" BH=16 " in r.name for r in fp8), [r.name for r in fp8]
    fp16 = [r for r in fp8 if " fp16 " in r.name]
    assert fp16 and all(r.loop_tile_allocs == 4 for r in fp8 if r not in fp16)
    staged = [(r.name, r.loop_tile_allocs) for r in fp16 if r.loop_tile_allocs != 0]
    assert not staged, f"fp8 rows: 16-bit tiles stored to shared memory in the loop: {staged}"
    shallow = [r.name for r in attn if (r.ring_depth or 0) < 2]
    waits = [r.name for r in attn if r.loop_full_wait is not False]
    no_cp_async = [r.name for r in attn if not r.loop_async_copies]
    assert not shallow, f"row tile not multi-buffered: {shallow}"
    assert not waits, f"async_wait {{num = 0}} in the main loop: {waits}"
    assert not no_cp_async, f"no cp.async gather in the main loop: {no_cp_async}"
    # paged logits over several key tiles per program (the benchmark's candidates): the key
    # tiles are copied with cp.async in the loop; from 3 stages up they form a 2+ deep ring
    # waited for partially (the next tile in flight under this tile's dot)
    multi = [r for r in rows if r.name.startswith("paged_logits") and " tiles=1 " not in r.name]
    assert {t for r in multi for t in (2, 4) if f" tiles={t} " in r.name} == {2, 4}
    no_cp_async = [r.name for r in multi if not r.loop_async_copies]
    assert not no_cp_async, f"paged logits: no cp.async key load in the loop: {no_cp_async}"
    deep = [r for r in multi if not r.name.endswith(" ns2")]
    assert deep, "no 3-stage paged logits candidate cross-compiled"
    serial = [r.name for r in deep if (r.ring_depth or 0) < 2 or r.loop_full_wait is not False]
    assert not serial, f"paged logits key tiles not pipelined: {serial}"


def test_pipelining_reader_flags_a_serialised_loop():
    """The TTGIR reader must be able to fail: a single buffer waited for in full."""
    ttgir = (
        "%a = ttg.local_alloc : () -> !ttg.memdesc<1x32x512xf16, #shared, #smem, mutable>\n"
        "%r:2 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %y) -> (i32) {\n"
        "  %w = ttg.async_wait %t {num = 0 : i32}\n"
        "  %c = ttg.async_copy_global_to_local %p, %b : tensor<32x512x!tt.ptr<f16>>\n"
        "  scf.yield %x : i32\n"
        "}\n"
        "%z = ttg.async_wait {num = 0 : i32}\n"
    )
    assert pipelining(ttgir, 32) == (1, True, 1)
    assert tile_allocs(ttgir, 32) == 0
    alloc = "%s = ttg.local_alloc %v : (tensor<32x128xf16>) -> !ttg.memdesc<32x128xf16, #shared1>"
    staged = ttgir.replace("  scf.yield", f"  {alloc}\n  scf.yield")
    assert tile_allocs(staged, 32) == 1 and tile_allocs(staged, 64) == 0
    assert pipelining(ttgir.replace("num = 0 : i32}\n  %c", "num = 2 : i32}\n  %c"), 32)[1] is False
