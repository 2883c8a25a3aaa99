"""scripts/glm5_gguf_writer.py and scripts/gguf_types_check.py on the controller (gguf-py only).

Full GLM-5 geometry is checked on the tensor plan (no bytes written); tiny files of every
published mix are written as split shards, merged with scripts/gguf_merge.py and read back by
gguf-py's own reader and dequantizer. GLM-5.2's IndexShare (--generation 5.2): the plan drops
exactly the shared layers' indexers (tests/support/tiny_glm5.py's rule), the file carries
llama.cpp's indexer.types key and the HF config tiny_glm5's GLM-5.2 keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import gguf
import gguf_merge
import gguf_nextn
import gguf_types_check as tc
import glm5_gguf_writer as w
import numpy as np
import pytest
from gguf.quants import dequantize
from support import tiny_glm5

Q = gguf.GGMLQuantizationType


def by_name(specs: list[w.TensorSpec]) -> dict[str, w.TensorSpec]:
    return {s.name: s for s in specs}


def test_full_geometry_plan_is_glm5() -> None:
    specs = by_name(w.plan(w.glm5(layers=78, experts=256), w.MIXES["Q4_K_M"]))
    assert len(specs) == 2 + 3 * 18 + 75 * 23 + 1
    assert specs["token_embd.weight"].ne == (6144, 154880)
    assert specs["output.weight"].ne == (6144, 154880)
    assert specs["output.weight"].type_name == "Q6_K"
    b = "blk.3."  # first MoE layer
    assert specs[b + "attn_q_a.weight"].ne == (6144, 2048)
    assert specs[b + "attn_q_b.weight"].ne == (2048, 64 * 256)
    assert specs[b + "attn_kv_a_mqa.weight"].ne == (6144, 576)
    assert specs[b + "attn_k_b.weight"].ne == (192, 512, 64)
    assert specs[b + "attn_v_b.weight"].ne == (512, 256, 64)
    assert specs[b + "attn_output.weight"].ne == (64 * 256, 6144)
    assert specs[b + "indexer.attn_q_b.weight"].ne == (2048, 32 * 128)
    assert specs[b + "indexer.attn_k.weight"].ne == (6144, 128)
    assert specs[b + "indexer.proj.weight"].ne == (6144, 32)
    assert specs[b + "ffn_gate_inp.weight"].ne == (6144, 256)
    assert specs[b + "ffn_gate_exps.weight"].ne == (6144, 2048, 256)
    assert specs[b + "ffn_down_exps.weight"].ne == (2048, 6144, 256)
    assert specs[b + "ffn_up_shexp.weight"].ne == (6144, 2048)
    assert specs["blk.2.ffn_gate.weight"].ne == (6144, 12288)
    assert "blk.2.ffn_gate_exps.weight" not in specs and "blk.3.ffn_gate.weight" not in specs
    roles = ["ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
             "attn_q_b.weight", "attn_k_b.weight", "ffn_gate_inp.weight", "indexer.proj.weight",
             "exp_probs_b.bias"]  # fmt: skip
    types = {k: specs[b + k].type_name for k in roles}
    assert types == {
        "ffn_gate_exps.weight": "Q4_K",
        "ffn_up_exps.weight": "Q4_K",
        "ffn_down_exps.weight": "Q5_K",
        "attn_q_b.weight": "Q8_0",
        "attn_k_b.weight": "Q8_0",
        "ffn_gate_inp.weight": "F32",
        "indexer.proj.weight": "F32",
        "exp_probs_b.bias": "F32",
    }
    # Q4_K_M at 78 layers: within a few percent of AesSedai's 432.8 GiB (no MTP block here)
    gib = sum(w.nbytes(s) for s in specs.values()) / 2**30
    assert 400 < gib < 433, gib


@pytest.mark.parametrize(
    ("mix", "gate", "down", "gib_lo", "gib_hi"),
    [("IQ4_XS", "IQ3_S", "IQ4_XS", 300, 337), ("UD-IQ2_M", "IQ2_XXS", "IQ2_S", 200, 236e9 / 2**30)],
)
def test_iq_mixes_sizes_and_types(
    mix: str, gate: str, down: str, gib_lo: float, gib_hi: float
) -> None:
    specs = by_name(w.plan(w.glm5(layers=78), w.MIXES[mix]))
    assert specs["blk.10.ffn_gate_exps.weight"].type_name == gate
    assert specs["blk.10.ffn_up_exps.weight"].type_name == gate
    assert specs["blk.10.ffn_down_exps.weight"].type_name == down
    gib = sum(w.nbytes(s) for s in specs.values()) / 2**30
    assert gib_lo < gib < gib_hi, gib


def test_ud_iq2_m_raises_the_first_moe_down() -> None:
    specs = by_name(w.plan(w.glm5(layers=6), w.MIXES["UD-IQ2_M"]))
    assert specs["blk.3.ffn_down_exps.weight"].type_name == "IQ3_S"
    assert specs["blk.4.ffn_down_exps.weight"].type_name == "IQ2_S"


def test_tp8_shard_geometry() -> None:
    specs = by_name(w.plan(w.tp8_shard(layers=4), w.MIXES["Q4_K_M"]))
    assert specs["blk.3.attn_q_b.weight"].ne == (2048, 8 * 256)
    assert specs["blk.3.attn_k_b.weight"].ne == (192, 512, 8)
    assert specs["blk.3.ffn_gate_exps.weight"].ne == (6144, 256, 256)
    assert specs["blk.3.ffn_down_exps.weight"].ne == (256, 6144, 256)
    assert specs["blk.3.indexer.attn_q_b.weight"].ne == (2048, 32 * 128)  # replicated


def test_unblockable_type_is_refused_before_writing(tmp_path: Path) -> None:
    geom = w.Geometry(layers=4, moe_inter=128, shared_inter=128)
    with pytest.raises(
        w.WriterError, match=r"blk.3.ffn_down_exps.weight: Q5_K needs ne0 divisible"
    ):
        w.write_gguf(tmp_path / "x.gguf", geom, w.MIXES["Q4_K_M"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "type_name",
    ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ3_S", "IQ4_XS", "IQ2_S", "IQ2_XXS", "IQ1_M", "MXFP4"],
)
def test_random_blocks_dequantize_finite_and_bounded(type_name: str) -> None:
    qt = Q[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    spec = w.TensorSpec("t", (block * 8, 16), type_name, "attn")
    raw = w.random_tensor(spec, np.random.default_rng(7))
    assert raw.dtype == np.uint8 and raw.shape == (16, 8 * size)
    vals = dequantize(raw, qt)
    assert vals.shape == (16, block * 8)
    assert np.isfinite(vals).all()
    peak = float(np.abs(vals).max())
    assert 0.3 * w.WEIGHT_BOUND < peak <= w.WEIGHT_BOUND * 1.01, peak
    assert float(vals.std()) > 0.002  # not constant


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in w.MIXES:
        d = tmp_path_factory.mktemp(name)
        shards = w.write_gguf(d / f"tiny-{name}.gguf", w.tiny(layers=3), w.MIXES[name],
                              split_max_tensors=20)  # fmt: skip
        assert len(shards) == 4 and shards[0].name == f"tiny-{name}-00001-of-00004.gguf"
        assert gguf_merge.main(["--no-progress", str(shards[0]), str(d / "merged.gguf")]) == 0
        out[name] = d / "merged.gguf"
    return out


@pytest.mark.parametrize("name", list(w.MIXES))
def test_merged_file_reads_back_as_planned(merged: dict[str, Path], name: str) -> None:
    reader = gguf.GGUFReader(merged[name])
    want = w.plan(w.tiny(layers=3), w.MIXES[name])
    got = [(t.name, tuple(int(x) for x in t.shape), t.tensor_type.name) for t in reader.tensors]
    assert got == [(s.name, s.ne, s.type_name) for s in want]
    assert reader.fields["general.architecture"].contents() == "glm-dsa"
    assert reader.fields["glm-dsa.block_count"].contents() == 3
    assert reader.fields["glm-dsa.expert_count"].contents() == 8
    assert reader.fields["glm-dsa.attention.indexer.top_k"].contents() == 128
    assert reader.fields["split.count"].contents() == 0  # as llama-gguf-split --merge leaves it
    for t in reader.tensors:
        vals = dequantize(t.data, t.tensor_type)
        assert np.isfinite(vals).all(), t.name
        if t.tensor_type not in (Q.F32, Q.F16):
            assert float(np.abs(vals).max()) <= w.WEIGHT_BOUND * 1.01, t.name


@pytest.mark.parametrize("name", list(w.MIXES))
def test_types_check_accepts_published_mixes(merged: dict[str, Path], name: str, capsys) -> None:
    assert tc.main([str(merged[name])]) == 0
    assert "every type runs on vLLM 0.23.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("roles", "tensor", "type_name", "reason"),
    [
        ({"down_exps": "MXFP4"}, "blk.1.ffn_down_exps.weight", "MXFP4", "no GGUF MoE kernel"),
        ({"attn": "TQ2_0"}, "blk.0.indexer.attn_k.weight", "TQ2_0", "no GGUF linear"),
        ({"up_exps": "Q5_K"}, "blk.1.ffn_up_exps.weight", "Q5_K", "ffn_gate_exps is Q4_K"),
        ({"gate_exps": "F16", "up_exps": "F16"}, "blk.1.ffn_gate_exps.weight", "F16",
         "per-token Python loop"),
    ],
)  # fmt: skip
def test_types_check_refuses_on_the_first_shard_before_merge(
    tmp_path: Path, roles: dict, tensor: str, type_name: str, reason: str, capsys
) -> None:
    shards = w.write_gguf(tmp_path / "bad.gguf", w.tiny(layers=3), w.mix_with("Q4_K_M", **roles),
                          split_max_tensors=20)  # fmt: skip
    assert tc.main([str(shards[0])]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: ")
    assert f"tensor {tensor} has GGUF type {type_name}" in err[0]
    assert reason in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(s.name for s in shards)


def test_types_check_missing_shard(tmp_path: Path, capsys) -> None:
    shards = w.write_gguf(tmp_path / "m.gguf", w.tiny(layers=3), w.MIXES["IQ4_XS"],
                          split_max_tensors=20)  # fmt: skip
    shards[2].unlink()
    assert tc.main([str(shards[0])]) == 1
    assert "missing shard 3 of 4" in capsys.readouterr().err


def test_writer_cli_refuses_unknown_mix_and_existing_output(tmp_path: Path, capsys) -> None:
    out = tmp_path / "a.gguf"
    assert w.main(["--mix", "Q3_XL", "--out", str(out), "--view", "tiny"]) == 1
    assert capsys.readouterr().err.startswith("error: unknown mix 'Q3_XL'")
    assert w.main(["--mix", "IQ4_XS", "--out", str(out), "--view", "tiny", "--layers", "2"]) == 0
    assert w.main(["--mix", "IQ4_XS", "--out", str(out), "--view", "tiny", "--layers", "2"]) == 1
    assert "exists (use --force" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf"]


# --- the MTP/nextn block (--nextn 1) ---------------------------------------------------------

NEXTN = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")
HEAD_NORM = "nextn.shared_head_norm.weight"


def test_nextn_block_is_glm5s_blk_78() -> None:
    plain = w.plan(w.glm5(layers=78), w.MIXES["Q4_K_M"])
    specs = w.plan(dataclasses.replace(w.glm5(layers=78), nextn=1), w.MIXES["Q4_K_M"])
    # the trunk is untouched; blk.78 comes before output_norm, as in the converter's output
    assert specs[: len(plain) - 1] == plain[:-1] and specs[-1] == plain[-1]
    blk78 = [s for s in specs if s.name.startswith("blk.78.")]
    blk77 = [s.name.removeprefix("blk.77.") for s in plain if s.name.startswith("blk.77.")]
    # the converter's order: eh_proj, enorm, hnorm, the MoE layer's 23 tensors, shared_head_norm
    assert [s.name.removeprefix("blk.78.") for s in blk78] == [*NEXTN, *blk77, HEAD_NORM]
    nextn = {s.name: (s.ne, s.type_name) for s in blk78 if ".nextn." in s.name}
    assert nextn == {
        "blk.78.nextn.eh_proj.weight": ((12288, 6144), "Q8_0"),  # HF [hidden, 2 * hidden]
        "blk.78.nextn.enorm.weight": ((6144,), "F32"),
        "blk.78.nextn.hnorm.weight": ((6144,), "F32"),
        "blk.78.nextn.shared_head_norm.weight": ((6144,), "F32"),
    }
    # gguf-py's glm-dsa table gives these names to DeepSeek-V3-style MTP checkpoint names; GLM-5
    # has no per-layer embed_tokens / shared_head.head, so the file has none (patch 0009 uses
    # the trunk's token_embd and output.weight)
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM_DSA, 79)
    hf = {"eh_proj": NEXTN[0], "enorm": NEXTN[1], "hnorm": NEXTN[2], "shared_head.norm": HEAD_NORM}
    for part, name in hf.items():
        assert table.get_name(f"model.layers.78.{part}") + ".weight" == "blk.78." + name
    for part in ("embed_tokens", "shared_head.head"):
        assert table.get_name(f"model.layers.78.{part}") + ".weight" not in nextn


@pytest.mark.parametrize(("mix", "published_gib"), [("Q4_K_M", 432.8), ("IQ4_XS", 336.6)])
def test_nextn_block_makes_the_published_sizes(mix: str, published_gib: float) -> None:
    # AesSedai's files carry blk.78: with it the plan is within 0.1% of their size
    geom = dataclasses.replace(w.glm5(layers=78), nextn=1)
    gib = sum(w.nbytes(s) for s in w.plan(geom, w.MIXES[mix])) / 2**30
    assert abs(gib / published_gib - 1) < 1e-3, gib


def test_nextn_must_be_0_or_1() -> None:
    with pytest.raises(w.WriterError, match="nextn must be 0 or 1"):
        w.Geometry(nextn=2)


# sha256 of the files main's writer (c6f4783, before --nextn existed) wrote for tiny(layers=2),
# seed 0, gguf==0.18.0 (pinned in requirements/): the default must stay byte for byte the same
BEFORE_NEXTN = {
    "Q4_K_M": "608d2c644ced5b17fc2d68de1e6e5200b55dceeb2944ef99ef870575617afbf9",
    "IQ4_XS": "6bb13897afcdcd6f05972ec550d9c12e0898c4b07311f7f64b6d89447c9215eb",
    "UD-IQ2_M": "36ae8f3bc3d28f044fb87a8ce0e074ffa75b911f6e34c7629a9d7f58d4c4c0c0",
}
BEFORE_NEXTN_TP8_CONFIG = "559c33747169af93ce6e88867671a8e374be65f741f38de812d5056747896d1f"


@pytest.mark.parametrize("mix", list(BEFORE_NEXTN))
def test_nextn_0_writes_the_same_bytes_as_before(tmp_path: Path, mix: str) -> None:
    out = tmp_path / "m.gguf"
    argv = ["--mix", mix, "--view", "tiny", "--layers", "2", "--experts", "8",
            "--out", str(out), "--hf-dir", str(tmp_path / "hf")]  # fmt: skip
    assert w.main(argv) == 0
    assert hashlib.sha256(out.read_bytes()).hexdigest() == BEFORE_NEXTN[mix]
    reader = gguf.GGUFReader(out)
    assert reader.get_field("glm-dsa.nextn_predict_layers") is None
    assert not [t.name for t in reader.tensors if ".nextn." in t.name]
    w.write_hf_dir(tmp_path / "tp8", w.tp8_shard(layers=6))
    config = (tmp_path / "tp8" / "config.json").read_bytes()
    assert hashlib.sha256(config).hexdigest() == BEFORE_NEXTN_TP8_CONFIG


@pytest.fixture(scope="module")
def nextn_files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The tiny geometry (3 layers: blk.0 dense, blk.1-2 MoE) with and without --nextn 1, written
    by the CLI as split shards and merged, as bench_serve does."""
    out = {}
    for n in (0, 1):
        d = tmp_path_factory.mktemp(f"nextn{n}")
        argv = ["--mix", "Q4_K_M", "--view", "tiny", "--layers", "3", "--experts", "8",
                "--nextn", str(n), "--out", str(d / "shards" / "t.gguf"),
                "--split-max-tensors", "20", "--hf-dir", str(d / "hf")]  # fmt: skip
        assert w.main(argv) == 0
        first = sorted((d / "shards").glob("t-00001-of-*.gguf"))[0]
        assert gguf_merge.main(["--no-progress", str(first), str(d / "t.gguf")]) == 0
        out[n] = d
    return out


