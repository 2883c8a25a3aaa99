"""Load a tiny GLM-5.1 or GLM-5.2 GGUF with the patched vLLM 0.23.0 and write what happened as JSON:
the GLM generations proof's child process (tests/integration/test_glm5x_generations.py).

    python tests/support/vllm_index_share_load.py GGUF HF_DIR OTHER_HF_DIR OUT.json [KEYLESS_GGUF]

PYTHONPATH must hold the patched vllm/ only. The model is built on the CPU with the same
stand-ins as the patch proof (vllm_gguf_load.simulate_cpu_platform: the platform's device type,
FlashMLASparseBackend as the selected class, never run). Everything else is vLLM's real code:
config, name map, weight iterator, loaders, patches 0005/0007/0008. OTHER_HF_DIR is the config
of the other generation, for the refusal of a GGUF / --hf-config-path mismatch; KEYLESS_GGUF a
GGUF of the same model without llama.cpp's glm-dsa.attention.indexer.types key (as some published
GLM-5.2 files are), checked against HF_DIR by its indexer tensors alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_gguf_load import (
    error_of,
    loaded_on_cpu,
    model_config,
    simulate_cpu_platform,
    write_report,
)


def layer_wiring(model, n_layers: int) -> list[dict]:
    """Per trunk layer: which indexer it has, whether it skips top-k, and whose buffer it reads.

    DeepseekV2Model makes one topk_indices_buffer and hands it to every layer (it keeps no
    attribute of it); layer 0 is always full, so its indexer's buffer is that one."""
    buf = model.model.layers[0].self_attn.indexer.topk_indices_buffer
    rows = []
    for i in range(n_layers):
        attn = model.model.layers[i].self_attn
        wrapper = attn.mla_attn
        impl = wrapper.mla_attn.impl
        rows.append(
            {
                "indexer": type(attn.indexer).__name__,
                "skip_topk": bool(wrapper.skip_topk),
                "indexer_params": sorted(n for n, _ in attn.indexer.named_parameters()),
                "indexer_buffer_is_layer0s": attn.indexer.topk_indices_buffer is buf,
                "attention_reads_layer0s_buffer": impl.topk_indices_buffer is buf,
            }
        )
    return rows


def run(gguf_path: str, hf_dir: str, other_hf_dir: str, keyless: str | None, out: dict) -> None:
    import gguf
    import torch
    from safetensors import safe_open

    simulate_cpu_platform()
    field = gguf.GGUFReader(gguf_path).get_field("glm-dsa.attention.indexer.types")
    out["gguf_indexer_types"] = None if field is None else [bool(v) for v in field.contents()]

    mc = model_config(gguf_path, hf_dir)
    with loaded_on_cpu(mc) as (model, vc, loader, records):
        out["model_class"] = type(model).__name__
        out["index_share_logs"] = [m for _, m in records.messages if m.startswith("IndexShare")]
        n_layers = mc.hf_config.num_hidden_layers
        out["layers"] = layer_wiring(model, n_layers)
        out["indexer_caches"] = sorted(
            n for n in vc.compilation_config.static_forward_context if n.endswith("k_cache")
        )
        params = dict(model.named_parameters())
        out["param_count"] = len(params)

        # Full layers' indexer weights are the checkpoint's (Q8_0 round trip).
        with safe_open(str(Path(hf_dir) / "model.safetensors"), "pt") as f:
            hf = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  (safe_open: no __iter__)
        checks = []
        for i in range(n_layers):
            p = f"model.layers.{i}.self_attn.indexer."
            if p + "wk.weight" not in hf:
                continue
            want = torch.cat([hf[p + "wk.weight"], hf[p + "weights_proj.weight"]]).float()
            got = params[p + "wk_weights_proj.weight"].data.float()
            checks.append(
                {
                    "layer": i,
                    "max_err": float((got - want).abs().max()),
                    "absmax": float(want.abs().max()),
                }
            )
        out["indexer_checks"] = checks

        # A GGUF and an HF config of different generations: refused before loading (0008).
        out["other_config_error"] = error_of(
            lambda: loader._check_index_share(model_config(gguf_path, other_hf_dir), gguf_path)
        )
        if keyless is not None:
            out["keyless_check"] = error_of(lambda: loader._check_index_share(mc, keyless))
        # Any other gap is still an error (0005): drop the mapping of one full layer's indexer
        # tensor; it must be named both as unmapped tensor and as unfilled parameter.
        gmap = loader._get_gguf_weights_map(mc)
        dropped = "blk.0.indexer.proj.weight"
        hf_name = gmap.pop(dropped)
        loaded = set(params) - {"model.layers.0.self_attn.indexer.wk_weights_proj.weight"}
        out["gap_error"] = error_of(
            lambda: loader._check_no_silent_gaps(model, mc, gguf_path, gmap, loaded)
        )
        out["gap_dropped"] = [dropped, hf_name]
        # A shared layer never computes its own top-k.
        shared = [i for i, row in enumerate(out["layers"]) if row["skip_topk"]]
        if shared:
            idx = model.model.layers[shared[0]].self_attn.indexer
            out["shared_forward_error"] = error_of(lambda: idx(None, None, None, None))


def main(argv: list[str]) -> int:
    gguf_path, hf_dir, other_hf_dir, out_path, *keyless = argv
    keyless_path = keyless[0] if keyless else None
    return write_report(out_path, run, gguf_path, hf_dir, other_hf_dir, keyless_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
