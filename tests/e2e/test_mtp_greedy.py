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
                                "ref_margin": pytest.approx(1.0), "near_tie": False,
                                "prefix_drift": 0.0}  # fmt: skip
    tie = mtp_greedy.compare(run, seqs([1, 2, 3], [4, 5], margin=0.01), tie=0.02)
    assert tie["passed"] and tie["rows"][0]["near_tie"]


def test_prefix_drift_is_the_largest_top1_gap_before_the_first_divergence() -> None:
    ref = {"seqs": [{"tokens": [1, 2, 3, 4], "top2": [[-1.0, -2.0], [-1.0, -2.0], [-1.0, -1.1],
                                                      [-1.0, -2.0]]}]}  # fmt: skip
    run = {"seqs": [{"tokens": [1, 2, 9, 4], "top2": [[-1.01, -2.0], [-1.25, -2.0], [-3.0, -4.0],
                                                      [-9.0, -9.5]]}]}  # fmt: skip
    check = mtp_greedy.compare(run, ref, tie=0.02)
    # positions 0 and 1 agree (drift 0.01, 0.25); position 2 is the divergence, 3 comes after it
    assert check["rows"][0]["first_divergence"] == 2
    assert check["rows"][0]["ref_margin"] == pytest.approx(0.1)
    assert check["max_prefix_drift"] == pytest.approx(0.25)
    same = mtp_greedy.compare(ref, ref, tie=0.02)
    assert same["passed"] and same["max_prefix_drift"] == 0.0


def test_controls_are_judged_against_their_own_reference_runs() -> None:
    assert mtp_greedy.run_plan([0, 1], controls=False) == [("0", 0, 4, None), ("1", 1, 4, "0")]
    assert mtp_greedy.run_plan([0], controls=True) == [
        ("0", 0, 4, None), ("0r", 0, 4, "0"), ("0b1", 0, 1, "0"), ("1b1", 1, 1, "0b1"),
    ]  # fmt: skip
    # every run name maps to a backend vLLM knows, a dtype and a weight source
    assert {v[0] for v in mtp_greedy.BACKENDS.values()} == {"CUSTOM", "FLASHMLA_SPARSE"}
    assert mtp_greedy.BACKENDS["CUSTOM_BF16"] == ("CUSTOM", "bfloat16", "safetensors")


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


def replayed(k: int, tokens: list[int], own: list[float], top1_token: list[int],
             top1: list[float], replay_own: list[float]) -> dict:  # fmt: skip
    return {"k": k, "seqs": [{"tokens": tokens, "own": own, "top2": []}],
            "replay": [{"own": replay_own, "top1_token": top1_token, "top1": top1}]}  # fmt: skip


def test_replay_counts_tokens_that_are_not_the_teacher_forced_top1() -> None:
    # position 1: replay prefers token 7 by 0.5 (beyond a tie); position 2: by 0.01 (a tie)
    run = replayed(1, [5, 6, 8], [-1.0, -1.2, -2.0], [5, 7, 9], [-1.0, -0.7, -1.99],
                   [-1.0, -1.2, -2.0])  # fmt: skip
    check = mtp_greedy.replay_check(run, tie=0.02)
    assert (check["positions"], check["mismatches"], check["beyond_tie"]) == (3, 2, 1)
    assert check["max"] == 0.0


def test_replay_verdict_holds_mtp_to_the_worst_plain_run() -> None:
    plain = replayed(0, [1, 2], [-1.0, -1.0], [1, 2], [-1.0, -1.0], [-1.01, -1.02])
    plain_r = replayed(0, [1, 3], [-1.0, -1.0], [1, 2], [-1.0, -0.5], [-1.0, -1.04])
    good = replayed(1, [1, 3], [-1.0, -1.0], [1, 2], [-1.0, -0.5], [-1.05, -1.0])
    bad = replayed(2, [1, 3], [-1.0, -1.0], [1, 2], [-1.0, -0.5], [-1.3, -1.0])
    runs = {"0": plain, "0r": plain_r, "1": good, "2": bad}
    verdicts = {v["run"]: v for v in mtp_greedy.replay_verdicts(runs, tie=0.02)}
    assert verdicts["0"]["passed"] is None and verdicts["0r"]["beyond_tie"] == 1
    # the worst plain run: 1 mismatch beyond a tie, p90 0.04; k=1 has 1 and 0.05 (<= 2 x 0.04)
    assert verdicts["1"]["passed"] is True
    assert verdicts["2"]["passed"] is False and verdicts["2"]["p90"] == pytest.approx(0.3)
