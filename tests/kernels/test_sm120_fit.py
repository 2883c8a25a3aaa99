"""Every launched kernel configuration compiles for sm_120 (cross-compiled, no GPU needed) within
SM120's 101376 bytes of shared memory per block and without register spills. Prints the table."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from sm120_fit import SM120_SHARED_LIMIT, fit_table  # noqa: E402

pytestmark = pytest.mark.runtime


def test_every_launched_config_fits_sm120(capsys):
    rows = fit_table()
    with capsys.disabled():
        print(f"\n{'kernel config (sm_120)':58} {'shared B':>9} {'regs':>5} {'spill B':>7}")
        for r in rows:
            print(f"{r.name:58} {r.shared:9d} {r.registers:5d} {r.local:7d}")
    too_big = [r.name for r in rows if r.shared > SM120_SHARED_LIMIT]
    spills = [r.name for r in rows if r.local != 0]
    assert not too_big, f"shared memory over {SM120_SHARED_LIMIT} B: {too_big}"
    assert not spills, f"register spills: {spills}"
    assert any(r.name.startswith("attn split") for r in rows)
    assert any(r.name.startswith("attn prefill") for r in rows)
