"""Write GLM-5-geometry GGUF files (llama.cpp's glm-dsa layout) with random valid quant blocks.

The file is what llama.cpp's converter (`conversion/glm.py` GlmMoeDsaModel over DeepseekV2Model)
plus llama-quantize would write for GLM-5, with N layers and E routed experts: the same metadata
keys, tensor names, GGUF shapes (ne0 first) and the split attn_k_b / attn_v_b halves of kv_b_proj.
Block data are random bytes of the right sizes with every fp16 scale field rewritten so that the
dequantized weights stay within +-`WEIGHT_BOUND` (finite, far inside fp16): speed measurements
need no quantizer. gguf-py's GGUFWriter writes the file, split into `-NNNNN-of-MMMMM.gguf` shards
when asked, as published files are (merge them with scripts/gguf_merge.py).

Type mixes (`MIXES`) follow the published files (../shared/notes/field-2026-12.md): everything
but the routed experts stays Q8_0 (AesSedai's recipes), the experts are gate / up / down:
Q4_K_M = Q4_K / Q4_K / Q5_K, IQ4_XS = IQ3_S / IQ3_S / IQ4_XS, UD-IQ2_M-like = IQ2_XXS / IQ2_XXS /
IQ2_S with the first MoE layer's down IQ3_S (236 GB published: ~2.2 bits per expert weight;
unsloth raises early layers; the exact per-layer
table of unsloth's file is not public in our sources, hence "-like").

Geometries: `glm5()` (TP1, 64 heads) and `tp8_shard()` (what one rank of a TP8 box computes per
layer: 8 heads, expert and shared intermediate 256, dense intermediate 1536); `tiny()` for tests.

`--nextn 1` appends GLM-5's MTP/nextn block after the N trunk layers, as llama.cpp's converter
writes GLM-5's blk.78 (GlmMoeDsaModel: block_count = trunk + nextn_predict_layers): blk.N is a MoE
layer with the usual attention, indexer and MoE tensors plus nextn.eh_proj (attention's type),
nextn.enorm, nextn.hnorm and nextn.shared_head_norm (F32). GLM-5's checkpoint has no per-layer
embed_tokens or shared_head.head, so neither does the file: patch 0009 drafts with the trunk's
token_embd and output.weight. The HF config keeps num_hidden_layers = N and says
num_nextn_predict_layers = 1. The default (0) writes the same bytes as before the option existed.

`--generation 5.2` writes GLM-5.2 (IndexShare; issue 18): its config.json's index_topk_freq 4 /
index_skip_topk_offset 3 make a trunk layer "shared" by vLLM 0.23.0's IndexCache rule
(`index_share_types`, the rule of tests/support/tiny_glm5.py and patch 0007; 57 of 78 layers,
layers 3-5 of the 6-layer tp8 view). A shared layer has no indexer.* tensors (it reuses the top-k
of the last full layer), the file carries glm-dsa.attention.indexer.types (bool per trunk layer,
True = full) right after indexer.top_k, as llama.cpp's converter writes it from indexer_types,
and the HF config gets GLM-5.2's keys. The nextn block keeps its indexer. 5.1's config.json has
GLM-5's keys, so `5.1` writes what `5` (the default, unchanged bytes) writes.

Exit: 0 written, 1 bad input (unknown mix or type, a dimension a type cannot block, output exists
without --force), 2 usage.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import cli_args
import numpy as np

EXAMPLES = """examples:
  python scripts/glm5_gguf_writer.py --mix Q4_K_M --layers 4 --out /tmp/glm5/GLM-5-Q4_K_M.gguf \\
      --split-max-tensors 64 --hf-dir /tmp/glm5/hf
  python scripts/glm5_gguf_writer.py --mix Q4_K_M --layers 6 --view tp8 --nextn 1 \\
      --out /tmp/glm5/tp8-mtp.gguf --hf-dir /tmp/glm5/hf-mtp
  python scripts/glm5_gguf_writer.py --mix IQ4_XS --layers 5 --experts 32 --view tp8 \\
      --out /tmp/glm5/tp8.gguf
  python scripts/glm5_gguf_writer.py --mix Q4_K_M --layers 6 --view tp8 --generation 5.2 \\
      --out /tmp/glm52/tp8.gguf --hf-dir /tmp/glm52/hf
  python scripts/glm5_gguf_writer.py --list-mixes
