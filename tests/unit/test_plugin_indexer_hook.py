"""Patch 0010: the deep_gemm wrappers use the plugin's MQA-logits kernels where DeepGEMM has none.

The patch is applied to a copy of the runtime env's pristine ``vllm/utils/deep_gemm.py`` and the
result loaded as a module; on this CPU-only machine ``support_deep_gemm()`` is False, exactly
the SM120 situation. The runtime env itself is never modified.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support.plugin import REPO, build_impl

pytestmark = pytest.mark.runtime
torch = pytest.importorskip("torch")  # collected by the controller venv too, which has none

PATCH = REPO / "patches/vllm-0.23.0/0010-deep-gemm-oot-mqa-logits.patch"


def _patched_deep_gemm(tmp_path: Path) -> ModuleType:
    import vllm

    target = tmp_path / "vllm/utils/deep_gemm.py"
    target.parent.mkdir(parents=True)
    shutil.copyfile(Path(vllm.__file__).parent / "utils/deep_gemm.py", target)
    # git apply works outside a repository as a strict `patch -p1` (no fuzz).
    subprocess.run(["git", "apply", "-p1", str(PATCH)], cwd=tmp_path, check=True, timeout=60)
    # The patched source runs as a fresh module beside the pristine one (the runtime env stays
    # untouched); it imports only absolute vllm names, so no package context is needed.
    module = ModuleType("vllm_utils_deep_gemm_patched")
    module.__file__ = str(target)
    exec(compile(target.read_text(), str(target), "exec"), module.__dict__)
    return module


def test_series_applies_the_plugin_patch_last() -> None:
    lines = (REPO / "patches/vllm-0.23.0/series").read_text().splitlines()
    assert [x for x in lines if x and not x.startswith("#")][-1] == PATCH.name
    header = PATCH.read_text().split("\n---\n", 1)[0]
    for field in ("Description:", "Author:", "Origin: vendor", "Upstream-Status: Pending",
                  "Last-Update:"):  # fmt: skip
        assert field in header


def test_registered_kernels_replace_deepgemm_where_it_has_none(tmp_path: Path) -> None:
    dg = _patched_deep_gemm(tmp_path)
    calls: list[tuple[str, tuple, dict]] = []

    def mqa(*args, **kwargs):
        calls.append(("mqa", args, kwargs))
        return torch.full((2, 3), 7.0)

    def paged(*args, **kwargs):
        calls.append(("paged", args, kwargs))
        return torch.full((2, 8), 5.0)

    dg.register_mqa_logits_impl(mqa, paged)
    q = (torch.zeros(2, 32, 128), None)
    kv = (torch.zeros(3, 128), torch.ones(3))
    weights, ks, ke = torch.ones(2, 32), torch.zeros(2, dtype=torch.int32), torch.ones(2)
    out = dg.fp8_fp4_mqa_logits(q, kv, weights, ks, ke, clean_logits=False)
    assert torch.equal(out, torch.full((2, 3), 7.0))
    assert calls[0] == ("mqa", (q, kv, weights, ks, ke), {"clean_logits": False})

    context_lens = torch.tensor([[5], [9]], dtype=torch.int32)
    meta = dg.get_paged_mqa_logits_metadata(context_lens, 64, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32 and not meta.any()
    block_table = torch.zeros(2, 4, dtype=torch.int32)
    cache = torch.zeros(4, 64, 1, 132, dtype=torch.uint8)
    out = dg.fp8_fp4_paged_mqa_logits(
        q, cache, weights, context_lens, block_table, meta, max_model_len=8, clean_logits=True
    )
    assert torch.equal(out, torch.full((2, 8), 5.0))
    assert calls[1] == (
        "paged",
        (q, cache, weights, context_lens, block_table, meta, 8),
        {"clean_logits": True},
    )


@pytest.fixture
def patched_dg(tmp_path, monkeypatch) -> ModuleType:
    """The patched deep_gemm standing in for vLLM's (unpatched here), plugin not registered."""
    import vllm.utils
    import vllm_sparse_mla

    dg = _patched_deep_gemm(tmp_path)
    monkeypatch.setitem(sys.modules, "vllm.utils.deep_gemm", dg)
    monkeypatch.setattr(vllm.utils, "deep_gemm", dg, raising=False)
    monkeypatch.setattr(vllm_sparse_mla, "_registered", False)
    return dg


@pytest.mark.parametrize(
    ("additional_config", "force"),
    [
        (None, False),
        ({"sparse_mla_indexer": "auto"}, False),
        ({"sparse_mla_indexer": "triton"}, True),
    ],
)
def test_plugin_fills_the_hook_as_the_config_says(patched_dg, additional_config, force) -> None:
    import vllm_sparse_mla
    from vllm_sparse_mla import indexer_hook

    dg = patched_dg
    assert vllm_sparse_mla.register() is True
    # register() alone (plugin load, no config yet): the auto default.
    assert dg._oot_mqa_logits_impl is indexer_hook.mqa_logits
    assert dg._oot_mqa_logits_force is False
    build_impl(additional_config)
    assert dg._oot_mqa_logits_impl is indexer_hook.mqa_logits
    assert dg._oot_paged_mqa_logits_impl is indexer_hook.paged_mqa_logits
    assert dg._oot_mqa_logits_force is force


def test_plugin_leaves_deepgemm_alone_when_told(patched_dg) -> None:
    import vllm_sparse_mla

    dg = patched_dg
    assert vllm_sparse_mla.register() is True
    impl = build_impl({"sparse_mla_indexer": "deepgemm"})
    assert impl.indexer == "deepgemm"
    assert dg._oot_mqa_logits_impl is None
    assert dg._use_oot_mqa_logits() is False


def test_triton_without_patch_0010_fails_the_build(monkeypatch) -> None:
    import vllm_sparse_mla

    monkeypatch.setattr(vllm_sparse_mla, "_registered", False)
    assert vllm_sparse_mla.register() is True  # the runtime env's vLLM is unpatched
    with pytest.raises(ValueError, match="triton needs vLLM's register_mqa_logits_impl"):
        build_impl({"sparse_mla_indexer": "triton"})
