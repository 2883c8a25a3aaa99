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

MTP cases (`view:mix:backend:mtpK`, K = 1..3; issue 17) measure one draft step against one
target step: the GGUF is written with `--nextn 1` (its own file, `<view>-<mix>-nextn1`), and two
children serve it at batch 1/8/32 x --mtp-context (4k), decode only: k = 0 (the target alone, its
nextn block skipped; profiled for `estimate_78`) and k = K (`speculative_config={"method": "mtp",
"num_speculative_tokens": K}`). CUDA events around vLLM's GPUModelRunner.execute_model (the target
forward: 1 token per request at k = 0, 1 + K when verifying) and EagleProposer.propose (the whole
draft: the MTP layer and head, K passes) time each decode step; a few calls of each are also
profiled by kernel family. Reported: draft_us, verify_us vs target_us of the same file, draft /
the 78-layer target estimate against issue 17's 2/78, and the K = 1 single-stream speed-up at the
published acceptance 0.8 / 0.9, with its arithmetic (`mtp_estimate`). Caveats, also in the output:
the tp8 view's lm_head is the full 154,880-row vocabulary on one GPU (a TP8 rank holds 1/8), so
the draft's (and target's) head is overstated: the figures are also given with the head's
measured share cut to 1/8; random routing sends 1 + K tokens to up to 8 (1 + K) distinct experts,
so the verify step is pessimistic; acceptance with random weights means nothing, hence the
published rates.