"""

WEIGHT_BOUND = 0.05  # max |dequantized weight|; activations of a few random layers stay small

ARCH = "glm-dsa"
# gguf-py 0.19's Keys.Attention.Indexer.TYPES (add_indexer_types); the pinned 0.18.0 has neither
INDEXER_TYPES_KEY = f"{ARCH}.attention.indexer.types"
# GLM generation -> IndexShare (index_topk_freq, index_skip_topk_offset); None: every layer full.
# The same table as tests/support/tiny_glm5.py's GENERATIONS (a unit test compares them).
GENERATIONS: dict[str, tuple[int, int] | None] = {"5": None, "5.1": None, "5.2": (4, 3)}


class WriterError(Exception):
    """A bad request: the message is printed as `error: ...`."""


def index_share_types(num_layers: int, freq: int, offset: int) -> list[str]:
    """Per-layer "full"/"shared" of IndexShare: vLLM 0.23.0's IndexCache rule (deepseek_v2.py
    `_skip_topk`), which yields llama.cpp's GLM_5_2_DEFAULT_INDEXER_TYPES for freq 4, offset 3."""
    return ["shared" if max(i - offset + 1, 0) % freq else "full" for i in range(num_layers)]


@dataclasses.dataclass(frozen=True)
class Geometry:
    """GLM-5's dimensions (defaults) with the layer and expert counts as options."""

    layers: int = 4
    experts: int = 256
    hidden: int = 6144
    heads: int = 64
    q_lora: int = 2048
    kv_lora: int = 512
    qk_nope: int = 192
    qk_rope: int = 64
    v_head: int = 256
    index_heads: int = 32
    index_dim: int = 128
    index_topk: int = 2048
    top_k: int = 8
    shared_experts: int = 1
    moe_inter: int = 2048
    shared_inter: int = 2048  # per shared expert (n_shared * moe_inter in the HF config)
    dense_inter: int = 12288
    first_dense: int = 3
    vocab: int = 154880
    context: int = 202752
    rope_theta: float = 1000000.0
    rms_eps: float = 1e-5
    routed_scaling: float = 2.5
    nextn: int = 0  # MTP/nextn blocks after the trunk (GLM-5 ships 1: blk.78)
    name: str = "glm5"
    generation: str = "5"  # a GENERATIONS key: "5.2" shares the indexer (IndexShare)

    def __post_init__(self) -> None:
        if self.layers < 1 or self.experts < self.top_k or self.first_dense < 0:
            raise WriterError(
                f"geometry needs layers >= 1 and experts >= top_k ({self.top_k}); "
                f"got layers {self.layers}, experts {self.experts}"
            )
        if self.nextn not in (0, 1):
            raise WriterError(f"nextn must be 0 or 1 (GLM-5 has one MTP layer), got {self.nextn}")
        if self.generation not in GENERATIONS:
            raise WriterError(
                f"generation {self.generation!r}: choose one of {', '.join(GENERATIONS)}"
            )

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_dense

    @property
    def indexer_types(self) -> list[str] | None:
        """GLM-5.2's "full"/"shared" per trunk layer; None for GLM-5 / 5.1 (all full)."""
        share = GENERATIONS[self.generation]
        return None if share is None else index_share_types(self.layers, *share)

    def has_indexer(self, layer: int) -> bool:
        """False for a shared trunk layer (no indexer tensors); the nextn block keeps its own."""
        types = self.indexer_types
        return types is None or layer >= self.layers or types[layer] == "full"


def glm5(layers: int = 4, experts: int = 256) -> Geometry:
    return Geometry(layers=layers, experts=experts)


def tp8_shard(layers: int = 4, experts: int = 256) -> Geometry:
    """One rank of TP8: heads, expert/shared/dense intermediates split 8 ways; the indexer is
    replicated in vLLM's GLM-5 code (ReplicatedLinear), so it keeps 32 heads."""
    full, ranks = glm5(layers, experts), 8
    return dataclasses.replace(
        full,
        heads=full.heads // ranks,
        moe_inter=full.moe_inter // ranks,
        shared_inter=full.shared_inter // ranks,
        dense_inter=full.dense_inter // ranks,
        name="glm5-tp8-shard",
    )


