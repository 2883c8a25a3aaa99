"""Do vLLM 0.23.0's GGUF MoE kernels address experts past 2 GiB of one expert tensor? (GPU probe)

GLM-5 at TP1 has w13 = 256 experts x 4096 rows x 6144 (Q4_K: 3.6 GB) per layer, past 2^31 bytes;
one TP8 rank has 453 MB. The full-view serving benchmark died with an illegal memory access at
the first forward while the TP8 view served. This probe calls ggml_moe_a8_vec (decode) and
ggml_moe_a8 (MMQ, > 64 tokens) on random Q4_K experts, routes every token to one expert, and
compares with gguf dequantization of that expert (ggml_dequantize) times x. Each case runs in its
own process: an illegal access poisons the CUDA context.

    PYTHONPATH=/tmp/site python benchmarks/gguf_moe_probe.py --json out.json

Exit: 0 probe ran (whatever the verdicts), 1 the probe could not run, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

Q4_K = 12
K = 6144
N = 4096  # 2 x moe_intermediate 2048
ROW_BYTES = K // 256 * 144

CASES = [  # (experts, routed expert, kernel, tokens)
    (64, 63, "vec", 1),
    (64, 63, "mmq", 128),
    (256, 0, "vec", 1),
    (256, 0, "mmq", 128),
    (256, 255, "vec", 1),
    (256, 255, "mmq", 128),
]


def one(experts: int, expert: int, kernel: str, tokens: int) -> dict:
    import torch
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe.fused_moe import moe_align_block_size

    torch.manual_seed(0)
    w = torch.randint(0, 256, (experts, N, ROW_BYTES), dtype=torch.uint8, device="cuda")
    # fp16 d and dmin of every block small and finite (bytes 0-3 of each 144-byte block)
    blocks = w.view(experts, N, K // 256, 144)
    scale = torch.tensor([5e-5], dtype=torch.float16).view(torch.uint8).cuda()
    blocks[..., 0:2] = scale
    blocks[..., 2:4] = scale
    x = torch.randn(tokens, K, dtype=torch.float16, device="cuda")
    ids = torch.full((tokens, 1), expert, dtype=torch.int32, device="cuda")
    if kernel == "vec":
        out = ops.ggml_moe_a8_vec(x, w, ids, 1, Q4_K, N, tokens)
    else:
        bs = ops.ggml_moe_get_block_size(Q4_K)
        sorted_ids, expert_ids, n_post = moe_align_block_size(ids, bs, experts)
        out = ops.ggml_moe_a8(x, w, sorted_ids, expert_ids, n_post, Q4_K, N, 1, tokens)
    torch.cuda.synchronize()
    ref_w = ops.ggml_dequantize(w[expert].contiguous(), Q4_K, N, K, torch.float16)
    ref = x.float() @ ref_w.float().T
    got = out.float().view(tokens, N)
    rel = float((got - ref).norm() / ref.norm())
    return {"rel_err": rel, "ok": bool(rel < 2e-2), "w_bytes": w.numel()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the verdicts here")
    p.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        e, x, k, t = args.one
        print(json.dumps(one(int(e), int(x), k, int(t))))
        return 0
    results = []
    for e, x, k, t in CASES:
        r = subprocess.run([sys.executable, __file__, "--one", str(e), str(x), k, str(t)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        row = {"experts": e, "expert": x, "kernel": k, "tokens": t,
               "offset_bytes": x * N * ROW_BYTES}  # fmt: skip
        try:
            row |= json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            err = [ln for ln in r.stderr.splitlines() if "Error" in ln or "error" in ln]
            row |= {"ok": False, "crash": (err[-1] if err else r.stderr[-300:])[:300]}
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
