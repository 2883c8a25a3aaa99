"""Load the MTP draft of a tiny GLM-5 GGUF with the patched vLLM 0.23.0 and write what happened as
JSON: the MTP load proof's child process (tests/integration/test_vllm_mtp_load.py).

    python tests/support/vllm_mtp_load.py GGUF HF_DIR NO_MTP_GGUF OUT.json

PYTHONPATH must hold the patched vllm/ only. vLLM's own SpeculativeConfig (method mtp, as
`--speculative-config '{"method":"mtp","num_speculative_tokens":1}'` builds it) derives the
draft's ModelConfig from the target's; the GGUF loader then builds DeepSeekMTPModel (vLLM's
DeepSeekMTP) from it on the CPU, with the patch proof's stand-ins (vllm_gguf_load: platform
device "cpu", FlashMLASparseBackend as the selected class, never run). Every parameter is
compared with the checkpoint: float ones as loaded, GGUF-quantized ones dequantized with gguf-py
from the bytes vLLM holds. NO_MTP_GGUF: the same model converted without its nextn layer (the
refusal).
"""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_gguf_load import (
    cpu_engine,
    error_of,
    model_config,
    simulate_cpu_platform,
    write_report,
)


def draft_setup(gguf_path: str, hf_dir: str):
    """(target ModelConfig, VllmConfig with vLLM's SpeculativeConfig for method mtp, k=1)."""
    from vllm.config import (
        DeviceConfig,
        LoadConfig,
        ParallelConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.model_executor.model_loader.weight_utils import get_quant_config

    mc = model_config(gguf_path, hf_dir)
    spec = SpeculativeConfig(
        method="mtp", num_speculative_tokens=1, target_model_config=mc,
        target_parallel_config=ParallelConfig(),
    )  # fmt: skip
    load_config = LoadConfig(load_format="gguf")
    vc = VllmConfig(
        model_config=mc, device_config=DeviceConfig(device="cpu"), load_config=load_config,
        quant_config=get_quant_config(mc, load_config), speculative_config=spec,
    )  # fmt: skip
    return mc, vc


def expected(hf: dict, name: str, n_layers: int, n_experts: int):
    """The checkpoint tensor a draft parameter holds (vLLM's fusions applied), or None."""
    import torch

    mtp = f"model.layers.{n_layers}."
    ckpt = name.replace(f"{mtp}mtp_block.", mtp)
    for suffix in (".qweight", ".weight", "_qweight"):
        if ckpt.endswith(suffix):
            ckpt = ckpt.removesuffix(suffix) + (".weight" if suffix[0] == "." else "_weight")
    if ckpt == f"{mtp}shared_head.head.weight":
        return hf["lm_head.weight"]  # the trunk's output.weight (GLM-5 has no own head)
    fused = {
        "self_attn.fused_qkv_a_proj": ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
        "self_attn.indexer.wk_weights_proj": ("self_attn.indexer.wk",
                                              "self_attn.indexer.weights_proj"),
        "mlp.shared_experts.gate_up_proj": ("mlp.shared_experts.gate_proj",
                                            "mlp.shared_experts.up_proj"),
    }  # fmt: skip
    for module, parts in fused.items():
        if ckpt == f"{mtp}{module}.weight":
            return torch.cat([hf[f"{mtp}{p}.weight"] for p in parts])
    experts = f"{mtp}mlp.experts."
    if ckpt in (experts + "w13_weight", experts + "w2_weight"):
        kinds = ("gate_proj", "up_proj") if "w13" in ckpt else ("down_proj",)
        return torch.stack(
            [torch.cat([hf[f"{experts}{e}.{k}.weight"] for k in kinds]) for e in range(n_experts)]
        )
    return hf.get(ckpt)


def dequantized(params: dict, param_name: str):
    """A GGUF-quantized parameter as float32: gguf-py's dequantize of the bytes vLLM holds. A
    merged layer's padded qweight is read shard by shard (shard_offset_map), in shard order."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    param = params[param_name]
    qtype = params[param_name.removesuffix("qweight") + "qweight_type"]
    types = sorted({int(t) for t in qtype.reshape(-1).tolist()})
    if len(types) != 1:
        raise ValueError(f"{param_name}: mixed quant types {types}")

    def deq(raw: torch.Tensor) -> torch.Tensor:
        data = dequantize(raw.contiguous().numpy().astype(np.uint8), GGMLQuantizationType(types[0]))
        return torch.from_numpy(data.astype(np.float32))

    offsets = getattr(param, "shard_offset_map", None)
    if not offsets:
        return deq(param.data)
    return torch.cat([deq(param.data[a:b, :size]) for _, (a, b, size) in sorted(offsets.items())])


def fused_qkv_a_forward(model, hf: dict, n_layers: int) -> dict:
    """The MTP layer's fused_qkv_a_proj through vLLM's GGUFLinearMethod.apply (the shard
    bookkeeping under test) against x @ [q_a_proj; kv_a_proj_with_mqa]^T of the checkpoint. The
    CUDA GGUF matmul is replaced by gguf-py's dequantize + a float32 matmul (CPU only)."""
    import numpy as np
    import torch
    import vllm.model_executor.layers.quantization.gguf as gguf_quant
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    def cpu_mul_mat(x, qweight, qweight_type):
        w = dequantize(qweight.contiguous().numpy().astype(np.uint8),
                       GGMLQuantizationType(int(qweight_type)))  # fmt: skip
        return x @ torch.from_numpy(w.astype(np.float32)).T

    layer = model.model.layers[str(n_layers)].mtp_block.self_attn.fused_qkv_a_proj
    x = torch.randn(3, layer.input_size, generator=torch.Generator().manual_seed(0))
    saved, gguf_quant.fused_mul_mat_gguf = gguf_quant.fused_mul_mat_gguf, cpu_mul_mat
    try:
        got = layer.quant_method.apply(layer, x)
    finally:
        gguf_quant.fused_mul_mat_gguf = saved
    p = f"model.layers.{n_layers}.self_attn."
    w = torch.cat([hf[p + "q_a_proj.weight"], hf[p + "kv_a_proj_with_mqa.weight"]]).float()
    want = x @ w.T
    return {
        "load_order": [int(i) for i in layer.qweight.shard_id],
        "shape_ok": list(got.shape) == list(want.shape),
        "max_err": float((got - want).abs().max()),
        "absmax": float(want.abs().max()),
    }


def run(gguf_path: str, hf_dir: str, no_mtp_gguf: str, out: dict) -> None:

    import torch
    from safetensors import safe_open
    from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP

    simulate_cpu_platform()
    mc, vc = draft_setup(gguf_path, hf_dir)
    spec = vc.speculative_config
    draft = spec.draft_model_config
    out["draft"] = {
        "method": spec.method,
        "model": draft.model,
        "hf_config_path": draft.hf_config_path,
        "model_type": draft.hf_config.model_type,
        "architectures": draft.hf_config.architectures,
        "dtype": str(draft.dtype),
        "quantization": draft.quantization,
    }
    with cpu_engine(vc) as (loader, records):
        gmap = loader._get_gguf_weights_map(draft)
        out["map"] = dict(gmap)
        # What DeepSeekMTP.load_weights reports as loaded (the loader's check consumes it).
        loaded_sets: list[set[str]] = []
        load_weights = DeepSeekMTP.load_weights

        def recording_load_weights(self, weights):
            loaded_sets.append(load_weights(self, weights))
            return loaded_sets[-1]

        DeepSeekMTP.load_weights = recording_load_weights
        model = loader.load_model(vc, draft)
        out["unfilled"] = sorted(n for n, _ in model.named_parameters() if n not in loaded_sets[0])
        out["model_class"] = type(model).__name__
        out["logs"] = [m for _, m in records.messages if "MTP" in m]
        params = dict(model.named_parameters())
        with safe_open(str(Path(hf_dir) / "model.safetensors"), "pt") as f:
            hf = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  (safe_open: no __iter__)
        cfg = mc.hf_config
        n_layers, n_experts = cfg.num_hidden_layers, cfg.n_routed_experts
        checks = {}
        for name, p in params.items():
            if name.endswith("qweight_type"):
                checks[name] = {"qtypes": sorted({int(t) for t in p.reshape(-1).tolist()})}
                continue
            want = expected(hf, name, n_layers, n_experts)
            row: dict = {"dtype": str(p.dtype).removeprefix("torch."), "shape": list(p.shape)}
            if want is None:
                row["expected"] = None
            else:
                got = dequantized(params, name) if name.endswith("qweight") else p.data
                got, want = got.float(), want.float()
                row |= {"want_shape": list(want.shape), "absmax": float(want.abs().max())}
                if got.shape == want.shape:
                    row |= {
                        "max_err": float((got - want).abs().max()),
                        "nan": bool(torch.isnan(got).any()),
                    }
            checks[name] = row
        out["checks"] = checks

        out["fused_qkv_a"] = fused_qkv_a_forward(model, hf, n_layers)

        # The gap check itself, fed one dropped nextn mapping.
        dropped = "blk.3.nextn.hnorm.weight"
        hf_name = gmap.pop(dropped)
        loaded = {n for n in params if n != "model.layers.3.hnorm.weight"}
        out["gap_error"] = error_of(
            lambda: loader._check_mtp_no_silent_gaps(model, draft, gguf_path, gmap, loaded)
        )
        out["gap_dropped"] = [dropped, hf_name]

        # The same model converted without its nextn layer: one clear error at the name map.
        _, vc2 = draft_setup(no_mtp_gguf, hf_dir)
        out["no_mtp_error"] = error_of(
            lambda: loader._get_gguf_weights_map(vc2.speculative_config.draft_model_config)
        )


def main(argv: list[str]) -> int:
    gguf_path, hf_dir, no_mtp_gguf, out_path = argv
    return write_report(out_path, run, gguf_path, hf_dir, no_mtp_gguf)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
