"""tests/e2e/reference_check.py's comparison and verdict on synthetic captures (no torch).

The reference rows are exact log-softmaxes of made-up logits; "served" captures are built from
them in vLLM's JSON shapes (prompt_logprobs: {token: {logprob, rank}}, completion logprobs'
token_logprobs), then perturbed to land inside or outside a given spread.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from e2e import reference_check as rc

VOCAB = 12
TOPK = 20  # index_topk: prompt entries 1..20 are the dense region, 21..39 the sparse one
SPREAD = {"source": "test", "measured": "test", "median": 0.01, "p90": 0.03, "max": 1.0, "n": 9}


def log_softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    z = m + math.log(sum(math.exp(x - m) for x in xs))
    return [x - z for x in xs]


def reference_rows(n: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [log_softmax([rng.gauss(0, 3) for _ in range(VOCAB)]) for _ in range(n)]


def served(
    ref: list[list[float]], prompt: list[int], gen_len: int, noise: float, seed: int = 0,
    force: dict[int, int] | None = None,
) -> dict:  # fmt: skip
    """A served run whose logprobs are the reference's + uniform noise in [-noise, noise];
    greedy tokens follow the reference's argmax unless ``force`` {step: token} says otherwise."""
    rng = random.Random(seed)

    def jitter(x: float) -> float:
        return x + rng.uniform(-noise, noise)

    plp: list = [None]
    for j in range(1, len(prompt)):
        row = ref[j - 1]
        order = sorted(range(VOCAB), key=lambda t: -row[t])
        entry = {
            str(t): {"logprob": jitter(row[t]), "rank": r + 1} for r, t in enumerate(order[:5])
        }
        entry[str(prompt[j])] = {"logprob": jitter(row[prompt[j]]),
                                 "rank": order.index(prompt[j]) + 1}  # fmt: skip
        plp.append(entry)
    tokens, lps = [], []
    for k in range(gen_len):
        row = ref[len(prompt) - 1 + k]
        tok = (force or {}).get(k, max(range(VOCAB), key=row.__getitem__))
        tokens.append(tok)
        lps.append(jitter(row[tok]))
    return {"prompt": prompt, "token_ids": tokens, "prompt_logprobs": plp,
            "logprobs": {"token_logprobs": lps}}  # fmt: skip


def case(noise: float, force: dict[int, int] | None = None) -> tuple[list, list]:
    runs, refs = [], []
    for i in range(3):
        prompt = [random.Random(i).randrange(VOCAB) for _ in range(40)]
        ref = reference_rows(40 + 8, seed=10 + i)
        runs.append(served(ref, prompt, 8, noise, seed=i, force=force if i == 1 else None))
        refs.append(ref)
    return runs, refs


def verdict(runs: list, refs: list) -> dict:
    return rc.judge([rc.compare_run(r, f, TOPK) for r, f in zip(runs, refs, strict=True)], SPREAD)


def test_within_spread_passes() -> None:
    v = verdict(*case(noise=0.01))
    assert v["passed"] is True
    tok = v["prompt_logprobs"]["actual_token"]
    assert tok["n"] == 3 * 39 and tok["max"] <= 0.01 and tok["median"] > 0
    assert v["prompt_logprobs"]["dense"]["n"] == 3 * TOPK
    assert v["index_share"]["sparse"]["n"] == 3 * 19
    assert v["index_share"]["closer_than_every_counterfactual"] is None  # none given
    assert v["prompt_logprobs"]["top1_agree"] == 3 * 39  # the noise never reorders these rows
    assert v["greedy"]["equal_steps"] == [8, 8, 8] and v["greedy"]["divergences"] == []
    assert v["greedy"]["generated_logprob_diff"]["max"] <= 0.01


def test_prompt_logprobs_outside_spread_fail() -> None:
    v = verdict(*case(noise=0.2))
    assert v["passed"] is False
    assert v["prompt_logprobs"]["within_spread"] is False
    assert v["prompt_logprobs"]["dense"]["median"] > 2 * SPREAD["median"]


def test_only_the_dense_region_is_held_to_the_spread() -> None:
    runs, refs = case(noise=0.01)
    for run in runs:  # the sparse region far off (fp8 top-k swaps): not the spread's business
        for entry in run["prompt_logprobs"][TOPK + 1 :]:
            for e in entry.values():
                e["logprob"] += 0.5
    v = verdict(runs, refs)
    assert v["passed"] is True and v["prompt_logprobs"]["dense"]["max"] <= 0.01
    assert v["index_share"]["sparse"]["median"] == pytest.approx(0.5, abs=0.011)


