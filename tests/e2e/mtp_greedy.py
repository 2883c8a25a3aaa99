"""GPU proof of MTP speculative decoding from the GGUF's nextn layer (issue 17): greedy outputs
with k = 1..3 speculative tokens equal the run without MTP, token for token.

One command on the GPU machine, after `tests/e2e/pipeline.sh` ran with CKPT_BUILDER=proof (the
tiny GLM-5 with its MTP layer, converted by llama.cpp and merged; patches applied to /tmp/site,
the plugin installed there):

    PYTHONPATH=/tmp/site:tests python3 -m e2e.mtp_greedy OUTDIR \
        --gguf /tmp/e2e/tiny-glm5-Q8_0.gguf --hf-dir /tmp/e2e/ckpt \
        --backend CUSTOM FLASHMLA_SPARSE --k 0 1 2 3

Per backend one worker process runs vLLM offline (`LLM(...)`) once per k, with full CUDA graphs
for (spec-)decode batches (FULL_DECODE_ONLY, no torch.compile), greedy, fixed random prompts
longer than index_topk (so attention is truly sparse), ignore_eos:
- CUSTOM: our backend, float16, from the GGUF (the target through patches 0001-0008, the MTP
  draft through patch 0009); the draft is given the same backend (`attention_backend` in the
  speculative config: vLLM does not inherit it), so its own MLA layer and indexer run on ours.
- FLASHMLA_SPARSE: vLLM's own sparse backend, the reference path. It runs bfloat16 only, and the
  GLM-5 GGUF path is float16 only (patch 0002), so this reference serves the same weights from
  the tiny checkpoint's safetensors (vLLM's own MTP loader for glm_moe_dsa), from a copy in
  OUTDIR/ref-ckpt that adds the MTP layer's embed_tokens/head (see reference_checkpoint).
- CUSTOM_BF16: our backend on FLASHMLA_SPARSE's inputs (the safetensors copy, bfloat16): the
  same weights and arithmetic as the reference path except attention and indexer, so a
  difference between the two is ours, and one between CUSTOM and CUSTOM_BF16 is the GGUF path's.
The sparse_mla_indexer (`--indexer`, default triton: our Triton MQA-logits kernels, the SM120
path, with next_n = 1 + k rows per request) applies to CUSTOM's engines.

`--controls` adds runs that say how far the engine itself moves greedy tokens without MTP, per
backend: `0r` (k = 0 again in a fresh engine: run-to-run determinism), `0b1` (k = 0 with one
request at a time: batch composition, since vLLM's kernels are not batch-invariant) and `1b1`
(k = 1, one request at a time, judged against `0b1`). Every comparison also reports the prefix
drift: the largest |top-1 logprob difference| over the positions before the first divergence,
the size of the perturbation whatever the chaos of a random model makes of it.

Writes OUTDIR/mtp.json: per backend and k the tokens, init and generate seconds, seconds per
engine step (a step = one target forward: k=0 one token per request, k>0 up to 1 + k), vLLM's
spec-decode counters (drafts, draft tokens, accepted tokens, per position) and the acceptance
rate; per backend and k>0 the comparison with k=0 (equal prompts, the first divergence and
whether k=0's top-2 logprobs there are a near tie). OUTDIR/mtp.log is the summary, OUTDIR/
<backend>.log vLLM's output. Random weights draft badly: a low acceptance rate is expected and
proves nothing about speed; equality is the point. Exit 0 when every k>0 run equals k=0 (near
ties allowed, see --tie), 1 otherwise, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support import cli

from e2e.plugin_proof import shutdown_engine

EXAMPLES = (
    "example: PYTHONPATH=/tmp/site:tests python3 -m e2e.mtp_greedy /tmp/mtp "
    "--gguf /tmp/e2e/tiny-glm5-Q8_0.gguf --hf-dir /tmp/e2e/ckpt --k 0 1 2 3"
)
SEED = 0
NUM_PROMPTS = 4
PROMPT_LEN = 200  # > index_topk 128 of the tiny model
NEW_TOKENS = 32
TOP_LOGPROBS = 2
# run name -> (attention backend, dtype, weights)
BACKENDS = {
    "CUSTOM": ("CUSTOM", "float16", "gguf"),
    "CUSTOM_BF16": ("CUSTOM", "bfloat16", "safetensors"),
    "FLASHMLA_SPARSE": ("FLASHMLA_SPARSE", "bfloat16", "safetensors"),
}
# control run id -> (k, max_num_seqs, the run it is judged against)
CONTROLS = {"0r": (0, NUM_PROMPTS, "0"), "0b1": (0, 1, "0"), "1b1": (1, 1, "0b1")}
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


def prompts(vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(SEED)
    return [[rng.randrange(16, vocab) for _ in range(PROMPT_LEN)] for _ in range(NUM_PROMPTS)]


def _metrics(llm: Any) -> dict[str, Any]:
    """vLLM's spec-decode counters (LLM.get_metrics, needs disable_log_stats=False)."""
    out: dict[str, Any] = {"per_position": None}
    for m in llm.get_metrics():
        if m.name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[m.name]] = int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["per_position"] = [int(v) for v in m.values]
        elif m.name == "vllm:iteration_tokens_total":
            out["steps"] = int(m.count)
    if out.get("draft_tokens"):
        out["acceptance_rate"] = round(out["accepted_tokens"] / out["draft_tokens"], 4)
    return out