def test_nextn_file_reads_back_with_its_block_and_keys(nextn_files: dict[int, Path]) -> None:
    reader = gguf.GGUFReader(nextn_files[1] / "t.gguf")
    geom = dataclasses.replace(w.tiny(layers=3), nextn=1)
    got = [(t.name, tuple(int(x) for x in t.shape), t.tensor_type.name) for t in reader.tensors]
    assert got == [(s.name, s.ne, s.type_name) for s in w.plan(geom, w.MIXES["Q4_K_M"])]
    types = {t.name: (tuple(int(x) for x in t.shape), t.tensor_type.name) for t in reader.tensors}
    assert types["blk.3.nextn.eh_proj.weight"] == ((1024, 512), "Q8_0")
    for name in ("enorm", "hnorm", "shared_head_norm"):
        assert types[f"blk.3.nextn.{name}.weight"] == ((512,), "F32")
    assert types["blk.3.ffn_gate_exps.weight"] == ((512, 256, 8), "Q4_K")  # a MoE layer
    assert types["blk.3.indexer.attn_k.weight"] == ((512, 128), "Q8_0")
    assert types["blk.3.attn_k_b.weight"] == ((192, 512, 8), "Q8_0")
    assert not [n for n in types if n.startswith("blk.4.")]
    fields = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("tok")}
    assert fields["glm-dsa.block_count"] == 4  # trunk + nextn, as llama.cpp counts them
    assert fields["glm-dsa.nextn_predict_layers"] == 1
    assert fields["glm-dsa.leading_dense_block_count"] == 1
    # the converter's key order: right after the rope dimension, before the indexer keys
    keys = list(fields)
    at = keys.index("glm-dsa.nextn_predict_layers")
    assert keys[at - 1 : at + 2] == ["glm-dsa.rope.dimension_count", "glm-dsa.nextn_predict_layers",
                                     "glm-dsa.attention.indexer.head_count"]  # fmt: skip
    for t in reader.tensors:
        if ".nextn." in t.name:
            vals = dequantize(t.data, t.tensor_type)
            assert np.isfinite(vals).all(), t.name
            if t.name.endswith("norm.weight"):
                assert abs(float(vals.mean()) - 1) < 0.05, t.name  # a norm weight, near 1


