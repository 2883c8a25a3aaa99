"""The GPU proof's verdict logic (tests/e2e/plugin_proof.py, driver side: no vLLM, no GPU)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from e2e import plugin_proof as proof


def _run(tokens: list[int], lps: list[dict[str, float]], prompt: list[float | None]) -> dict:
    return {"seqs": [{"tokens": tokens, "steps": lps, "prompt": prompt}]}


REF = _run([5, 9], [{"5": -0.5, "7": -1.5}, {"9": -0.2, "4": -2.0}], [None, -3.0, -2.0])


def test_identical_runs_pass() -> None:
    verdict = proof.compare(REF, REF, 0.1)
    assert verdict == {
        "tokens_equal": True,
        "divergences": [],
        "max_abs_logprob_diff": 0.0,
        "tolerance": 0.1,
        "passed": True,
    }


def test_logprob_drift_beyond_tolerance_fails() -> None:
    run = _run([5, 9], [{"5": -0.5}, {"9": -0.45}], [None, -3.0, -2.05])
    verdict = proof.compare(run, REF, 0.1)
    assert verdict["tokens_equal"] is True
    assert verdict["max_abs_logprob_diff"] == 0.25
    assert verdict["passed"] is False


def test_divergence_at_a_near_tie_passes_but_a_real_one_fails() -> None:
    ref = _run([5, 9], [{"5": -0.50, "7": -0.55}, {"9": -0.2}], [None, -3.0, -2.0])
    near = _run([7, 1], [{"7": -0.52, "5": -0.53}, {"1": -0.1}], [None, -3.0, -2.0])
    verdict = proof.compare(near, ref, 0.1)
    assert verdict["divergences"] == [{"prompt": 0, "step": 0, "ref_gap": 0.05}]
    assert verdict["tokens_equal"] is False and verdict["passed"] is True
    far = _run([3, 1], [{"3": -0.1}, {"1": -0.1}], [None, -3.0, -2.0])  # not in ref's top-k
    assert proof.compare(far, ref, 0.1)["passed"] is False


def test_proof_groups_cover_every_checked_run() -> None:
    names = {spec[0] for group in proof.GROUPS.values() for spec in group["runs"]}
    for _, run, ref, _ in proof.CHECKS:
        assert {run, ref} <= names
    for group in proof.GROUPS.values():
        for spec in group["runs"]:
            assert spec[1] in proof.MODELS
    assert Path(proof.PATCH).is_file()


def _prompt_run(shift: float) -> dict:
    prompt = [None] + [-2.0 - shift * (i % 3) for i in range(1, 200)]
    return {"seqs": [{"tokens": [5], "steps": [{"5": -0.5}], "prompt": prompt}]}


def test_fp8_cost_is_judged_against_vllms_own_fp8_cost() -> None:
    """Our fp8 cache may cost what vLLM's costs (x FLOOR_FACTOR), not more; a subset run (--only)
    skips the checks it cannot judge instead of failing them."""
    base = {
        "ref_flashmla_bf16": _prompt_run(0.0), "ref_flashmla_bf16_fp8": _prompt_run(0.01),
        "custom_fp16": _prompt_run(0.0), "triton_mla_bf16_dense": _prompt_run(0.002),
        "custom_bf16_fp8": _prompt_run(0.011),
    }  # fmt: skip
    label = next(c[0] for c in proof.CHECKS if c[3] == "fp8")
    only = sorted(base) + ["custom_fp16_fp8"]
    for shift, passed in ((0.015, True), (0.05, False)):
        runs = base | {"custom_fp16_fp8": _prompt_run(shift)}
        checks = {c["check"]: c for c in proof.judge(runs, only)}
        assert checks[label]["passed"] is passed, checks[label]
        assert checks[label]["noise_floor_diff"]["p90"] == 0.02
        skipped = [c for c in checks.values() if c.get("skipped")]
        assert skipped and all(c["passed"] is None for c in skipped)
        assert any("custom_bf16_dg" in c["not_run"] for c in skipped)
    # without --only the same missing runs fail
    full = proof.judge(base | {"custom_fp16_fp8": _prompt_run(0.015)})
    assert not any(c.get("skipped") for c in full)
    assert any(c["passed"] is False and c.get("missing") for c in full)


@pytest.mark.runtime  # the tokenizer writer needs `tokenizers` (runtime env)
def test_proof_models_are_written_with_the_geometry_their_names_say(tmp_path: Path) -> None:
    proof.write_models(tmp_path)
    for group in proof.GROUPS.values():
        for spec in group["runs"]:
            assert (tmp_path / spec[1] / "config.json").is_file()
            assert (tmp_path / spec[1] / "tokenizer.json").is_file()
    cfg = {n: json.loads((tmp_path / n / "config.json").read_text()) for n in proof.MODELS}
    assert cfg["tiny-glm5-dsa"]["index_topk"] == proof.DENSE_POSITIONS == 128
    assert cfg["tiny-glm5-dsa-topk2048"]["index_topk"] == 2048
    assert cfg["tiny-dsv3-dense"]["model_type"] == "deepseek_v3"
    assert "index_topk" not in cfg["tiny-dsv3-dense"]
    assert {c["num_nextn_predict_layers"] for c in cfg.values()} == {0}
    geometry = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    assert len({tuple(c[k] for k in geometry) for c in cfg.values()}) == 1


@pytest.mark.runtime
def test_python_hunk_applier_matches_patch(tmp_path: Path) -> None:
    """The proof's fallback for machines without patch/git gives patch(1)'s bytes."""
    import shutil
    import subprocess

    pristine = tmp_path / "pristine.py"
    vllm_spec = importlib.util.find_spec("vllm")
    assert vllm_spec is not None and vllm_spec.origin is not None
    shutil.copyfile(Path(vllm_spec.origin).parent / "utils/deep_gemm.py", pristine)
    ours = tmp_path / "ours/vllm/utils/deep_gemm.py"
    ours.parent.mkdir(parents=True)
    shutil.copyfile(pristine, ours)
    proof._apply_hunks(proof.PATCH.read_text(), ours)
    ref_root = tmp_path / "ref"
    (ref_root / "vllm/utils").mkdir(parents=True)
    shutil.copyfile(pristine, ref_root / "vllm/utils/deep_gemm.py")
    subprocess.run(["git", "apply", "-p1", str(proof.PATCH)], cwd=ref_root, check=True)
    assert ours.read_bytes() == (ref_root / "vllm/utils/deep_gemm.py").read_bytes()
