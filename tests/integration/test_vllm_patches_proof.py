"""Proof on the real vLLM 0.23.0 code: why each patch exists (pristine) and that it works (patched).

A tiny GLM-5-architecture checkpoint (tests/support/tiny_glm5.py) is converted to a Q8_0 GGUF by
llama.cpp's own convert_hf_to_gguf.py. The installed vLLM is only read; the patched run uses a
copy of it (a symlink farm of the package with the touched files copied, then patched by
scripts/vllm_patches.py). vLLM runs in subprocesses (tests/support/vllm_gguf_load.py) so that each
run imports the vllm/ it is meant to.

K-quants: the converter writes only f32/f16/bf16/q8_0/tq1_0/tq2_0 and gguf-py 0.18 cannot quantize
to Q4_K (dequantize only), so the GGUF here is Q8_0 plus the F32 tensors llama.cpp keeps unquantized
(norms, router, indexer.proj, exp_probs_b); K-quant files would need llama.cpp's llama-quantize.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import support
import vllm_patches
from support import llama_cpp, tiny_glm5

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
# Run by file path in a child whose PYTHONPATH is only the vLLM under test (pristine or patched).
VLLM_GGUF_LOAD = Path(support.__file__).with_name("vllm_gguf_load.py")


def installed_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def symlink_farm(src: Path, dest: Path, copies: list[str]) -> None:
    """dest/vllm mirrors src with symlinks; the files in `copies` are real copies (patchable)."""
    for root, _dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dest / "vllm" / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            os.symlink(Path(root) / name, dest / "vllm" / rel / name)
    for path in copies:
        target = dest / path
        target.unlink()
        shutil.copy2(src.parent / path, target)


def load_in_vllm(mode: str, gguf: Path, hf: Path, out: Path, pythonpath: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"VLLM_LOGGING_LEVEL": "INFO", "CUDA_VISIBLE_DEVICES": ""}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    res = subprocess.run(
        [sys.executable, str(VLLM_GGUF_LOAD), mode, str(gguf), str(hf), str(out)],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    data = json.loads(out.read_text())
    assert "crash" not in data, data["crash"]
    return data


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("proof")
    hf = tiny_glm5.write_checkpoint(tmp / "hf", seed=0)
    gguf = tmp / "tiny-glm5-q8_0.gguf"
    conv = llama_cpp.convert(hf, gguf, "q8_0")
    assert conv.returncode == 0, conv.stderr[-4000:]

    src = installed_vllm()
    site = tmp / "site"
    series = vllm_patches.ps.load_series(vllm_patches.ps.vllm_version(src.parent))
    symlink_farm(src, site, series.files)
    assert vllm_patches.main(["apply", "--site-packages", str(site)]) == 0
    assert vllm_patches.main(["verify", "--site-packages", str(site)]) == 0
    return {
        "hf": hf,
        "gguf": gguf,
        "pristine": load_in_vllm("pristine", gguf, hf, tmp / "pristine.json", None),
        "patched": load_in_vllm("patched", gguf, hf, tmp / "patched.json", site),
    }


# --- pristine vLLM: the failures each patch exists for ---------------------------------------


def test_pristine_speculators_check_raises_glm_dsa_valueerror(runs: dict) -> None:
    err = runs["pristine"]["speculators"]["error"]
    assert err == {
        "type": "ValueError",
        "message": "GGUF model with architecture glm-dsa is not supported yet.",
    }
    assert "site-packages/vllm/" in runs["pristine"]["vllm_file"]


def test_pristine_loader_knows_no_glm_moe_dsa(runs: dict) -> None:
    assert runs["pristine"]["weights_map"] == {
        "type": "RuntimeError",
        "message": "Unknown gguf model_type: glm_moe_dsa",
    }


def test_pristine_leaves_kv_b_proj_unloaded_without_a_word(runs: dict) -> None:
    it = runs["pristine"]["iterator"]
    # gguf-py maps kv_b_proj to attn_kv_b, which llama.cpp never writes (attn_k_b + attn_v_b) ...
    assert it["kv_b_map"] == {
        f"blk.{i}.attn_kv_b.weight": f"model.layers.{i}.self_attn.kv_b_proj.weight"
        for i in range(3)
    }
    # ... so no kv_b_proj weight is ever yielded, and nothing is logged about it.
    assert it["yielded_kv_b"] == []
    assert it["warnings"] == []
    assert {f"model.layers.{i}.self_attn.kv_b_proj.weight" for i in range(3)} <= set(
        it["extra_names"]
    )


def test_pristine_picks_bfloat16_silently_on_cpu(runs: dict) -> None:
    assert runs["pristine"]["auto_dtype"] == "torch.bfloat16"


# --- patched vLLM: it loads, completely and correctly ----------------------------------------


def test_patched_speculators_check_passes_through(runs: dict) -> None:
    pat = runs["patched"]
    assert pat["vllm_file"].endswith("/site/vllm/__init__.py")
    assert pat["speculators"]["result"] == [str(runs["gguf"]), str(runs["hf"]), None]


def test_patched_config_from_gguf_says_what_to_pass(runs: dict) -> None:
    err = runs["patched"]["get_config_gguf"]
    assert err["type"] == "ValueError"
    assert err["message"].startswith("GGUF model with architecture glm-dsa is not supported yet.")
    assert "--hf-config-path DIR and --tokenizer DIR" in err["message"]


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_patched_requires_explicit_float16(runs: dict, dtype: str) -> None:
    msg = runs["patched"]["dtype_errors"][dtype]["message"]
    assert f"GLM-5 (glm_moe_dsa) from a GGUF file needs --dtype float16 (got '{dtype}'" in msg
    assert "fp16 overflow" in msg
    assert runs["patched"]["dtype"] == "torch.float16"


def test_patched_fills_every_parameter_of_the_vllm_model(runs: dict) -> None:
    pat = runs["patched"]
    # load_model ran vLLM's loaders, the no-silent-gaps check and process_weights_after_loading
    assert pat["model_class"] == "GlmMoeDsaForCausalLM"
    params = pat["params"]
    for i in range(3):
        p = f"model.layers.{i}."
        assert params[p + "self_attn.kv_b_proj.weight"] == {
            "shape": [8 * (192 + 256), 512],
            "dtype": "float16",
        }
        assert params[p + "self_attn.indexer.wk_weights_proj.weight"] == {
            "shape": [128 + 32, 512],
            "dtype": "float16",
        }
    assert params["model.layers.1.mlp.experts.w13_qweight"] == {
        "shape": [8, 512, 512 // 32 * 34],
        "dtype": "uint8",
    }
    assert params["model.layers.1.mlp.experts.w2_qweight"] == {
        "shape": [8, 512, 256 // 32 * 34],
        "dtype": "uint8",
    }
    assert params["model.layers.1.mlp.gate.e_score_correction_bias"]["dtype"] == "float32"
    for name, meta in params.items():
        if name.endswith("qweight"):
            assert meta["dtype"] == "uint8" and meta["shape"][-1] % 34 == 0, name
        elif not name.endswith(("qweight_type", "e_score_correction_bias", "indexer.k_norm.weight",
                                "indexer.k_norm.bias")):  # fmt: skip
            assert meta["dtype"] == "float16", name
    # every quantized parameter is Q8_0 (GGML type 8), including both shards of fused layers
    assert pat["qweight_types"] and all(set(v) == {8} for v in pat["qweight_types"].values()), pat[
        "qweight_types"
    ]


def test_patched_kv_b_proj_equals_hf_checkpoint_within_q8_0_tolerance(runs: dict) -> None:
    checks = {c["name"]: c for c in runs["patched"]["checks"]}
    for i in range(3):
        for name in ("self_attn.kv_b_proj.weight", "self_attn.indexer.wk_weights_proj.weight"):
            c = checks[f"model.layers.{i}.{name}"]
            # Q8_0: per block of 32, scale = absmax/127, error <= scale/2; plus fp16 rounding
            assert c["shape_ok"] and c["max_err"] <= c["absmax"] / 127, c
            assert c["max_err"] > 0, "expected a quantized round trip"
    for name, c in checks.items():
        if "norm" in name or ".mlp.gate." in name:  # F32 in the GGUF: exact up to fp16
            assert c["shape_ok"] and c["max_err"] <= c["absmax"] * 2**-10, c


def test_patched_rebuilds_kv_b_proj_from_halves_in_different_shards(runs: dict) -> None:
    assert runs["patched"]["kv_b_across_shards"] == {
        "names": ["model.layers.2.self_attn.kv_b_proj.weight"],
        "equal_to_loaded": True,
    }


def test_patched_rebuilds_kv_b_proj_from_q5_0_and_q4_0_halves(runs: dict) -> None:
    low = runs["patched"]["kv_b_low_bit"]
    assert low["names"] == ["model.layers.0.self_attn.kv_b_proj.weight"] and low["shape_ok"]
    # Q4_0: d = blockmax/-8, levels -8..7, so error <= |d| = blockmax/8 (at the clipped end)
    assert 0 < low["max_err"] <= low["absmax"] / 8, low


def test_patched_skips_mtp_layer_with_a_log_line(runs: dict) -> None:
    assert runs["patched"]["skip_logs"] == [
        "Skipping 27 GGUF tensors of the MTP/nextn layer(s) blk.3 in the trunk: they load into the "
        "MTP draft model only (--speculative-config with method mtp)."
    ]


def test_patched_gap_check_names_unfilled_param_and_unmapped_tensor(runs: dict) -> None:
    err = runs["patched"]["gap_error"]
    tensor, param = runs["patched"]["gap_dropped"]
    assert err["type"] == "RuntimeError"
    assert f"Model parameters no GGUF tensor filled (1): ['{param}']" in err["message"]
    assert f"GGUF tensors that map to no parameter (1): ['{tensor}']" in err["message"]
    assert "only the MTP/nextn block(s) ['blk.3']" in err["message"]
