"""glm5_reference.load_gguf reads what llama.cpp's converter writes for tiny GLM-5.2 (CPU).

Converted with --outtype f32 (the bf16 weights fit exactly), every tensor the reference reads
equals the HF checkpoint's: names through gguf-py's GLM_DSA table, experts merged per layer,
kv_b_proj rebuilt from attn_k_b/attn_v_b, and the shared layers without indexer tensors. A q8_0
conversion (the e2e run's) is within its quantisation step; a missing tensor is an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import llama_cpp, tiny_glm5

pytestmark = pytest.mark.runtime(requires=("torch", "gguf", "safetensors", "transformers"))
pytest.importorskip("torch")  # collected by the controller venv too, which has none
from support import glm5_reference as ref  # noqa: E402  (imports torch)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("ref-gguf")
    ckpt = tiny_glm5.write_checkpoint(
        tmp / "ckpt", 0, num_layers=7, serve=True, generation="5.2"
    )  # the e2e run's model (tests/e2e/pipeline.sh ckpt, GENERATION=5.2)
    out = {"ckpt": ckpt}
    for outtype in ("f32", "q8_0"):
        out[outtype] = tmp / f"tiny-{outtype}.gguf"
        conv = llama_cpp.convert(ckpt, out[outtype], outtype)
        assert conv.returncode == 0, conv.stderr[-3000:]
    return out


def test_gguf_f32_equals_hf_tensor_for_tensor(converted: dict[str, Path]) -> None:
    import torch

    cfg = ref.load_config(converted["ckpt"])
    hf = ref.load_hf(converted["ckpt"])
    gg = ref.load_gguf(converted["f32"], cfg)
    assert sorted(gg) == sorted(ref.weight_names(cfg)) == sorted(hf)
    assert not any(f"layers.{i}.self_attn.indexer." in n for n in gg for i in (3, 4, 5))
    unequal = [n for n in gg if not torch.equal(gg[n], hf[n])]
    assert unequal == []
    assert gg["model.layers.2.self_attn.kv_b_proj.weight"].shape == (8 * (192 + 256), 512)


def test_gguf_q8_0_close_to_hf(converted: dict[str, Path]) -> None:
    import torch

    torch.set_num_threads(2)
    cfg = ref.load_config(converted["ckpt"])
    hf = ref.load_hf(converted["ckpt"])
    gg = ref.load_gguf(converted["q8_0"], cfg)
    for name, t in gg.items():  # q8_0: 8-bit blocks of 32, step <= max|block| / 127
        assert float((t - hf[name]).abs().max()) <= float(hf[name].abs().max()) / 127 + 1e-12
    assert not torch.equal(gg["lm_head.weight"], hf["lm_head.weight"])  # really quantised
    ids = list(range(16, 16 + 40))
    a, _ = ref.forward(cfg, hf, ids)
    b, _ = ref.forward(cfg, gg, ids)
    diff = (ref.logprobs(a) - ref.logprobs(b)).abs()
    # A random-weight MoE amplifies q8_0's ~0.4 % weight error where routers flip (measured:
    # median 0.21, max 6.9): the reference must read the served GGUF, not the HF weights.
    assert 0.01 < float(diff.median()) < 0.5


def test_gguf_missing_tensor_is_an_error(converted: dict[str, Path], tmp_path: Path) -> None:
    cfg = ref.load_config(converted["ckpt"])
    cfg["num_hidden_layers"], cfg["indexer_types"] = 8, cfg["indexer_types"] + ["shared"]
    cfg["mlp_layer_types"] += ["sparse"]
    with pytest.raises(ValueError) as exc:
        ref.load_gguf(converted["f32"], cfg)
    assert "no tensor for model.layers.7." in str(exc.value)


def test_q8_1_rounds_as_ggml_quantize_q8_1() -> None:
    """q8_1: blocks of 32, d = amax / 127, integers roundf(x / d), d kept as half."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4 * 32, generator=g, dtype=torch.float64) * 3
    x[0, :32] = 0  # an all-zero block stays zero
    y = ref.q8_1(x)
    assert y.shape == x.shape and y.dtype == x.dtype and bool((y[0, :32] == 0).all())
    b, yb = x.view(3, 4, 32), y.view(3, 4, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    q = b / torch.where(d > 0, d, 1)
    ints = torch.sign(q) * torch.floor(q.abs() + 0.5)
    assert int(ints.abs().max()) == 127
    assert torch.equal(yb, ints * d.half().double())
    # half a step, plus half's rounding of d (2^-11 relative) times up to 127 steps
    assert bool(((yb - b).abs() <= d * (0.5 + 127 * 2**-11) + 1e-12).all())
    assert not torch.equal(y, x)
    assert ref.q8_1(x.half()).dtype == torch.float16


def test_gguf_quantized_names_are_the_gguf_kernels_matmuls(converted: dict[str, Path]) -> None:
    cfg = ref.load_config(converted["ckpt"])
    assert ref.gguf_quantized_names(converted["f32"], cfg) == []  # no quantised kernel at all
    names = ref.gguf_quantized_names(converted["q8_0"], cfg)
    assert "lm_head.weight" in names and "model.embed_tokens.weight" not in names
    assert "model.layers.1.mlp.experts.down_proj.weight" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names
    assert "model.layers.6.self_attn.indexer.wq_b.weight" in names
    assert not any(n.endswith("kv_b_proj.weight") for n in names)  # absorbed, dequantised
    assert not any(n.endswith(("norm.weight", "gate.weight", "weights_proj.weight")) for n in names)
    assert len(names) == 76  # 7 layers x (q_a, q_b, kv_a, o) + indexers + MLPs/experts + lm_head


def _capture_from_reference(
    cfg: dict, w: dict, prompts: list[list[int]], gen: int, **kw: object
) -> dict:
    """A capture.json as index_share_check writes it, "served" by the reference itself
    (``kw``: forward options, e.g. a wrong IndexShare source)."""
    runs = []
    for ids in prompts:
        seq = list(ids)
        for _ in range(gen):  # free-running greedy, one forward per token
            logits, _ = ref.forward(cfg, w, seq, **kw)
            seq.append(int(logits[-1].argmax()))
        lp = ref.logprobs(ref.forward(cfg, w, seq[:-1], **kw)[0])
        plp: list = [None]
        for j in range(1, len(ids)):
            order = lp[j - 1].argsort(descending=True).tolist()
            entry = {str(t): {"logprob": float(lp[j - 1, t]), "rank": r + 1}
                     for r, t in enumerate(order[:5])}  # fmt: skip
            entry[str(ids[j])] = {"logprob": float(lp[j - 1, ids[j]]),
                                  "rank": order.index(ids[j]) + 1}  # fmt: skip
            plp.append(entry)
        toks = seq[len(ids) :]
        lps = [float(lp[len(ids) - 1 + k, t]) for k, t in enumerate(toks)]
        runs.append({"prompt": ids, "token_ids": toks, "prompt_logprobs": plp,
                     "logprobs": {"token_logprobs": lps}})  # fmt: skip
    return {"model": "glm5-tiny", "hf_config": cfg, "max_tokens": gen, "runs": runs}


def test_reference_check_cli_on_a_self_made_capture(
    converted: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """reference_check end to end (GGUF load, forward, top-k, verdict, exit codes): a capture
    equal to the reference passes, one shifted by 0.2 per prompt logprob fails."""
    import json
    import random

    import torch
    from e2e import reference_check as rc

    torch.set_num_threads(2)
    cfg = ref.load_config(converted["ckpt"])
    w = ref.load_gguf(converted["q8_0"], cfg)
    rng = random.Random(5)
    prompts = [[rng.randrange(16, 480) for _ in range(140 + 10 * i)] for i in range(2)]
    capture = _capture_from_reference(cfg, w, prompts, gen=3)
    (tmp_path / "capture.json").write_text(json.dumps(capture))
    _, rows = ref.forward(cfg, w, prompts[0])
    torch.save({f"layer{i}": t.int() for i, t in rows.items()}, tmp_path / "topk.pt")
    args = ["--gguf", str(converted["q8_0"]), "--hf-dir", str(converted["ckpt"]),
            "--topk", str(tmp_path / "topk.pt"), "--device", "cpu",
            "--sensitivity-dtype", "float32", "--act-quant", "none"]  # fmt: skip

    assert rc.main(["--capture", str(tmp_path / "capture.json"), *args,
                    "--json", str(tmp_path / "ok.json")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("reference check passed: dense-region prompt logprobs |served - ref")
    v = json.loads((tmp_path / "ok.json").read_text())
    assert v["prompt_logprobs"]["actual_token"]["max"] < 1e-9
    assert v["prompt_logprobs"]["dense"]["n"] == 2 * 128
    ish = v["index_share"]  # the counterfactuals (layers 0, 1 instead of 2) are far
    assert sorted(ish["counterfactual"]) == ["shared_reuse_layer0", "shared_reuse_layer1"]
    assert ish["closer_than_every_counterfactual"] is True and ish["sparse"]["max"] < 1e-9
    assert all(q["median"] > 0.05 for q in ish["counterfactual"].values())
    gs = ish["given_selection"]  # prompt 0 on the dumped selection: judged, the other reported
    assert ish["judged"] is False and gs["closer_than_every_counterfactual"] is True
    assert gs["sparse"]["max"] < 1e-9 and gs["sparse"]["n"] == 140 - 1 - 128
    assert sorted(gs["counterfactual"]) == ["shared_reuse_layer0", "shared_reuse_layer1"]
    assert all(q["median"] > 0.05 for q in gs["counterfactual"].values())
    assert v["greedy"]["equal_steps"] == [3, 3] and v["greedy"]["divergences"] == []
    assert v["spread"]["measured"] == "committed figure"
    assert all(
        t["rows_equal"] == 140 and t["key_overlap"] == 1.0 for t in v["topk_prompt0"].values()
    )
    assert sorted(v["topk_prompt0"]) == [f"layer{i}" for i in range(7)]
    sens = v["sensitivity"]  # float32 rounding alone moves these logprobs, a little
    assert sens["dtype"] == "float32" and sens["prompt_logprob_diff"]["n"] == 139 + 149
    assert 0 < sens["prompt_logprob_diff"]["max"] < 1e-3
    assert "; reference in float32 vs float64, every prompt position: median" in out
    assert v["floor"]["median_from"] == "spread"  # float32 moves less than the spread

    for run in capture["runs"]:
        for entry in run["prompt_logprobs"][1:]:
            for e in entry.values():
                e["logprob"] -= 0.2
    (tmp_path / "shifted.json").write_text(json.dumps(capture))
    assert rc.main(["--capture", str(tmp_path / "shifted.json"), *args,
                    "--json", str(tmp_path / "bad.json")]) == 1  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: reference check failed: dense-region prompt logprobs"
    )
    bad = json.loads((tmp_path / "bad.json").read_text())
    assert bad["passed"] is False and bad["prompt_logprobs"]["dense"]["median"] == 0.2

    # A server whose shared layers read layer 1's top-k (not layer 2's): the dense region is
    # the same math, the sparse region gives it away.
    # Its dump is its own selection: layer 6's differs, layers 0-2's are the right ones.
    wrong = _capture_from_reference(cfg, w, prompts, gen=3, share_from=1)
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    _, rows = ref.forward(cfg, w, prompts[0], share_from=1)
    torch.save({f"layer{i}": t.int() for i, t in rows.items()}, tmp_path / "wrong-topk.pt")
    wrong_args = [a if a != str(tmp_path / "topk.pt") else str(tmp_path / "wrong-topk.pt")
                  for a in args]  # fmt: skip
    assert rc.main(["--capture", str(tmp_path / "wrong.json"), *wrong_args,
                    "--json", str(tmp_path / "wrong-out.json")]) == 1  # fmt: skip
    assert "margin 0.0: NOT closer" in capsys.readouterr().err
    v = json.loads((tmp_path / "wrong-out.json").read_text())
    assert v["prompt_logprobs"]["within_spread"] is True
    assert v["index_share"]["closer_than_every_counterfactual"] is False
    gs = v["index_share"]["given_selection"]
    assert gs["closer_than_every_counterfactual"] is False
    assert gs["counterfactual"]["shared_reuse_layer1"]["max"] < 1e-9  # it IS that counterfactual

    # A dump without a full layer cannot pin the selection: one error line, exit 1.
    torch.save({f"layer{i}": t.int() for i, t in rows.items() if i != 6}, tmp_path / "part.pt")
    part_args = [a if a != str(tmp_path / "topk.pt") else str(tmp_path / "part.pt")
                 for a in args]  # fmt: skip
    assert rc.main(["--capture", str(tmp_path / "wrong.json"), *part_args,
                    "--json", str(tmp_path / "part-out.json")]) == 1  # fmt: skip
    assert capsys.readouterr().err == "error: the top-k dump lacks full layers [6]\n"


def test_reference_check_judges_a_w8a8_server_by_the_models_own_sensitivity(
    converted: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The GLM-5.2 e2e run's failure: a capture "served" in vLLM's GGUF arithmetic (here float32
    with every quantised weight's input rounded to Q8_1) is ~10x the committed spread away from
    the float64 reference on the dense region, as far as the reference's own float16 + Q8_1
    run is: the default floor (max of spread and that sensitivity) passes it, a floor without
    the activation rounding (the check before) fails it."""
    import json
    import random

    import torch
    from e2e import reference_check as rc

    torch.set_num_threads(2)
    cfg = ref.load_config(converted["ckpt"])
    w = ref.load_gguf(converted["q8_0"], cfg)
    aq = ref.gguf_quantized_names(converted["q8_0"], cfg)
    rng = random.Random(7)
    prompts = [[rng.randrange(16, 480) for _ in range(135)] for _ in range(3)]
    capture = _capture_from_reference(cfg, w, prompts, gen=1, dtype=torch.float32, act_quant=aq)
    (tmp_path / "capture.json").write_text(json.dumps(capture))
    args = ["--capture", str(tmp_path / "capture.json"), "--gguf", str(converted["q8_0"]),
            "--hf-dir", str(converted["ckpt"]), "--device", "cpu"]  # fmt: skip

    assert rc.main([*args, "--json", str(tmp_path / "ok.json")]) == 0
    out = capsys.readouterr().out
    assert "sensitivity float16 + Q8_1 inputs of 76 GGUF-quantised weights" in out
    v = json.loads((tmp_path / "ok.json").read_text())
    pl, floor, spread = v["prompt_logprobs"], v["floor"], v["spread"]
    assert pl["within_floor"] is True and pl["within_spread"] is False
    assert pl["dense"]["median"] > 4 * spread["median"]  # far outside the committed spread ...
    assert floor["median_from"] == floor["p90_from"] == "sensitivity"
    assert v["sensitivity"]["dense"]["n"] == pl["dense"]["n"] == 3 * 128

    assert rc.main([*args, "--act-quant", "none", "--json", str(tmp_path / "bad.json")]) == 1
    assert "OUTSIDE" in capsys.readouterr().err  # ... which float16 rounding alone does not explain
    bad = json.loads((tmp_path / "bad.json").read_text())
    assert bad["sensitivity"]["act_quant_weights"] == 0
    assert bad["sensitivity"]["dense"]["median"] < pl["dense"]["median"] / 4
