"""Load a tiny GLM-5 GGUF with the real vLLM 0.23.0 code (config, name map, weights) and write
what happened as JSON: the patch proof's child process.

Run in a subprocess with the runtime env's python; the vllm/ that is imported is the first on
sys.path (PYTHONPATH=<patched copy> for the patched run, nothing for the pristine venv):

    python tests/support/vllm_gguf_load.py {pristine,patched} GGUF HF_DIR OUT.json

There is no GPU here, so building vLLM's model class on the CPU needs four stand-ins, all in
`simulate_cpu_platform()` and used by the patched run only: the platform's device type is "cpu";
the attention selector returns FlashMLASparseBackend (the class is only constructed, never run);
the FlashAttention prefill kernel symbol is a placeholder (never called); the workspace manager
lives on the CPU. Everything the patches touch (config, name map, weight iterator, weight loaders,
process_weights_after_loading, the no-silent-gaps check) is vLLM's real code.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.levelname, record.getMessage()))


def error_of(fn) -> dict | None:
    try:
        fn()
    except Exception as exc:  # every failure is reported as data
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def simulate_cpu_platform() -> None:
    import torch
    import vllm.v1.attention.backends.mla.prefill.flash_attn as fa_prefill
    from vllm.platforms import current_platform

    current_platform.device_type = "cpu"
    current_platform.get_attn_backend_cls = lambda *a, **k: (
        "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend"
    )
    fa_prefill.flash_attn_varlen_func = lambda *a, **k: None  # placeholder, never called
    from vllm.v1.worker.workspace import init_workspace_manager

    init_workspace_manager(torch.device("cpu"))


def model_config(gguf_path: str, hf_dir: str, dtype: str = "float16"):
    """vLLM's ModelConfig for the GGUF with HF_DIR as --hf-config-path and tokenizer."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=gguf_path, hf_config_path=hf_dir, tokenizer=hf_dir, dtype=dtype,
        max_model_len=256, enforce_eager=True,
    ).create_model_config()  # fmt: skip


@contextmanager
def cpu_engine(vc) -> Iterator[tuple]:
    """Inside vLLM_CONFIG's current-config context, a one-rank gloo process group (no GPU) and
    vLLM's GGUF loader; yields (loader, records), records catching vLLM's log lines."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader

    records = Records()
    logging.getLogger("vllm").addHandler(records)
    with set_current_vllm_config(vc):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method="tcp://127.0.0.1:0",
        )  # fmt: skip
        initialize_model_parallel(1, 1)
        yield GGUFModelLoader(vc.load_config), records


@contextmanager
def loaded_on_cpu(mc) -> Iterator[tuple]:
    """vLLM's real GGUF loader builds and fills the model on the CPU platform (call
    simulate_cpu_platform() first). Yields (model, vllm_config, loader, records) inside the
    current-config context, where the model's own methods may be called."""
    from vllm.config import DeviceConfig, LoadConfig, VllmConfig
    from vllm.model_executor.model_loader.weight_utils import get_quant_config

    load_config = LoadConfig(load_format="gguf")
    vc = VllmConfig(
        model_config=mc,
        device_config=DeviceConfig(device="cpu"),
        load_config=load_config,
        quant_config=get_quant_config(mc, load_config),
    )
    with cpu_engine(vc) as (loader, records):
        yield loader.load_model(vc, mc), vc, loader, records


def common(gguf_path: str, hf_dir: str, out: dict) -> None:
    from vllm.transformers_utils.config import get_config, maybe_override_with_speculators

    try:
        out["speculators"] = {
            "result": list(maybe_override_with_speculators(gguf_path, hf_dir, False))
        }
    except Exception as exc:
        out["speculators"] = {"error": {"type": type(exc).__name__, "message": str(exc)}}
    out["get_config_gguf"] = error_of(lambda: get_config(gguf_path, trust_remote_code=False))