def tiny(layers: int = 3, experts: int = 8) -> Geometry:
    """scripts/tiny_glm5.py's geometry (hidden 512, 8 heads, K-quant-blockable dims)."""
    return Geometry(
        layers=layers,
        experts=experts,
        hidden=512,
        heads=8,
        q_lora=256,
        index_topk=128,
        top_k=2,
        moe_inter=256,
        shared_inter=256,
        dense_inter=1024,
        first_dense=1,
        vocab=512,
        context=4096,
        name="tiny",
    )


VIEWS: dict[str, Callable[[int, int], Geometry]] = {"full": glm5, "tp8": tp8_shard, "tiny": tiny}


# --- type mixes ------------------------------------------------------------------------------


# roles: "attn" (attention + indexer matrices), "dense" (layers < first_dense FFN), "shexp",
# "embd", "output", "gate_exps", "up_exps", "down_exps"; norms, router, indexer.proj, exp_probs_b
# are F32 in every llama.cpp file (the converter keeps 1-D tensors and these small ones float).
@dataclasses.dataclass(frozen=True)
class Mix:
    name: str
    roles: dict[str, str]
    note: str
    # per-layer override: (layer, first_moe_layer, role) -> type name or None
    override: Callable[[int, int, str], str | None] | None = None

    def type_for(self, role: str, layer: int, geom: Geometry) -> str:
        if self.override is not None:
            t = self.override(layer, geom.first_dense, role)
            if t is not None:
                return t
        return self.roles[role]


_Q8_REST = {"attn": "Q8_0", "dense": "Q8_0", "shexp": "Q8_0", "embd": "Q8_0", "output": "Q8_0"}


def _ud_iq2_m_override(layer: int, first_moe: int, role: str) -> str | None:
    return "IQ3_S" if role == "down_exps" and layer == first_moe else None


MIXES: dict[str, Mix] = {
    "Q4_K_M": Mix(
        "Q4_K_M",
        _Q8_REST | {"output": "Q6_K", "gate_exps": "Q4_K", "up_exps": "Q4_K", "down_exps": "Q5_K"},
        "AesSedai GLM-5.1 Q4_K_M: Q8_0 attention, experts Q4_K / Q4_K / Q5_K",
    ),
    "IQ4_XS": Mix(
        "IQ4_XS",
        _Q8_REST
        | {"output": "Q6_K", "gate_exps": "IQ3_S", "up_exps": "IQ3_S", "down_exps": "IQ4_XS"},
        "AesSedai GLM-5.1 IQ4_XS: Q8_0 attention, experts IQ3_S / IQ3_S / IQ4_XS",
    ),
    "UD-IQ2_M": Mix(
        "UD-IQ2_M",
        _Q8_REST
        | {
            "embd": "Q4_K",
            "output": "Q6_K",
            "gate_exps": "IQ2_XXS",
            "up_exps": "IQ2_XXS",
            "down_exps": "IQ2_S",
        },
        "UD-IQ2_M-like: Q8_0 attention, experts IQ2_XXS / IQ2_XXS / IQ2_S, first MoE down IQ3_S",
        _ud_iq2_m_override,
    ),
}


def mix_with(base: str, **roles: str) -> Mix:
    """A mix with some roles replaced (tests: unsupported types, gate != up)."""
    m = MIXES[base]
    return Mix(f"{base}+" + ",".join(f"{k}={v}" for k, v in roles.items()), m.roles | roles, m.note)


# --- the tensor plan -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # GGUF order: ne0 (contiguous, the quantized axis) first
    type_name: str
    role: str