def test_nextn_config_keeps_the_trunk_layer_count(nextn_files: dict[int, Path]) -> None:
    cfg = {n: json.loads((nextn_files[n] / "hf" / "config.json").read_text()) for n in (0, 1)}
    assert cfg[1]["num_nextn_predict_layers"] == 1 and cfg[0]["num_nextn_predict_layers"] == 0
    assert cfg[1]["num_hidden_layers"] == 3
    assert cfg[1]["mlp_layer_types"] == ["dense", "sparse", "sparse"]
    assert {k: v for k, v in cfg[1].items() if k != "num_nextn_predict_layers"} == {
        k: v for k, v in cfg[0].items() if k != "num_nextn_predict_layers"
    }


def test_gguf_nextn_check_accepts_nextn_1_and_refuses_nextn_0(
    nextn_files: dict[int, Path], capsys
) -> None:
    assert gguf_nextn.main([str(nextn_files[1] / "t.gguf")]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "arch": "glm-dsa", "block_count": 4, "nextn_predict_layers": 1, "nextn_blocks": [3],
    }  # fmt: skip
    assert gguf_nextn.main([str(nextn_files[0] / "t.gguf")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {nextn_files[0] / 't.gguf'} has no complete MTP/nextn layer")
    assert "nextn_predict_layers=0, nextn eh_proj tensors in blocks [] of 3" in err


# --- GLM-5.2's IndexShare (--generation 5.2; issue 18) ----------------------------------------

INDEXER = ("indexer.k_norm.bias", "indexer.k_norm.weight", "indexer.proj.weight",
           "indexer.attn_k.weight", "indexer.attn_q_b.weight")  # fmt: skip


def test_index_share_rule_is_tiny_glm5s() -> None:
    # scripts/ cannot import tests/: the two copies of the rule must agree
    assert w.GENERATIONS == tiny_glm5.GENERATIONS
    for n in (1, 3, 6, 7, 12, 78):
        assert w.index_share_types(n, 4, 3) == tiny_glm5.index_share_types(n, 4, 3)
    types = w.index_share_types(78, 4, 3)
    assert types.count("full") == 21 and types.count("shared") == 57  # GLM-5.2's config.json
    assert w.index_share_types(7, 4, 3) == ["full"] * 3 + ["shared"] * 3 + ["full"]


@pytest.mark.parametrize(("view", "layers", "shared"), [("tp8", 6, [3, 4, 5]),
                                                        ("tiny", 7, [3, 4, 5])])  # fmt: skip
def test_glm52_plan_omits_exactly_the_shared_layers_indexers(
    view: str, layers: int, shared: list[int]
) -> None:
    base = w.VIEWS[view](layers, 8)
    plain = w.plan(base, w.MIXES["Q4_K_M"])
    g52 = dataclasses.replace(base, generation="5.2")
    specs = w.plan(g52, w.MIXES["Q4_K_M"])
    assert [i for i in range(layers) if not g52.has_indexer(i)] == shared
    missing = {s.name for s in plain} - {s.name for s in specs}
    assert missing == {f"blk.{i}.{t}" for i in shared for t in INDEXER}
    # everything else is the same tensor in the same order
    assert specs == [s for s in plain if s.name not in missing]
    assert w.plan(dataclasses.replace(base, generation="5.1"), w.MIXES["Q4_K_M"]) == plain


def test_glm52_full_geometry_drops_57_indexers_and_keeps_the_nextn_ones() -> None:
    g = dataclasses.replace(w.glm5(layers=78), nextn=1)
    plain = by_name(w.plan(g, w.MIXES["Q4_K_M"]))
    specs = by_name(w.plan(dataclasses.replace(g, generation="5.2"), w.MIXES["Q4_K_M"]))
    assert len(plain) - len(specs) == 57 * len(INDEXER)
    assert "blk.78.indexer.attn_k.weight" in specs  # the MTP block's own indexer
    assert "blk.74.indexer.attn_k.weight" in specs and "blk.75.indexer.attn_k.weight" not in specs
    saved = sum(w.nbytes(s) for s in plain.values()) - sum(w.nbytes(s) for s in specs.values())
    # per layer: Q8_0 wq_b 2048 x 4096 + wk 6144 x 128 (34 / 32 bytes) + F32 proj + k_norm
    per_layer = (2048 * 4096 + 6144 * 128) * 34 // 32 + (6144 * 32 + 2 * 128) * 4
    assert saved == 57 * per_layer


def test_unknown_generation_is_refused() -> None:
    with pytest.raises(w.WriterError, match="generation '6': choose one of 5, 5.1, 5.2"):
        w.Geometry(generation="6")


@pytest.fixture(scope="module")
def glm52_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("glm52")
    argv = ["--mix", "Q4_K_M", "--view", "tiny", "--layers", "7", "--experts", "8",
            "--generation", "5.2", "--out", str(d / "t.gguf"),
            "--hf-dir", str(d / "hf")]  # fmt: skip
    assert w.main(argv) == 0
    return d


def test_glm52_file_has_llama_cpps_indexer_types_key(glm52_file: Path) -> None:
    reader = gguf.GGUFReader(glm52_file / "t.gguf")
    field = reader.get_field("glm-dsa.attention.indexer.types")
    assert field is not None
    # what tests/support/vllm_index_share_load.py reads from a llama.cpp conversion
    assert [bool(v) for v in field.contents()] == [True, True, True, False, False, False, True]
    assert field.types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL]
    keys = [k for k in reader.fields if not k.startswith("tok")]
    at = keys.index("glm-dsa.attention.indexer.types")
    assert keys[at - 1] == "glm-dsa.attention.indexer.top_k"  # the converter's place
    geom = dataclasses.replace(w.tiny(layers=7), generation="5.2")
    got = [(t.name, tuple(int(x) for x in t.shape), t.tensor_type.name) for t in reader.tensors]
    assert got == [(s.name, s.ne, s.type_name) for s in w.plan(geom, w.MIXES["Q4_K_M"])]
    assert {t.name for t in reader.tensors if ".indexer." in t.name} == {
        f"blk.{i}.{t}" for i in (0, 1, 2, 6) for t in INDEXER
    }
    assert "GLM-5.2" in reader.get_field("general.name").contents()


def test_glm5_file_has_no_indexer_types_key(tmp_path: Path) -> None:
    out = tmp_path / "t.gguf"
    argv = ["--view", "tiny", "--layers", "7", "--experts", "8", "--generation", "5.1",
            "--out", str(out)]  # fmt: skip
    assert w.main(argv) == 0
    reader = gguf.GGUFReader(out)
    assert reader.get_field("glm-dsa.attention.indexer.types") is None
    assert sum(1 for t in reader.tensors if t.name.endswith("indexer.attn_k.weight")) == 7


def test_glm52_hf_config_has_glm52s_keys(glm52_file: Path) -> None:
    cfg = json.loads((glm52_file / "hf" / "config.json").read_text())
    ref = tiny_glm5.config(7, 0, generation="5.2")
    keys = ("index_topk_freq", "index_skip_topk_offset", "index_topk_pattern", "indexer_types")
    assert {k: cfg[k] for k in keys} == {
        "index_topk_freq": 4,
        "index_skip_topk_offset": 3,
        "index_topk_pattern": None,
        "indexer_types": ["full"] * 3 + ["shared"] * 3 + ["full"],
    }
    assert {k: cfg[k] for k in keys} == {k: ref[k] for k in keys}
    plain = w.hf_config(w.tiny(layers=7))
    assert {k: v for k, v in cfg.items() if k not in keys} == plain
    assert not set(keys) & set(plain)