def reference_checkpoint(hf_dir: Path, dest: Path) -> Path:
    """HF_DIR with the MTP layer's own embed_tokens and shared_head.head (copies of the trunk's,
    as DeepSeek-V3 checkpoints ship them): vLLM's safetensors loader checks strictly that every
    parameter of the draft is loaded, and GLM-5's layout (the tiny builder's) has neither; the
    proposer replaces both with the target's, so the values change nothing."""
    from safetensors.torch import load_file, save_file

    config = json.loads((hf_dir / "config.json").read_text())
    mtp = f"model.layers.{config['num_hidden_layers']}."
    dest.mkdir(parents=True, exist_ok=True)
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors" and f.is_file():
            (dest / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(hf_dir / "model.safetensors"))
    weights[mtp + "embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
    weights[mtp + "shared_head.head.weight"] = weights["lm_head.weight"].clone()
    save_file(weights, str(dest / "model.safetensors"), {"format": "pt"})
    return dest


def run_plan(ks: list[int], controls: bool) -> list[tuple[str, int, int, str | None]]:
    """(run id, k, max_num_seqs, the run it is judged against) in running order."""
    runs = [(str(k), k, NUM_PROMPTS, "0" if k else None) for k in ks]
    if controls:
        runs += [(rid, k, seqs, ref) for rid, (k, seqs, ref) in CONTROLS.items()]
    return runs


def engine(backend: str, k: int, args: argparse.Namespace, max_num_seqs: int) -> Any:
    from vllm import LLM
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode, CUDAGraphMode
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    attention, dtype, weights = BACKENDS[backend]
    gguf = weights == "gguf"
    kwargs: dict[str, Any] = {}
    if gguf:
        kwargs["hf_config_path"] = str(args.hf_dir)
    if attention == "CUSTOM":
        kwargs["additional_config"] = {"sparse_mla_indexer": args.indexer}
    if k:
        kwargs["speculative_config"] = {
            "method": "mtp",
            "num_speculative_tokens": k,
            "attention_backend": attention,
        }
    if not args.eager:
        kwargs["compilation_config"] = CompilationConfig(
            mode=CompilationMode.NONE,
            cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY,
            cudagraph_capture_sizes=[1, 2, 4, 8, 16],
        )
    hf_ref = args.outdir / "ref-ckpt"
    return LLM(
        model=str(args.gguf if gguf else hf_ref),
        tokenizer=str(args.hf_dir),
        dtype=dtype,
        seed=SEED,
        enforce_eager=args.eager,
        attention_backend=AttentionBackendEnum[attention],
        max_model_len=512,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=1024,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.2,
        kv_cache_memory_bytes=1 << 30,
        disable_log_stats=False,
        **kwargs,
    )


def run_one(
    backend: str, k: int, args: argparse.Namespace, log: Any, max_num_seqs: int = NUM_PROMPTS
) -> dict[str, Any]:
    import torch
    from vllm import SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.inputs import TokensPrompt

    dtype, weights = BACKENDS[backend][1:]
    t0 = time.perf_counter()
    llm = engine(backend, k, args, max_num_seqs)
    init_s = time.perf_counter() - t0
    try:
        vocab = llm.llm_engine.model_config.get_vocab_size()
        params = SamplingParams(
            temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP_LOGPROBS,
            seed=SEED,
        )  # fmt: skip
        batch = [TokensPrompt(prompt_token_ids=p) for p in prompts(vocab)]
        llm.generate(batch[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
        before = _metrics(llm)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        torch.cuda.synchronize()
        gen_s = time.perf_counter() - t1
        after = _metrics(llm)
        spec = {
            key: after[key] - before.get(key, 0)
            for key in ("drafts", "draft_tokens", "accepted_tokens", "steps")
            if key in after
        }
        if after.get("per_position"):
            prev = before.get("per_position") or [0] * len(after["per_position"])
            spec["per_position"] = [
                a - b for a, b in zip(after["per_position"], prev, strict=False)
            ]
        if spec.get("draft_tokens"):
            spec["acceptance_rate"] = round(spec["accepted_tokens"] / spec["draft_tokens"], 4)
        seqs = []
        for out in outs:
            c = out.outputs[0]
            steps = [
                sorted((float(v.logprob) for v in lp.values()), reverse=True)[:2]
                for lp in (c.logprobs or [])
            ]
            own = [float(lp[t].logprob) for t, lp in zip(c.token_ids, c.logprobs or [],
                                                         strict=False)]  # fmt: skip
            seqs.append({"tokens": list(c.token_ids), "top2": steps, "own": own})
        result = {
            "backend": backend, "k": k, "dtype": dtype, "max_num_seqs": max_num_seqs,
            "model": weights, "init_s": round(init_s, 1),
            "generate_s": round(gen_s, 4), "spec": spec, "seqs": seqs,
        }  # fmt: skip
        if spec.get("steps"):
            result["s_per_step"] = round(gen_s / spec["steps"], 6)
        print(f"[{backend} k={k} seqs={max_num_seqs}] init {init_s:.1f}s generate {gen_s:.3f}s "
              f"{spec}", file=log, flush=True)  # fmt: skip
        return result
    finally:  # free the GPU for the next engine even when this one failed
        shutdown_engine(llm)
        del llm
        cleanup_dist_env_and_memory()


def replay(backend: str, args: argparse.Namespace, runs: dict[str, Any], log: Any) -> None:
    """Teacher-forced scoring of every run's tokens by one fresh k = 0 engine (prompt logprobs of
    prompt + generated tokens): per run the emitted tokens' replay logprobs, the replay's top-1
    token and logprob, stored as run["replay"]. Immune to where trajectories part: each run is
    judged on its own tokens."""
    from vllm import SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.inputs import TokensPrompt

    llm = engine(backend, 0, args, NUM_PROMPTS)
    try:
        vocab = llm.llm_engine.model_config.get_vocab_size()
        base = prompts(vocab)
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1, seed=SEED)
        for run in runs.values():
            batch = [TokensPrompt(prompt_token_ids=p + s["tokens"])
                     for p, s in zip(base, run["seqs"], strict=True)]  # fmt: skip
            outs = llm.generate(batch, params, use_tqdm=False)
            scored = []
            for out, seq in zip(outs, run["seqs"], strict=True):
                rows = out.prompt_logprobs[PROMPT_LEN:]
                top1 = [max(r.items(), key=lambda kv: kv[1].logprob) for r in rows]
                scored.append({
                    "own": [float(r[t].logprob) for r, t in zip(rows, seq["tokens"], strict=True)],
                    "top1_token": [int(t) for t, _ in top1],
                    "top1": [float(v.logprob) for _, v in top1],
                })  # fmt: skip
            run["replay"] = scored
        print(f"[{backend}] replayed {len(runs)} runs", file=log, flush=True)
    finally:
        shutdown_engine(llm)
        del llm
        cleanup_dist_env_and_memory()


def replay_check(run: dict[str, Any], tie: float) -> dict[str, Any]:
    """One run against its replay: positions where the emitted token is not the replay's top-1
    (beyond a near tie: replay top-1 minus the token's replay logprob > tie), and the |emitted
    logprob - replay logprob| quantiles."""
    diffs: list[float] = []
    mismatches = beyond = positions = 0
    for seq, rep_ in zip(run["seqs"], run["replay"], strict=True):
        for j, tok in enumerate(seq["tokens"]):
            positions += 1
            diffs.append(abs(seq["own"][j] - rep_["own"][j]))
            if rep_["top1_token"][j] != tok:
                mismatches += 1
                beyond += rep_["top1"][j] - rep_["own"][j] > tie
    diffs.sort()

    def q(f: float) -> float:
        return round(diffs[min(len(diffs) - 1, int(f * len(diffs)))], 5) if diffs else 0.0

    return {"positions": positions, "mismatches": mismatches, "beyond_tie": beyond,
            "median": q(0.5), "p90": q(0.9), "max": q(1.0)}  # fmt: skip


def replay_verdicts(runs: dict[str, Any], tie: float) -> list[dict[str, Any]]:
    """k > 0 runs against the k = 0 family (0 and the controls without MTP): MTP is as faithful
    to the target as plain decoding when its emitted tokens are the replay's top-1 as often
    (beyond-tie mismatches no more than the worst k = 0 run's) and its logprobs sit as close to
    the replay (p90 within 2x the worst k = 0 run's p90, the engine's own spread)."""
    checks = {rid: replay_check(r, tie) for rid, r in runs.items() if "replay" in r}
    plain = [c for rid, c in checks.items() if runs[rid]["k"] == 0]
    if not plain:
        return []
    worst_beyond = max(c["beyond_tie"] for c in plain)
    worst_p90 = max(c["p90"] for c in plain)
    out = []
    for rid, c in checks.items():
        verdict = None
        if runs[rid]["k"]:
            verdict = c["beyond_tie"] <= worst_beyond and c["p90"] <= 2 * worst_p90
        out.append({"run": rid, "k": runs[rid]["k"], "passed": verdict} | c)
    return out


def worker(backend: str, out: Path, args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"runs": {}, "errors": {}}
    for rid, k, max_num_seqs, _ in run_plan(args.k, args.controls):
        try:
            results["runs"][rid] = run_one(backend, k, args, sys.stdout, max_num_seqs)
        except Exception as exc:  # keep going: the other runs still say something
            import traceback

            traceback.print_exc()
            results["errors"][rid] = f"{type(exc).__name__}: {exc}"
        out.write_text(json.dumps(results))
    if args.replay and results["runs"]:
        try:
            replay(backend, args, results["runs"], sys.stdout)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            results["errors"]["replay"] = f"{type(exc).__name__}: {exc}"
        out.write_text(json.dumps(results))
    return 0


def compare(run: dict[str, Any], ref: dict[str, Any], tie: float) -> dict[str, Any]:
    """A run vs its reference run of one backend: equal prompts; else the first divergence, near
    tie or not; and the prefix drift (largest |top-1 logprob difference| while tokens agree)."""
    rows = []
    for i, (a, b) in enumerate(zip(run["seqs"], ref["seqs"], strict=True)):
        pos = next(
            (j for j, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=False)) if x != y),
            None,
        )
        agreed = zip(a["top2"][:pos], b["top2"][:pos], strict=False)
        drift = max((abs(x[0] - y[0]) for x, y in agreed if x and y), default=0.0)
        if pos is None:
            rows.append({"prompt": i, "equal": True, "prefix_drift": drift})
            continue
        top2 = b["top2"][pos] if pos < len(b["top2"]) else []
        margin = top2[0] - top2[1] if len(top2) == 2 else None
        rows.append({"prompt": i, "equal": False, "first_divergence": pos, "ref_margin": margin,
                     "near_tie": margin is not None and margin <= tie,
                     "prefix_drift": drift})  # fmt: skip
    return {
        "equal_prompts": sum(r["equal"] for r in rows),
        "prompts": len(rows),
        "passed": all(r["equal"] or r["near_tie"] for r in rows),
        "max_prefix_drift": max((r["prefix_drift"] for r in rows), default=0.0),
        "rows": rows,
    }