def pristine(gguf_path: str, hf_dir: str, out: dict) -> None:
    import gguf
    from safetensors import safe_open
    from vllm.config import LoadConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader
    from vllm.model_executor.model_loader.weight_utils import (
        get_gguf_extra_tensor_names,
        gguf_quant_weights_iterator,
    )

    common(gguf_path, hf_dir, out)
    mc = EngineArgs(
        model=gguf_path, hf_config_path=hf_dir, tokenizer=hf_dir, dtype="auto", max_model_len=256
    ).create_model_config()
    out["auto_dtype"] = str(mc.dtype)
    loader = GGUFModelLoader(LoadConfig(load_format="gguf"))
    out["weights_map"] = error_of(lambda: loader._get_gguf_weights_map(mc))

    # What the pristine iterator does with gguf-py's own glm-dsa names for every HF tensor.
    n_layers = mc.hf_config.num_hidden_layers
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM_DSA, n_layers)
    with safe_open(str(Path(hf_dir) / "model.safetensors"), "pt") as f:
        hf_names = list(f.keys())
    gguf_to_hf = {}
    for hf in hf_names:
        base, _, suffix = hf.rpartition(".")
        if (g := name_map.get_name(base)) is not None:
            gguf_to_hf[f"{g}.{suffix}"] = hf
    records = Records()
    logging.getLogger("vllm").addHandler(records)
    yielded = [name for name, _ in gguf_quant_weights_iterator(gguf_path, gguf_to_hf)]
    out["iterator"] = {
        "kv_b_map": {k: v for k, v in gguf_to_hf.items() if "attn_kv_b" in k},
        "yielded_kv_b": [n for n in yielded if "kv_b_proj" in n],
        "yielded_count": len(yielded),
        "extra_names": sorted(get_gguf_extra_tensor_names(gguf_path, gguf_to_hf)),
        "warnings": [m for lvl, m in records.messages if lvl in ("WARNING", "ERROR")],
        "qweights_proj": [n for n in yielded if "qweights_proj" in n],
    }


def patched(gguf_path: str, hf_dir: str, out: dict) -> None:
    import torch
    from safetensors import safe_open

    simulate_cpu_platform()
    common(gguf_path, hf_dir, out)
    out["dtype_errors"] = {
        d: error_of(lambda d=d: model_config(gguf_path, hf_dir, d)) for d in ("auto", "bfloat16")
    }
    mc = model_config(gguf_path, hf_dir)
    out["dtype"] = str(mc.dtype)
    with loaded_on_cpu(mc) as (model, _, loader, records):
        out["model_class"] = type(model).__name__
        out["skip_logs"] = [m for _, m in records.messages if "MTP/nextn" in m]

        params = dict(model.named_parameters())
        with safe_open(str(Path(hf_dir) / "model.safetensors"), "pt") as f:
            hf = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  (safe_open: no __iter__)
        out["params"] = {
            n: {"shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch.")}
            for n, p in params.items()
        }
        out["qweight_types"] = {
            n: p.tolist() for n, p in params.items() if n.endswith("qweight_type")
        }

        def compare(name: str, got: torch.Tensor, want: torch.Tensor) -> dict:
            got, want = got.float(), want.float()
            return {
                "name": name,
                "shape_ok": list(got.shape) == list(want.shape),
                "max_err": float((got - want).abs().max()) if got.shape == want.shape else None,
                "absmax": float(want.abs().max()),
            }

        checks = []
        for i in range(mc.hf_config.num_hidden_layers):
            p = f"model.layers.{i}"
            checks.append(
                compare(
                    f"{p}.self_attn.kv_b_proj.weight",
                    params[f"{p}.self_attn.kv_b_proj.weight"].data,
                    hf[f"{p}.self_attn.kv_b_proj.weight"],
                )
            )
            wk = hf[f"{p}.self_attn.indexer.wk.weight"]
            wp = hf[f"{p}.self_attn.indexer.weights_proj.weight"]
            checks.append(
                compare(
                    f"{p}.self_attn.indexer.wk_weights_proj.weight",
                    params[f"{p}.self_attn.indexer.wk_weights_proj.weight"].data,
                    torch.cat([wk, wp]),
                )
            )
            for norm in ("input_layernorm", "self_attn.kv_a_layernorm"):
                checks.append(
                    compare(f"{p}.{norm}.weight", params[f"{p}.{norm}.weight"].data,
                            hf[f"{p}.{norm}.weight"])
                )  # fmt: skip
            if f"{p}.mlp.gate.weight" in hf:
                for name in ("mlp.gate.weight", "mlp.gate.e_score_correction_bias"):
                    checks.append(
                        compare(f"{p}.{name}", params[f"{p}.{name}"].data, hf[f"{p}.{name}"])
                    )
        out["checks"] = checks

        # kv_b_proj halves in different shards (as in split GGUF sets): the multi-file iterator
        # must join them the same way. Two one-tensor GGUFs are written with gguf-py.
        out["kv_b_across_shards"] = kv_b_across_shards(gguf_path, params)
        out["kv_b_low_bit"] = kv_b_low_bit(hf["model.layers.2.self_attn.kv_b_proj.weight"], 8)

        # The no-silent-gaps check itself, fed one dropped mapping: the GGUF tensor is then
        # unmapped and the parameter it filled is unfilled; both must be named.
        gmap = loader._get_gguf_weights_map(mc)
        dropped = "blk.1.attn_q_a_norm.weight"
        hf_name = gmap.pop(dropped)
        loaded = set(params) - {hf_name}
        out["gap_error"] = error_of(
            lambda: loader._check_no_silent_gaps(model, mc, gguf_path, gmap, loaded)
        )
        out["gap_dropped"] = [dropped, hf_name]


