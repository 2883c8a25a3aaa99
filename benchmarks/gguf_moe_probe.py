"""Where vLLM 0.23.0's GGUF MoE kernels stop being right, at GLM-5's sizes (GPU probe).

Two limits read in vLLM's csrc/quantization/gguf/, each probed on both sides of its edge:
- MMQ (ggml_moe_a8, batches > 64 tokens of standard/K types) finds expert e at
  `(char*)vx + exp_idx * exp_stride` with both `int`: past 2^31 bytes of one expert tensor the
  offset wraps. GLM-5 at TP1 has w13 = 256 experts x 4096 rows x 6144 (Q4_K: 14.2 MB an expert,
  3.6 GB a layer): expert 151 starts at 2,137,522,176 B, expert 152 past 2^31. One TP8 rank
  (453 MB) never gets there. The full-view serving benchmark died at its first forward.
- vec (ggml_moe_a8_vec: every batch of IQ types, batches <= 64 of the others) launches a grid
  whose z is tokens x top_k, and CUDA caps grid z at 65535: at top-8, 8191 tokens a step run
  and 8192 (vLLM's default prefill chunk on large GPUs) do not.

Each case routes its tokens to known experts of random Q4_K weights and compares the output
with gguf dequantization (ggml_dequantize) of those experts times x. The cases run in one child
process; a CUDA error ends the child (an illegal access poisons its context) and the next case
starts in a fresh one. Every row says what the source predicts and what happened.

    PYTHONPATH=/tmp/site python benchmarks/gguf_moe_probe.py --json out.json

Exit: 0 every case matched its prediction, 1 a case did not (or the probe could not run),
2 usage.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

Q4_K = 12
K = 6144
N = 4096  # w13 rows: 2 x moe_intermediate 2048
ROW_BYTES = K // 256 * 144
GRID_Z_MAX = 65535
INT32_MAX = 2**31 - 1
EXAMPLES = "example:\n  PYTHONPATH=/tmp/site python benchmarks/gguf_moe_probe.py --json out.json"

# (name, kernel, experts, first routed expert, tokens, top_k)
CASES = [
    ("mmq-expert-151", "mmq", 256, 151, 128, 1),
    ("mmq-expert-152", "mmq", 256, 152, 128, 1),
    ("mmq-expert-255", "mmq", 256, 255, 128, 1),
    ("vec-expert-255", "vec", 256, 255, 1, 1),
    ("vec-8191-tokens-top8", "vec", 8, 0, 8191, 8),
    ("vec-8192-tokens-top8", "vec", 8, 0, 8192, 8),
]


def predicted_ok(kernel: str, expert: int, tokens: int, top_k: int) -> bool:
    if kernel == "mmq":
        return (expert + top_k - 1) * N * ROW_BYTES <= INT32_MAX
    return tokens * top_k <= GRID_Z_MAX


def run_case(kernel: str, experts: int, expert: int, tokens: int, top_k: int) -> dict[str, Any]:
    import torch
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe.fused_moe import moe_align_block_size

    torch.manual_seed(0)
    w = torch.randint(0, 256, (experts, N, ROW_BYTES), dtype=torch.uint8, device="cuda")
    # fp16 d and dmin of every 144-byte block small and finite (its bytes 0-3)
    blocks = w.view(experts, N, K // 256, 144)
    scale = torch.tensor([5e-5], dtype=torch.float16).view(torch.uint8).cuda()
    blocks[..., 0:2] = scale
    blocks[..., 2:4] = scale
    x = torch.randn(tokens, K, dtype=torch.float16, device="cuda")
    routed = [expert + j for j in range(top_k)]
    ids = torch.tensor([routed] * tokens, dtype=torch.int32, device="cuda")
    if kernel == "vec":
        out = ops.ggml_moe_a8_vec(x, w, ids, top_k, Q4_K, N, tokens)
    else:
        bs = ops.ggml_moe_get_block_size(Q4_K)
        sorted_ids, expert_ids, n_post = moe_align_block_size(ids, bs, experts)
        out = ops.ggml_moe_a8(x, w, sorted_ids, expert_ids, n_post, Q4_K, N, top_k, tokens)
    torch.cuda.synchronize()
    got = out.float().view(tokens, top_k, N)
    rows = sorted({0, tokens - 1})  # the first and the last token: the grid's two ends
    err = 0.0
    for j, e in enumerate(routed):
        ref_w = ops.ggml_dequantize(w[e].contiguous(), Q4_K, N, K, torch.float16).float()
        ref = x[rows].float() @ ref_w.T
        err = max(err, float((got[rows, j] - ref).norm() / ref.norm()))
    return {"rel_err": err, "ok": bool(err < 2e-2)}


def child(start: int) -> int:
    """Run CASES[start:], one JSON line each; stop at the first CUDA error."""
    for i in range(start, len(CASES)):
        name, kernel, experts, expert, tokens, top_k = CASES[i]
        t0 = time.time()
        try:
            row = run_case(kernel, experts, expert, tokens, top_k)
        except Exception as exc:  # a CUDA error: record it, end this process
            msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            print(json.dumps({"i": i, "ok": False, "error": msg}), flush=True)
            return 1
        print(json.dumps({"i": i, **row, "seconds": round(time.time() - t0, 2)}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--timeout", type=float, default=300, help="seconds for each child")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        return child(args.child)
    done: dict[int, dict[str, Any]] = {}
    start = 0
    while start < len(CASES):
        try:
            r = subprocess.run([sys.executable, __file__, "--child", str(start)],
                               capture_output=True, text=True, timeout=args.timeout)  # fmt: skip
            out, tail = r.stdout, r.stderr[-300:]
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            tail = f"child timed out after {args.timeout:.0f} s"
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                done[row.pop("i")] = row
        if start not in done:  # died before its first line: record and move on
            done[start] = {"ok": False, "error": " ".join(tail.split())}
        start = max(done) + 1
    results = []
    for i, (name, kernel, experts, expert, tokens, top_k) in enumerate(CASES):
        want = predicted_ok(kernel, expert, tokens, top_k)
        row = {"case": name, "kernel": kernel, "experts": experts, "expert": expert,
               "tokens": tokens, "top_k": top_k,
               "offset_bytes": (expert + top_k - 1) * N * ROW_BYTES,
               "grid_z": tokens * top_k if kernel == "vec" else None,
               "predicted_ok": want, **done[i]}  # fmt: skip
        row["as_predicted"] = row["ok"] == want
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0 if all(r["as_predicted"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