def _divergence(row: dict[str, Any]) -> str:
    if row["equal"]:
        return "equal"
    margin = row["ref_margin"]
    return f"({row['first_divergence']}, {'?' if margin is None else f'{margin:.3f}'})"


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, EXAMPLES, prog="python3 -m e2e.mtp_greedy")
    p.add_argument("outdir", type=Path)
    p.add_argument("--gguf", type=Path, required=True, help="the merged tiny GGUF (with nextn)")
    p.add_argument("--hf-dir", type=Path, required=True, help="its checkpoint folder")
    p.add_argument("--backend", nargs="+", choices=sorted(BACKENDS), default=["CUSTOM"])
    p.add_argument("--k", nargs="+", type=int, default=[0, 1, 2, 3],
                   help="speculative tokens per run; 0 (no MTP) is the reference")  # fmt: skip
    p.add_argument("--indexer", choices=("auto", "triton", "deepgemm"), default="triton")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (a fallback)")
    p.add_argument("--controls", action="store_true",
                   help="also run 0r, 0b1, 1b1 (the engine's own spread; see above)")  # fmt: skip
    p.add_argument("--replay", action="store_true",
                   help="score every run's tokens by a fresh k=0 engine")  # fmt: skip
    p.add_argument("--tie", type=float, default=0.02,
                   help="pass a divergence where k=0's top-2 logprobs differ <= this")  # fmt: skip
    p.add_argument("--report-only", action="store_true",
                   help="judge the <backend>.json files in OUTDIR, run nothing")  # fmt: skip
    p.add_argument("--worker", choices=sorted(BACKENDS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if any(k < 0 or k > 3 for k in args.k) or 0 not in args.k:
        p.error("--k takes 0..3 and must include 0 (the reference)")
    for path in (args.gguf, args.hf_dir):
        if not path.exists():
            print(f"error: {path} does not exist (run tests/e2e/pipeline.sh with "
                  "CKPT_BUILDER=proof first)", file=sys.stderr)  # fmt: skip
            return 2
    if args.worker:
        return worker(args.worker, args.outdir / f"{args.worker}.json", args)

    args.outdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    forwarded = [str(args.outdir), "--gguf", str(args.gguf), "--hf-dir", str(args.hf_dir),
                 "--indexer", args.indexer, "--k", *map(str, args.k)]  # fmt: skip
    forwarded += ["--eager"] * args.eager + ["--controls"] * args.controls
    forwarded += ["--replay"] * args.replay
    if not args.report_only and any(BACKENDS[b][2] == "safetensors" for b in args.backend):
        reference_checkpoint(args.hf_dir, args.outdir / "ref-ckpt")
    exits: dict[str, int] = {}
    walls: dict[str, float] = {}
    for backend in [] if args.report_only else args.backend:
        t0 = time.perf_counter()
        with open(args.outdir / f"{backend}.log", "w") as blog:
            exits[backend] = subprocess.run(
                [sys.executable, "-m", "e2e.mtp_greedy", *forwarded, "--worker", backend],
                env=env, stdout=blog, stderr=subprocess.STDOUT, check=False,
            ).returncode  # fmt: skip
        walls[backend] = round(time.perf_counter() - t0, 1)
    report = build_report(args, exits)
    report["wall_s_per_backend"] = walls
    report["wall_s"] = round(time.perf_counter() - started, 1)
    (args.outdir / "mtp.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = report_lines(report)
    (args.outdir / "mtp.log").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if report["passed"] or report.get("replay_passed") else 1


def build_report(args: argparse.Namespace, exits: dict[str, int]) -> dict[str, Any]:
    """The judgement from OUTDIR/<backend>.json (what the workers wrote)."""
    report: dict[str, Any] = {"runs": {}, "checks": [], "replay": [], "errors": {}}
    for backend in args.backend:
        result_file = args.outdir / f"{backend}.json"
        data = json.loads(result_file.read_text()) if result_file.exists() else {}
        runs = data.get("runs", {})
        report["runs"][backend] = runs
        for rid, err in data.get("errors", {}).items():
            report["errors"][f"{backend} {rid}"] = err
        if exits.get(backend) or not result_file.exists():
            report["errors"][backend] = f"worker exit {exits.get(backend)}; see {backend}.log"
        for rid, k, _, ref in run_plan(args.k, args.controls):
            if ref is not None and ref in runs and rid in runs:
                check = compare(runs[rid], runs[ref], args.tie)
                report["checks"].append({"backend": backend, "run": rid, "k": k, "ref": ref}
                                        | check)  # fmt: skip
        report["replay"] += [{"backend": backend} | v for v in replay_verdicts(runs, args.tie)]
    # The proof is MTP's runs against k = 0; the controls only measure the engine's own spread.
    judged = [c for c in report["checks"] if c["run"] not in CONTROLS]
    report["passed"] = bool(judged) and all(c["passed"] for c in judged) and not report["errors"]
    if args.replay:
        mtp = [v for v in report["replay"] if v["passed"] is not None]
        report["replay_passed"] = (
            bool(mtp) and all(v["passed"] for v in mtp) and not report["errors"]
        )
    return report


def report_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for backend, runs in report["runs"].items():
        for rid, r in runs.items():
            spec = r.get("spec", {})
            lines.append(
                f"{backend} {rid} (k={r['k']}, seqs {r.get('max_num_seqs')}): generate "
                f"{r['generate_s']}s, steps {spec.get('steps')}, s/step {r.get('s_per_step')}, "
                f"acceptance {spec.get('acceptance_rate')} "
                f"(per position {spec.get('per_position')})"
            )
    for c in report["checks"]:
        verdict = ("control " if c["run"] in CONTROLS else "") + ("PASS" if c["passed"] else "FAIL")
        divs = " ".join(_divergence(r) for r in c["rows"])
        lines.append(f"{verdict} {c['backend']} {c['run']} == {c['ref']}: "
                     f"{c['equal_prompts']}/{c['prompts']} prompts equal [{divs}], "
                     f"max prefix drift {c['max_prefix_drift']:.4f}")  # fmt: skip
    for v in report["replay"]:
        verdict = {None: "k=0 family", True: "PASS", False: "FAIL"}[v["passed"]]
        lines.append(f"replay {verdict} {v['backend']} {v['run']}: {v['mismatches']}/"
                     f"{v['positions']} tokens not the replay's top-1 ({v['beyond_tie']} beyond "
                     f"a tie), |logprob - replay| median {v['median']} p90 {v['p90']} "
                     f"max {v['max']}")  # fmt: skip
    lines += [f"error {n}: {e}" for n, e in report["errors"].items()]
    verdicts = [f"token equality {'PASSED' if report['passed'] else 'FAILED'}"]
    if "replay_passed" in report:
        verdicts.append(f"replay {'PASSED' if report['replay_passed'] else 'FAILED'}")
    lines.append(", ".join(verdicts) + f" in {report.get('wall_s')}s")
    return lines


if __name__ == "__main__":
    sys.exit(main())
