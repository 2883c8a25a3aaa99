"""Serving benchmark on GLM-5's real layer geometry: K-quant and IQ GGUFs in patched vLLM 0.23.0.

On a GPU host with the patched vLLM + plugin importable (tests/e2e staging: PYTHONPATH=/tmp/site),
for each case (view x mix x backend), in priority order and within --deadline:
  1. scripts/glm5_gguf_writer.py writes a few-layer GLM-5-geometry GGUF of the mix as split
     shards (random valid blocks), scripts/gguf_types_check.py checks the shard set, and
     scripts/gguf_merge.py merges it, as a user would (files are written in the background while
     earlier cases run; shards are deleted after the merge);
  2. a child process loads the merged file with vLLM's offline engine in-process (--load-format
     gguf, skip_tokenizer_init, block size 64, no torch.compile, full CUDA graphs for decode
     batches 1/8/32) and measures:
       - TTFT and prefill tok/s of one 4k and one 32k prompt,
       - decode tok/s at batch 1, 8, 32 x context 4k and 32k (32k x 32 only with --full-grid),
       - GPU memory: weights and KV cache (vLLM's own log lines),
       - a torch-profiler breakdown of decode steps and of one prefill by kernel family
         (attention, indexer logits, top-k, MoE GGUF, dense GGUF, lm_head, dense GEMM, other);
  3. a table is printed and everything is written as JSON (default benchmarks/results/).

Views: "full" (TP1, 64 heads, E routed experts, default 4 layers = 3 dense + 1 MoE) and "tp8"
(one TP8 rank's shapes: 8 heads, expert intermediate 256; default 6 layers). Backends: CUSTOM
(ours, fp16) and FLASHMLA_SPARSE (vLLM's, bf16; patch 0002's fp16-only rule is bypassed in the
child process only, since bf16 GGUF runs on compute capability 9.0). No communication is
measured; the 78-layer, 8x RTX PRO 6000 figure is an estimate (see `estimate_78`), labelled so.

Exit: 0 every case that ran passed, 1 a case failed or no case ran, 2 usage.

examples:
  PYTHONPATH=/tmp/site python benchmarks/bench_serve.py --work /tmp/bench --deadline 480
  PYTHONPATH=/tmp/site python benchmarks/bench_serve.py --cases full:Q4_K_M:CUSTOM --quick
  python benchmarks/bench_serve.py --list-cases
  python benchmarks/bench_serve.py --report benchmarks/results/serve-h200-2026-12-04.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# the service's default (vllm_service_max_num_batched_tokens): 8192 x top-8 overflows the GGUF MoE
# vec kernel's 65535-block grid z, the only kernel IQ experts have (benchmarks/gguf_moe_probe.py)
MAX_BATCHED_TOKENS = 8191
REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
H200_TBS = 4.25  # the H200 figure (datasheet 4.8; ~4.2-4.3 measured copies here)
PRO6000_TBS = 1.79  # RTX PRO 6000 Blackwell
# small-message (12 KiB) all-reduce over PCIe on 8 GPUs, no NVLink: nccl-tests latency-bound
# figures are ~15-30 us; an assumption, not a measurement of this run
ALLREDUCE_US = 20.0

DEFAULT_CASES = [
    "full:Q4_K_M:CUSTOM",
    "full:Q4_K_M:FLASHMLA_SPARSE",
    "tp8:Q4_K_M:CUSTOM",
    "tp8:Q4_K_M:FLASHMLA_SPARSE",
    "full:IQ4_XS:CUSTOM",
    "full:UD-IQ2_M:CUSTOM",
]
LAYERS = {"full": 4, "tp8": 6, "tiny": 3}  # tiny: CPU tests of this script only
DTYPE = {"CUSTOM": "float16", "FLASHMLA_SPARSE": "bfloat16", "TRITON_MLA": "float16"}

# kernel name -> family, first match wins (names as the CUDA/Triton kernels are called)
FAMILIES: list[tuple[str, re.Pattern[str]]] = [
    (
        "attention",
        re.compile(
            r"sparse_mla|_combine_kernel|flash_?mla|sparse_attn|mla_decode|"
            r"flash_fwd|splitkv|decode_attention|_fwd_kernel",
            re.I,
        ),
    ),
    ("indexer_logits", re.compile(r"mqa_logits", re.I)),
    ("topk", re.compile(r"topk|top_k|radix|sort", re.I)),
    ("moe_gguf", re.compile(r"moe_vec|moe_q|ggml_moe|moe_align|moe_sum|count_and_sort", re.I)),
    ("lm_head", re.compile(r"q6_K", re.I)),  # output.weight is the only Q6_K tensor of the mixes
    ("dense_gguf", re.compile(r"mul_mat|quantize_q8_1|dequantize|dequant", re.I)),
    ("dense_gemm", re.compile(r"gemm|gemv|cutlass|xmma|cublas|nvjet|sm90_", re.I)),
]


def family(kernel: str) -> str:
    for name, pat in FAMILIES:
        if pat.search(kernel):
            return name
    return "other"


def log(msg: str) -> None:
    print(f"[bench_serve {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- checkpoint generation (parent) ----------------------------------------------------------


def gen_command(work: Path, view: str, mix: str, layers: int, experts: int) -> list[str]:
    stem = work / f"{view}-{mix}"
    return [
        sys.executable, "-c",
        "import sys, glm5_gguf_writer as w; sys.exit(w.main(sys.argv[1:]))",
        "--mix", mix, "--view", view, "--layers", str(layers), "--experts", str(experts),
        "--out", str(stem / "shards" / f"GLM-5-{view}-{mix}.gguf"), "--split-max-tensors", "24",
        "--hf-dir", str(stem / "hf"), "--force",
    ]  # fmt: skip


def start_generation(work: Path, view: str, mix: str, layers: int, experts: int):
    d = work / f"{view}-{mix}"
    done = d / "gen.json"
    if done.exists():  # a later call on the same (warm) machine reuses the merged file
        info = json.loads(done.read_text())
        same = info.get("layers") == layers and info.get("experts") == experts
        if same and Path(info.get("gguf", "")).exists():
            return {"info": info | {"reused": True}, "dir": d}
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=f"{SCRIPTS}:{os.environ.get('PYTHONPATH', '')}")
    log_f = open(d / "gen.log", "w")  # noqa: SIM115  (closed by finish_generation)
    t0 = time.time()
    proc = subprocess.Popen(gen_command(work, view, mix, layers, experts), env=env,
                            stdout=log_f, stderr=subprocess.STDOUT)  # fmt: skip
    return {"proc": proc, "log": log_f, "t0": t0, "dir": d}


def finish_generation(job: dict) -> dict:
    """Wait for the writer, check types on the shard set, merge, delete the shards."""
    d: Path = job["dir"]
    rc = job["proc"].wait()
    job["log"].close()
    info: dict = {"write_s": round(time.time() - job["t0"], 1)}
    if rc != 0:
        info["error"] = "writer failed: " + (d / "gen.log").read_text()[-2000:]
        return info
    shards = sorted((d / "shards").glob("*-00001-of-*.gguf"))
    env = dict(os.environ, PYTHONPATH=f"{SCRIPTS}:{os.environ.get('PYTHONPATH', '')}")
    chk = subprocess.run([sys.executable, str(SCRIPTS / "gguf_types_check.py"), "--summary",
                          str(shards[0])], capture_output=True, text=True, env=env)  # fmt: skip
    info["types_check"] = {"rc": chk.returncode, "out": chk.stdout + chk.stderr}
    if chk.returncode != 0:
        info["error"] = "types check refused the file: " + chk.stderr.strip()
        return info
    merged = d / f"GLM-5-{d.name}.gguf"
    t1 = time.time()
    mg = subprocess.run([sys.executable, str(SCRIPTS / "gguf_merge.py"), "--no-progress",
                         str(shards[0]), str(merged)], capture_output=True, text=True,
                        env=env)  # fmt: skip
    info["merge_s"] = round(time.time() - t1, 1)
    info["shards"] = len(list((d / "shards").glob("*.gguf")))
    if mg.returncode != 0:
        info["error"] = "merge failed: " + (mg.stdout + mg.stderr)[-2000:]
        return info
    shutil.rmtree(d / "shards")
    info["gguf"] = str(merged)
    info["hf"] = str(d / "hf")
    info["gguf_bytes"] = merged.stat().st_size
    return info


# --- one case (child process) ----------------------------------------------------------------


def _kernel_table(prof) -> dict[str, float]:
    import torch

    out: dict[str, float] = {}
    for evt in prof.key_averages():
        if getattr(evt, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        us = float(getattr(evt, "self_device_time_total", 0.0) or 0.0)
        if us > 0:
            out[evt.key] = out.get(evt.key, 0.0) + us
    return out


def _by_family(kernels: dict[str, float], steps: int) -> dict[str, float]:
    fam: dict[str, float] = {}
    for k, us in kernels.items():
        f = family(k)
        fam[f] = fam.get(f, 0.0) + us / steps
    return {k: round(v, 1) for k, v in sorted(fam.items())}


class Engine:
    """vLLM's LLMEngine driven step by step in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0),
    so step times and the torch profiler see the model's own kernels."""

    def __init__(self, llm, vocab: int) -> None:
        from vllm import SamplingParams

        self.engine = llm.llm_engine
        self.vocab = vocab
        self.uid = 0
        self.SamplingParams = SamplingParams

    def prompts(self, n: int, length: int) -> list[list[int]]:
        import numpy as np

        rng = np.random.default_rng(self.uid + 17)
        return [rng.integers(16, self.vocab - 16, length).tolist() for _ in range(n)]

    def run(self, n: int, length: int, max_tokens: int, profile: bool = False) -> dict:
        """n requests of `length` random tokens, `max_tokens` each; returns timings."""
        from vllm.inputs import TokensPrompt

        params = self.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                                     detokenize=False)  # fmt: skip
        ids = []
        t_add = time.perf_counter()
        for p in self.prompts(n, length):
            self.uid += 1
            rid = f"r{self.uid}"
            ids.append(rid)
            self.engine.add_request(rid, TokensPrompt(prompt_token_ids=p), params)
        counts = dict.fromkeys(ids, 0)
        first_all = None  # time when every request had its first token
        first_any = None
        steps: list[tuple[float, int, bool]] = []  # decode steps: (seconds, tokens, profiled)
        prof = None
        prof_steps = 0
        t_prev = t_add
        while self.engine.has_unfinished_requests():
            profiled = prof is not None and prof_steps >= 0
            if profile and first_all is not None and prof is None:
                import torch

                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                prof = torch.profiler.profile(activities=acts)
                prof.__enter__()
                profiled = True
            outs = self.engine.step()
            if profiled:
                prof_steps += 1
                if prof_steps == 8:
                    import torch

                    torch.cuda.synchronize()
                    prof.__exit__(None, None, None)
                    prof_steps = -1
            now = time.perf_counter()
            new_tokens = 0
            for o in outs:
                c = len(o.outputs[0].token_ids)
                new_tokens += c - counts[o.request_id]
                counts[o.request_id] = c
            if first_all is not None:
                steps.append((now - t_prev, new_tokens, profiled))
            if first_any is None and any(counts.values()):
                first_any = now
            if first_all is None and all(counts.values()):
                first_all = now
            t_prev = now
        t_end = time.perf_counter()
        if prof is not None and prof_steps > 0:
            prof.__exit__(None, None, None)
        plain = [(dt, k) for dt, k, pr in steps if not pr]
        decode_tokens = sum(k for _, k in plain)
        decode_s = sum(dt for dt, _ in plain)
        res = {
            "n": n,
            "prompt": length,
            "max_tokens": max_tokens,
            "ttft_s": round(first_any - t_add, 4) if first_any else None,
            "all_first_s": round(first_all - t_add, 4) if first_all else None,
            "decode_tokens": decode_tokens,
            "decode_s": round(decode_s, 4),
            "total_s": round(t_end - t_add, 3),
        }
        if decode_tokens and decode_s > 0:
            res["decode_tok_s"] = round(decode_tokens / decode_s, 1)
            res["step_ms"] = round(decode_s / (decode_tokens / n) * 1e3, 3)
            full = sorted(dt for dt, k in plain if k == n)
            if full:
                res["median_full_step_ms"] = round(full[len(full) // 2] * 1e3, 3)
        if prof is not None:
            try:
                kernels = _kernel_table(prof)
            except Exception as exc:  # the timings stand without the breakdown
                res["profile_error"] = f"{type(exc).__name__}: {exc}"
                return res
            steps = 8 if prof_steps == -1 else max(prof_steps, 1)
            res["profile_steps"] = steps
            res["breakdown_us_per_step"] = _by_family(kernels, steps)
            res["gpu_us_per_step"] = round(sum(kernels.values()) / steps, 1)
            top = sorted(kernels.items(), key=lambda kv: -kv[1])[:25]
            res["top_kernels_us_per_step"] = {k[:160]: round(v / steps, 1) for k, v in top}
        return res

    def profile_prefill(self, length: int) -> dict:
        import torch
        from vllm.inputs import TokensPrompt

        params = self.SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False)
        self.uid += 1
        self.engine.add_request(
            f"p{self.uid}", TokensPrompt(prompt_token_ids=self.prompts(1, length)[0]), params
        )
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            while self.engine.has_unfinished_requests():
                self.engine.step()
            torch.cuda.synchronize()
        kernels = _kernel_table(prof)
        return {"prompt": length, "breakdown_us": _by_family(kernels, 1),
                "gpu_us": round(sum(kernels.values()), 1)}  # fmt: skip


class LogLines:
    """vLLM's own log records of the load: weights and KV-cache memory, KV capacity, backend."""

    PATTERNS = {
        "weights_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
        "load_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
        "kv_cache_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
        "kv_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
        "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    }

    def __init__(self) -> None:
        import logging

        self.found: dict = {"backend_lines": []}
        outer = self

        class H(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    msg = record.getMessage()
                except Exception:  # a malformed record never breaks the benchmark
                    return
                for key, pat in outer.PATTERNS.items():
                    if key not in outer.found and (m := pat.search(msg)):
                        outer.found[key] = float(m[1].replace(",", ""))
                low = msg.lower()
                wanted = ("backend" in low and "attention" in low) or "CUSTOM" in msg
                if wanted and len(outer.found["backend_lines"]) < 6:
                    outer.found["backend_lines"].append(msg[:300])

        logging.getLogger("vllm").addHandler(H(logging.INFO))


def run_case(args: argparse.Namespace) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    import torch
    import vllm

    out: dict = {"case": args.case, "vllm": vllm.__version__, "torch": torch.__version__,
                 "gpu": torch.cuda.get_device_name(0),
                 "capability": list(torch.cuda.get_device_capability(0))}  # fmt: skip
    view, mix, backend = args.case.split(":")
    dtype = DTYPE[backend]
    if dtype == "bfloat16":
        # patch 0002 refuses bf16 for glm-dsa GGUF (Blackwell's GGUF path takes no bf16); on
        # compute capability 9.0 vLLM's GGUFConfig accepts bf16, which FlashMLA needs: lifted
        # for this comparison process only, recorded in the JSON
        import vllm.config.model as vcm

        if hasattr(vcm, "_check_gguf_glm_dsa_dtype"):
            vcm._check_gguf_glm_dsa_dtype = lambda *a, **k: None
            out["patch_0002_bf16_check_lifted"] = True
    cfg = json.loads((Path(args.hf) / "config.json").read_text())
    max_ctx = max(args.contexts)
    lines = LogLines()
    from vllm import LLM

    kwargs = dict(
        model=args.gguf, hf_config_path=args.hf, tokenizer=args.hf, skip_tokenizer_init=True,
        load_format="gguf", dtype=dtype, attention_backend=backend, block_size=64,
        max_model_len=max_ctx + 256, max_num_seqs=max(args.batches),
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        gpu_memory_utilization=0.88, enable_prefix_caching=False, seed=0,
    )  # fmt: skip
    compile_cfgs = [
        {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
         "cudagraph_capture_sizes": sorted(set(args.batches))},
        {"cudagraph_capture_sizes": sorted(set(args.batches))},
    ]  # fmt: skip
    t0 = time.time()
    llm = None
    errors = []
    for cc in compile_cfgs if not args.enforce_eager else [None]:
        try:
            if cc is None:
                llm = LLM(**kwargs, enforce_eager=True)
            else:
                llm = LLM(**kwargs, compilation_config=cc)
            out["compilation_config"] = cc
            break
        except Exception as exc:  # record and try the next configuration
            errors.append(f"{type(exc).__name__}: {str(exc)[:1500]}")
            log(f"engine start failed with {cc}: {errors[-1][:300]}")
            if "CUDA out of memory" in str(exc) or cc is None:
                break
    if llm is None:
        out["error"] = " | ".join(errors)
        return out
    if errors:
        out["start_errors"] = errors
    out["start_s"] = round(time.time() - t0, 1)
    ccfg = llm.llm_engine.vllm_config.compilation_config
    out["cudagraph_mode"] = str(ccfg.cudagraph_mode)
    out["compile_mode"] = str(ccfg.mode)
    out["memory"] = {k: v for k, v in lines.found.items() if k != "backend_lines"}
    out["backend_lines"] = lines.found["backend_lines"]
    eng = Engine(llm, cfg["vocab_size"])
    t_w = time.time()
    eng.run(1, 1024, 8)  # warm-up: Triton JIT of prefill and decode paths
    eng.run(max(args.batches), 256, 8)
    out["warmup_s"] = round(time.time() - t_w, 1)
    deadline = time.time() + args.case_budget
    out["prefill"] = []
    for ctx in args.contexts:
        if time.time() > deadline:
            out.setdefault("skipped", []).append(f"prefill {ctx}")
            continue
        try:
            r = eng.run(1, ctx, 1)
        except Exception as exc:  # keep what was measured so far
            out.setdefault("errors", []).append(f"prefill {ctx}: {type(exc).__name__}: {exc}")
            continue
        r["prefill_tok_s"] = round(ctx / r["ttft_s"], 1) if r["ttft_s"] else None
        out["prefill"].append(r)
        log(f"{args.case} TTFT {ctx}: {r['ttft_s']} s")
    out["decode"] = []
    grid = [(b, c) for c in args.contexts for b in args.batches
            if args.full_grid or b * c <= 8 * 32768]  # fmt: skip
    prof_points = {(1, max(args.contexts)), (max(args.batches), min(args.contexts))}
    for b, c in grid:
        if time.time() > deadline:
            out.setdefault("skipped", []).append(f"decode b{b} c{c}")
            continue
        try:
            r = eng.run(b, c, args.decode_tokens + 1, profile=(b, c) in prof_points)
        except Exception as exc:  # keep what was measured so far
            out.setdefault("errors", []).append(f"decode b{b} c{c}: {type(exc).__name__}: {exc}")
            continue
        out["decode"].append(r)
        log(f"{args.case} decode b{b} c{c}: {r.get('decode_tok_s')} tok/s, {r.get('step_ms')} ms")
    if time.time() < deadline:
        try:
            out["prefill_profile"] = eng.profile_prefill(min(args.contexts))
        except Exception as exc:  # the decode figures stand without it
            out.setdefault("errors", []).append(f"prefill profile: {type(exc).__name__}: {exc}")
    return out


def child_main(args: argparse.Namespace) -> int:
    try:
        res = run_case(args)
    except Exception as exc:  # the parent records the failure and goes on
        import traceback

        res = {"case": args.case, "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
    Path(args.result).write_text(json.dumps(res, indent=1))
    return 0 if "error" not in res else 1


def _writer():
    """scripts/glm5_gguf_writer.py (on PYTHONPATH: `make bench-serve`, pytest's pythonpath)."""
    import glm5_gguf_writer

    return glm5_gguf_writer


# --- estimates and report --------------------------------------------------------------------


def layer_bytes(view: str, mix: str, layers: int, experts: int) -> dict:
    """Q8_0 (non-expert) bytes per dense and per MoE layer, from the writer's plan."""
    w = _writer()
    geom = w.VIEWS[view](layers, experts)
    out = {"dense": 0, "moe": 0, "n_dense": 0, "n_moe": 0}
    seen = set()
    for s in w.plan(geom, w.MIXES[mix]):
        m = re.match(r"blk\.(\d+)\.", s.name)
        if not m or s.type_name == "F32" or "_exps." in s.name:
            continue
        layer = int(m[1])
        kind = "moe" if geom.is_moe(layer) else "dense"
        if layer not in seen:
            seen.add(layer)
            out["n_" + kind] += 1
        out[kind] += w.nbytes(s)
    out["dense"] //= max(out["n_dense"], 1)
    out["moe"] //= max(out["n_moe"], 1)
    return out


def estimate_78(case: dict, gen: dict) -> dict | None:
    """Batch-1 decode per-layer time from the profile, extrapolated to 78 layers (3 dense + 75
    MoE) on 8x RTX PRO 6000: memory-bound time x 4.25/1.79, plus two all-reduces per layer
    (assumed ALLREDUCE_US each). An estimate, not a measurement.

    Per-layer kernels (attention, indexer, top-k, fp16 GEMMs) are divided by the layer count;
    dense GGUF time (Q8_0 attention projections, dense FFN, shared expert) is spread over the
    layers by their Q8_0 bytes; MoE GGUF time over the MoE layers; lm_head (Q6_K) once. The
    "other" family mixes per-layer kernels (norms, RoPE, routing) with once-per-step ones
    (embedding, sampler), so it bounds the figure: counted per layer (pessimistic) and once
    per step (optimistic)."""
    prof = next((d for d in case.get("decode", []) if d["n"] == 1 and "breakdown_us_per_step"
                 in d), None)  # fmt: skip
    if prof is None:
        return None
    view, mix, _ = case["case"].split(":")
    lb = layer_bytes(view, mix, gen["layers"], gen["experts"])
    n = lb["n_dense"] + lb["n_moe"]
    b = prof["breakdown_us_per_step"]
    per_layer = sum(b.get(k, 0.0) for k in ("attention", "indexer_logits", "topk",
                                            "dense_gemm")) / n  # fmt: skip
    other = b.get("other", 0.0)
    per_byte = b.get("dense_gguf", 0.0) / (lb["dense"] * lb["n_dense"] + lb["moe"] * lb["n_moe"])
    moe_layer = per_layer + per_byte * lb["moe"] + b.get("moe_gguf", 0.0) / max(lb["n_moe"], 1)
    dense_layer = per_layer + per_byte * lb["dense"]
    head = b.get("lm_head", 0.0)
    scale = H200_TBS / PRO6000_TBS
    out = {
        "label": "ESTIMATE (extrapolated, not measured)",
        "context": prof["prompt"],
        "h200_moe_layer_us_without_other": round(moe_layer, 1),
        "h200_dense_layer_us_without_other": round(dense_layer, 1),
        "h200_other_us_per_step": round(other, 1),
        "h200_lm_head_us": round(head, 1),
        "bandwidth_scale": round(scale, 3),
        "allreduce_us_assumed": ALLREDUCE_US,
    }
    for name, other_per_layer, other_once in (("pessimistic", other / n, 0.0),
                                              ("optimistic", 0.0, other)):  # fmt: skip
        h200_us = 3 * (dense_layer + other_per_layer) + 75 * (moe_layer + other_per_layer)
        h200_us += head + other_once
        pro_us = h200_us * scale + 78 * 2 * ALLREDUCE_US
        out[name] = {
            "h200_78_layer_step_us": round(h200_us, 1),
            "h200_tok_s": round(1e6 / h200_us, 1),
            "pro6000_tp8_step_us": round(pro_us, 1),
            "pro6000_tp8_tok_s": round(1e6 / pro_us, 1),
        }
    out["note"] = (
        "tp8 view: one rank of TP8 (8x RTX PRO 6000 after scaling); full view: TP1 on one H200"
    )
    return out


def table(results: dict) -> str:
    rows = ["case                           | load GiB | KV tok    | TTFT 4k s | decode tok/s "
            "(b x ctx)"]  # fmt: skip
    for c in results["cases"]:
        if "error" in c:
            rows.append(f"{c['case']:30s} | ERROR {c['error'][:200]}")
            continue
        mem = c.get("memory", {})
        ttft = next((p["ttft_s"] for p in c.get("prefill", []) if p["prompt"] == 4096), None)
        dec = ", ".join(f"{d['n']}x{d['prompt'] // 1024}k={d.get('decode_tok_s')}"
                        for d in c.get("decode", []))  # fmt: skip
        rows.append(f"{c['case']:30s} | {mem.get('weights_gib', '?'):>8} | "
                    f"{int(mem.get('kv_tokens', 0)):>9,} | {ttft!s:>9} | {dec}")  # fmt: skip
    rows.append("")
    rows.append("breakdown, us per decode step (batch x ctx): family=us")
    for c in results["cases"]:
        for d in c.get("decode", []):
            if "breakdown_us_per_step" in d:
                fam = " ".join(f"{k}={v}" for k, v in d["breakdown_us_per_step"].items())
                head = f"{c['case']:30s} {d['n']}x{d['prompt'] // 1024}k step {d.get('step_ms')} ms"
                rows.append(f"{head} gpu {d['gpu_us_per_step']} us: {fam}")
    for c in results["cases"]:
        if c.get("estimate_78"):
            e = c["estimate_78"]
            lo, hi = e["pessimistic"], e["optimistic"]
            rows.append(f"{c['case']:30s} {e['label']}: 78 layers, batch 1, ctx "
                        f"{e['context'] // 1024}k: H200 {lo['h200_tok_s']}-{hi['h200_tok_s']} "
                        f"tok/s; 8x PRO 6000 TP8 {lo['pro6000_tp8_tok_s']}-"
                        f"{hi['pro6000_tp8_tok_s']} tok/s")  # fmt: skip
    return "\n".join(rows)


def parent_main(args: argparse.Namespace) -> int:
    t_start = time.time()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cases = args.cases.split(",") if args.cases else DEFAULT_CASES
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "argv": sys.argv, "experts": args.experts, "cases": [], "gen": {}}  # fmt: skip
    try:
        git = ["git", "-C", str(REPO), "rev-parse", "HEAD"]
        results["commit"] = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    except OSError:
        results["commit"] = None
    files = []
    for c in cases:
        view, mix, _ = c.split(":")
        if (view, mix) not in files:
            files.append((view, mix))
    # the writers run two at a time in the background, in case order
    jobs: dict = {}
    pending = list(files)

    def top_up() -> None:
        while pending and sum(1 for j in jobs.values() if "info" not in j) < args.gen_parallel:
            view, mix = pending.pop(0)
            layers = args.layers or LAYERS[view]
            jobs[(view, mix)] = start_generation(work, view, mix, layers, args.experts)
            jobs[(view, mix)]["layers"] = layers
            if "info" in jobs[(view, mix)]:
                continue
            log(f"writing {view} {mix} ({layers} layers, {args.experts} experts)")

    top_up()
    out_json = Path(args.json)
    rc = 0
    for c in cases:
        view, mix, backend = c.split(":")
        left = args.deadline - (time.time() - t_start)
        if left < args.min_case_s:
            results["cases"].append({"case": c, "error": f"skipped: {left:.0f} s left"})
            rc = 1
            continue
        if (view, mix) not in jobs:  # not started yet: start it now, ahead of the queue
            pending.remove((view, mix))
            pending.insert(0, (view, mix))
            jobs[(view, mix)] = start_generation(work, view, mix, args.layers or LAYERS[view],
                                                 args.experts)  # fmt: skip
            jobs[(view, mix)]["layers"] = args.layers or LAYERS[view]
            pending.pop(0)
        job = jobs[(view, mix)]
        if "info" not in job:
            job["info"] = finish_generation(job) | {"layers": job["layers"],
                                                    "experts": args.experts}  # fmt: skip
            if "error" not in job["info"]:
                (job["dir"] / "gen.json").write_text(json.dumps(job["info"]))
            results["gen"][f"{view}:{mix}"] = job["info"]
            log(f"{view} {mix}: {job['info']}")
            top_up()
        info = job["info"]
        results["gen"][f"{view}:{mix}"] = info
        if "error" in info:
            results["cases"].append({"case": c, "error": info["error"]})
            rc = 1
            continue
        res_file = work / f"{c.replace(':', '_')}.json"
        res_file.unlink(missing_ok=True)
        budget = min(args.case_budget, left - 40)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--case", c,
               "--gguf", info["gguf"], "--hf", info["hf"], "--result", str(res_file),
               "--case-budget", str(int(budget)), "--decode-tokens", str(args.decode_tokens),
               "--contexts", ",".join(map(str, args.contexts)),
               "--batches", ",".join(map(str, args.batches))]  # fmt: skip
        if args.full_grid:
            cmd.append("--full-grid")
        if args.enforce_eager:
            cmd.append("--enforce-eager")
        log(f"case {c}: {left:.0f} s left")
        t0 = time.time()
        with open(work / f"{c.replace(':', '_')}.log", "w") as lf:
            try:
                p = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                   timeout=max(left - 15, 30))  # fmt: skip
                crc = p.returncode
            except subprocess.TimeoutExpired:
                crc = -9
        if res_file.exists():
            res = json.loads(res_file.read_text())
        else:
            tail = (work / f"{c.replace(':', '_')}.log").read_text()[-3000:]
            res = {"case": c, "error": f"child exit {crc}, no result; log tail: {tail}"}
        res["wall_s"] = round(time.time() - t0, 1)
        if "error" not in res:
            res["estimate_78"] = estimate_78(res, info)
        else:
            rc = 1
            res["log_tail"] = (work / f"{c.replace(':', '_')}.log").read_text()[-3000:]
        results["cases"].append(res)
        log(f"case {c} done in {res['wall_s']} s" + (f": {res['error'][:300]}" if "error" in
                                                        res else ""))  # fmt: skip
        results["total_s"] = round(time.time() - t_start, 1)
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(results, indent=1))
    for job in jobs.values():  # writers of files no case reached
        if "info" not in job:
            job["proc"].kill()
            job["log"].close()
    results["total_s"] = round(time.time() - t_start, 1)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(results, indent=1))
    print(table(results))
    log(f"wrote {out_json}")
    if not results["cases"] or all("error" in c for c in results["cases"]):
        return 1
    return rc


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("examples:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cases", help="comma list of view:mix:backend (default: the priority list)")
    p.add_argument("--list-cases", action="store_true", help="print the default cases and exit")
    p.add_argument("--work", default="/tmp/bench-serve", help="folder for the GGUFs and logs")
    p.add_argument("--json", default=str(REPO / "benchmarks/results/serve.json"))
    p.add_argument("--report", help="print the table of an existing JSON and exit")
    p.add_argument("--layers", type=int, default=0, help="override the view's layer count")
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--contexts", type=_ints, default=[4096, 32768])
    p.add_argument("--batches", type=_ints, default=[1, 8, 32])
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--full-grid", action="store_true", help="also batch 32 at the longest ctx")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--deadline", type=float, default=540, help="seconds for everything")
    p.add_argument("--case-budget", type=float, default=150, help="measuring seconds per case")
    p.add_argument("--min-case-s", type=float, default=75, help="skip a case with less left")
    p.add_argument("--gen-parallel", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="contexts 4096 only, batches 1,32")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--gguf", help=argparse.SUPPRESS)
    p.add_argument("--hf", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.list_cases:
        print("\n".join(DEFAULT_CASES))
        return 0
    if args.report:
        res = json.loads(Path(args.report).read_text())
        for c in res["cases"]:  # estimates recomputed: the method may be newer than the run
            g = res.get("gen", {}).get(":".join(c["case"].split(":")[:2]))
            if "error" not in c and g:
                c["estimate_78"] = estimate_78(c, g)
        print(table(res))
        return 0
    if args.quick:
        args.contexts, args.batches = [4096], [1, 32]
    for c in args.cases.split(",") if args.cases else []:
        parts = c.split(":")
        if len(parts) != 3 or parts[0] not in LAYERS or parts[2] not in DTYPE:
            p.error(f"bad case {c!r}: view:mix:backend, views {sorted(LAYERS)}, "
                    f"backends {sorted(DTYPE)}")  # fmt: skip
    if args.child:
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
