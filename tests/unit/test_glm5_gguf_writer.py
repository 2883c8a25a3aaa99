"""scripts/glm5_gguf_writer.py and scripts/gguf_types_check.py on the controller (gguf-py only).

Full GLM-5 geometry is checked on the tensor plan (no bytes written); tiny files of every
published mix are written as split shards, merged with scripts/gguf_merge.py and read back by
gguf-py's own reader and dequantizer.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import gguf_merge
import gguf_types_check as tc
import glm5_gguf_writer as w
import numpy as np
import pytest
from gguf.quants import dequantize

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