def _shifted(rows: list[list[float]], by: float) -> list[list[float]]:
    return [row if j < TOPK else [x + by for x in row] for j, row in enumerate(rows)]


def test_counterfactual_index_share_decides_the_sparse_region() -> None:
    runs, refs = case(noise=0.01)
    cfs = [{"shared_reuse_layer0": _shifted(f, 0.3), "shared_reuse_layer1": _shifted(f, -0.2)}
           for f in refs]  # fmt: skip
    results = [rc.compare_run(r, f, TOPK, c) for r, f, c in zip(runs, refs, cfs, strict=True)]
    assert all(len(r["counterfactual_diffs"]["shared_reuse_layer0"]) == 19 for r in results)
    v = rc.judge(results, SPREAD)
    assert v["passed"] is True and v["index_share"]["closer_than_every_counterfactual"] is True
    cf = v["index_share"]["counterfactual"]
    assert cf["shared_reuse_layer0"]["median"] == pytest.approx(0.3, abs=0.011)
    assert cf["shared_reuse_layer1"]["median"] == pytest.approx(0.2, abs=0.011)
    # served as if its shared layers read layer 1's top-k: closer to that counterfactual, fails
    wrong = [served(_shifted(f, -0.2), r["prompt"], 8, 0.01, seed=i)
             for i, (r, f) in enumerate(zip(runs, refs, strict=True))]  # fmt: skip
    results = [rc.compare_run(r, f, TOPK, c) for r, f, c in zip(wrong, refs, cfs, strict=True)]
    v = rc.judge(results, SPREAD)
    assert v["index_share"]["closer_than_every_counterfactual"] is False
    assert v["passed"] is False and v["prompt_logprobs"]["within_spread"] is True


def test_exact_served_logprobs_give_zero_diffs() -> None:
    runs, refs = case(noise=0.0)
    r = rc.compare_run(runs[0], refs[0], TOPK)
    assert max(r["prompt_token_diffs"]) == 0 and max(r["top1_diffs"]) == 0
    assert r["greedy_equal_steps"] == 8 and r["divergence"] is None


def _second_best(row: list[float]) -> int:
    return sorted(range(VOCAB), key=lambda t: -row[t])[1]


def test_greedy_divergence_is_reported_and_nothing_compared_after() -> None:
    runs, refs = case(noise=0.0)
    ref = refs[1]
    step = 3
    alt = _second_best(ref[40 - 1 + step])
    runs[1] = served(ref, runs[1]["prompt"], 8, 0.0, seed=1, force={step: alt})
    res = rc.compare_run(runs[1], ref, TOPK)
    assert res["greedy_equal_steps"] == step and len(res["generated_diffs"]) == step
    row = ref[40 - 1 + step]
    best = max(range(VOCAB), key=row.__getitem__)
    assert res["divergence"] == {"step": step, "served": alt, "reference": best,
                                 "ref_gap": round(row[best] - row[alt], 5)}  # fmt: skip
    v = rc.judge([rc.compare_run(r, f, TOPK) for r, f in zip(runs, refs, strict=True)], SPREAD)
    assert v["greedy"]["divergences"][0]["prompt"] == 1
    assert v["greedy"]["note"] == "after a prompt's first divergence nothing more is compared"
    # reported with its margin against the spread's max, and not judged (see the module doc)
    gap = res["divergence"]["ref_gap"]
    both = [rc.compare_run(r, f, TOPK) for r, f in zip(runs, refs, strict=True)]
    tight = rc.judge(both, SPREAD | {"max": gap / 2})
    assert tight["greedy"]["divergences"][0]["within_spread_max"] is False
    assert tight["passed"] is True and tight["greedy"]["judged"] is False
    loose = rc.judge(both, SPREAD | {"max": gap * 2})
    assert loose["greedy"]["divergences"][0]["within_spread_max"] is True


def test_top1_choice_compared_where_it_is_not_the_actual_token() -> None:
    runs, refs = case(noise=0.0)
    run = runs[0]
    j = next(
        j for j in range(1, 40) if run["prompt_logprobs"][j][str(run["prompt"][j])]["rank"] > 1
    )
    top = next(t for t, e in run["prompt_logprobs"][j].items() if e["rank"] == 1)
    run["prompt_logprobs"][j][top]["logprob"] += 0.5  # only the top-1 entry moves
    r = rc.compare_run(run, refs[0], TOPK)
    assert r["top1_diffs"][j - 1] == pytest.approx(0.5)
    assert r["prompt_token_diffs"][j - 1] == 0


