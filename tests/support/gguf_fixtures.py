"""Tiny split GGUF sets written by gguf-py's GGUFWriter (an independent writer) for merger tests.

Split the way llama-gguf-split --split does it: shard 1 holds every key/value and, with
metadata_only_first, no tensors (as the published GLM-5 GGUFs do); every shard has split.no (u16,
0-based), split.tensors.count (i32) and split.count (u16) in that order (llama.cpp sets split.count
last, so it ends the list); names `<prefix>-NNNNN-of-MMMMM.gguf`. Keys and tensor names are
glm-dsa's, shrunk to a few kilobytes per tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf_format
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

Q = GGMLQuantizationType
ARCH = "glm-dsa"


@dataclass
class Tensor:
    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order (outermost first); GGUF stores it reversed as ne
    data: np.ndarray  # F32/F16: that dtype and shape; quantized: the raw bytes as uint8

    @property
    def raw(self) -> bytes:
        return self.data.tobytes()


def make_tensor(
    rng: np.random.Generator, name: str, ggml_type: Q, shape: tuple[int, ...]
) -> Tensor:
    if ggml_type == Q.F32:
        data = rng.standard_normal(shape).astype(np.float32)
    elif ggml_type == Q.F16:
        data = rng.standard_normal(shape).astype(np.float16)
    else:
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        assert shape[-1] % block == 0, (name, shape, block)
        byte_shape = (*shape[:-1], shape[-1] // block * type_size)
        data = rng.integers(0, 256, size=byte_shape, dtype=np.uint8)
    return Tensor(name, ggml_type, shape, data)


def glm_dsa_tensors(seed: int = 0, n_blocks: int = 4, hidden: int = 256) -> list[Tensor]:
    """glm-dsa tensor names and F32/F16/Q8_0/Q4_K types; first block dense, then MoE, last MTP."""
    rng = np.random.default_rng(seed)
    n_expert, vocab = 4, 512
    t = [make_tensor(rng, "token_embd.weight", Q.Q8_0, (vocab, hidden))]
    for b in range(n_blocks):
        p = f"blk.{b}."
        t += [
            make_tensor(rng, p + "attn_norm.weight", Q.F32, (hidden,)),
            make_tensor(rng, p + "attn_q_a.weight", Q.Q8_0, (128, hidden)),
            make_tensor(rng, p + "attn_q_a_norm.weight", Q.F32, (128,)),
            make_tensor(rng, p + "attn_q_b.weight", Q.Q8_0, (192, 128)),
            make_tensor(rng, p + "attn_kv_a_mqa.weight", Q.Q8_0, (96, hidden)),
            make_tensor(rng, p + "attn_kv_a_norm.weight", Q.F32, (64,)),
            make_tensor(rng, p + "attn_k_b.weight", Q.F16, (2, 64, 32)),
            make_tensor(rng, p + "attn_v_b.weight", Q.F16, (2, 32, 64)),
            make_tensor(rng, p + "attn_output.weight", Q.Q4_K, (hidden, 256)),
            make_tensor(rng, p + "indexer.k_norm.weight", Q.F32, (32,)),
            make_tensor(rng, p + "indexer.k_norm.bias", Q.F32, (32,)),
            make_tensor(rng, p + "indexer.proj.weight", Q.F16, (2, hidden)),
            make_tensor(rng, p + "indexer.attn_k.weight", Q.Q8_0, (32, hidden)),
            make_tensor(rng, p + "indexer.attn_q_b.weight", Q.Q8_0, (64, 128)),
            make_tensor(rng, p + "ffn_norm.weight", Q.F32, (hidden,)),
        ]
        if b == 0:
            t += [
                make_tensor(rng, p + "ffn_gate.weight", Q.Q4_K, (64, hidden)),
                make_tensor(rng, p + "ffn_up.weight", Q.Q4_K, (64, hidden)),
                make_tensor(rng, p + "ffn_down.weight", Q.Q8_0, (hidden, 64)),
            ]
        else:
            t += [
                make_tensor(rng, p + "ffn_gate_inp.weight", Q.F32, (n_expert, hidden)),
                # (1, n): ne = [n, 1], two dims in the shard; llama.cpp writes ggml_n_dims() = 1
                make_tensor(rng, p + "exp_probs_b.bias", Q.F32, (1, n_expert)),
                make_tensor(rng, p + "ffn_gate_exps.weight", Q.Q4_K, (n_expert, 32, hidden)),
                make_tensor(rng, p + "ffn_up_exps.weight", Q.Q4_K, (n_expert, 32, hidden)),
                make_tensor(rng, p + "ffn_down_exps.weight", Q.Q8_0, (n_expert, hidden, 32)),
                make_tensor(rng, p + "ffn_gate_shexp.weight", Q.Q4_K, (32, hidden)),
                make_tensor(rng, p + "ffn_up_shexp.weight", Q.Q4_K, (32, hidden)),
                make_tensor(rng, p + "ffn_down_shexp.weight", Q.Q8_0, (hidden, 32)),
            ]
        if b == n_blocks - 1:
            t += [
                make_tensor(rng, p + "nextn.eh_proj.weight", Q.Q8_0, (hidden, 2 * hidden)),
                make_tensor(rng, p + "nextn.enorm.weight", Q.F32, (hidden,)),
                make_tensor(rng, p + "nextn.hnorm.weight", Q.F32, (hidden,)),
                make_tensor(rng, p + "nextn.shared_head_norm.weight", Q.F32, (hidden,)),
            ]
    t += [
        make_tensor(rng, "output_norm.weight", Q.F32, (hidden,)),
        make_tensor(rng, "output.weight", Q.Q4_K, (vocab, hidden)),
    ]
    return t


def glm_dsa_metadata(n_blocks: int = 4, vocab: int = 512) -> list[tuple[str, Any, GGUFValueType]]:
    """Shard 1's key/values in convert_hf_to_gguf's order (architecture first)."""
    a = ARCH
    s, u32, f32 = GGUFValueType.STRING, GGUFValueType.UINT32, GGUFValueType.FLOAT32
    arr = GGUFValueType.ARRAY
    tokens = [f"tok{i}" if i % 7 else f"Ġ{i}é" for i in range(vocab)]
    return [
        ("general.architecture", a, s),
        ("general.type", "model", s),
        ("general.name", "GLM 5 (tiny test)", s),
        ("general.size_label", "256x2.1K", s),
        ("general.license", "mit", s),
        ("general.tags", ["text-generation"], arr),
        (f"{a}.block_count", n_blocks, u32),
        (f"{a}.context_length", 202752, u32),
        (f"{a}.embedding_length", 256, u32),
        (f"{a}.feed_forward_length", 64, u32),
        (f"{a}.attention.head_count", 2, u32),
        (f"{a}.attention.head_count_kv", 1, u32),
        (f"{a}.rope.freq_base", 1000000.0, f32),
        (f"{a}.attention.layer_norm_rms_epsilon", 1e-5, f32),
        (f"{a}.expert_used_count", 2, u32),
        (f"{a}.expert_count", 4, u32),
        (f"{a}.expert_shared_count", 1, u32),
        (f"{a}.leading_dense_block_count", 1, u32),
        (f"{a}.expert_weights_scale", 2.5, f32),
        (f"{a}.expert_weights_norm", True, GGUFValueType.BOOL),
        (f"{a}.attention.q_lora_rank", 128, u32),
        (f"{a}.attention.kv_lora_rank", 64, u32),
        (f"{a}.attention.key_length", 96, u32),
        (f"{a}.attention.value_length", 64, u32),
        (f"{a}.attention.key_length_mla", 96, u32),
        (f"{a}.attention.value_length_mla", 64, u32),
        (f"{a}.rope.dimension_count", 32, u32),
        (f"{a}.attention.indexer.head_count", 2, u32),
        (f"{a}.attention.indexer.key_length", 32, u32),
        (f"{a}.attention.indexer.top_k", 2048, u32),
        (f"{a}.nextn_predict_layers", 1, u32),
        ("general.file_type", 15, u32),
        ("general.quantization_version", 2, u32),
        ("tokenizer.ggml.model", "gpt2", s),
        ("tokenizer.ggml.pre", "glm4", s),
        ("tokenizer.ggml.tokens", tokens, arr),
        ("tokenizer.ggml.token_type", [1] * (vocab - 2) + [3, 3], arr),
        ("tokenizer.ggml.merges", [f"t o{i}" for i in range(vocab // 2)], arr),
        ("tokenizer.ggml.eos_token_id", vocab - 1, u32),
        ("tokenizer.ggml.padding_token_id", vocab - 2, u32),
        ("tokenizer.ggml.add_bos_token", False, GGUFValueType.BOOL),
        ("tokenizer.chat_template", "[gMASK]<sop>{% for m in messages %}{{ m.content }}{% endfor %}", s),  # noqa: E501
    ]  # fmt: skip


SplitKeys = Callable[[int, int, int], list[tuple[str, Any, GGUFValueType]]]


def llama_split_keys(
    index: int, count: int, n_tensors: int
) -> list[tuple[str, Any, GGUFValueType]]:
    return [
        ("split.no", index, GGUFValueType.UINT16),
        ("split.tensors.count", n_tensors, GGUFValueType.INT32),
        ("split.count", count, GGUFValueType.UINT16),
    ]


def shard_path(directory: Path, prefix: str, index: int, count: int) -> Path:
    return directory / f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def write_split(
    directory: Path,
    tensors: list[Tensor],
    n_shards: int,
    *,
    prefix: str = "GLM-5-tiny-Q4_K_M",
    metadata_only_first: bool = True,
    alignment: int = 32,
    metadata: list[tuple[str, Any, GGUFValueType]] | None = None,
    split_keys: SplitKeys = llama_split_keys,
) -> list[Path]:
    """Write the set with one GGUFWriter per shard; returns the shard paths in order."""
    metadata = glm_dsa_metadata() if metadata is None else metadata
    with_tensors = n_shards - 1 if metadata_only_first else n_shards
    per = -(-len(tensors) // with_tensors)
    groups = [tensors[i * per : (i + 1) * per] for i in range(with_tensors)]
    if metadata_only_first:
        groups.insert(0, [])
    paths = []
    for i, group in enumerate(groups):
        path = shard_path(directory, prefix, i, n_shards)
        w = GGUFWriter(path, ARCH)
        w.kv_data[0].clear()  # GGUFWriter adds general.architecture; only shard 1 carries it
        if i == 0:
            for key, value, vtype in metadata:
                w.add_key_value(key, value, vtype, _sub_type(value, vtype))
        if alignment != 32:
            w.add_custom_alignment(alignment)  # every shard declares the layout it has
        for key, value, vtype in split_keys(i, n_shards, len(tensors)):
            w.add_key_value(key, value, vtype)
        _write_tensors_and_close(w, group)
        paths.append(path)
    return paths


def write_native_split(path: Path, tensors: list[Tensor], split_max_tensors: int) -> list[Path]:
    """gguf-py's own splitter (small_first_shard: a metadata-only first shard, as the converter
    writes); ``path`` names the unsplit file, the shards come back in order."""
    w = GGUFWriter(path, ARCH, split_max_tensors=split_max_tensors, small_first_shard=True)
    for key, value, vtype in glm_dsa_metadata()[1:]:
        sub = GGUFValueType.STRING if key.endswith(("tokens", "merges", "tags")) else None
        w.add_key_value(key, value, vtype, sub)
    _write_tensors_and_close(w, tensors)
    return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))


def write_raw_set(directory: Path, tensors: list[tuple[str, np.ndarray, tuple, Q]]) -> list[Path]:
    """Two shards `raw-0000N-of-00002.gguf` (split keys only, then TENSORS: (name, raw bytes as a
    non-uint8 array, raw shape, type)), so a shape Tensor cannot express (0 dimensions) reaches
    the file as written."""
    paths = []
    for i, group in enumerate([[], tensors]):
        path = shard_path(directory, "raw", i, 2)
        w = GGUFWriter(path, "glm-dsa")
        if i:
            w.kv_data[0].clear()
        for key, value, vtype in llama_split_keys(i, 2, len(tensors)):
            w.add_key_value(key, value, vtype)
        for name, data, shape, qtype in group:
            w.add_tensor(name, data, raw_shape=shape, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(path)
    return paths


def _write_tensors_and_close(w: GGUFWriter, tensors: list[Tensor]) -> None:
    for t in tensors:
        raw_dtype = None if t.ggml_type in (Q.F32, Q.F16) else t.ggml_type  # quantized: raw bytes
        w.add_tensor(t.name, t.data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _sub_type(value: Any, vtype: GGUFValueType) -> GGUFValueType | None:
    if vtype != GGUFValueType.ARRAY:
        return None
    first = value[0]
    if isinstance(first, str):
        return GGUFValueType.STRING
    return GGUFValueType.INT32


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    """GGUF ne with trailing 1s dropped (ggml_n_dims), as llama.cpp writes them."""
    ne = list(shape)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)


def _field_value(reader: GGUFReader, key: str):
    f = reader.fields[key]
    if f.types[0] == GGUFValueType.ARRAY:
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def assert_merged_matches(merged: Path, shards: list[Path], tensors, alignment: int) -> None:
    """Every key/value of shard 1 and every tensor's bytes, compared through GGUFReader."""
    out = GGUFReader(merged)
    first = GGUFReader(shards[0])
    assert out.alignment == alignment
    in_keys = [k for k in first.fields if not k.startswith("GGUF.")]
    out_keys = [k for k in out.fields if not k.startswith("GGUF.")]
    # shard 1's order, except split.count, which moves to the end (llama.cpp's gguf_set_val)
    assert out_keys == [k for k in in_keys if k != "split.count"] + ["split.count"]
    for key in in_keys:
        assert out.fields[key].types == first.fields[key].types, key
        if key != "split.count":
            assert _field_value(out, key) == _field_value(first, key), key
    assert out.fields["split.count"].contents() == 0
    assert out.fields["split.no"].contents() == 0
    assert out.fields["split.tensors.count"].contents() == len(tensors)

    by_name = {t.name: t for t in tensors}
    in_order = [t.name for s in shards for t in GGUFReader(s).tensors]
    assert [t.name for t in out.tensors] == in_order
    assert sorted(in_order) == sorted(by_name)
    for rt in out.tensors:
        src = by_name[rt.name]
        assert rt.tensor_type == src.ggml_type, rt.name
        assert tuple(int(d) for d in rt.shape) == _strip(tuple(reversed(src.shape))), rt.name
        assert rt.data_offset % alignment == 0, rt.name
        assert np.asarray(rt.data).tobytes() == src.raw, rt.name
    # zero padding between tensors and after the last one
    raw = merged.read_bytes()
    for rt in out.tensors:
        end = rt.data_offset + rt.n_bytes
        assert raw[end : gguf_format.pad(end, alignment)] == bytes(
            gguf_format.pad(end, alignment) - end
        )
    assert len(raw) == gguf_format.pad(len(raw), alignment)
