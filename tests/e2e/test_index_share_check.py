"""The IndexShare verdict of tests/e2e/index_share_check.py on hand-made top-k rows."""

from __future__ import annotations

import pytest
from support import tiny_glm5

from e2e import index_share_check as isc

pytestmark = pytest.mark.runtime
torch = pytest.importorskip("torch")  # collected by the controller venv too, which has none
TYPES = tiny_glm5.index_share_types(7, 4, 3)  # full full full shared shared shared full


def rows(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(301, generator=g)[:128] for _ in range(301)]).int()


def dumps() -> dict[int, torch.Tensor]:
    d = {i: rows(i) for i in (0, 1, 2, 6)}
    return d | {3: d[2].clone(), 4: d[2].clone(), 5: d[2].clone()}


def test_types_are_glm52s() -> None:
    assert TYPES == ["full", "full", "full", "shared", "shared", "shared", "full"]


def test_shared_rows_equal_to_the_last_full_layer_pass() -> None:
    v = isc.compare(dumps(), TYPES)
    assert v["passed"] is True
    assert v["shared_equal_last_full"] == [
        {"shared": 3, "full": 2, "equal": True},
        {"shared": 4, "full": 2, "equal": True},
        {"shared": 5, "full": 2, "equal": True},
    ]
    assert [p["full"] for p in v["full_layers_differ"]] == [[0, 1], [1, 2], [2, 6]]
    assert all(p["rows_differ"] == 301 for p in v["full_layers_differ"])
    assert (v["rows"], v["topk"], v["last_row_selected"]) == (301, 128, 128)


def test_a_shared_layer_with_its_own_rows_fails() -> None:
    d = dumps()
    d[3] = d[3].clone()
    d[3][7, 0] = d[3][7, 1]  # one index of one row differs from layer 2's
    v = isc.compare(d, TYPES)
    assert v["passed"] is False
    assert v["shared_equal_last_full"][0] == {"shared": 3, "full": 2, "equal": False}


def test_identical_full_layers_prove_nothing() -> None:
    d = {i: rows(0) for i in range(7)}  # every key selected alike: a prompt <= index_topk
    v = isc.compare(d, TYPES)
    assert v["passed"] is False
    assert {p["rows_differ"] for p in v["full_layers_differ"]} == {0}


def test_a_missing_layer_fails() -> None:
    d = dumps()
    del d[4]
    v = isc.compare(d, TYPES)
    assert v["passed"] is False and v["missing_layers"] == [4]


def test_prompts_only_the_first_has_the_dump_length() -> None:
    ps = isc.prompts(4, 301, 480)
    assert [len(p) for p in ps] == [301, 311, 321, 331]
    assert all(isc.FIRST_ID <= t < 480 for p in ps for t in p)
    assert ps == isc.prompts(4, 301, 480)  # the same prompts on every machine
    assert isc.layer_index("model.layers.12.self_attn.attn.pt") == 12