IndexShare cases (`view:mix:backend:glm52`; issue 18) serve the same view and mix as GLM-5.2:
the writer's `--generation 5.2` (its own file, `<view>-<mix>-glm52`): index_topk_freq 4 /
index_skip_topk_offset 3 in the HF config, no indexer tensors in the "shared" layers (3-5 of the
tp8 view's 6), which reuse the top-k of the last full layer (patches 0007/0008); everything else
as the plain case. When both `view:mix:backend` and its `:glm52` ran, the report prints, per
decode point (batch x context), the 5.2 vs 5 step time (median full-batch step), the saving in µs
and %, the profiled indexer_logits + topk per step of each (where profiled), and an ESTIMATE for
78 layers: the saving per shared layer x GLM-5.2's 57 shared layers (`index_share_summary`).

fp8 KV cases (`view:mix:backend:fp8`; issue 19) serve the plain case's file with
`kv_cache_dtype="fp8_ds_mla"` (656-byte MLA rows). When both ran, the report prints vLLM's KV
tokens of each at --gpu-memory-utilization (0.85 by default, as the issue states capacity; runs
before 2026-12-07 used 0.88), their ratio beside the MLA row-byte ratio 1152 / 656 = 1.756 (the
indexer's key cache, the same in both, makes the whole-cache ratio smaller), and the decode step
of each at the points both ran (`kv_capacity_summary`).

Views: "full" (TP1, 64 heads, E routed experts, default 4 layers = 3 dense + 1 MoE) and "tp8"
(one TP8 rank's shapes: 8 heads, expert intermediate 256; default 6 layers). Backends: CUSTOM
(ours, fp16) and FLASHMLA_SPARSE (vLLM's, bf16; patch 0002's fp16-only rule is bypassed in the
child process only, since bf16 GGUF runs on compute capability 9.0). No communication is
measured; the 78-layer, 8x RTX PRO 6000 figure is an estimate (see `estimate_78`), labelled so.

Exit: 0 every case that ran passed, 1 a case failed or no case ran, 2 usage.

examples:
  PYTHONPATH=/tmp/site python benchmarks/bench_serve.py --work /tmp/bench --deadline 480
  PYTHONPATH=/tmp/site python benchmarks/bench_serve.py --cases full:Q4_K_M:CUSTOM --quick
  PYTHONPATH=/tmp/site:scripts python benchmarks/bench_serve.py --cases tp8:Q4_K_M:CUSTOM:mtp1
  PYTHONPATH=/tmp/site:scripts python benchmarks/bench_serve.py \
      --cases tp8:Q4_K_M:CUSTOM,tp8:Q4_K_M:CUSTOM:glm52 --quick
  PYTHONPATH=/tmp/site:scripts python benchmarks/bench_serve.py \
      --cases tp8:Q4_K_M:CUSTOM,tp8:Q4_K_M:CUSTOM:fp8 --quick
  python benchmarks/bench_serve.py --list-cases
  python benchmarks/bench_serve.py --report benchmarks/results/serve-h200-2026-12-04.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

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
CASE_FORMAT = "view:mix:backend[:mtpK|glm52|fp8]"
GLM52 = "glm52"  # the case suffix of GLM-5.2 (the writer's --generation 5.2)
FP8 = "fp8"  # the case suffix of the fp8_ds_mla KV cache (issue 19)
KV_FP8 = "fp8_ds_mla"  # its vLLM kv_cache_dtype
# the utilization issue 19 states KV capacity at; bench runs before 2026-12-07 used 0.88
GPU_MEMORY_UTILIZATION = 0.85
MTP_TARGET = 2 / 78  # issue 17: one draft step <= 2/78 of a target step (one layer + the head)
ACCEPTANCE = (0.8, 0.9)  # published first-draft-token acceptance (DeepSeek's figures)
TP8_RANKS = 8  # a TP8 rank's lm_head holds 1/8 of the vocabulary
MTP_CAVEATS = [
    "tp8 view: the lm_head is the full 154,880-row vocabulary on one GPU; a real TP8 rank's head "
    "is vocab-split 8 ways, so the draft's (one layer + head) and target's head costs are "
    "overstated: the 'tp8_head' rows cut the measured head share to 1/8",
    "random routing: 1 + K tokens reach up to 8 (1 + K) distinct experts, so the verify step is "
    "pessimistic against real weights (whose consecutive tokens share experts)",
    "acceptance with random weights is meaningless: the speed-up uses published rates "
    f"{ACCEPTANCE} for the first draft token (K = 1 only)",
    "the 78-layer target is estimate_78's (an extrapolation); verify_78 = target_78 + "
    "(verify - target, measured) x 75 / the view's MoE layers (all of the extra on MoE layers: "
    "pessimistic); the draft is measured, not extrapolated",
    "vLLM 0.23.0 gives the draft piecewise CUDA graphs only (none under this benchmark's "
    "no-compile FULL_DECODE_ONLY; see 'drafter'), so an eager draft's event time includes "
    "launch gaps (compare its host time); its profiled kernel time is the graphed lower bound",
]


class CaseError(ValueError):
    """A bad --cases entry: printed as one `error: ...` line, exit 2."""


class Case(NamedTuple):
    """One --cases entry: view:mix:backend and the optional 4th field, mtpK (k = 0 without it),
    glm52 (generation "5.2": the GLM-5.2 IndexShare file) or fp8 (kv "fp8_ds_mla": the same
    file served with vLLM's fp8 MLA cache rows)."""

    view: str
    mix: str
    backend: str
    k: int = 0
    generation: str = "5"
    kv: str = "auto"

    @property
    def nextn(self) -> int:
        """1 when the case drafts: its GGUF carries the nextn block."""
        return 1 if self.k else 0

    @property
    def file_key(self) -> str:
        """The generated file's key (results["gen"]): a nextn file never shares a plain one's."""
        return f"{self.view}:{self.mix}" + (":nextn1" if self.nextn else "") + self._glm52

    @property
    def _glm52(self) -> str:
        return f":{GLM52}" if self.generation == "5.2" else ""

    def __str__(self) -> str:
        mtp = f":mtp{self.k}" if self.k else ""
        fp8 = f":{FP8}" if self.kv == KV_FP8 else ""
        return f"{self.view}:{self.mix}:{self.backend}{mtp}{self._glm52}{fp8}"


def parse_case(text: str) -> Case:
    """`view:mix:backend[:mtpK|glm52]` -> Case; CaseError names the bad field."""
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise CaseError(f"bad case {text!r}: {CASE_FORMAT}")
    view, mix, backend = parts[:3]
    if view not in LAYERS:
        raise CaseError(f"bad case {text!r}: view {view!r} is not one of {sorted(LAYERS)}")
    if backend not in DTYPE:
        raise CaseError(f"bad case {text!r}: backend {backend!r} is not one of {sorted(DTYPE)}")
    k, generation, kv = 0, "5", "auto"
    if len(parts) == 4 and parts[3] == GLM52:
        generation = "5.2"
    elif len(parts) == 4 and parts[3] == FP8:
        kv = KV_FP8
    elif len(parts) == 4:
        m = re.fullmatch(r"mtp([1-3])", parts[3])
        if m is None:
            raise CaseError(f"bad case {text!r}: 4th field {parts[3]!r} is not mtp1, mtp2 or "
                            f"mtp3 (MTP draft tokens K = 1..3), {GLM52} (GLM-5.2's "
                            f"IndexShare) or {FP8} (the fp8_ds_mla KV cache)")  # fmt: skip
        k = int(m[1])
    return Case(view, mix, backend, k, generation, kv)


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


def gen_name(view: str, mix: str, nextn: int = 0, generation: str = "5") -> str:
    """The folder (and merged file) name of one generated checkpoint."""
    glm52 = f"-{GLM52}" if generation == "5.2" else ""
    return f"{view}-{mix}" + ("-nextn1" if nextn else "") + glm52


def gen_command(
    work: Path,
    view: str,
    mix: str,
    layers: int,
    experts: int,
    nextn: int = 0,
    generation: str = "5",
) -> list[str]:
    name = gen_name(view, mix, nextn, generation)
    stem = work / name
    return [
        sys.executable, "-c",
        "import sys, glm5_gguf_writer as w; sys.exit(w.main(sys.argv[1:]))",
        "--mix", mix, "--view", view, "--layers", str(layers), "--experts", str(experts),
        *(["--nextn", "1"] if nextn else []),
        *(["--generation", generation] if generation != "5" else []),
        "--out", str(stem / "shards" / f"GLM-5-{name}.gguf"), "--split-max-tensors", "24",
        "--hf-dir", str(stem / "hf"), "--force",
    ]  # fmt: skip


def start_generation(
    work: Path, view: str, mix: str, layers: int, experts: int, nextn: int = 0,
    generation: str = "5",
):  # fmt: skip
    d = work / gen_name(view, mix, nextn, generation)
    done = d / "gen.json"
    if done.exists():  # a later call on the same (warm) machine reuses the merged file
        info = json.loads(done.read_text())
        same = info.get("layers") == layers and info.get("experts") == experts
        same = same and info.get("nextn", 0) == nextn
        same = same and info.get("generation", "5") == generation
        if same and Path(info.get("gguf", "")).exists():
            return {"info": info | {"reused": True}, "dir": d}
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=f"{SCRIPTS}:{os.environ.get('PYTHONPATH', '')}")
    log_f = open(d / "gen.log", "w")  # noqa: SIM115  (closed by finish_generation)
    t0 = time.time()
    proc = subprocess.Popen(gen_command(work, view, mix, layers, experts, nextn, generation),
                            env=env, stdout=log_f, stderr=subprocess.STDOUT)  # fmt: skip
    return {"proc": proc, "log": log_f, "t0": t0, "dir": d, "nextn": nextn}


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
    if job.get("nextn"):  # the service's own check (header only) before any GPU time goes to it
        nx = subprocess.run([sys.executable, str(SCRIPTS / "gguf_nextn.py"), str(merged)],
                            capture_output=True, text=True, env=env)  # fmt: skip
        info["nextn_check"] = {"rc": nx.returncode, "out": (nx.stdout + nx.stderr).strip()}
        if nx.returncode != 0:
            info["error"] = "gguf_nextn.py refused the file: " + nx.stderr.strip()
            return info
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


class StepTimer:
    """CUDA events around the target forward (GPUModelRunner.execute_model) and the MTP draft
    (EagleProposer.propose, vLLM 0.23.0's proposer for method "mtp": the MTP layer over the
    step's 1 + K tokens per request, the head, then K - 1 single-token passes), installed on
    the classes in this process before the engine starts (the engine runs in-process). A
    benchmark-only wrapper: it changes no argument and no result. Each call is kept with its
    token count (execute_model: scheduled tokens; propose: target tokens), so decode steps are
    told apart from prefill by count. `arm(kind, tokens, n)` runs the next n such calls under
    the torch profiler (synchronised, so their event times are not used) for a kernel-family
    breakdown of the draft alone and of the verify forward alone."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, object, object, float]] = []
        self.armed: dict[str, tuple[int, int]] = {}
        self.profiles: dict[str, dict] = {}
        self.drafter: dict = {}

    def install(self) -> None:
        from vllm.v1.spec_decode.eagle import EagleProposer
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        GPUModelRunner.execute_model = self._wrap("target", GPUModelRunner.execute_model,
                                                  _scheduled_tokens)  # fmt: skip
        EagleProposer.propose = self._wrap("draft", EagleProposer.propose, _target_tokens)

    def _wrap(self, kind: str, fn, tokens_of):
        timer = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            import torch

            tokens = tokens_of(args, kwargs)
            if kind == "draft" and not timer.drafter:
                disp = getattr(args[0], "cudagraph_dispatcher", None)
                mode = str(getattr(disp, "cudagraph_mode", None))
                timer.drafter = {"class": type(args[0]).__name__, "cudagraph_mode": mode}
            want, left = timer.armed.get(kind, (-1, 0))
            if left > 0 and tokens == want:
                timer.armed[kind] = (want, left - 1)
                return timer._profiled(kind, fn, args, kwargs)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            timer.calls.append((kind, tokens, start, end, time.perf_counter() - t0))
            return out

        return timed

    def _profiled(self, kind: str, fn, args, kwargs):
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=acts) as prof:
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()
        acc = self.profiles.setdefault(kind, {"calls": 0, "kernels": {}})
        acc["calls"] += 1
        for name, us in _kernel_table(prof).items():
            acc["kernels"][name] = acc["kernels"].get(name, 0.0) + us
        return out

    def arm(self, kind: str, tokens: int, n: int) -> None:
        self.armed[kind] = (tokens, n)

    def reset(self) -> None:
        self.calls = []

    def summary(self, tokens: int) -> dict:
        """Per kind, the calls with exactly `tokens` tokens (this run's decode steps): median
        and mean GPU µs between the events, median host µs of the call."""
        import torch

        torch.cuda.synchronize()
        out: dict = {}
        for kind in ("target", "draft"):
            gpu = sorted(s.elapsed_time(e) * 1e3 for k, t, s, e, _ in self.calls
                         if k == kind and t == tokens)  # fmt: skip
            cpu = sorted(c * 1e6 for k, t, _, _, c in self.calls if k == kind and t == tokens)
            if gpu:
                out[kind] = {"tokens": tokens, "calls": len(gpu),
                             "median_us": round(gpu[len(gpu) // 2], 1),
                             "mean_us": round(sum(gpu) / len(gpu), 1),
                             "host_median_us": round(cpu[len(cpu) // 2], 1)}  # fmt: skip
        return out

    def profile_summary(self) -> dict:
        out = {}
        for kind, acc in self.profiles.items():
            n = max(acc["calls"], 1)
            top = sorted(acc["kernels"].items(), key=lambda kv: -kv[1])[:15]
            out[kind] = {
                "calls": acc["calls"],
                "gpu_us_per_call": round(sum(acc["kernels"].values()) / n, 1),
                "breakdown_us_per_call": _by_family(acc["kernels"], n),
                "top_kernels_us_per_call": {k[:160]: round(v / n, 1) for k, v in top},
            }
        return out


def _scheduled_tokens(args: tuple, kwargs: dict) -> int:
    so = kwargs.get("scheduler_output", args[1] if len(args) > 1 else None)
    return int(getattr(so, "total_num_scheduled_tokens", -1))


def _target_tokens(args: tuple, kwargs: dict) -> int:
    ids = kwargs.get("target_token_ids", args[1] if len(args) > 1 else None)
    return int(ids.shape[0]) if ids is not None else -1


class Engine:
    """vLLM's LLMEngine driven step by step in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0),
    so step times and the torch profiler see the model's own kernels."""

    def __init__(self, llm, vocab: int, timer: StepTimer | None = None, spec_k: int = 0) -> None:
        from vllm import SamplingParams

        self.engine = llm.llm_engine
        self.vocab = vocab
        self.uid = 0
        self.SamplingParams = SamplingParams
        self.timer = timer
        self.spec_k = spec_k  # tokens per request in a decode step: 1 + spec_k

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
        if self.timer is not None:
            self.timer.reset()
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
        if self.timer is not None:
            res["timer"] = self.timer.summary(n * (1 + self.spec_k))
            if plain:  # > 1 when drafts were accepted (random weights: ~1)
                res["tokens_per_step"] = round(decode_tokens / n / len(plain), 3)
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
    case = parse_case(args.case)
    backend = case.backend
    dtype = DTYPE[backend]
    spec_k = args.spec_k  # None: a plain case; 0 / K: the two children of an MTP case
    out["spec_k"] = spec_k
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
        gpu_memory_utilization=args.gpu_memory_utilization, enable_prefix_caching=False, seed=0,
        kv_cache_dtype=case.kv,
    )  # fmt: skip
    out["kv_cache_dtype"] = case.kv
    out["gpu_memory_utilization"] = args.gpu_memory_utilization
    timer = None
    if spec_k is not None:
        timer = StepTimer()
        timer.install()
    if spec_k:
        # as the service renders it (vllm_service_speculative_tokens): the draft on our backend
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": spec_k,
                                        "attention_backend": backend}  # fmt: skip
    # graph sizes count tokens: a verify step is batch x (1 + K)
    sizes = sorted({b * (1 + (spec_k or 0)) for b in args.batches})
    compile_cfgs = [
        {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": sizes},
        {"cudagraph_capture_sizes": sizes},
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
    eng = Engine(llm, cfg["vocab_size"], timer, spec_k or 0)
    t_w = time.time()
    eng.run(1, 1024, 8)  # warm-up: Triton JIT of prefill and decode paths
    eng.run(max(args.batches), 256, 8)
    out["warmup_s"] = round(time.time() - t_w, 1)
    deadline = time.time() + args.case_budget
    out["prefill"] = []
    for ctx in args.contexts if spec_k is None else []:  # MTP cases: decode only
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
    if spec_k:  # whole-step profiles would mix draft and target: StepTimer profiles each alone
        prof_points = set()
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
    if timer is not None:
        # batch 1: the next 8 decode forwards (and drafts) alone under the profiler
        timer.arm("target", 1 + spec_k, 8)
        if spec_k:
            timer.arm("draft", 1 + spec_k, 8)
        try:
            eng.run(1, min(args.contexts), 12)
            out["step_profile"] = timer.profile_summary()
        except Exception as exc:  # the event timings stand without it
            out.setdefault("errors", []).append(f"step profile: {type(exc).__name__}: {exc}")
        out["drafter"] = timer.drafter
    elif time.time() < deadline:
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


def layer_bytes(view: str, mix: str, layers: int, experts: int, generation: str = "5") -> dict:
    """Q8_0 (non-expert) bytes per dense and per MoE layer, from the writer's plan."""
    w = _writer()
    geom = dataclasses.replace(w.VIEWS[view](layers, experts), generation=generation)
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
    c = parse_case(case["case"])
    lb = layer_bytes(c.view, c.mix, gen["layers"], gen["experts"], c.generation)
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


def mtp_speedup(
    t_target_us: float, t_verify_us: float, t_draft_us: float, acceptance: float
) -> tuple[float, str]:
    """Single-stream speed-up of MTP with K = 1 at first-draft-token acceptance `acceptance`.

    Without MTP a step costs t_target and yields 1 token. With K = 1 it costs one draft (t_draft)
    plus one target forward over 2 tokens (t_verify) and yields 1 + a tokens on average (the
    verified token, plus the draft when accepted):
        speed-up = (1 + a) * t_target / (t_verify + t_draft)
    Returns the value (3 decimals) and the arithmetic as printed. Raises ValueError on a
    non-positive time or an acceptance outside [0, 1]."""
    if min(t_target_us, t_verify_us, t_draft_us) <= 0 or not 0 <= acceptance <= 1:
        raise ValueError(f"mtp_speedup: times must be > 0 and 0 <= a <= 1, got "
                         f"{t_target_us}, {t_verify_us}, {t_draft_us}, a={acceptance}")  # fmt: skip
    x = (1 + acceptance) * t_target_us / (t_verify_us + t_draft_us)
    text = (f"(1 + {acceptance}) x {t_target_us:.1f} / ({t_verify_us:.1f} + {t_draft_us:.1f}) "
            f"= {x:.3f}x")  # fmt: skip
    return round(x, 3), text


def mtp_estimate(
    est78: dict,
    *,
    k: int,
    target_us: float,
    verify_us: float,
    draft_us: float,
    n_moe: int,
    target_head_us: float,
    draft_head_us: float,
) -> dict:
    """The MTP figures of one case from the N-layer measurements at batch 1 (µs, H200):
    target_us (k = 0 forward), verify_us (forward over 1 + K tokens), draft_us (propose), and
    est78, estimate_78 of the k = 0 run (its 78-layer H200 step, pessimistic and optimistic).

    target_78 = est78's step; verify_78 = target_78 + (verify_us - target_us) x 75 / n_moe (the
    view's MoE layers carry all of the extra: pessimistic); the draft (one layer + head) as
    measured. "full_head" keeps the view's full-vocabulary head; "tp8_head" cuts the target's
    and the draft's measured head time to 1/8, as a TP8 rank's vocab shard. The ratio draft /
    target_78 is checked against MTP_TARGET (2/78); the speed-up (K = 1 only) is mtp_speedup at
    ACCEPTANCE, on the H200 and for 8x RTX PRO 6000 (x bandwidth_scale, + 2 all-reduces per
    layer: 78 in the target and the verify, 1 in the draft). An estimate, not a measurement."""
    scale, ar = est78["bandwidth_scale"], est78["allreduce_us_assumed"]
    extra = verify_us - target_us
    out: dict = {"label": "ESTIMATE (78 layers extrapolated; draft measured)", "k": k,
                 "measured_us": {"target": target_us, "verify": verify_us, "draft": draft_us,
                                 "target_head": target_head_us, "draft_head": draft_head_us},
                 "n_moe": n_moe, "target_ratio": round(MTP_TARGET, 4)}  # fmt: skip
    for bound in ("pessimistic", "optimistic"):
        for head in ("full_head", "tp8_head"):
            cut = (1 - 1 / TP8_RANKS) if head == "tp8_head" else 0.0
            t78 = est78[bound]["h200_78_layer_step_us"] - target_head_us * cut
            v78 = t78 + extra * 75 / n_moe
            d = draft_us - draft_head_us * cut
            row: dict = {
                "target_78_us": round(t78, 1),
                "verify_78_us": round(v78, 1),
                "verify_78_arithmetic": f"{t78:.1f} + {extra:.1f} x 75 / {n_moe} = {v78:.1f}",
                "draft_us": round(d, 1),
                "draft_ratio": round(d / t78, 4),
                "draft_ratio_arithmetic": f"{d:.1f} / {t78:.1f} = {d / t78:.4f} "
                f"({'<=' if d / t78 <= MTP_TARGET else '>'} 2/78 = {MTP_TARGET:.4f})",
                "meets_2_78": d / t78 <= MTP_TARGET,
            }
            if k == 1:
                pro_t = t78 * scale + 78 * 2 * ar
                pro_v = v78 * scale + 78 * 2 * ar
                pro_d = d * scale + 2 * ar
                for a in ACCEPTANCE:
                    x, text = mtp_speedup(t78, v78, d, a)
                    px, ptext = mtp_speedup(pro_t, pro_v, pro_d, a)
                    row[f"speedup_a{a}"] = {
                        "h200": x, "h200_arithmetic": text, "pro6000_tp8": px,
                        "pro6000_tp8_arithmetic": ptext,
                        "pro6000_tp8_tok_s": round((1 + a) * 1e6 / (pro_v + pro_d), 1),
                    }  # fmt: skip
            out[f"{bound}_{head}"] = row
    if k != 1:
        out["speedup"] = "K = 1 only (published acceptance is the first draft token's)"
    return out


LAYER_FAMILIES = ("attention", "indexer_logits", "topk", "dense_gemm", "dense_gguf", "other")


def mtp_kernel_estimate(
    est78: dict,
    *,
    target_fam: dict,
    verify_fam: dict,
    draft_gpu_us: float,
    draft_head_us: float,
    n_layers: int,
    n_moe: int,
) -> dict:
    """The K = 1 figures from kernel time alone (torch-profiler sums per call at batch 1), the
    graphed bound: the event-timed verify of vLLM 0.23.0 also holds launch gaps (it is not
    replayed as one graph there), and the event-based verify_78 multiplies them, and the extra
    lm_head row, by 75 / n_moe. Here the verify's extra over the k = 0 step is split by family:
    lm_head once, moe_gguf x 75 / n_moe, every other family x 78 / n_layers ("other" per layer:
    pessimistic); the draft is its profiled kernel time. target_78 is est78's pessimistic step
    (kernel-based too). An estimate, not a measurement."""
    delta = {f: verify_fam.get(f, 0.0) - target_fam.get(f, 0.0)
             for f in (*LAYER_FAMILIES, "moe_gguf", "lm_head")}  # fmt: skip
    per_layer = sum(delta[f] for f in LAYER_FAMILIES)
    extra_78 = delta["lm_head"] + delta["moe_gguf"] * 75 / n_moe + per_layer * 78 / n_layers
    out: dict = {"label": "ESTIMATE from kernel time (graphed bound; 78 layers extrapolated)",
                 "delta_us": {k: round(v, 1) for k, v in delta.items()}}  # fmt: skip
    for head in ("full_head", "tp8_head"):
        cut = (1 - 1 / TP8_RANKS) if head == "tp8_head" else 0.0
        head_delta = delta["lm_head"] * cut
        t78 = est78["pessimistic"]["h200_78_layer_step_us"] - target_fam.get("lm_head", 0.0) * cut
        v78 = t78 + extra_78 - head_delta
        d = draft_gpu_us - draft_head_us * cut
        row: dict = {
            "target_78_us": round(t78, 1),
            "verify_78_us": round(v78, 1),
            "verify_78_arithmetic": (
                f"{t78:.1f} + {delta['lm_head'] - head_delta:.1f} (head) + "
                f"{delta['moe_gguf']:.1f} x 75 / {n_moe} + {per_layer:.1f} x 78 / {n_layers} "
                f"= {v78:.1f}"
            ),
            "draft_us": round(d, 1),
            "draft_ratio": round(d / t78, 4),
            "draft_ratio_arithmetic": f"{d:.1f} / {t78:.1f} = {d / t78:.4f} "
            f"({'<=' if d / t78 <= MTP_TARGET else '>'} 2/78 = {MTP_TARGET:.4f})",
            "meets_2_78": d / t78 <= MTP_TARGET,
        }
        for a in ACCEPTANCE:
            x, text = mtp_speedup(t78, v78, d, a)
            row[f"speedup_a{a}"] = {"h200": x, "h200_arithmetic": text}
        out[f"kernels_{head}"] = row
    return out


def _b1(case: dict) -> dict | None:
    return next((d for d in case.get("decode", []) if d["n"] == 1 and "timer" in d), None)


def mtp_summary(case: dict, gen: dict) -> dict | None:
    """mtp_estimate from an MTP case's JSON (k = K child, its k = 0 child under "base");
    None when a figure is missing (the reason under "missing")."""
    c = parse_case(case["case"])
    base = case.get("base", {})
    est = base.get("estimate_78") or estimate_78(base, gen) if base else None
    b1, b1_base = _b1(case), _b1(base)
    need = {
        "estimate_78 of the k=0 run": est,
        "k=0 target_us at batch 1": b1_base and b1_base["timer"].get("target"),
        "verify_us at batch 1": b1 and b1["timer"].get("target"),
        "draft_us at batch 1": b1 and b1["timer"].get("draft"),
    }
    missing = [k for k, v in need.items() if not v]
    if missing:
        return {"missing": missing}
    # the head's measured share: the draft's own profile, else the k = 0 step's lm_head
    fam = case.get("step_profile", {}).get("draft", {}).get("breakdown_us_per_call", {})
    draft_head = fam.get("lm_head", est["h200_lm_head_us"])
    lb = layer_bytes(c.view, c.mix, gen["layers"], gen["experts"])
    out = mtp_estimate(
        est, k=c.k, target_us=b1_base["timer"]["target"]["median_us"],
        verify_us=b1["timer"]["target"]["median_us"], draft_us=b1["timer"]["draft"]["median_us"],
        n_moe=lb["n_moe"], target_head_us=est["h200_lm_head_us"], draft_head_us=draft_head,
    )  # fmt: skip
    out["drafter"] = case.get("drafter")
    prof, base_prof = case.get("step_profile", {}), base.get("step_profile", {})
    if c.k == 1 and all(k in prof for k in ("draft", "target")) and "target" in base_prof:
        out["kernels"] = mtp_kernel_estimate(
            est, target_fam=base_prof["target"]["breakdown_us_per_call"],
            verify_fam=prof["target"]["breakdown_us_per_call"],
            draft_gpu_us=prof["draft"]["gpu_us_per_call"], draft_head_us=draft_head,
            n_layers=lb["n_dense"] + lb["n_moe"], n_moe=lb["n_moe"],
        )  # fmt: skip
    return out


def mtp_lines(c: dict) -> list[str]:
    """The printed MTP block of one case."""
    rows = [f"{c['case']:30s} MTP K={parse_case(c['case']).k}, drafter {c.get('drafter')}"]
    base = {d["n"]: d for d in c.get("base", {}).get("decode", []) if "timer" in d}
    for d in c.get("decode", []):
        t = d.get("timer", {})
        b = base.get(d["n"], {}).get("timer", {}).get("target", {})
        rows.append(f"  b{d['n']}@{d['prompt'] // 1024}k: target (k=0) {b.get('median_us')} us, "
                    f"verify {t.get('target', {}).get('median_us')} us, draft "
                    f"{t.get('draft', {}).get('median_us')} us (host "
                    f"{t.get('draft', {}).get('host_median_us')} us), "
                    f"{d.get('tokens_per_step')} tokens/step")  # fmt: skip
    prof = c.get("step_profile", {})
    for kind in ("draft", "target"):
        if kind in prof:
            fam = " ".join(f"{k}={v}" for k, v in prof[kind]["breakdown_us_per_call"].items())
            rows.append(f"  b1 {'draft' if kind == 'draft' else 'verify'} kernels "
                        f"{prof[kind]['gpu_us_per_call']} us: {fam}")  # fmt: skip
    m = c.get("mtp_estimate")
    if not m or "missing" in m:
        rows.append(f"  no MTP estimate: missing {m and m.get('missing')}")
        return rows
    rows.append(f"  {m['label']}, batch 1:")
    for key in ("pessimistic_full_head", "optimistic_full_head", "pessimistic_tp8_head",
                "optimistic_tp8_head"):  # fmt: skip
        r = m[key]
        rows.append(f"  {key}: verify_78 {r['verify_78_arithmetic']}; draft/target_78 "
                    f"{r['draft_ratio_arithmetic']}")  # fmt: skip
        for a in ACCEPTANCE:
            if f"speedup_a{a}" in r:
                sp = r[f"speedup_a{a}"]
                pro = f"{sp['pro6000_tp8_arithmetic']} -> {sp['pro6000_tp8_tok_s']} tok/s"
                rows.append(f"    a={a}: H200 {sp['h200_arithmetic']}; 8x PRO 6000 {pro}")
    if "speedup" in m:
        rows.append(f"  speed-up: {m['speedup']}")
    kern = m.get("kernels")
    if kern:
        rows.append(f"  {kern['label']}, batch 1: verify - target by family {kern['delta_us']}")
        for key in ("kernels_full_head", "kernels_tp8_head"):
            r = kern[key]
            rows.append(f"  {key}: verify_78 {r['verify_78_arithmetic']}; draft/target_78 "
                        f"{r['draft_ratio_arithmetic']}")  # fmt: skip
            for a in ACCEPTANCE:
                rows.append(f"    a={a}: H200 {r[f'speedup_a{a}']['h200_arithmetic']}")
    return rows


INDEX_SHARE_CAVEATS = [
    "step = the median full-batch decode step (host wall time of engine.step, CUDA graphs), "
    "step_ms where absent; the saving is 5 minus 5.2 (positive: 5.2 is faster)",
    "indexer_logits+topk: the torch-profiler families, profiled at (1, longest context) and "
    "(largest batch, shortest context) only; '-' elsewhere",
    "ESTIMATE 78 layers = saving / the view's shared layers x GLM-5.2's shared layers (57 of "
    "78): no communication; the glm52 case's own estimate_78 row spreads its view's share of "
    "shared layers over 78 layers, so read this one instead",
]


def _step_us(d: dict) -> tuple[float | None, str]:
    for key in ("median_full_step_ms", "step_ms"):
        if d.get(key) is not None:
            return d[key] * 1e3, key
    return None, ""


def _indexer_us(d: dict) -> float | None:
    b = d.get("breakdown_us_per_step")
    return None if b is None else round(b.get("indexer_logits", 0.0) + b.get("topk", 0.0), 1)


def _twin_cases(results: dict, field: str, value: str) -> Iterator[tuple[str, dict, str, dict]]:
    """(name, result, twin name, twin result) of each case with `field` == value whose twin, the
    same case with the field at its default (the plain case), ran too; both without error."""
    ok = {c["case"]: c for c in results.get("cases", []) if "error" not in c}
    for name, c in ok.items():
        case = parse_case(name)
        if getattr(case, field) != value or case.k:
            continue
        base = str(case._replace(**{field: Case._field_defaults[field]}))
        if base in ok:
            yield name, c, base, ok[base]


def _decode_twins(c: dict, base: dict) -> Iterator[tuple[dict, dict, tuple, tuple]]:
    """(point, twin point, (step us, key), twin's (step us, key)) of each decode point (batch,
    context) both cases ran with a step time."""
    by_point = {(d["n"], d["prompt"]): d for d in base.get("decode", [])}
    for d in c.get("decode", []):
        db = by_point.get((d["n"], d["prompt"]))
        t, tb = _step_us(d), _step_us(db) if db else (None, "")
        if t[0] is not None and tb[0] is not None:
            yield d, db, t, tb


def index_share_summary(results: dict) -> list[dict]:
    """For each `view:mix:backend:glm52` case whose plain `view:mix:backend` ran too (both
    without error): per decode point both step times, the saving (5 - 5.2) in µs and %, the
    profiled indexer_logits + topk per step of each, and the ESTIMATE for 78 layers (saving per
    shared layer of the view x the shared layers of 78 by the writer's IndexShare rule)."""
    w = _writer()
    share = w.GENERATIONS["5.2"]
    shared_78 = w.index_share_types(78, *share).count("shared")
    out = []
    for name, c52, base, c5 in _twin_cases(results, "generation", "5.2"):
        gen = results.get("gen", {}).get(parse_case(name).file_key, {})
        if "layers" not in gen:
            continue
        shared = [i for i, t in enumerate(w.index_share_types(gen["layers"], *share))
                  if t == "shared"]  # fmt: skip
        row: dict = {"case": name, "base_case": base, "layers": gen["layers"],
                     "shared_layers": shared, "shared_78": shared_78, "points": []}  # fmt: skip
        for d52, d, (t52, key), (t5, key5) in _decode_twins(c52, c5):
            saving = t5 - t52
            pt = {"batch": d52["n"], "context": d52["prompt"], "step_key": key,
                  "step_us_5": round(t5, 1), "step_us_52": round(t52, 1),
                  "saving_us": round(saving, 1), "saving_pct": round(100 * saving / t5, 2),
                  "indexer_us_5": _indexer_us(d), "indexer_us_52": _indexer_us(d52)}  # fmt: skip
            if key5 != key:
                pt["step_key_5"] = key5
            if shared:
                per = saving / len(shared)
                pt["estimate_78"] = {
                    "label": "ESTIMATE (extrapolated, not measured)",
                    "saving_per_shared_layer_us": round(per, 1),
                    "saving_us": round(per * shared_78, 1),
                    "arithmetic": f"{saving:.1f} / {len(shared)} x {shared_78} = "
                    f"{per * shared_78:.1f} us",
                }
            row["points"].append(pt)
        out.append(row)
    return out


def index_share_lines(summary: list[dict]) -> list[str]:
    """The printed IndexShare block: one line per decode point of each glm52 / plain pair."""
    rows: list[str] = []
    for r in summary:
        rows.append(f"IndexShare (issue 18): {r['case']} vs {r['base_case']}, shared layers "
                    f"{r['shared_layers']} of {r['layers']}")  # fmt: skip
        for pt in r["points"]:
            idx = "/".join(str(pt[k]) if pt[k] is not None else "-"
                           for k in ("indexer_us_52", "indexer_us_5"))  # fmt: skip
            line = (f"  {pt['batch']}x{pt['context'] // 1024}k: step 5.2 {pt['step_us_52']} us vs "
                    f"5 {pt['step_us_5']} us, saving {pt['saving_us']} us "
                    f"({pt['saving_pct']}%); indexer_logits+topk 5.2/5 {idx} us/step")  # fmt: skip
            if "estimate_78" in pt:
                e = pt["estimate_78"]
                line += (f"; ESTIMATE 78 layers: {e['saving_per_shared_layer_us']} us/shared "
                         f"layer x {r['shared_78']} = {e['saving_us']} us/step")  # fmt: skip
            rows.append(line)
        if not r["points"]:
            rows.append("  no decode point ran in both")
    if summary:
        rows.extend(f"  caveat: {x}" for x in INDEX_SHARE_CAVEATS)
    return rows


# bytes per token per layer of the two MLA rows (vLLM's fp8_ds_mla: 512 e4m3 + 4 fp32 scales + 64
# bf16 RoPE); the indexer's own key cache is the same in both and not counted here. A copy of
# vllm_sparse_mla.kernels._dims (that package needs torch; a runtime-tier test holds them equal)
KV_ROW_BYTES = {"auto": 576 * 2, KV_FP8: 512 + 4 * 4 + 64 * 2}


def kv_capacity_summary(results: dict) -> list[dict]:
    """For each `view:mix:backend:fp8` case whose plain twin ran too (both without error, same
    utilization): vLLM's KV tokens and KV GiB of each, their ratio beside the MLA row-byte ratio
    (1152 / 656), and the decode step of each at the points both ran (issue 19's capacity)."""
    out = []
    for name, c8, base, c16 in _twin_cases(results, "kv", KV_FP8):
        m8, m16 = c8.get("memory", {}), c16.get("memory", {})
        row: dict = {"case": name, "base_case": base,
                     "gpu_memory_utilization": c8.get("gpu_memory_utilization"),
                     "kv_tokens_fp8": m8.get("kv_tokens"), "kv_tokens_16bit": m16.get("kv_tokens"),
                     "kv_gib_fp8": m8.get("kv_cache_gib"), "kv_gib_16bit": m16.get("kv_cache_gib"),
                     "row_bytes_ratio": round(KV_ROW_BYTES["auto"] / KV_ROW_BYTES[KV_FP8], 3),
                     "points": []}  # fmt: skip
        if c16.get("gpu_memory_utilization") != row["gpu_memory_utilization"]:
            row["warning"] = "the two cases ran at different --gpu-memory-utilization"
        if row["kv_tokens_fp8"] and row["kv_tokens_16bit"]:
            row["kv_tokens_ratio"] = round(row["kv_tokens_fp8"] / row["kv_tokens_16bit"], 3)
        for d8, _, (t8, _), (t16, _) in _decode_twins(c8, c16):
            row["points"].append({"batch": d8["n"], "context": d8["prompt"],
                                  "step_us_fp8": round(t8, 1), "step_us_16bit": round(t16, 1),
                                  "speedup": round(t16 / t8, 3)})  # fmt: skip
        out.append(row)
    return out


def kv_capacity_lines(summary: list[dict]) -> list[str]:
    rows: list[str] = []
    for r in summary:
        ratio = r.get("kv_tokens_ratio", "?")
        rows.append(f"KV capacity (issue 19): {r['case']} vs {r['base_case']} at utilization "
                    f"{r['gpu_memory_utilization']}: {r['kv_tokens_fp8']} vs "
                    f"{r['kv_tokens_16bit']} tokens ({ratio}x; MLA rows "
                    f"{r['row_bytes_ratio']}x)")  # fmt: skip
        if "warning" in r:
            rows.append(f"  warning: {r['warning']}")
        for pt in r["points"]:
            rows.append(f"  {pt['batch']}x{pt['context'] // 1024}k: step fp8 {pt['step_us_fp8']} "
                        f"us vs 16-bit {pt['step_us_16bit']} us ({pt['speedup']}x)")  # fmt: skip
    return rows


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
    mtp = [c for c in results["cases"] if parse_case(c["case"]).k and "error" not in c]
    if mtp:
        rows.append("")
        rows.append("MTP draft vs target step (issue 17; caveats below)")
        for c in mtp:
            rows.extend(mtp_lines(c))
        rows.extend(f"  caveat: {x}" for x in MTP_CAVEATS)
    share = index_share_summary(results)
    if share:
        rows.append("")
        rows.extend(index_share_lines(share))
    capacity = kv_capacity_summary(results)
    if capacity:
        rows.append("")
        rows.extend(kv_capacity_lines(capacity))
    for c in results["cases"]:
        if c.get("estimate_78"):
            e = c["estimate_78"]
            lo, hi = e["pessimistic"], e["optimistic"]
            rows.append(f"{c['case']:30s} {e['label']}: 78 layers, batch 1, ctx "
                        f"{e['context'] // 1024}k: H200 {lo['h200_tok_s']}-{hi['h200_tok_s']} "
                        f"tok/s; 8x PRO 6000 TP8 {lo['pro6000_tp8_tok_s']}-"
                        f"{hi['pro6000_tp8_tok_s']} tok/s")  # fmt: skip
    return "\n".join(rows)


def run_child(
    args: argparse.Namespace,
    work: Path,
    case: str,
    info: dict,
    left: float,
    spec_k: int | None = None,
    tag: str = "",
) -> dict:
    """One child process measuring `case` on info's GGUF (spec_k: an MTP case's k = 0 or K)."""
    name = case.replace(":", "_") + tag
    res_file = work / f"{name}.json"
    res_file.unlink(missing_ok=True)
    budget = min(args.case_budget, left - 40)
    contexts = args.contexts if spec_k is None else [args.mtp_context]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--case", case,
           "--gguf", info["gguf"], "--hf", info["hf"], "--result", str(res_file),
           "--case-budget", str(int(budget)), "--decode-tokens", str(args.decode_tokens),
           "--gpu-memory-utilization", str(args.gpu_memory_utilization),
           "--contexts", ",".join(map(str, contexts)),
           "--batches", ",".join(map(str, args.batches))]  # fmt: skip
    if spec_k is not None:
        cmd += ["--spec-k", str(spec_k)]
    if args.full_grid:
        cmd.append("--full-grid")
    if args.enforce_eager:
        cmd.append("--enforce-eager")
    t0 = time.time()
    with open(work / f"{name}.log", "w") as lf:
        try:
            p = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                               timeout=max(left - 15, 30))  # fmt: skip
            crc = p.returncode
        except subprocess.TimeoutExpired:
            crc = -9
    if res_file.exists():
        res = json.loads(res_file.read_text())
    else:
        tail = (work / f"{name}.log").read_text()[-3000:]
        res = {"case": case, "error": f"child exit {crc}, no result; log tail: {tail}"}
    res["wall_s"] = round(time.time() - t0, 1)
    if "error" in res:
        res["log_tail"] = (work / f"{name}.log").read_text()[-3000:]
    return res


def run_mtp_case(
    args: argparse.Namespace, work: Path, case: Case, info: dict, deadline_left
) -> dict:
    """An MTP case: k = 0 then k = K, each in its own child on the same nextn GGUF (two engines
    in one process would share GPU memory vLLM does not fully give back). The k = 0 child is the
    baseline (its engine skips the nextn block, patch 0005) and carries the profile
    estimate_78 needs; the K child's result is the case's, with the baseline under "base"."""
    c = str(case)
    log(f"case {c}: k=0 baseline on the nextn file, {deadline_left():.0f} s left")
    base = run_child(args, work, c, info, deadline_left(), spec_k=0, tag="_k0")
    if "error" in base:
        return {"case": c, "error": "k=0 baseline: " + base["error"][:1500], "base": base}
    left = deadline_left()
    if left < args.min_case_s:
        return {"case": c, "error": f"skipped the k={case.k} run: {left:.0f} s left",
                "base": base}  # fmt: skip
    log(f"case {c}: k={case.k}, {left:.0f} s left")
    res = run_child(args, work, c, info, left, spec_k=case.k)
    res["base"] = base
    return res


def parent_main(args: argparse.Namespace) -> int:
    t_start = time.time()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cases = [parse_case(c) for c in (args.cases.split(",") if args.cases else DEFAULT_CASES)]
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "argv": sys.argv, "experts": args.experts, "cases": [], "gen": {}}  # fmt: skip
    try:
        git = ["git", "-C", str(REPO), "rev-parse", "HEAD"]
        results["commit"] = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    except OSError:
        results["commit"] = None
    if any(c.k for c in cases):
        results["mtp_caveats"] = MTP_CAVEATS
    # (view, mix, nextn, generation): a nextn or a GLM-5.2 file is its own
    files: list[tuple[str, str, int, str]] = []
    for c in cases:
        if (c.view, c.mix, c.nextn, c.generation) not in files:
            files.append((c.view, c.mix, c.nextn, c.generation))
    # the writers run two at a time in the background, in case order
    jobs: dict = {}
    pending = list(files)

    def start(key: tuple[str, str, int, str]) -> None:
        view, mix, nextn, generation = key
        layers = args.layers or LAYERS[view]
        jobs[key] = start_generation(work, view, mix, layers, args.experts, nextn, generation)
        jobs[key]["layers"] = layers
        if "info" not in jobs[key]:
            log(
                f"writing {gen_name(view, mix, nextn, generation)} ({layers} layers, "
                f"{args.experts} experts)"
            )

    def top_up() -> None:
        while pending and sum(1 for j in jobs.values() if "info" not in j) < args.gen_parallel:
            start(pending.pop(0))

    def deadline_left() -> float:
        return args.deadline - (time.time() - t_start)

    top_up()
    out_json = Path(args.json)
    rc = 0
    for case in cases:
        c = str(case)
        key = (case.view, case.mix, case.nextn, case.generation)
        left = deadline_left()
        if left < args.min_case_s:
            results["cases"].append({"case": c, "error": f"skipped: {left:.0f} s left"})
            rc = 1
            continue
        if key not in jobs:  # not started yet: start it now, ahead of the queue
            pending.remove(key)
            start(key)
        job = jobs[key]
        if "info" not in job:
            job["info"] = finish_generation(job) | {"layers": job["layers"],
                                                    "experts": args.experts,
                                                    "nextn": case.nextn,
                                                    "generation": case.generation}  # fmt: skip
            if "error" not in job["info"]:
                (job["dir"] / "gen.json").write_text(json.dumps(job["info"]))
            log(f"{case.file_key}: {job['info']}")
            top_up()
        info = job["info"]
        results["gen"][case.file_key] = info
        if "error" in info:
            results["cases"].append({"case": c, "error": info["error"]})
            rc = 1
            continue
        if case.k:
            res = run_mtp_case(args, work, case, info, deadline_left)
        else:
            log(f"case {c}: {left:.0f} s left")
            res = run_child(args, work, c, info, left)
        if "error" not in res:
            res["estimate_78"] = estimate_78(res.get("base", res), info)
            if case.k:
                res["mtp_estimate"] = mtp_summary(res, info)
        else:
            rc = 1
        results["cases"].append(res)
        log(f"case {c} done in {res.get('wall_s', '?')} s" +
            (f": {res['error'][:300]}" if "error" in res else ""))  # fmt: skip
        results["total_s"] = round(time.time() - t_start, 1)
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(results, indent=1))
    for job in jobs.values():  # writers of files no case reached
        if "info" not in job:
            job["proc"].kill()
            job["log"].close()
    results["total_s"] = round(time.time() - t_start, 1)
    results["index_share"] = index_share_summary(results)
    results["kv_capacity"] = kv_capacity_summary(results)
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
    p.add_argument(
        "--cases",
        help=f"comma list of {CASE_FORMAT}; mtpK (K = 1..3) makes an MTP "
        "draft-cost case, e.g. tp8:Q4_K_M:CUSTOM:mtp1; glm52 serves the GLM-5.2 (IndexShare) "
        "file, e.g. tp8:Q4_K_M:CUSTOM:glm52 (default: the priority list)",
    )
    p.add_argument("--list-cases", action="store_true", help="print the default cases and exit")
    p.add_argument("--mtp-context", type=int, default=4096,
                   help="prompt length of MTP cases (default %(default)s)")  # fmt: skip
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
    p.add_argument("--gpu-memory-utilization", type=float, default=GPU_MEMORY_UTILIZATION,
                   help="vLLM's share of GPU memory; KV capacity is stated at it "
                   "(default %(default)s)")  # fmt: skip
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
    p.add_argument("--spec-k", type=int, help=argparse.SUPPRESS)  # an MTP case's child: 0 or K
    args = p.parse_args(argv)
    if args.list_cases:
        print(
            f"{CASE_FORMAT}: views {sorted(LAYERS)}, backends {sorted(DTYPE)}, optional mtpK "
            "(K = 1..3 draft tokens: the MTP draft-cost case, e.g. tp8:Q4_K_M:CUSTOM:mtp1), "
            f"{GLM52} (GLM-5.2's IndexShare file, compared with the plain case: "
            f"tp8:Q4_K_M:CUSTOM,tp8:Q4_K_M:CUSTOM:glm52) or {FP8} (the fp8_ds_mla KV cache, "
            "compared with the plain case: tp8:Q4_K_M:CUSTOM,tp8:Q4_K_M:CUSTOM:fp8)"
        )
        print("default cases:")
        print("\n".join(DEFAULT_CASES))
        return 0
    if args.report:
        res = json.loads(Path(args.report).read_text())
        for c in res["cases"]:  # estimates recomputed: the method may be newer than the run
            g = res.get("gen", {}).get(parse_case(c["case"]).file_key)
            if "error" not in c and g:
                c["estimate_78"] = estimate_78(c.get("base", c), g)
                if "base" in c:
                    c["mtp_estimate"] = mtp_summary(c, g)
        print(table(res))
        return 0
    if args.quick:
        args.contexts, args.batches = [4096], [1, 32]
    try:
        for c in args.cases.split(",") if args.cases else []:
            parse_case(c)
    except CaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.child:
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
