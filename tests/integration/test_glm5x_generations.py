"""GLM-5.1 and GLM-5.2 (IndexShare) GGUFs on the patched vLLM 0.23.0 (patches 0007, 0008).

Tiny 7-layer checkpoints of both generations (tests/support/tiny_glm5.py; 5.2 with GLM-5.2's
index_topk_freq 4 / index_skip_topk_offset 3, so layers 3-5 are "shared" and carry no indexer
weights) are converted to Q8_0 by llama.cpp's own convert_hf_to_gguf.py (the pinned
llama-cpp-python sdist's llama.cpp, which knows GLM-5.2: it writes glm-dsa.attention.indexer.types
from config.json's indexer_types). The patched vLLM builds and loads each in a child process
(tests/support/vllm_index_share_load.py) on the CPU; no forward pass runs here (vLLM's indexer
and sparse attention kernels are CUDA-only), that is the GPU proof's part.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
import support
from support import llama_cpp, patched_vllm, tiny_glm5

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
CHILD = Path(support.__file__).with_name("vllm_index_share_load.py")
LAYERS = 7
FULL = [0, 1, 2, 6]  # max(i - 3 + 1, 0) % 4 == 0
SHARED = [3, 4, 5]
INDEXER_TENSORS = ("indexer.k_norm.weight", "indexer.k_norm.bias", "indexer.proj.weight",
                   "indexer.attn_k.weight", "indexer.attn_q_b.weight")  # fmt: skip


def child(gguf_path: Path, hf: Path, other: Path, out: Path, *extra: Path, site: Path) -> dict:
    return patched_vllm.run_child(CHILD, gguf_path, hf, other, out, *extra, out=out, site=site)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("generations")
    hf = {g: tiny_glm5.write_checkpoint(tmp / f"hf{g}", seed=0, num_layers=LAYERS, generation=g)
          for g in ("5.1", "5.2")}  # fmt: skip
    # A GLM-5.2 file without llama.cpp's indexer.types key (converted from a config.json that
    # lacks indexer_types): only its indexer tensors tell the layers apart.
    keyless_hf = tmp / "hf5.2-keyless"
    shutil.copytree(hf["5.2"], keyless_hf)
    cfg = json.loads((keyless_hf / "config.json").read_text())
    del cfg["indexer_types"]
    (keyless_hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    ggufs = {}
    for name, src in (("5.1", hf["5.1"]), ("5.2", hf["5.2"]), ("keyless", keyless_hf)):
        ggufs[name] = tmp / f"tiny-glm{name}-q8_0.gguf"
        conv = llama_cpp.convert(src, ggufs[name], "q8_0")
        assert conv.returncode == 0, conv.stderr[-4000:]
    site = patched_vllm.patched_site(tmp / "site")
    return {
        "hf": hf,
        "gguf": ggufs,
        "5.2": child(ggufs["5.2"], hf["5.2"], hf["5.1"], tmp / "52.json", ggufs["keyless"],
                     site=site),
        "5.1": child(ggufs["5.1"], hf["5.1"], hf["5.2"], tmp / "51.json", site=site),
    }  # fmt: skip


def gguf_contents(path: Path) -> tuple[dict, set[str]]:
    reader = gguf.GGUFReader(path)
    keys = {k: f for k, f in reader.fields.items() if not k.startswith("general.")}
    return keys, {t.name for t in reader.tensors}


# --- what llama.cpp's converter writes per generation -----------------------------------------


def test_converter_writes_indexer_types_for_glm52_only(runs: dict) -> None:
    assert runs["5.2"]["gguf_indexer_types"] == [i in FULL for i in range(LAYERS)]
    assert runs["5.1"]["gguf_indexer_types"] is None


def test_glm52_gguf_differs_from_glm51_by_one_key_and_the_shared_indexers(runs: dict) -> None:
    keys51, tensors51 = gguf_contents(runs["gguf"]["5.1"])
    keys52, tensors52 = gguf_contents(runs["gguf"]["5.2"])
    assert set(keys52) - set(keys51) == {"glm-dsa.attention.indexer.types"}
    assert set(keys51) <= set(keys52)
    assert tensors51 - tensors52 == {f"blk.{i}.{t}" for i in SHARED for t in INDEXER_TENSORS}
    assert tensors52 <= tensors51
    _, keyless = gguf_contents(runs["gguf"]["keyless"])
    assert keyless == tensors52


# --- the patched vLLM builds and fills both ---------------------------------------------------


@pytest.mark.parametrize("gen", ["5.1", "5.2"])
def test_every_parameter_filled_and_indexers_equal_the_checkpoint(runs: dict, gen: str) -> None:
    run = runs[gen]
    # load_model ran the no-silent-gaps check (0005): every parameter filled, every tensor used
    assert run["model_class"] == "GlmMoeDsaForCausalLM"
    full = FULL if gen == "5.2" else list(range(LAYERS))
    assert [c["layer"] for c in run["indexer_checks"]] == full
    for c in run["indexer_checks"]:
        assert 0 < c["max_err"] <= c["absmax"] / 127, c  # Q8_0 round trip
    # 5 indexer parameters (wq_b.qweight/qweight_type, wk_weights_proj, k_norm w/b) per shared layer
    assert runs["5.1"]["param_count"] - runs["5.2"]["param_count"] == 5 * len(SHARED)


def test_glm51_runs_its_indexer_in_every_layer(runs: dict) -> None:
    layers = runs["5.1"]["layers"]
    assert [r["indexer"] for r in layers] == ["Indexer"] * LAYERS
    assert not any(r["skip_topk"] for r in layers)
    assert runs["5.1"]["index_share_logs"] == []
    assert len(runs["5.1"]["indexer_caches"]) == LAYERS


def test_glm52_shared_layers_have_no_indexer_and_read_the_full_layers_buffer(runs: dict) -> None:
    layers = runs["5.2"]["layers"]
    assert [i for i, r in enumerate(layers) if r["skip_topk"]] == SHARED
    for i, r in enumerate(layers):
        if i in SHARED:
            assert r["indexer"] == "SharedTopkIndexer" and r["indexer_params"] == [], r
        else:
            assert r["indexer"] == "Indexer" and len(r["indexer_params"]) == 5, r
        # one buffer: the full layer before a shared one writes the rows the shared one reads
        assert r["indexer_buffer_is_layer0s"] and r["attention_reads_layer0s_buffer"], r
    assert runs["5.2"]["indexer_caches"] == [
        f"model.layers.{i}.self_attn.indexer.k_cache" for i in FULL
    ]
    assert runs["5.2"]["index_share_logs"] == [
        "IndexShare: 4 of 7 layers run the DSA indexer, 3 reuse the top-k of the last full layer"
    ]
    assert runs["5.2"]["shared_forward_error"] == {
        "type": "RuntimeError",
        "message": "model.layers.3.self_attn.indexer is a shared (IndexShare) indexer layer: it "
        "reuses the top-k of the last full layer and never computes its own",
    }


def test_glm52_gguf_without_the_key_is_checked_by_its_tensors(runs: dict) -> None:
    assert runs["5.2"]["keyless_check"] is None


# --- refusals ---------------------------------------------------------------------------------

HINT = (
    "The GGUF and --hf-config-path must be the same GLM generation (GLM-5.2's config.json lists "
    "indexer_types; GLM-5's and 5.1's do not)."
)


def test_glm52_gguf_with_glm51_config_is_refused_by_the_key(runs: dict) -> None:
    assert runs["5.2"]["other_config_error"] == {
        "type": "RuntimeError",
        "message": "GGUF glm-dsa.attention.indexer.types (full layers [0, 1, 2, 6] of 7) does not "
        "match the GLM-5/5.1 config (full layers [0, 1, 2, 3, 4, 5, 6] of 7). " + HINT,
    }


def test_glm51_gguf_with_glm52_config_is_refused_by_its_tensors(runs: dict) -> None:
    assert runs["5.1"]["other_config_error"] == {
        "type": "RuntimeError",
        "message": "GGUF indexer tensors do not match the GLM-5.2 (IndexShare) config: layers the "
        "config shares but the GGUF has indexer tensors for: [3, 4, 5]; layers the config runs an "
        "indexer in but the GGUF has no indexer tensors for: []. " + HINT,
    }


@pytest.mark.parametrize("gen", ["5.1", "5.2"])
def test_any_other_gap_is_still_an_error(runs: dict, gen: str) -> None:
    err = runs[gen]["gap_error"]
    assert err["type"] == "RuntimeError"
    assert (
        "Model parameters no GGUF tensor filled (1): "
        "['model.layers.0.self_attn.indexer.wk_weights_proj.weight']" in err["message"]
    )
    assert (
        "GGUF tensors that map to no parameter (1): ['blk.0.indexer.proj.weight']" in err["message"]
    )