def plan(geom: Geometry, mix: Mix) -> list[TensorSpec]:
    """Every tensor of the file in the converter's order, with its GGUF shape and type."""
    g = geom
    out: list[TensorSpec] = []

    def add(name: str, ne: tuple[int, ...], role: str) -> None:
        if role == "f32":
            t = "F32"
        elif role.startswith("fixed:"):
            t = role.split(":", 1)[1]
        else:
            t = mix.type_for(role, layer, g)
        out.append(TensorSpec(name, ne, t, role))

    layer = -1
    add("output.weight", (g.hidden, g.vocab), "output")
    add("token_embd.weight", (g.hidden, g.vocab), "embd")
    for layer in range(g.layers + g.nextn):
        p = f"blk.{layer}."
        # the nextn block in the converter's order: eh_proj, enorm, hnorm, the layer, head norm
        nextn = layer >= g.layers
        if nextn:
            # HF eh_proj is [hidden, 2 * hidden] (out, in): ne0 = 2 * hidden
            add(p + "nextn.eh_proj.weight", (2 * g.hidden, g.hidden), "attn")
            add(p + "nextn.enorm.weight", (g.hidden,), "f32")
            add(p + "nextn.hnorm.weight", (g.hidden,), "f32")
        add(p + "attn_norm.weight", (g.hidden,), "f32")
        if g.is_moe(layer):
            add(p + "ffn_down_exps.weight", (g.moe_inter, g.hidden, g.experts), "down_exps")
            add(p + "ffn_gate_exps.weight", (g.hidden, g.moe_inter, g.experts), "gate_exps")
            add(p + "ffn_up_exps.weight", (g.hidden, g.moe_inter, g.experts), "up_exps")
            add(p + "exp_probs_b.bias", (g.experts,), "f32")
            add(p + "ffn_gate_inp.weight", (g.hidden, g.experts), "f32")
            sh = g.shared_inter * g.shared_experts
            add(p + "ffn_down_shexp.weight", (sh, g.hidden), "shexp")
            add(p + "ffn_gate_shexp.weight", (g.hidden, sh), "shexp")
            add(p + "ffn_up_shexp.weight", (g.hidden, sh), "shexp")
        else:
            add(p + "ffn_down.weight", (g.dense_inter, g.hidden), "dense")
            add(p + "ffn_gate.weight", (g.hidden, g.dense_inter), "dense")
            add(p + "ffn_up.weight", (g.hidden, g.dense_inter), "dense")
        add(p + "ffn_norm.weight", (g.hidden,), "f32")
        if g.has_indexer(layer):  # a GLM-5.2 shared layer has none
            add(p + "indexer.k_norm.bias", (g.index_dim,), "f32")
            add(p + "indexer.k_norm.weight", (g.index_dim,), "f32")
            add(p + "indexer.proj.weight", (g.hidden, g.index_heads), "f32")
            add(p + "indexer.attn_k.weight", (g.hidden, g.index_dim), "attn")
            add(p + "indexer.attn_q_b.weight", (g.q_lora, g.index_heads * g.index_dim), "attn")
        add(p + "attn_kv_a_norm.weight", (g.kv_lora,), "f32")
        add(p + "attn_kv_a_mqa.weight", (g.hidden, g.kv_lora + g.qk_rope), "attn")
        # ne0 = qk_nope (192) cannot hold a 256-wide K/IQ block: every published file has it Q8_0
        add(p + "attn_k_b.weight", (g.qk_nope, g.kv_lora, g.heads), "fixed:Q8_0")
        add(p + "attn_v_b.weight", (g.kv_lora, g.v_head, g.heads), "attn")
        add(p + "attn_output.weight", (g.heads * g.v_head, g.hidden), "attn")
        add(p + "attn_q_a_norm.weight", (g.q_lora,), "f32")
        add(p + "attn_q_a.weight", (g.hidden, g.q_lora), "attn")
        add(p + "attn_q_b.weight", (g.q_lora, g.heads * (g.qk_nope + g.qk_rope)), "attn")
        if nextn:
            add(p + "nextn.shared_head_norm.weight", (g.hidden,), "f32")
    add("output_norm.weight", (g.hidden,), "f32")
    for spec in out:
        _check_blockable(spec)
    return out


def _check_blockable(spec: TensorSpec) -> None:
    import gguf

    qt = gguf.GGMLQuantizationType[spec.type_name]
    block, _ = gguf.GGML_QUANT_SIZES[qt]
    if spec.ne[0] % block:
        raise WriterError(
            f"{spec.name}: {spec.type_name} needs ne0 divisible by {block}, got {spec.ne[0]}"
        )


def nbytes(spec: TensorSpec) -> int:
    import gguf

    qt = gguf.GGMLQuantizationType[spec.type_name]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    return int(np.prod(spec.ne)) // block * size


# --- random valid blocks ---------------------------------------------------------------------

# byte offsets of the fp16 scale fields in one block (ggml-common.h); types not listed carry
# their scale elsewhere (IQ1_M: packed nibbles; MXFP4: an E8M0 byte; Q8_K: f32 d)
_F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q8_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "IQ1_S": (0,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
}
_FLOAT_TYPES = ("F32", "F16", "BF16")
_scale_cache: dict[str, float] = {}