def test_bad_captures_are_one_line_errors() -> None:
    runs, refs = case(noise=0.0)
    short = dict(runs[0], prompt_logprobs=runs[0]["prompt_logprobs"][:-1])
    with pytest.raises(rc.CheckError, match="prompt_logprobs of a 40-token prompt has 39"):
        rc.compare_run(short, refs[0], TOPK)
    with pytest.raises(rc.CheckError, match="reference has 10 rows, needs 47"):
        rc.compare_run(runs[0], refs[0][:10], TOPK)
    missing = json.loads(json.dumps(runs[0]))
    del missing["prompt_logprobs"][5][str(missing["prompt"][5])]
    with pytest.raises(rc.CheckError, match=r"prompt_logprobs\[5\] lacks the prompt's token"):
        rc.compare_run(missing, refs[0], TOPK)


def test_spread_from_two_captures_and_from_the_committed_proof() -> None:
    runs, refs = case(noise=0.0)
    other, _ = case(noise=0.05)
    s = rc.spread_from_captures({"runs": runs}, {"runs": other}, "flashmla.json", TOPK)
    assert s["measured"] == "in this run" and 0 < s["median"] <= 0.05 and s["n"] == 3 * TOPK
    with pytest.raises(rc.CheckError, match="its prompts are not capture.json's"):
        rc.spread_from_captures({"runs": runs}, {"runs": other[::-1]}, "x.json", TOPK)
    proof = rc.spread_from_proof(rc.PLUGIN_PROOF, "dtype")
    # the committed H200 figure (benchmarks/results/h200-2026-12-03-e2e/.../plugin_proof.json)
    assert {k: proof[k] for k in ("median", "p90", "max")} == {
        "median": 0.01227, "p90": 0.03466, "max": 1.40027}  # fmt: skip
    assert "TRITON_MLA fp16 vs TRITON_MLA bf16" in proof["source"]
    assert "plugin_proof.json" in proof["source"]


def test_cli_usage_and_missing_capture(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        rc.main(["--capture", "x.json"])
    assert exc.value.code == 2
    capsys.readouterr()
    rc_ = rc.main(["--capture", str(tmp_path / "none.json"), "--gguf", "g", "--hf-dir",
                   str(tmp_path), "--json", str(tmp_path / "out.json")])  # fmt: skip
    assert rc_ == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: FileNotFoundError:")


def test_the_floor_is_the_larger_of_spread_and_sensitivity() -> None:
    sens = {"median": 0.2, "p90": 0.005, "max": 3.0, "n": 9}
    floor = rc.floor_of(SPREAD, sens)
    assert {k: floor[k] for k in ("median", "p90", "max")} == {"median": 0.2, "p90": 0.03,
                                                               "max": 3.0}  # fmt: skip
    assert (floor["median_from"], floor["p90_from"]) == ("sensitivity", "spread")
    assert rc.floor_of(SPREAD, None)["source"] == "spread"


def test_a_model_as_sensitive_as_the_served_arithmetic_is_judged_by_its_own_sensitivity() -> None:
    """The GLM-5.2 e2e run's case: a Q8_0 GGUF is served W8A8 (vLLM's GGUF kernels round every
    quantised weight's input to Q8_1), which moves this random model's dense-region logprobs ~10x
    the committed fp16-vs-bf16 spread of another model; the reference in that arithmetic moves
    them as much, so the served model is judged against that, the spread only reported."""
    runs, refs = case(noise=0.2)
    results = [rc.compare_run(r, f, TOPK) for r, f in zip(runs, refs, strict=True)]
    assert rc.judge(results, SPREAD)["passed"] is False  # the spread alone: outside
    sens = {"median": 0.12, "p90": 0.2, "max": 2.0, "n": 3 * TOPK}
    v = rc.judge(results, SPREAD, sens)
    pl = v["prompt_logprobs"]
    assert v["passed"] is True and pl["within_floor"] is True and pl["within_spread"] is False
    assert v["floor"]["median"] == 0.12 and v["floor"]["median_from"] == "sensitivity"
    # ... and a served error well beyond its own sensitivity still fails
    far, _ = case(noise=1.0)
    results = [rc.compare_run(r, f, TOPK) for r, f in zip(far, refs, strict=True)]
    assert rc.judge(results, SPREAD, sens)["prompt_logprobs"]["within_floor"] is False
