"""Refuse a GLM-5 GGUF whose tensor types vLLM 0.23.0's CUDA GGUF path cannot run, before a merge.

Reads only the headers of every shard of the set (or one merged file), so it takes milliseconds
on a 400 GB download; meant for preflight, before `scripts/gguf_merge.py` copies anything.

What vLLM 0.23.0 runs (vllm/model_executor/layers/quantization/gguf.py, read for this check;
tests/integration/test_glm5_gguf_mixes.py compares these sets with the installed module):
- dense linears and embeddings: F32/F16/BF16 (unquantized) and DEQUANT_TYPES = Q4_0 Q4_1 Q5_0
  Q5_1 Q8_0 Q8_1, Q2_K..Q6_K, IQ1_M IQ1_S IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_XS IQ4_NL;
  anything else fails in GGUFLinearMethod.process_weights_after_loading;
- routed experts (GGUFMoEMethod): MMQ kernels for standard + K types (batches > 64), the vec
  kernel for those and the IQ types at any batch (IQ prefill runs the vec kernel: slow), and a
  per-token Python loop for anything else; gate and up experts are loaded into ONE fused w13
  tensor with ONE type, so a layer whose ffn_gate_exps and ffn_up_exps types differ loads wrong
  (rows of different byte widths) - refused here.
Not runnable: Q8_K, TQ1_0, TQ2_0, MXFP4, I8..I64, F64; unquantized routed experts (F16/BF16/F32)
take the per-token loop and are refused too (hours per request at GLM-5 size).

Exit: 0 every tensor runnable, 1 a tensor is not (one `error:` line naming type and tensor) or
the file cannot be read, 2 usage.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import cli_args
import gguf_format

EXAMPLES = """examples:
  python scripts/gguf_types_check.py /models/GLM-5.1-IQ4_XS-00001-of-00008.gguf
  python scripts/gguf_types_check.py --summary /models/GLM-5-Q4_K_M.gguf
"""

# GGML type ids (ggml.h / gguf-py constants): stable across versions, so no gguf-py import
TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
    34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip
UNQUANTIZED = frozenset({"F32", "F16", "BF16"})
STANDARD = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1"})
KQUANT = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})
IMATRIX = frozenset(
    {"IQ1_M", "IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL"}
)
DEQUANT = STANDARD | KQUANT | IMATRIX
MMQ = STANDARD | KQUANT  # MoE prefill kernel; IQ types have only the vec kernel
EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")


@dataclass(frozen=True)
class Refusal:
    tensor: str
    type_name: str
    path: Path
    reason: str

    def line(self) -> str:
        return (
            f"error: {self.path.name}: tensor {self.tensor} has GGUF type {self.type_name}, "
            f"which vLLM 0.23.0 cannot serve: {self.reason}; pick a file without it "
            "(e.g. Q4_K_M, IQ4_XS or UD-IQ2_M) before merging"
        )


def type_name(ggml_type: int) -> str:
    return TYPE_NAMES.get(ggml_type, f"type {ggml_type}")


def check_tensors(tensors: list[tuple[str, int, Path]]) -> list[Refusal]:
    """(name, ggml type, file) of every tensor -> what vLLM 0.23.0 cannot run, in file order."""
    out: list[Refusal] = []
    experts: dict[int, dict[str, tuple[str, str, Path]]] = {}
    for name, ggml_type, path in tensors:
        t = type_name(ggml_type)
        m = EXPERT_RE.match(name)
        if m:
            experts.setdefault(int(m[1]), {})[m[2]] = (name, t, path)
            if t not in DEQUANT:
                why = (
                    "its MoE kernels take quantized experts only (unquantized experts run a "
                    "per-token Python loop)"
                    if t in UNQUANTIZED
                    else "no GGUF MoE kernel of it takes this type"
                )
                out.append(Refusal(name, t, path, why))
        elif t not in DEQUANT | UNQUANTIZED:
            out.append(Refusal(name, t, path, "no GGUF linear/embedding kernel takes this type"))
    for layer in sorted(experts):
        roles = experts[layer]
        if "gate" in roles and "up" in roles and roles["gate"][1] != roles["up"][1]:
            name, t, path = roles["up"]
            out.append(
                Refusal(
                    name,
                    t,
                    path,
                    f"blk.{layer}.ffn_gate_exps is {roles['gate'][1]}, and vLLM fuses gate and "
                    "up experts into one w13 tensor of one type",
                )
            )
    return out


def read_tensors(path: Path) -> list[tuple[str, int, Path]]:
    """Every tensor of the set `path` belongs to (or of the single file), headers only."""
    paths = gguf_format.find_shards(path) if gguf_format.SHARD_NAME_RE.match(path.name) else [path]
    return [(t.name, t.ggml_type, p) for p in paths for t in gguf_format.read_header(p).tensors]


def summary(tensors: list[tuple[str, int, Path]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, ggml_type, _ in tensors:
        counts[type_name(ggml_type)] = counts.get(type_name(ggml_type), 0) + 1
    return dict(sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    p = cli_args.parser(__doc__, EXAMPLES)
    p.add_argument("gguf", type=Path, help="any shard of a split set, or a single .gguf")
    p.add_argument("--summary", action="store_true", help="print tensor counts per type")
    args = p.parse_args(argv)
    try:
        tensors = read_tensors(args.gguf)
    except gguf_format.ShardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {args.gguf}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    refusals = check_tensors(tensors)
    if refusals:
        first = refusals[0]
        more = f" ({len(refusals) - 1} more tensors refused)" if len(refusals) > 1 else ""
        print(first.line() + more, file=sys.stderr)
        return 1
    if args.summary:
        for name, n in summary(tensors).items():
            print(f"{name:8s} {n}")
    print(f"ok: {len(tensors)} tensors, every type runs on vLLM 0.23.0's GGUF path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