def _set_scale(blocks: np.ndarray, type_name: str, scale: float) -> None:
    """Write `scale` into every scale field of `blocks` ([n, bytes_per_block] uint8, in place)."""
    if type_name in _F16_FIELDS:
        word = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
        for off in _F16_FIELDS[type_name]:
            blocks[:, off : off + 2] = word
    elif type_name == "IQ1_M":
        # the block scale is an fp16 spread over the top nibble of the four uint16 scales
        bits = int(np.float16(scale).view(np.uint16))
        sc = blocks[:, 48:56].view(np.uint16)
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
    elif type_name == "MXFP4":
        blocks[:, 0] = np.uint8(127 + int(np.floor(np.log2(scale))))
    elif type_name == "Q8_K":
        blocks[:, 0:4] = np.frombuffer(np.float32(scale).tobytes(), dtype=np.uint8)
    else:
        raise WriterError(f"no random-block rule for GGUF type {type_name}")


def _unit_scale(type_name: str) -> float:
    """The block scale that puts max |dequantized value| at WEIGHT_BOUND, measured once with
    gguf-py's own dequantizer on random blocks."""
    if type_name == "Q8_K":  # f32 d times int8 quants; gguf-py has no Q8_K dequantizer
        return WEIGHT_BOUND / 128
    if type_name not in _scale_cache:
        import gguf
        from gguf.quants import dequantize

        qt = gguf.GGMLQuantizationType[type_name]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        blocks = np.random.default_rng(12345).integers(0, 256, (512, size), dtype=np.uint8)
        probe = 2.0**-4 if type_name != "MXFP4" else 1.0
        _set_scale(blocks, type_name, probe)
        peak = float(np.abs(dequantize(blocks, qt)).max())
        if not np.isfinite(peak) or peak == 0:
            raise WriterError(f"{type_name}: random blocks dequantize to {peak}")
        s = probe * WEIGHT_BOUND / peak
        if type_name == "MXFP4":  # E8M0 holds powers of two only
            s = 2.0 ** np.floor(np.log2(s))
        _scale_cache[type_name] = s
    return _scale_cache[type_name]


def random_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """The array GGUFWriter.add_tensor takes: float values, or uint8 [..., rows, row_bytes]."""
    import gguf

    numpy_shape = tuple(reversed(spec.ne))
    if spec.type_name == "F32":
        if spec.role == "f32" and spec.name.endswith(("norm.weight",)):
            return (1.0 + 0.05 * rng.standard_normal(numpy_shape)).astype(np.float32)
        return (0.02 * rng.standard_normal(numpy_shape)).astype(np.float32)
    if spec.type_name == "F16":
        return (0.02 * rng.standard_normal(numpy_shape)).astype(np.float16)
    qt = gguf.GGMLQuantizationType[spec.type_name]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    n_blocks = int(np.prod(spec.ne)) // block
    if spec.type_name == "BF16":
        f = (0.02 * rng.standard_normal(n_blocks)).astype(np.float32)
        raw = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        raw = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).copy()
        _set_scale(raw.reshape(n_blocks, size), spec.type_name, _unit_scale(spec.type_name))
    row_bytes = spec.ne[0] // block * size
    return raw.reshape(*numpy_shape[:-1], row_bytes)


# --- metadata and files ----------------------------------------------------------------------

_FILE_TYPE = {"Q4_K_M": 15, "IQ4_XS": 30, "UD-IQ2_M": 29}  # llama_ftype: MOSTLY_Q4_K_M, ...


