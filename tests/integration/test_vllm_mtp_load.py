"""The MTP draft of a GLM-5 GGUF on the patched vLLM 0.23.0 (patch 0009), on the CPU.

The tiny GLM-5 with one MTP/nextn layer (tests/support/tiny_glm5.py; model.layers.3.* as GLM-5
ships its layer 78: eh_proj, enorm, hnorm, shared_head.norm and a full MoE decoder layer, no own
embed_tokens or head) is converted to Q8_0 by llama.cpp's own convert_hf_to_gguf.py, so the
nextn tensors carry llama.cpp's real names (blk.3.nextn.*). vLLM's own SpeculativeConfig
(method mtp) derives the draft's ModelConfig and the patched GGUF loader builds and fills vLLM's
DeepSeekMTP in a child process (tests/support/vllm_mtp_load.py). No forward pass runs here
(the sparse kernels are CUDA-only): greedy equality with and without MTP is the H200's part
(tests/e2e/mtp_greedy.py).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import support
from support import llama_cpp, patched_vllm, tiny_glm5

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
CHILD = Path(support.__file__).with_name("vllm_mtp_load.py")
MTP = "model.layers.3."
# Q8_0: per block of 32, scale = absmax/127, error <= scale/2; plus fp16 rounding.
Q8_0 = 1 / 127


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("mtp")
    hf = tiny_glm5.write_checkpoint(tmp / "hf", seed=0)
    ggufs = {"mtp": tmp / "tiny-glm5-q8_0.gguf", "none": tmp / "tiny-glm5-no-nextn-q8_0.gguf"}
    conv = llama_cpp.convert(hf, ggufs["mtp"], "q8_0")
    assert conv.returncode == 0, conv.stderr[-4000:]
    # The same model converted without its nextn layer, served with a config.json that says it
    # has one (num_nextn_predict_layers=1): what a GGUF published without blk.78 looks like.
    hf0 = tiny_glm5.write_checkpoint(tmp / "hf-no-nextn", seed=0, mtp_layers=0)
    conv = llama_cpp.convert(hf0, ggufs["none"], "q8_0")
    assert conv.returncode == 0, conv.stderr[-4000:]
    site = patched_vllm.patched_site(tmp / "site")
    out = tmp / "mtp.json"
    data = patched_vllm.run_child(CHILD, ggufs["mtp"], hf, ggufs["none"], out, out=out, site=site)
    return data | {"hf": hf, "gguf": ggufs}


def test_speculative_config_builds_the_draft_from_the_gguf_and_the_targets_config(
    run: dict,
) -> None:
    assert run["draft"] == {
        "method": "mtp",
        "model": str(run["gguf"]["mtp"]),
        "hf_config_path": str(run["hf"]),
        "model_type": "deepseek_mtp",
        "architectures": ["DeepSeekMTPModel"],
        "dtype": "torch.float16",
        "quantization": "gguf",
    }
    assert run["model_class"] == "DeepSeekMTP"


def test_every_nextn_tensor_of_the_gguf_is_mapped(run: dict) -> None:
    names = {t.name for t in gguf.GGUFReader(run["gguf"]["mtp"]).tensors}
    nextn = {n for n in names if n.startswith("blk.3.")}
    assert len(nextn) == 27  # the decoder layer's 23 + eh_proj, enorm, hnorm, shared_head_norm
    mapped = {g for g in run["map"] if g in names}
    assert mapped == nextn | {"output.weight"}
    assert run["map"]["blk.3.nextn.eh_proj.weight"] == MTP + "eh_proj.weight"
    assert run["map"]["blk.3.nextn.shared_head_norm.weight"] == MTP + "shared_head.norm.weight"
    # GLM-5 has no head of its own in the MTP layer: the trunk's output.weight is it.
    assert run["map"]["output.weight"] == MTP + "shared_head.head.weight"
    assert run["logs"] == patched_vllm.TINY_MTP_DRAFT_LOGS


def test_every_parameter_equals_the_checkpoint(run: dict) -> None:
    checks = run["checks"]
    values = {n: c for n, c in checks.items() if "qtypes" not in c}
    # the draft's own 5 (enorm, hnorm, eh_proj, shared_head norm/head), embed_tokens and the
    # decoder block's 18 (fused as vLLM fuses them)
    assert len(values) == 24
    for name, c in values.items():
        if name == "model.embed_tokens.weight":
            continue  # left to the proposer (the next test)
        assert c.get("want_shape") == c["shape"] or name.endswith("qweight"), (name, c)
        assert c["max_err"] is not None and not c["nan"], (name, c)
        dequantized = ("eh_proj.weight", "kv_b_proj.weight", "wk_weights_proj.weight")
        if c["dtype"] == "uint8" or name.endswith(dequantized):
            # Q8_0 in the GGUF (dequantized from vLLM's bytes, or by the loader)
            assert 0 < c["max_err"] <= c["absmax"] * Q8_0, (name, c)
        else:  # F32 in the GGUF (norms, router, bias): exact up to fp16
            assert c["max_err"] <= c["absmax"] * 2**-10, (name, c)
    for name in ("self_attn.fused_qkv_a_proj.qweight", "mlp.experts.w13_qweight",
                 "mlp.experts.w2_qweight", "self_attn.kv_b_proj.weight"):  # fmt: skip
        assert MTP + "mtp_block." + name in values, name
    assert all(c["qtypes"] == [8] for c in checks.values() if "qtypes" in c)


def test_only_embed_tokens_is_left_to_the_proposer(run: dict) -> None:
    # vLLM's MTP proposer replaces the draft's embed_tokens with the target's
    # (llm_base_proposer._maybe_share_embeddings); no GGUF tensor fills it.
    assert run["unfilled"] == ["model.embed_tokens.weight"]
    emb = run["checks"]["model.embed_tokens.weight"]
    assert emb["shape"] == [512, 512] and emb["dtype"] == "float16"


def test_gap_check_names_the_unfilled_parameter_and_the_unused_tensor(run: dict) -> None:
    tensor, param = run["gap_dropped"]
    assert run["gap_error"] == {
        "type": "RuntimeError",
        "message": "GGUF MTP/nextn weights do not cover the MTP draft model exactly (blk.3).\n"
        f"Model parameters no GGUF tensor filled (1): ['{param}']\n"
        f"GGUF tensors that map to no parameter (1): ['{tensor}']",
    }


def test_gguf_without_nextn_layer_is_one_clear_error(run: dict) -> None:
    assert run["no_mtp_error"] == {
        "type": "RuntimeError",
        "message": "--speculative-config method mtp needs the GGUF's MTP/nextn layer, but "
        f"{run['gguf']['none']} has no blk.3.* tensors (config.json: "
        "num_nextn_predict_layers=1); use a GGUF converted with its nextn layer or drop "
        "--speculative-config",
    }


def test_fused_qkv_a_proj_returns_q_then_kv(run: dict) -> None:
    # llama.cpp writes attn_kv_a_mqa before attn_q_a, so vLLM loads shard 1 first; patch 0011
    # makes GGUFLinearMethod.apply concatenate in shard order (pristine: [kv, q], err ~absmax).
    fused = run["fused_qkv_a"]
    assert fused["load_order"] == [1, 0] and fused["shape_ok"], fused
    # Q8_0 weights, 512-long dot products of N(0,1) inputs: a small fraction of absmax
    assert fused["max_err"] <= fused["absmax"] * 0.02, fused
