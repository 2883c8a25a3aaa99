"""What the fp8_ds_mla KV cache costs in accuracy, on the CPU (fp64 math, no kernels): random
N(0, 1) cache rows (no structure: a pessimistic case) quantized by the pure-torch write rule,
relative Frobenius error of the dequantized latent values and of the sparse-attention output
against the same attention over the 16-bit rows.

Exit: 0 ok, 2 usage.

    PYTHONPATH=tests:backend/src python benchmarks/fp8_kv_accuracy.py
    PYTHONPATH=tests:backend/src python benchmarks/fp8_kv_accuracy.py --tokens 64 --topk 512
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n")[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tokens", type=int, default=32, help="query tokens (default: %(default)s)")
    p.add_argument("--heads", type=int, default=16, help="(default: %(default)s)")
    p.add_argument("--topk", type=int, default=256, help="(default: %(default)s)")
    args = p.parse_args(argv)

    import torch
    from support.kernel_inputs import SCALE, attn_inputs
    from vllm_sparse_mla.kernels.fp8_ds_mla import dequantize_rows, quantize_rows

    blocks = max(4, -(-2 * args.topk // 64))
    for dtype in (torch.float16, torch.bfloat16):
        q, kv, idx = attn_inputs(args.tokens, args.heads, args.topk, dtype, num_blocks=blocks,
                                 pad=0.1)  # fmt: skip
        flat = kv.reshape(-1, 576)
        deq = dequantize_rows(quantize_rows(flat[:, :512].contiguous(),
                                            flat[:, 512:].contiguous()), dtype)  # fmt: skip
        x = flat.double()
        valid = idx >= 0
        qd = q.double()

        def attn(rows, q=qd, valid=valid, idx=idx):
            r = rows[torch.where(valid, idx, 0).long()]
            s = torch.einsum("thd,tkd->thk", q, r) * SCALE
            s = s.masked_fill(~valid[:, None, :], float("-inf"))
            return torch.einsum("thk,tkd->thd", s.softmax(-1), r[..., :512])

        lat = ((deq[:, :512] - x[:, :512]).norm() / x[:, :512].norm()).item()
        a16, a8 = attn(x), attn(deq)
        out = ((a8 - a16).norm() / a16.norm()).item()
        print(f"{str(dtype):15} latent rel err {lat:.4f}  attention output rel err {out:.4f}  "
              f"rope exact {torch.equal(deq[:, 512:], x[:, 512:])}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