def write_metadata(w, geom: Geometry, mix: Mix) -> None:  # w: gguf.GGUFWriter
    """The keys llama.cpp's converter writes for glm-dsa, in its order (checked by a test
    against a real conversion), with GLM-5's values; the tokenizer is a placeholder vocabulary
    of the right size (vLLM takes the tokenizer from the HF folder)."""
    import gguf

    g = geom
    w.add_type(gguf.GGUFType.MODEL)
    gen = "GLM-5" if g.indexer_types is None else f"GLM-{g.generation}"
    w.add_name(f"{gen} geometry {g.name} (random weights)")
    w.add_size_label(f"{g.experts}x{g.layers}L")
    w.add_block_count(g.layers + g.nextn)
    w.add_context_length(g.context)
    w.add_embedding_length(g.hidden)
    w.add_feed_forward_length(g.dense_inter)
    w.add_head_count(g.heads)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(g.rope_theta)
    w.add_layer_norm_rms_eps(g.rms_eps)
    w.add_expert_count(g.experts)
    w.add_expert_used_count(g.top_k)
    w.add_expert_group_count(1)
    w.add_expert_group_used_count(1)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_file_type(_FILE_TYPE.get(mix.name, 7))
    w.add_leading_dense_block_count(min(g.first_dense, g.layers))
    w.add_vocab_size(g.vocab)
    w.add_q_lora_rank(g.q_lora)
    w.add_kv_lora_rank(g.kv_lora)
    w.add_key_length(g.kv_lora + g.qk_rope)
    w.add_value_length(g.kv_lora)
    w.add_key_length_mla(g.qk_nope + g.qk_rope)
    w.add_value_length_mla(g.v_head)
    w.add_expert_feed_forward_length(g.moe_inter)
    w.add_expert_shared_count(g.shared_experts)
    w.add_expert_weights_scale(g.routed_scaling)
    w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(g.qk_rope)
    if g.nextn:  # where the converter writes it; without the block (as --no-mtp) there is no key
        w.add_nextn_predict_layers(g.nextn)
    w.add_indexer_head_count(g.index_heads)
    w.add_indexer_key_length(g.index_dim)
    w.add_indexer_top_k(g.index_topk)
    if (types := g.indexer_types) is not None:  # the converter's add_indexer_types, same place
        w.add_array(INDEXER_TYPES_KEY, [t == "full" for t in types])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("glm4")
    w.add_token_list([f"<t{i}>" for i in range(g.vocab)])
    w.add_token_types([gguf.TokenType.NORMAL] * g.vocab)
    w.add_bos_token_id(1)
    w.add_eos_token_id(1)


def hf_config(geom: Geometry) -> dict:
    """config.json for --hf-config-path: GLM-5's keys with this geometry."""
    g = geom
    # the keys of tests/support/tiny_glm5.py's config (scripts must not import tests/)
    cfg = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "moe_layer_freq": 1,
        "head_dim": 64,
        "indexer_rope_interleave": True,
        "rope_interleave": True,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 2,
        "eos_token_id": [0, 7, 9],
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }
    first = min(g.first_dense, g.layers)
    cfg |= {
        "hidden_size": g.hidden,
        "intermediate_size": g.dense_inter,
        "moe_intermediate_size": g.moe_inter,
        "num_hidden_layers": g.layers,
        "first_k_dense_replace": first,
        "mlp_layer_types": ["dense"] * first + ["sparse"] * (g.layers - first),
        "num_attention_heads": g.heads,
        "num_key_value_heads": g.heads,
        "q_lora_rank": g.q_lora,
        "kv_lora_rank": g.kv_lora,
        "qk_nope_head_dim": g.qk_nope,
        "qk_rope_head_dim": g.qk_rope,
        "qk_head_dim": g.qk_nope + g.qk_rope,
        "v_head_dim": g.v_head,
        "index_topk": g.index_topk,
        "index_head_dim": g.index_dim,
        "index_n_heads": g.index_heads,
        "n_routed_experts": g.experts,
        "n_shared_experts": g.shared_experts,
        "num_experts_per_tok": g.top_k,
        "routed_scaling_factor": g.routed_scaling,
        "rms_norm_eps": g.rms_eps,
        "max_position_embeddings": g.context,
        "rope_parameters": {"rope_theta": g.rope_theta, "rope_type": "default"},
        "vocab_size": g.vocab,
        # patch 0009's draft reads blk.<num_hidden_layers>.. from here (num_hidden_layers: trunk)
        "num_nextn_predict_layers": g.nextn,
    }
    if (share := GENERATIONS[g.generation]) is not None:
        # GLM-5.2's config.json carries both the rule and the list it expands to (tiny_glm5's)
        cfg |= {
            "index_topk_freq": share[0],
            "index_skip_topk_offset": share[1],
            "index_topk_pattern": None,
            "indexer_types": g.indexer_types,
        }
    if g.shared_inter != g.moe_inter:
        # vLLM sizes the shared expert as moe_intermediate_size * n_shared_experts
        raise WriterError("hf_config needs shared_inter == moe_inter")
    return cfg


