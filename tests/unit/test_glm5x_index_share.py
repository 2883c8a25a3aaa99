"""GLM-5.2 IndexShare layer rule and the tiny 5.2 checkpoint's layout (no torch, no vLLM).

The rule (vLLM 0.23.0's IndexCache `_skip_topk`, which tiny_glm5 and patch 0011 use) is checked
against llama.cpp's own GLM-5.2 default table (src/models/glm-dsa.cpp of the pinned llama.cpp,
PR #25407), read from the source the tests convert with.
"""

from __future__ import annotations

import re

import pytest
from support import llama_cpp, tiny_glm5


def llama_cpp_glm52_default_types() -> list[bool]:
    src = (llama_cpp.source_dir() / "src" / "models" / "glm-dsa.cpp").read_text()
    m = re.search(r"GLM_5_2_DEFAULT_INDEXER_TYPES\s*=\s*\{([^}]*)\}", src)
    assert m, "llama.cpp's glm-dsa.cpp has no GLM_5_2_DEFAULT_INDEXER_TYPES"
    return [v.strip() == "1" for v in m.group(1).split(",") if v.strip()]


def test_rule_equals_llama_cpp_glm52_table_21_full_57_shared() -> None:
    types = tiny_glm5.index_share_types(78, 4, 3)
    assert [t == "full" for t in types] == llama_cpp_glm52_default_types()
    full = [i for i, t in enumerate(types) if t == "full"]
    assert full == [0, 1, 2, *range(6, 78, 4)]
    assert (len(full), types.count("shared")) == (21, 57)


def test_tiny_glm52_config_and_tensors() -> None:
    cfg = tiny_glm5.config(7, 1, generation="5.2")
    assert cfg["indexer_types"] == ["full"] * 3 + ["shared"] * 3 + ["full"]
    assert (cfg["index_topk_freq"], cfg["index_skip_topk_offset"]) == (4, 3)
    assert cfg["index_topk_pattern"] is None
    names = tiny_glm5.tensor_shapes(cfg)
    with_indexer = {int(n.split(".")[2]) for n in names if ".indexer." in n}
    assert with_indexer == {0, 1, 2, 6, 7}  # 7: the MTP block keeps its indexer
    assert tiny_glm5.shared_indexer_layers(cfg) == [3, 4, 5]


def test_glm51_writes_glm5s_config() -> None:
    assert tiny_glm5.config(3, 1, generation="5.1") == tiny_glm5.config(3, 1)
    assert "indexer_types" not in tiny_glm5.config(3, 1)


def test_unknown_generation_refused() -> None:
    with pytest.raises(ValueError) as exc:
        tiny_glm5.config(3, 1, generation="5.3")
    assert str(exc.value) == "generation '5.3': choose one of 5, 5.1, 5.2"
