"""benchmarks/bench_serve.py on the CPU: case parsing (the MTP and glm52 fields), the generation
of a nextn and of a GLM-5.2 file, the MTP speed-up arithmetic (values checked by hand), the report
of an MTP case's JSON and the IndexShare comparison (issue 18) of a synthetic one.
The GPU measurement itself (StepTimer's CUDA events inside vLLM) runs only on a GPU host; the
runtime-tier test at the end checks that the vLLM methods it wraps have the arguments it reads.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import bench_serve as bs
import pytest

REPO = Path(__file__).resolve().parents[2]


def test_mtp_case_parses() -> None:
    c = bs.parse_case("tp8:Q4_K_M:CUSTOM:mtp1")
    assert c == bs.Case("tp8", "Q4_K_M", "CUSTOM", 1)
    assert str(c) == "tp8:Q4_K_M:CUSTOM:mtp1" and c.nextn == 1
    assert c.file_key == "tp8:Q4_K_M:nextn1"
    plain = bs.parse_case("tp8:Q4_K_M:CUSTOM")
    assert plain.k == 0 and plain.nextn == 0 and str(plain) == "tp8:Q4_K_M:CUSTOM"
    assert plain.file_key == "tp8:Q4_K_M"  # as before: old JSONs' "gen" keys still match
    assert bs.parse_case("full:IQ4_XS:FLASHMLA_SPARSE:mtp3").k == 3


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("tp8:Q4_K_M:CUSTOM:mtp0", "4th field 'mtp0'"),
        ("tp8:Q4_K_M:CUSTOM:mtp4", "4th field 'mtp4'"),
        ("tp8:Q4_K_M:CUSTOM:mtpx", "4th field 'mtpx'"),
        ("tp9:Q4_K_M:CUSTOM:mtp1", "view 'tp9'"),
        ("tp8:Q4_K_M:FLASH:mtp1", "backend 'FLASH'"),
        ("tp8:Q4_K_M:CUSTOM:mtp1:x", "view:mix:backend[:mtpK|glm52|fp8]"),
        (
            "tp8:Q4_K_M:CUSTOM:glm5",
            "4th field 'glm5' is not mtp1, mtp2 or mtp3 (MTP draft tokens K = 1..3), glm52",
        ),
        ("tp8:Q4_K_M:CUSTOM:glm52:mtp1", "view:mix:backend[:mtpK|glm52|fp8]"),
    ],
)
def test_bad_case_is_one_error_line_naming_the_field(case: str, field: str, capsys) -> None:
    assert bs.main(["--cases", f"tp8:Q4_K_M:CUSTOM,{case}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: bad case {case!r}: "), lines
    assert field in lines[0]


def test_list_cases_and_help_show_the_mtp_field(capsys) -> None:
    assert bs.main(["--list-cases"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("view:mix:backend[:mtpK|glm52|fp8]") and "tp8:Q4_K_M:CUSTOM:mtp1" in out
    assert "tp8:Q4_K_M:CUSTOM,tp8:Q4_K_M:CUSTOM:glm52" in out
    assert "tp8:Q4_K_M:CUSTOM,tp8:Q4_K_M:CUSTOM:fp8" in out
    assert "tp8:Q4_K_M:CUSTOM\n" in out  # the default cases follow
    with pytest.raises(SystemExit):
        bs.main(["--help"])
    out = capsys.readouterr().out
    assert "view:mix:backend[:mtpK|glm52|fp8]" in out and "--mtp-context" in out
    assert "tp8:Q4_K_M:CUSTOM:glm52" in out


def test_gen_command_writes_a_nextn_file_apart_from_the_plain_one(tmp_path: Path) -> None:
    plain = bs.gen_command(tmp_path, "tp8", "Q4_K_M", 6, 256)
    nextn = bs.gen_command(tmp_path, "tp8", "Q4_K_M", 6, 256, nextn=1)
    assert "--nextn" not in plain  # the plain command is unchanged
    assert plain[plain.index("--out") + 1] == str(
        tmp_path / "tp8-Q4_K_M" / "shards" / "GLM-5-tp8-Q4_K_M.gguf"
    )
    assert nextn[nextn.index("--nextn") + 1] == "1"
    assert nextn[nextn.index("--out") + 1] == str(
        tmp_path / "tp8-Q4_K_M-nextn1" / "shards" / "GLM-5-tp8-Q4_K_M-nextn1.gguf"
    )
    assert nextn[nextn.index("--hf-dir") + 1] == str(tmp_path / "tp8-Q4_K_M-nextn1" / "hf")


def test_generation_of_a_nextn_file_checks_its_block(tmp_path: Path) -> None:
    job = bs.start_generation(tmp_path, "tiny", "Q4_K_M", 3, 8, nextn=1)
    info = bs.finish_generation(job)
    assert "error" not in info, info
    assert Path(info["gguf"]).name == "GLM-5-tiny-Q4_K_M-nextn1.gguf"
    assert info["nextn_check"]["rc"] == 0
    assert json.loads(info["nextn_check"]["out"])["nextn_blocks"] == [3]
    cfg = json.loads((Path(info["hf"]) / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["num_hidden_layers"] == 3


def test_glm52_case_parses_to_its_own_file() -> None:
    c = bs.parse_case("tp8:Q4_K_M:CUSTOM:glm52")
    assert c == bs.Case("tp8", "Q4_K_M", "CUSTOM", 0, "5.2")
    assert str(c) == "tp8:Q4_K_M:CUSTOM:glm52" and c.nextn == 0 and c.k == 0
    assert c.file_key == "tp8:Q4_K_M:glm52"
    assert bs.parse_case("tp8:Q4_K_M:CUSTOM").generation == "5"
    assert bs.parse_case("tp8:Q4_K_M:CUSTOM:mtp1").generation == "5"
    assert bs.gen_name("tp8", "Q4_K_M", 0, "5.2") == "tp8-Q4_K_M-glm52"
    cmd = bs.gen_command(Path("/w"), "tp8", "Q4_K_M", 6, 256, generation="5.2")
    assert cmd[cmd.index("--generation") + 1] == "5.2" and "--nextn" not in cmd
    assert cmd[cmd.index("--out") + 1] == "/w/tp8-Q4_K_M-glm52/shards/GLM-5-tp8-Q4_K_M-glm52.gguf"
    assert "--generation" not in bs.gen_command(Path("/w"), "tp8", "Q4_K_M", 6, 256)


def test_generation_of_a_glm52_file_passes_the_types_check(tmp_path: Path) -> None:
    # 4 tiny layers: blk.3 is shared (max(3 - 3 + 1, 0) % 4 = 1), so it has no indexer
    job = bs.start_generation(tmp_path, "tiny", "Q4_K_M", 4, 8, generation="5.2")
    info = bs.finish_generation(job)
    assert "error" not in info, info
    assert Path(info["gguf"]).name == "GLM-5-tiny-Q4_K_M-glm52.gguf"
    assert info["types_check"]["rc"] == 0
    cfg = json.loads((Path(info["hf"]) / "config.json").read_text())
    assert cfg["indexer_types"] == ["full", "full", "full", "shared"]
    assert cfg["index_topk_freq"] == 4 and cfg["index_skip_topk_offset"] == 3
    import gguf

    names = {t.name for t in gguf.GGUFReader(info["gguf"]).tensors}
    assert "blk.2.indexer.attn_k.weight" in names and "blk.3.indexer.attn_k.weight" not in names
    lb5 = bs.layer_bytes("tiny", "Q4_K_M", 4, 8)
    lb52 = bs.layer_bytes("tiny", "Q4_K_M", 4, 8, "5.2")
    # blk.3, one of the 3 MoE layers (blk.1-3), loses Q8_0 wq_b 256 x 4096 and wk 512 x 128:
    # the per-MoE-layer mean drops by a third of that
    assert lb5["n_moe"] == lb52["n_moe"] == 3
    assert lb52["moe"] == (3 * lb5["moe"] - (256 * 4096 + 512 * 128) * 34 // 32) // 3
    assert lb5["dense"] == lb52["dense"]


def index_share_results() -> dict:
    """Two tp8 cases as parent_main stores them: the plain file and its glm52 twin."""

    def dec(n: int, prompt: int, step_ms: float, fam: dict | None = None) -> dict:
        d = {"n": n, "prompt": prompt, "step_ms": step_ms + 0.5, "median_full_step_ms": step_ms}
        return d | ({"breakdown_us_per_step": fam, "gpu_us_per_step": 5000.0} if fam else {})

    five = [dec(1, 4096, 10.0), dec(32, 4096, 20.0, {"indexer_logits": 300.0, "topk": 300.0,
                                                     "attention": 900.0}),
            dec(1, 32768, 12.0, {"indexer_logits": 100.0, "topk": 140.0})]  # fmt: skip
    glm52 = [dec(1, 4096, 9.7), dec(32, 4096, 19.1, {"indexer_logits": 150.0, "topk": 150.0}),
             dec(1, 32768, 12.3, {"indexer_logits": 50.0, "topk": 70.0})]  # fmt: skip
    gen = {"layers": 6, "experts": 256}
    return {
        "cases": [{"case": "tp8:Q4_K_M:CUSTOM", "decode": five},
                  {"case": "tp8:Q4_K_M:CUSTOM:glm52", "decode": glm52},
                  {"case": "tp8:Q4_K_M:FLASHMLA_SPARSE:glm52", "error": "boom"}],
        "gen": {"tp8:Q4_K_M": gen, "tp8:Q4_K_M:glm52": gen | {"generation": "5.2"}},
    }  # fmt: skip


def test_index_share_summary_by_hand() -> None:
    (r,) = bs.index_share_summary(index_share_results())
    assert (r["case"], r["base_case"]) == ("tp8:Q4_K_M:CUSTOM:glm52", "tp8:Q4_K_M:CUSTOM")
    assert r["shared_layers"] == [3, 4, 5] and r["shared_78"] == 57
    p1, p32, p1_32k = r["points"]
    # b1@4k: 10000 - 9700 = 300 us = 3%; 300 / 3 = 100 us per shared layer x 57 = 5700 us
    assert (p1["step_us_5"], p1["step_us_52"], p1["saving_us"], p1["saving_pct"]) == (
        10000.0, 9700.0, 300.0, 3.0)  # fmt: skip
    assert p1["step_key"] == "median_full_step_ms"
    assert p1["indexer_us_5"] is None and p1["indexer_us_52"] is None  # not profiled there
    assert p1["estimate_78"]["saving_per_shared_layer_us"] == 100.0
    assert p1["estimate_78"]["saving_us"] == 5700.0
    assert p1["estimate_78"]["arithmetic"] == "300.0 / 3 x 57 = 5700.0 us"
    assert p1["estimate_78"]["label"].startswith("ESTIMATE")
    # b32@4k: 900 us = 4.5%; indexer 600 vs 300 per step
    assert (p32["saving_us"], p32["saving_pct"]) == (900.0, 4.5)
    assert (p32["indexer_us_5"], p32["indexer_us_52"]) == (600.0, 300.0)
    assert p32["estimate_78"]["saving_us"] == 17100.0  # 300 x 57
    # b1@32k: 5.2 slower by 300 us: a negative saving is reported as measured
    assert (p1_32k["saving_us"], p1_32k["saving_pct"]) == (-300.0, -2.5)
    assert (p1_32k["indexer_us_5"], p1_32k["indexer_us_52"]) == (240.0, 120.0)


def test_index_share_lines_in_the_report(tmp_path: Path, capsys) -> None:
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(index_share_results()))
    assert bs.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("IndexShare (issue 18): tp8:Q4_K_M:CUSTOM:glm52 vs tp8:Q4_K_M:CUSTOM, shared layers "
            "[3, 4, 5] of 6") in out  # fmt: skip
    assert ("  1x4k: step 5.2 9700.0 us vs 5 10000.0 us, saving 300.0 us (3.0%); "
            "indexer_logits+topk 5.2/5 -/- us/step; ESTIMATE 78 layers: 100.0 us/shared layer "
            "x 57 = 5700.0 us/step") in out  # fmt: skip
    assert "  32x4k: step 5.2 19100.0 us vs 5 20000.0 us, saving 900.0 us (4.5%); " in out
    assert "indexer_logits+topk 5.2/5 300.0/600.0 us/step" in out
    assert out.count("caveat: ") == len(bs.INDEX_SHARE_CAVEATS)
    # without the plain case there is nothing to compare
    res = index_share_results()
    res["cases"] = res["cases"][1:]
    assert bs.index_share_summary(res) == []
    assert "IndexShare" not in bs.table(res)


def test_mtp_speedup_arithmetic() -> None:
    # (1 + 0.8) x 10000 / (10500 + 300) = 18000 / 10800 = 1.6667
    x, text = bs.mtp_speedup(10000.0, 10500.0, 300.0, 0.8)
    assert x == 1.667
    assert text == "(1 + 0.8) x 10000.0 / (10500.0 + 300.0) = 1.667x"
    assert bs.mtp_speedup(10000.0, 10500.0, 300.0, 0.9)[0] == 1.759  # 19000 / 10800
    with pytest.raises(ValueError, match="times must be > 0"):
        bs.mtp_speedup(10000.0, 0.0, 300.0, 0.8)
    with pytest.raises(ValueError):
        bs.mtp_speedup(10000.0, 10500.0, 300.0, 1.5)


EST78 = {
    "bandwidth_scale": 2.0,
    "allreduce_us_assumed": 10.0,
    "pessimistic": {"h200_78_layer_step_us": 15000.0},
    "optimistic": {"h200_78_layer_step_us": 12000.0},
}


def test_mtp_estimate_by_hand() -> None:
    m = bs.mtp_estimate(EST78, k=1, target_us=1800.0, verify_us=1860.0, draft_us=700.0, n_moe=3,
                        target_head_us=400.0, draft_head_us=400.0)  # fmt: skip
    full = m["pessimistic_full_head"]
    # verify_78 = 15000 + (1860 - 1800) x 75 / 3 = 16500; draft / target = 700 / 15000
    assert full["target_78_us"] == 15000.0 and full["verify_78_us"] == 16500.0
    assert full["verify_78_arithmetic"] == "15000.0 + 60.0 x 75 / 3 = 16500.0"
    assert full["draft_ratio"] == 0.0467 and not full["meets_2_78"]
    assert full["speedup_a0.8"]["h200"] == 1.570  # 1.8 x 15000 / 17200 = 1.5698
    tp8 = m["pessimistic_tp8_head"]
    # the head cut to 1/8: target 15000 - 350 = 14650, verify 16150, draft 700 - 350 = 350
    assert (tp8["target_78_us"], tp8["verify_78_us"], tp8["draft_us"]) == (14650.0, 16150.0, 350.0)
    assert tp8["draft_ratio"] == 0.0239 and tp8["meets_2_78"]  # 350 / 14650 <= 2/78 = 0.0256
    sp = tp8["speedup_a0.8"]
    assert sp["h200"] == 1.598  # 1.8 x 14650 / 16500 = 1.59818
    assert sp["h200_arithmetic"] == "(1 + 0.8) x 14650.0 / (16150.0 + 350.0) = 1.598x"
    # 8x PRO 6000: x 2 + 78 x 2 x 10 us (target, verify), + 2 x 10 us (draft):
    # 1.8 x 30860 / (33860 + 720) = 1.60636; 1.8e6 / 34580 = 52.05 tok/s
    assert sp["pro6000_tp8"] == 1.606 and sp["pro6000_tp8_tok_s"] == 52.1
    assert m["optimistic_full_head"]["verify_78_us"] == 13500.0
    k2 = bs.mtp_estimate(EST78, k=2, target_us=1800.0, verify_us=1900.0, draft_us=900.0,
                         n_moe=3, target_head_us=400.0, draft_head_us=400.0)  # fmt: skip
    assert "speedup_a0.8" not in k2["pessimistic_full_head"] and "K = 1 only" in k2["speedup"]


def test_mtp_kernel_estimate_splits_the_verify_extra_by_family() -> None:
    target = {"attention": 50.0, "other": 300.0, "moe_gguf": 100.0, "lm_head": 400.0}
    verify = {"attention": 56.0, "other": 330.0, "moe_gguf": 160.0, "lm_head": 800.0,
              "dense_gguf": -6.0}  # fmt: skip
    m = bs.mtp_kernel_estimate(EST78, target_fam=target, verify_fam=verify, draft_gpu_us=500.0,
                               draft_head_us=400.0, n_layers=6, n_moe=3)  # fmt: skip
    assert m["delta_us"]["lm_head"] == 400.0 and m["delta_us"]["dense_gguf"] == -6.0
    full = m["kernels_full_head"]
    # per-layer extra 6 + 30 - 6 = 30: 15000 + 400 (head, once) + 60 x 75 / 3 + 30 x 78 / 6 = 17290
    assert full["verify_78_us"] == 17290.0
    assert full["verify_78_arithmetic"] == (
        "15000.0 + 400.0 (head) + 60.0 x 75 / 3 + 30.0 x 78 / 6 = 17290.0"
    )
    assert full["draft_ratio"] == 0.0333 and not full["meets_2_78"]  # 500 / 15000
    assert full["speedup_a0.8"]["h200"] == 1.518  # 1.8 x 15000 / (17290 + 500) = 1.5177
    tp8 = m["kernels_tp8_head"]
    # head cut to 1/8: target 15000 - 350, verify's head extra 400 - 350, draft 500 - 350
    assert (tp8["target_78_us"], tp8["verify_78_us"], tp8["draft_us"]) == (14650.0, 16590.0, 150.0)
    assert tp8["meets_2_78"] and tp8["speedup_a0.9"]["h200"] == 1.663  # 1.9 x 14650 / 16740


def fake_mtp_result(tmp_path: Path) -> Path:
    """A results JSON as parent_main writes it for one MTP case on the tiny view."""
    breakdown = {"attention": 60.0, "dense_gguf": 600.0, "moe_gguf": 120.0, "lm_head": 400.0,
                 "other": 300.0}  # fmt: skip
    base_b1 = {"n": 1, "prompt": 4096, "decode_tok_s": 550.0, "gpu_us_per_step": 1480.0,
               "timer": {"target": {"median_us": 1800.0}},
               "breakdown_us_per_step": breakdown}  # fmt: skip
    case = {
        "case": "tiny:Q4_K_M:CUSTOM:mtp1", "memory": {}, "prefill": [],
        "decode": [{"n": 1, "prompt": 4096, "decode_tok_s": 480.0, "tokens_per_step": 1.0,
                    "timer": {"target": {"median_us": 1860.0},
                              "draft": {"median_us": 700.0, "host_median_us": 900.0}}}],
        "step_profile": {"draft": {"calls": 8, "gpu_us_per_call": 520.0,
                                   "breakdown_us_per_call": {"lm_head": 410.0, "other": 110.0}}},
        "drafter": {"class": "EagleProposer", "cudagraph_mode": "NONE"},
        "base": {"case": "tiny:Q4_K_M:CUSTOM:mtp1", "decode": [base_b1]},
    }  # fmt: skip
    res = {"cases": [case], "gen": {"tiny:Q4_K_M:nextn1": {"layers": 3, "experts": 8}}}
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(res))
    return path


def test_report_of_an_mtp_case(tmp_path: Path, capsys) -> None:
    path = fake_mtp_result(tmp_path)
    res = json.loads(path.read_text())
    case, gen = res["cases"][0], res["gen"]["tiny:Q4_K_M:nextn1"]
    m = bs.mtp_summary(case, gen)
    assert m["measured_us"] == {"target": 1800.0, "verify": 1860.0, "draft": 700.0,
                                "target_head": 400.0, "draft_head": 410.0}  # fmt: skip
    est = bs.estimate_78(case["base"], gen)
    assert m["pessimistic_full_head"]["target_78_us"] == est["pessimistic"]["h200_78_layer_step_us"]
    assert m["n_moe"] == 2  # tiny: blk.0 dense, blk.1-2 MoE (the nextn block is not the trunk's)
    assert bs.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "MTP draft vs target step" in out
    assert "b1@4k: target (k=0) 1800.0 us, verify 1860.0 us, draft 700.0 us" in out
    assert "pessimistic_tp8_head: verify_78 " in out and "2/78 = 0.0256" in out
    assert "a=0.8: H200 (1 + 0.8) x " in out and "tok/s" in out
    assert out.count("caveat: ") == len(bs.MTP_CAVEATS) and "154,880-row" in out


def test_mtp_summary_names_what_is_missing() -> None:
    case = {"case": "tiny:Q4_K_M:CUSTOM:mtp1", "decode": [], "base": {"decode": []}}
    m = bs.mtp_summary(case, {"layers": 3, "experts": 8})
    assert "draft_us at batch 1" in m["missing"] and "estimate_78 of the k=0 run" in m["missing"]


def test_token_counts_read_from_vllms_arguments() -> None:
    so = SimpleNamespace(total_num_scheduled_tokens=2)
    assert bs._scheduled_tokens((None, so), {}) == 2
    assert bs._scheduled_tokens((None,), {"scheduler_output": so}) == 2
    ids = SimpleNamespace(shape=(64,))
    assert bs._target_tokens((None,), {"target_token_ids": ids}) == 64


@pytest.mark.runtime
def test_wrapped_vllm_methods_take_the_arguments_read() -> None:
    # StepTimer wraps these two on the GPU host; it reads scheduler_output and target_token_ids
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert list(inspect.signature(GPUModelRunner.execute_model).parameters)[:2] == [
        "self", "scheduler_output"]  # fmt: skip
    assert list(inspect.signature(EagleProposer.propose).parameters)[:2] == [
        "self", "target_token_ids"]  # fmt: skip


def test_fp8_case_serves_the_plain_file_with_fp8_rows() -> None:
    c = bs.parse_case("tp8:Q4_K_M:CUSTOM:fp8")
    assert c == bs.Case("tp8", "Q4_K_M", "CUSTOM", 0, "5", "fp8_ds_mla")
    assert str(c) == "tp8:Q4_K_M:CUSTOM:fp8" and c.file_key == "tp8:Q4_K_M"
    assert bs.parse_case("tp8:Q4_K_M:CUSTOM").kv == "auto"
    with pytest.raises(bs.CaseError, match=r"'fp16' is not mtp1, mtp2 or mtp3 .* or fp8"):
        bs.parse_case("tp8:Q4_K_M:CUSTOM:fp16")


def _served(case: str, kv_tokens: float, steps: dict, util: float = 0.85) -> dict:
    return {"case": case, "gpu_memory_utilization": util,
            "memory": {"kv_tokens": kv_tokens, "kv_cache_gib": kv_tokens / 1e4},
            "decode": [{"n": b, "prompt": ctx, "median_full_step_ms": ms}
                       for (b, ctx), ms in steps.items()]}  # fmt: skip


def test_kv_capacity_pairs_each_fp8_case_with_its_16bit_twin() -> None:
    res = {"cases": [
        _served("tp8:Q4_K_M:CUSTOM", 100_000, {(1, 4096): 10.0, (32, 4096): 20.0}),
        _served("tp8:Q4_K_M:CUSTOM:fp8", 175_000, {(1, 4096): 9.0, (8, 4096): 1.0}),
        _served("full:Q4_K_M:CUSTOM:fp8", 50_000, {}),  # no twin: no row
        {"case": "tp8:Q4_K_M:FLASHMLA_SPARSE:fp8", "error": "boom"},
    ]}  # fmt: skip
    (row,) = bs.kv_capacity_summary(res)
    assert row["base_case"] == "tp8:Q4_K_M:CUSTOM" and row["kv_tokens_ratio"] == 1.75
    assert row["row_bytes_ratio"] == round(1152 / 656, 3) and "warning" not in row
    assert row["points"] == [{"batch": 1, "context": 4096, "step_us_fp8": 9000.0,
                              "step_us_16bit": 10000.0, "speedup": 1.111}]  # fmt: skip
    text = bs.table(res)
    assert (
        "KV capacity (issue 19): tp8:Q4_K_M:CUSTOM:fp8 vs tp8:Q4_K_M:CUSTOM at utilization "
        "0.85: 175000 vs 100000 tokens (1.75x; MLA rows 1.756x)" in text
    )
    res["cases"][0]["gpu_memory_utilization"] = 0.88
    assert bs.kv_capacity_summary(res)[0]["warning"].startswith("the two cases ran at different")


@pytest.mark.runtime
def test_the_kv_dtypes_passed_are_vllms_engine_arguments() -> None:
    import dataclasses
    import typing

    from vllm.config.cache import CacheDType
    from vllm.engine.arg_utils import EngineArgs

    names = {f.name for f in dataclasses.fields(EngineArgs)}
    assert {"kv_cache_dtype", "gpu_memory_utilization"} <= names
    assert set(bs.KV_ROW_BYTES) <= set(typing.get_args(CacheDType))


@pytest.mark.runtime
def test_the_benchmarks_row_bytes_are_the_kernels() -> None:
    # bench_serve runs without torch, so it cannot import the kernels' _dims; this holds the copy
    from vllm_sparse_mla.kernels._dims import D_QK, FP8_ROW_BYTES

    assert bs.KV_ROW_BYTES == {"auto": 2 * D_QK, bs.KV_FP8: FP8_ROW_BYTES}