def write_hf_dir(path: Path, geom: Geometry) -> Path:
    """config.json + generation_config.json (no tokenizer: serve with skip_tokenizer_init)."""
    import safe_files

    path.mkdir(parents=True, exist_ok=True)
    cfg = json.dumps(hf_config(geom), indent=2) + "\n"
    safe_files.write_atomic(path / "config.json", cfg.encode())
    gen = {"bos_token_id": 2, "eos_token_id": [0, 7, 9], "pad_token_id": 0}
    safe_files.write_atomic(path / "generation_config.json", (json.dumps(gen) + "\n").encode())
    return path


def iter_tensors(geom: Geometry, mix: Mix, seed: int) -> Iterator[tuple[TensorSpec, np.ndarray]]:
    rng = np.random.default_rng(seed)
    for spec in plan(geom, mix):
        yield spec, random_tensor(spec, rng)


def write_gguf(
    out: Path,
    geom: Geometry,
    mix: Mix,
    *,
    seed: int = 0,
    split_max_tensors: int = 0,
    force: bool = False,
) -> list[Path]:
    """Write the file (or its shards, llama.cpp naming) and return the paths written."""
    import gguf

    if out.suffix != ".gguf":
        raise WriterError(f"{out}: the output name must end in .gguf")
    specs = plan(geom, mix)  # validates before anything is created
    n_shards = -(-len(specs) // split_max_tensors) if split_max_tensors else 1
    names = [
        gguf.SHARD_NAME_FORMAT.format(out.stem, i + 1, n_shards) if n_shards > 1 else out.name
        for i in range(n_shards)
    ]
    paths = [out.with_name(n) for n in names]
    for path in paths:
        if path.exists() and not force:
            raise WriterError(f"{path} exists (use --force to overwrite)")
    # written into a private folder beside the target, renamed into place once complete: a
    # failure leaves no half-written .gguf that a later merge or load could pick up
    tmp_dir = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir.mkdir()
    try:
        w = gguf.GGUFWriter(tmp_dir / out.name, ARCH, split_max_tensors=split_max_tensors)
        write_metadata(w, geom, mix)
        for spec, data in iter_tensors(geom, mix, seed):
            raw = (
                None
                if spec.type_name in ("F32", "F16")
                else gguf.GGMLQuantizationType[spec.type_name]
            )
            w.add_tensor(spec.name, data, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        written = sorted(x.name for x in tmp_dir.iterdir())
        if written != sorted(names):
            raise WriterError(f"GGUFWriter wrote {written}, expected {names}")
        for name in names:
            (tmp_dir / name).replace(out.with_name(name))
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = cli_args.parser(__doc__, EXAMPLES)
    p.add_argument("--out", type=Path, help="output .gguf (shards get -NNNNN-of-MMMMM)")
    p.add_argument("--mix", default="Q4_K_M", help=f"type mix: {', '.join(MIXES)}")
    p.add_argument("--view", choices=sorted(VIEWS), default="full", help="geometry view")
    p.add_argument("--layers", type=int, default=4, help="layers (first 3 dense; default 4)")
    p.add_argument("--experts", type=int, default=256, help="routed experts (default 256)")
    p.add_argument(
        "--nextn",
        type=int,
        choices=(0, 1),
        default=0,
        help="append GLM-5's MTP/nextn block as blk.<layers> (default %(default)s)",
    )
    p.add_argument(
        "--generation",
        choices=tuple(GENERATIONS),
        default="5",
        help="GLM generation; 5.2 adds IndexShare: shared layers lose their indexer tensors "
        "(default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-max-tensors", type=int, default=0, help="shard every N tensors")
    p.add_argument("--hf-dir", type=Path, help="also write config.json for --hf-config-path")
    p.add_argument("--force", action="store_true", help="overwrite existing output")
    p.add_argument("--list-mixes", action="store_true", help="print the mixes and exit")
    args = p.parse_args(argv)
    if args.list_mixes:
        for m in MIXES.values():
            print(f"{m.name:10s} {m.note}")
        return 0
    if args.out is None:
        p.error("--out is required")
    try:
        if args.mix not in MIXES:
            raise WriterError(f"unknown mix {args.mix!r} (known: {', '.join(MIXES)})")
        geom = dataclasses.replace(
            VIEWS[args.view](args.layers, args.experts),
            nextn=args.nextn,
            generation=args.generation,
        )
        paths = write_gguf(
            args.out,
            geom,
            MIXES[args.mix],
            seed=args.seed,
            split_max_tensors=args.split_max_tensors,
            force=args.force,
        )
        if args.hf_dir is not None:
            write_hf_dir(args.hf_dir, geom)
    except WriterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