def kv_b_across_shards(gguf_path: str, params: dict) -> dict:
    import tempfile

    import gguf
    import torch
    from vllm.model_executor.model_loader.weight_utils import gguf_quant_weights_iterator_multi

    reader = gguf.GGUFReader(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    name_map = {
        "blk.2.attn_k_b.weight": "model.layers.2.self_attn.k_b_proj.weight",
        "blk.2.attn_v_b.weight": "model.layers.2.self_attn.v_b_proj.weight",
    }
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, name in enumerate(name_map):
            t = tensors[name]
            path = f"{tmp}/half-0000{i + 1}-of-00002.gguf"
            writer = gguf.GGUFWriter(path, "glm-dsa")
            writer.add_tensor(name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            files.append(path)
        got = list(gguf_quant_weights_iterator_multi(list(reversed(files)), name_map))
    want = params["model.layers.2.self_attn.kv_b_proj.weight"].data.float()
    return {
        "names": [n for n, _ in got],
        "equal_to_loaded": bool(torch.equal(got[0][1].half().float(), want)) if got else False,
    }


def kv_b_low_bit(kv_b, n_head: int) -> dict:
    """attn_k_b as Q5_0 and attn_v_b as Q4_0 (the types llama.cpp's K-quant mixes fall back to for
    ne0=192 tensors), split the way llama.cpp's conversion/deepseek.py splits kv_b_proj, quantized
    with gguf-py, written as two shards, rebuilt by the patched multi-file iterator."""
    import tempfile

    import gguf
    from gguf.quants import quantize
    from vllm.model_executor.model_loader.weight_utils import gguf_quant_weights_iterator_multi

    kv_lora = kv_b.shape[1]
    w = kv_b.float().view(n_head, -1, kv_lora)
    k_b, v_b = w[:, :192], w[:, 192:]  # [H, nope, kv_lora], [H, v_head, kv_lora]
    halves = {
        "blk.0.attn_k_b.weight": (k_b.transpose(1, 2), gguf.GGMLQuantizationType.Q5_0),
        "blk.0.attn_v_b.weight": (v_b, gguf.GGMLQuantizationType.Q4_0),
    }
    name_map = {
        "blk.0.attn_k_b.weight": "model.layers.0.self_attn.k_b_proj.weight",
        "blk.0.attn_v_b.weight": "model.layers.0.self_attn.v_b_proj.weight",
    }
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, (name, (t, qtype)) in enumerate(halves.items()):
            data = quantize(t.contiguous().numpy(), qtype)
            path = f"{tmp}/lowbit-0000{i + 1}-of-00002.gguf"
            writer = gguf.GGUFWriter(path, "glm-dsa")
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            files.append(path)
        got = list(gguf_quant_weights_iterator_multi(files, name_map))
    rebuilt = got[0][1]
    return {
        "names": [n for n, _ in got],
        "shape_ok": list(rebuilt.shape) == list(kv_b.shape),
        "max_err": float((rebuilt - kv_b.float()).abs().max()),
        "absmax": float(kv_b.float().abs().max()),
    }


def write_report(out_path: str, run, *args, **out) -> int:
    """RUN(*ARGS, out) fills OUT (started with OUT's keywords and the vllm/ imported); OUT is
    written to OUT_PATH as JSON, a crash included as its traceback: the parent asserts on it."""
    import vllm

    out["vllm_file"] = vllm.__file__
    try:
        run(*args, out)
    except Exception:
        out["crash"] = traceback.format_exc()
    Path(out_path).write_text(json.dumps(out, indent=1))
    return 0


def main(argv: list[str]) -> int:
    mode, gguf_path, hf_dir, out_path = argv
    run = {"pristine": pristine, "patched": patched}[mode]
    return write_report(out_path, run, gguf_path, hf_dir, mode=mode)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
