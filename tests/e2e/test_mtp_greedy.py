"""tests/e2e/mtp_greedy.py's judging, without a GPU: k>0 vs k=0 token equality with near-tie
accounting, and the usage errors (the GPU runs themselves are the H200's part)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import mtp_greedy


def seqs(*tokens: list[int], margin: float = 1.0) -> dict:
    return {"seqs": [{"tokens": t, "top2": [[-0.1, -0.1 - margin]] * len(t)} for t in tokens]}


def test_equal_runs_pass() -> None:
    check = mtp_greedy.compare(seqs([1, 2, 3], [4, 5]), seqs([1, 2, 3], [4, 5]), tie=0.02)
    assert check["passed"] and check["equal_prompts"] == 2 and check["prompts"] == 2


def test_divergence_fails_unless_the_reference_was_a_near_tie() -> None:
    run, ref = seqs([1, 2, 9], [4, 5]), seqs([1, 2, 3], [4, 5])
    check = mtp_greedy.compare(run, ref, tie=0.02)
    assert not check["passed"] and check["equal_prompts"] == 1
    assert check["rows"][0] == {"prompt": 0, "equal": False, "first_divergence": 2,
                                "ref_margin": pytest.approx(1.0), "near_tie": False}  # fmt: skip
    tie = mtp_greedy.compare(run, seqs([1, 2, 3], [4, 5], margin=0.01), tie=0.02)
    assert tie["passed"] and tie["rows"][0]["near_tie"]


def test_usage_errors(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        mtp_greedy.main([str(tmp_path), "--gguf", "x", "--hf-dir", "y", "--k", "1", "2"])
    assert exc.value.code == 2
    assert "--k takes 0..3 and must include 0" in capsys.readouterr().err
    missing = tmp_path / "none.gguf"
    assert mtp_greedy.main([str(tmp_path), "--gguf", str(missing), "--hf-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {missing} does not exist (run tests/e2e/pipeline.sh with CKPT_BUILDER=proof "
        "first)\n"
    )
