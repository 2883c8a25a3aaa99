"""The plugin's top-k debug dump (VLLM_SPARSE_MLA_DUMP_TOPK), used by the GLM-5.2 H200 proof."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime
torch = pytest.importorskip("torch")  # collected by the controller venv too, which has none


def test_off_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_sparse_mla import debug_dump

    monkeypatch.delenv(debug_dump.ENV, raising=False)
    assert debug_dump.target() is None
    assert debug_dump.target("") is None
    assert debug_dump.maybe_dump(None, "x", torch.zeros(3, 2)) is False


@pytest.mark.parametrize("value", ["/tmp/x", "/tmp/x:", "/tmp/x:0", ":5", "/tmp/x:abc"])
def test_bad_value_is_one_clear_error(value: str) -> None:
    from vllm_sparse_mla import debug_dump

    with pytest.raises(ValueError, match=r"VLLM_SPARSE_MLA_DUMP_TOPK must be DIR:N"):
        debug_dump.target(value)


def test_saves_only_forwards_of_n_rows_under_the_layer_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_sparse_mla import debug_dump

    monkeypatch.setenv(debug_dump.ENV, f"{tmp_path}/d:5")
    where = debug_dump.target()
    assert where == (tmp_path / "d", 5)
    rows = torch.arange(20, dtype=torch.int32).reshape(5, 4)
    assert debug_dump.maybe_dump(where, "model.layers.3.self_attn.attn", rows) is True
    assert debug_dump.maybe_dump(where, "model.layers.3.self_attn.attn", rows[:4]) is False
    saved = torch.load(tmp_path / "d" / "model.layers.3.self_attn.attn.pt")
    assert torch.equal(saved, rows) and saved.dtype == torch.int32
    rows[0, 0] = -7  # the file holds a copy, not a view of the live buffer
    assert saved[0, 0] == 0
    padded = torch.arange(28, dtype=torch.int32).reshape(7, 4)  # 5 rows + 2 rows of padding
    assert debug_dump.maybe_dump(where, "model.layers.3.self_attn.attn", padded) is True
    assert torch.equal(torch.load(tmp_path / "d" / "model.layers.3.self_attn.attn.pt"), padded[:5])
    too_many = torch.zeros(5 + debug_dump.PAD, 4, dtype=torch.int32)
    assert debug_dump.maybe_dump(where, "model.layers.3.self_attn.attn", too_many) is False
    assert debug_dump.maybe_dump(where, "a/b c", rows) is True
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "a_b_c.pt", "model.layers.3.self_attn.attn.pt",
    ]  # fmt: skip
