"""Load a scripts/glm5_gguf_writer.py file written with --nextn 1 into the patched vLLM 0.23.0 on
the CPU, target and MTP draft, and write what happened as JSON (the child process of
tests/integration/test_glm5_writer_mtp_load.py).

    python tests/support/vllm_writer_mtp_load.py GGUF HF_DIR OUT.json

PYTHONPATH must hold the patched vllm/ only. This is what benchmarks/bench_serve.py's MTP case
builds on a GPU (`speculative_config={"method": "mtp", ...}`): the target GlmMoeDsa from the
trunk (patch 0005 skips the nextn block) and vLLM's DeepSeekMTP from blk.<num_hidden_layers>
(patch 0009), both through the loaders' own no-silent-gaps checks. The stand-ins are the patch
proof's (vllm_gguf_load.simulate_cpu_platform); nothing runs a forward pass.
"""

from __future__ import annotations

import sys

from vllm_gguf_load import cpu_engine, simulate_cpu_platform, write_report
from vllm_mtp_load import draft_setup


def run(gguf_path: str, hf_dir: str, out: dict) -> None:
    import gguf
    import numpy as np
    import torch
    from gguf.quants import dequantize

    simulate_cpu_platform()
    mc, vc = draft_setup(gguf_path, hf_dir)
    draft = vc.speculative_config.draft_model_config
    out["draft_model_type"] = draft.hf_config.model_type
    with cpu_engine(vc) as (loader, records):
        target = loader.load_model(vc, mc)
        out["target_class"] = type(target).__name__
        out["target_logs"] = [m for _, m in records.messages if "MTP/nextn" in m]
        del target
        records.messages.clear()
        out["map"] = dict(loader._get_gguf_weights_map(draft))
        model = loader.load_model(vc, draft)
        out["draft_class"] = type(model).__name__
        out["draft_logs"] = [m for _, m in records.messages if "MTP" in m]
        params = dict(model.named_parameters())
        out["draft_params"] = sorted(params)
        # the bytes and values vLLM holds against gguf-py's reading of the same file
        tensors = {t.name: t for t in gguf.GGUFReader(gguf_path).tensors}
        n = mc.hf_config.num_hidden_layers
        eh = tensors[f"blk.{n}.nextn.eh_proj.weight"]
        want = torch.from_numpy(dequantize(eh.data, eh.tensor_type).astype(np.float32))
        got = params[f"model.layers.{n}.eh_proj.weight"]
        out["eh_proj"] = {
            "dtype": str(got.dtype).removeprefix("torch."),
            "shape": list(got.shape),
            "max_err": float((got.float() - want).abs().max()),
        }
        head = params[f"model.layers.{n}.shared_head.head.qweight"]
        raw = np.asarray(tensors["output.weight"].data)
        out["head_is_output_weight"] = bool(
            list(head.shape) == list(raw.shape) and np.array_equal(head.numpy(), raw)
        )


def main(argv: list[str]) -> int:
    gguf_path, hf_dir, out_path = argv
    return write_report(out_path, run, gguf_path, hf_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
