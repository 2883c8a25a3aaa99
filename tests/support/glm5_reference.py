"""An independent plain-torch forward of the tiny GLM-5 / GLM-5.2 (glm_moe_dsa), in float64.

The served model is vLLM 0.23.0's DeepSeek-V2 code (with patches 0007/0008) on a GGUF written by
llama.cpp's converter; this module recomputes the same math from the weights alone, written from
the model's definition (MLA + DSA indexer + sigmoid-routed MoE), not from either implementation,
so the e2e reference comparison (tests/e2e/reference_check.py) has something to compare against:

- MLA attention with the plain kv_b_proj (the absorbed form is the same product in another order,
  equal in float64); softmax scale qk_head_dim ** -0.5; RMSNorm eps from config.json
  (vLLM uses rms_norm_eps for q_a/kv_a norms too; transformers 5.5 uses 1e-6 there:
  ``lora_norm_eps``).
- RoPE (default type, rope_theta) on the qk_rope dims: interleaved pairs (2i, 2i+1) as vLLM
  applies it to GLM-5 (`is_neox_style=False`; the indexer's follows indexer_rope_interleave);
  ``rope="neox"`` is the split-half form transformers 5.5 uses.
- The DSA indexer: per query, score(t) = sum_h w_h * relu(q_h . k_t) over causal keys, with
  w = weights_proj(x) * n_heads^-0.5 * head_dim^-0.5, k = LayerNorm(wk(x)) and RoPE on the first
  qk_rope dims of q and k; the attention reads only the index_topk best keys. IndexShare
  (GLM-5.2's indexer_types): a "shared" layer has no indexer and reuses the top-k of the last
  "full" layer before it.
- MoE: sigmoid scores, e_score_correction_bias only for the choice, group-limited top-k
  (n_group/topk_group, groups ranked by their two best biased scores), unbiased weights of the
  chosen experts renormalised (norm_topk_prob) and times routed_scaling_factor, plus the shared
  expert; the first_k_dense_replace layers are dense SwiGLU MLPs. Then the final norm, lm_head.

Weights are a dict in HF naming, routed experts stacked per layer
(``model.layers.N.mlp.experts.gate_proj.weight`` [E, inter, hidden]): load_hf reads an HF
safetensors folder, load_gguf a converted GGUF (dequantised with gguf-py; kv_b_proj rebuilt from
attn_k_b/attn_v_b the way patch 0004 does). Needs torch (and numpy + gguf for load_gguf).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

F64 = torch.float64


def load_config(hf_dir: Path) -> dict[str, Any]:
    return json.loads((Path(hf_dir) / "config.json").read_text())


def layer_types(cfg: dict[str, Any]) -> list[str]:
    """ "full"/"shared" per trunk layer; every layer full without IndexShare (GLM-5, 5.1)."""
    types = cfg.get("indexer_types") or ["full"] * cfg["num_hidden_layers"]
    if len(types) != cfg["num_hidden_layers"] or types[0] != "full":
        raise ValueError(f"indexer_types must list {cfg['num_hidden_layers']} layers, first full")
    return list(types)


def is_moe(cfg: dict[str, Any], i: int) -> bool:
    if cfg.get("mlp_layer_types"):
        return cfg["mlp_layer_types"][i] == "sparse"
    return i >= cfg["first_k_dense_replace"]


def weight_names(cfg: dict[str, Any]) -> list[str]:
    """Every tensor the forward reads (HF naming, experts stacked)."""
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i, kind in enumerate(layer_types(cfg)):
        p = f"model.layers.{i}."
        names += [p + n for n in (
            "input_layernorm.weight", "post_attention_layernorm.weight",
            "self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight",
            "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
            "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight",
            "self_attn.o_proj.weight",
        )]  # fmt: skip
        if kind == "full":
            names += [p + "self_attn.indexer." + n for n in (
                "wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight",
            )]  # fmt: skip
        if is_moe(cfg, i):
            names += [p + "mlp." + n for n in (
                "gate.weight", "gate.e_score_correction_bias", "experts.gate_proj.weight",
                "experts.up_proj.weight", "experts.down_proj.weight",
                "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight",
                "shared_experts.down_proj.weight",
            )]  # fmt: skip
        else:
            names += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
    return names


def _check(cfg: dict[str, Any], w: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    missing = [n for n in weight_names(cfg) if n not in w]
    if missing:
        raise ValueError(f"{source}: {len(missing)} tensors missing, first {missing[0]}")
    return w


def load_hf(hf_dir: Path, cfg: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The HF checkpoint's trunk tensors in float64, per-expert tensors stacked."""
    from safetensors.torch import load_file

    cfg = cfg or load_config(hf_dir)
    raw: dict[str, torch.Tensor] = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        raw |= load_file(str(f))
    w = {k: v.to(F64) for k, v in raw.items() if ".experts." not in k}
    for i in range(cfg["num_hidden_layers"]):
        if not is_moe(cfg, i):
            continue
        for proj in ("gate_proj", "up_proj", "down_proj"):
            p = f"model.layers.{i}.mlp.experts."
            experts = [raw[f"{p}{e}.{proj}.weight"] for e in range(cfg["n_routed_experts"])]
            w[f"{p}{proj}.weight"] = torch.stack(experts).to(F64)
    return _check(cfg, w, str(hf_dir))


def _gguf_open(path: Path, cfg: dict[str, Any]) -> tuple[Any, dict[str, list[str]]]:
    """The GGUF's reader and, per HF weight name, the GGUF tensors it comes from.

    Names come from gguf-py's own table for the file's architecture (what llama.cpp's converter
    used to name them); kv_b_proj comes from attn_k_b and attn_v_b.
    """
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    arch_id = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    tmap = gguf.get_tensor_name_map(arch_id, cfg["num_hidden_layers"])
    present = {t.name for t in reader.tensors}
    src: dict[str, list[str]] = {}
    for name in weight_names(cfg):
        if name.endswith("kv_b_proj.weight"):
            src[name] = [
                tmap.get_name(name.replace("kv_b_proj.weight", half)) + ".weight"
                for half in ("k_b_proj", "v_b_proj")
            ]
            continue
        stem, _, suffix = name.rpartition(".")
        if suffix == "e_score_correction_bias":  # gguf-py's stem for it ends "_correction"
            stem, suffix = stem + ".e_score_correction", "bias"
        gname = tmap.get_name(stem)
        if gname is None or f"{gname}.{suffix}" not in present:
            raise ValueError(f"{path}: no tensor for {name} ({gname}.{suffix})")
        src[name] = [f"{gname}.{suffix}"]
    return reader, src


def load_gguf(path: Path, cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A converted GGUF's tensors dequantised to float64 under their HF names.

    kv_b_proj is rebuilt from attn_k_b [H, kv_lora, nope] (transposed per head) and attn_v_b
    [H, v_head, kv_lora], the inverse of the converter's split.
    """
    import gguf
    import numpy as np

    reader, src = _gguf_open(path, cfg)
    tensors = {t.name: t for t in reader.tensors}

    def get(gname: str) -> torch.Tensor:
        t = tensors[gname]
        data = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
        return torch.from_numpy(data.copy())

    w: dict[str, torch.Tensor] = {}
    for name, gnames in src.items():
        if name.endswith("kv_b_proj.weight"):
            k_b, v_b = (get(g) for g in gnames)
            w[name] = torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, k_b.shape[1])
        else:
            w[name] = get(gnames[0])
    return _check(cfg, w, str(path))


# Read without a matmul of vLLM's GGUF linear/MoE kernels: the embedding is a row lookup, and
# kv_b_proj is dequantised into MLA's absorbed W_UK_T/W_UV (patch 0004), which the sparse MLA
# backends multiply in the model dtype.
NOT_GGUF_MATMUL = ("model.embed_tokens.weight", "kv_b_proj.weight")


def gguf_quantized_names(path: Path, cfg: dict[str, Any]) -> list[str]:
    """HF names of the weights that vLLM multiplies with a quantised GGUF kernel, whose input it
    rounds to 8 bits first (ggml_mul_mat_a8 / _vec_a8, ggml_moe_a8 / _vec: quantize_q8_1): every
    tensor stored in a quantised type, except the embedding and kv_b_proj (NOT_GGUF_MATMUL).
    forward(act_quant=) takes the list."""
    reader, src = _gguf_open(path, cfg)
    plain = {"F32", "F16", "BF16", "F64"}
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    return [
        name for name, gnames in src.items()
        if not name.endswith(NOT_GGUF_MATMUL) and any(types[g] not in plain for g in gnames)
    ]  # fmt: skip


def _hi(x: torch.Tensor) -> torch.dtype:
    """At least float32: where vLLM keeps fp32 in a 16-bit model (norms, softmax, router)."""
    return torch.promote_types(x.dtype, torch.float32)


Q8_1_BLOCK = 32  # ggml's QK8_1: the activation block of vLLM's GGUF int8 kernels


def q8_1(x: torch.Tensor) -> torch.Tensor:
    """x rounded the way vLLM's GGUF matmuls round their input (ggml's quantize_q8_1).

    Blocks of 32 along the last dim: d = amax / 127, values rounded to integers q = roundf(x / d)
    in [-127, 127] (half away from zero), d kept as half; a Q8_0 x Q8_1 product is then
    d_w * d_x * (integer dot), so the activation carries ~8 bits where fp16 carries 11.
    """
    shape = x.shape
    b = x.reshape(*shape[:-1], shape[-1] // Q8_1_BLOCK, Q8_1_BLOCK).to(_hi(x))
    d = b.abs().amax(-1, keepdim=True) / 127
    q = b / torch.where(d > 0, d, 1)
    q = torch.sign(q) * torch.floor(q.abs() + 0.5)
    return (q * d.to(torch.float16).to(b.dtype)).reshape(shape).to(x.dtype)


def _mm(x: torch.Tensor, w: dict[str, torch.Tensor], name: str, aq: frozenset[str]) -> torch.Tensor:
    """x @ w[name].T, its input rounded by q8_1 first where ``name`` is in ``aq``."""
    return (q8_1(x) if name in aq else x) @ w[name].T


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(_hi(x))
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def _rope(x: torch.Tensor, theta: float, interleaved: bool) -> torch.Tensor:
    """RoPE of x [T, heads, d] at positions 0..T-1: pair i turns by pos * theta^(-2i/d)."""
    t, d = x.shape[0], x.shape[-1]
    f64 = torch.float64  # the angles in float64 whatever x is (pos * freq needs the digits)
    inv = theta ** (-torch.arange(0, d, 2, dtype=f64, device=x.device) / d)
    ang = torch.arange(t, dtype=f64, device=x.device)[:, None] * inv[None]  # [T, d/2]
    cos, sin = (f(ang)[:, None, :].to(x.dtype) for f in (torch.cos, torch.sin))
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def indexer_topk(
    cfg: dict[str, Any], w: dict[str, torch.Tensor], p: str, x: torch.Tensor, qr: torch.Tensor,
    rope: str, aq: frozenset[str] = frozenset(),
) -> torch.Tensor:  # fmt: skip
    """[T, min(index_topk, T)] key indices per query, -1 where fewer causal keys exist."""
    t = x.shape[0]
    nh, hd, rd = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
    inter = rope == "interleaved" and bool(cfg.get("indexer_rope_interleave", False))
    theta = cfg["rope_parameters"]["rope_theta"]
    q = _mm(qr, w, p + "wq_b.weight", aq).view(t, nh, hd)
    q = torch.cat([_rope(q[..., :rd], theta, inter), q[..., rd:]], dim=-1)
    k = _mm(x, w, p + "wk.weight", aq)
    k = torch.nn.functional.layer_norm(
        k, (hd,), w[p + "k_norm.weight"], w[p + "k_norm.bias"], eps=1e-6
    )  # the indexer's LayerNorm eps is fixed at 1e-6 in vLLM and transformers alike
    k = torch.cat([_rope(k[:, None, :rd], theta, inter)[:, 0], k[:, rd:]], dim=-1)
    weights = _mm(x, w, p + "weights_proj.weight", aq) * nh**-0.5 * hd**-0.5  # [T, H]
    scores = torch.einsum("sh,sht->st", weights, torch.relu(torch.einsum("shd,td->sht", q, k)))
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    scores = scores.masked_fill(~causal, -math.inf)
    vals, idx = scores.topk(min(cfg["index_topk"], t), dim=-1)
    return idx.masked_fill(vals == -math.inf, -1)


def _attention(
    cfg: dict[str, Any], w: dict[str, torch.Tensor], p: str, x: torch.Tensor,
    topk: torch.Tensor | None, kind: str, rope: str, lora_eps: float,
    aq: frozenset[str] = frozenset(),
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    t = x.shape[0]
    nh, nope, rd = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    vd, kvl = cfg["v_head_dim"], cfg["kv_lora_rank"]
    theta = cfg["rope_parameters"]["rope_theta"]
    inter = rope == "interleaved"
    qr = _rms(_mm(x, w, p + "q_a_proj.weight", aq), w[p + "q_a_layernorm.weight"], lora_eps)
    q = _mm(qr, w, p + "q_b_proj.weight", aq).view(t, nh, nope + rd)
    q_nope, q_pe = q[..., :nope], _rope(q[..., nope:], theta, inter)
    kv_a = _mm(x, w, p + "kv_a_proj_with_mqa.weight", aq)
    c = _rms(kv_a[:, :kvl], w[p + "kv_a_layernorm.weight"], lora_eps)
    k_pe = _rope(kv_a[:, None, kvl:], theta, inter)  # one rope key shared by every head
    kv = _mm(c, w, p + "kv_b_proj.weight", aq).view(t, nh, nope + vd)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    if kind == "full":  # shared layers keep the top-k they were handed (IndexShare)
        topk = indexer_topk(cfg, w, p + "indexer.", x, qr, rope, aq)
    assert topk is not None
    scores = torch.einsum("shd,thd->hst", q_nope, k_nope) + torch.einsum(
        "shd,td->hst", q_pe, k_pe[:, 0]
    )
    scores = scores * (nope + rd) ** -0.5
    allowed = torch.zeros(t, t + 1, dtype=torch.bool, device=x.device)
    allowed.scatter_(1, topk.masked_fill(topk < 0, t), True)  # -1 lands in a dropped column
    allowed = allowed[:, :t] & torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    probs = scores.to(_hi(scores)).masked_fill(~allowed[None], -math.inf).softmax(-1)
    probs = probs.to(v.dtype)
    out = torch.einsum("hst,thd->shd", probs, v).reshape(t, nh * vd)
    return _mm(out, w, p + "o_proj.weight", aq), topk


def _swiglu(
    x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
    quant: tuple[bool, bool] = (False, False),
) -> torch.Tensor:  # fmt: skip
    """down(silu(gate x) * up x); ``quant``: q8_1 on the input of gate/up, of down."""
    xq = q8_1(x) if quant[0] else x
    h = torch.nn.functional.silu(xq @ gate.T) * (xq @ up.T)
    return (q8_1(h) if quant[1] else h) @ down.T


def _moe(
    cfg: dict[str, Any], w: dict[str, torch.Tensor], p: str, x: torch.Tensor,
    aq: frozenset[str] = frozenset(),
) -> torch.Tensor:  # fmt: skip
    n_exp, top_k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    n_group, topk_group = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise ValueError("the reference implements GLM-5's sigmoid router only")
    hi = _hi(x)  # vLLM routes in fp32 (GateLinear's out_dtype with a correction bias)
    scores = (x.to(hi) @ w[p + "gate.weight"].to(hi).T).sigmoid()  # [T, E]
    biased = scores + w[p + "gate.e_score_correction_bias"].to(hi)
    groups = biased.view(-1, n_group, n_exp // n_group).topk(min(2, n_exp // n_group), -1)[0]
    keep = groups.sum(-1).topk(topk_group, -1)[1]  # [T, topk_group]
    group_mask = torch.zeros_like(groups[..., 0]).scatter_(1, keep, 1.0).bool()
    expert_mask = group_mask.repeat_interleave(n_exp // n_group, dim=1)
    chosen = biased.masked_fill(~expert_mask, -math.inf).topk(top_k, -1)[1]  # [T, k]
    gates = scores.gather(1, chosen)
    if cfg.get("norm_topk_prob", True):
        gates = gates / (gates.sum(-1, keepdim=True) + 1e-20)
    gates = gates * cfg.get("routed_scaling_factor", 1.0)
    dense = torch.zeros_like(scores).scatter_(1, chosen, gates).to(x.dtype)  # 0: unchosen
    sh = [p + f"shared_experts.{n}_proj.weight" for n in ("gate", "up", "down")]
    out = _swiglu(x, *(w[n] for n in sh), quant=(sh[0] in aq, sh[2] in aq))
    ex = [p + f"experts.{n}_proj.weight" for n in ("gate", "up", "down")]
    g, u, d = (w[n] for n in ex)
    for e in range(n_exp):  # every expert on every token: tiny model, simplest exact sum
        if bool(dense[:, e].any()):
            y = _swiglu(x, g[e], u[e], d[e], quant=(ex[0] in aq, ex[2] in aq))
            out = out + dense[:, e : e + 1] * y
    return out


def forward(
    cfg: dict[str, Any],
    w: dict[str, torch.Tensor],
    ids: list[int],
    *,
    rope: str = "interleaved",
    lora_norm_eps: float | None = None,
    index_share: bool = True,
    share_from: int | None = None,
    device: str = "cpu",
    dtype: torch.dtype = F64,
    act_quant: Collection[str] = (),
    given_topk: Mapping[int, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Logits [T, vocab] (in ``dtype``) of one sequence and each layer's top-k rows [T, k].

    ``index_share=False`` gives every layer its own indexer (needs indexer weights everywhere):
    what a GLM-5 forward of the same weights would select, for tests that must tell them apart.
    ``share_from`` (a full layer): the shared layers reuse that layer's top-k instead of the
    last full one's, a counterfactual IndexShare for checks that must be able to fail.
    ``dtype`` other than float64: the same math in that arithmetic (weights and activations),
    to see how much this model's outputs move with rounding alone.
    ``act_quant``: weight names whose matmul input is rounded by q8_1 first, what vLLM's GGUF
    kernels do for a quantized weight (gguf_quantized_names lists a GGUF's).
    ``given_topk`` {full layer: [>= T, k] rows}: those layers attend these keys instead of their
    indexer's (a served model's own selections, -1 padded), so a comparison sees everything
    after the selection and none of the selection's rounding; shared layers still reuse them.
    """
    aq = frozenset(act_quant)
    if rope not in ("interleaved", "neox"):
        raise ValueError(f"rope {rope!r}: interleaved (vLLM) or neox (transformers 5.5)")
    eps = cfg["rms_norm_eps"]
    lora_eps = eps if lora_norm_eps is None else lora_norm_eps
    types = layer_types(cfg) if index_share else ["full"] * cfg["num_hidden_layers"]
    w = {k: v.to(device=device, dtype=dtype) for k, v in w.items()}
    x = w["model.embed_tokens.weight"][torch.tensor(ids, device=device)]
    topk: torch.Tensor | None = None
    rows: dict[int, torch.Tensor] = {}
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        if kind == "shared" and share_from is not None:
            topk = rows[share_from]
        if kind == "full" and given_topk is not None and i in given_topk:
            topk, kind = given_topk[i][: len(ids)].to(device=device, dtype=torch.long), "given"
        a, topk = _attention(cfg, w, p + "self_attn.", h, topk, kind, rope, lora_eps, aq)
        rows[i] = topk
        x = x + a
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        if is_moe(cfg, i):
            x = x + _moe(cfg, w, p + "mlp.", h, aq)
        else:
            mlp = [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
            x = x + _swiglu(h, *(w[n] for n in mlp), quant=(mlp[0] in aq, mlp[2] in aq))
    x = _rms(x, w["model.norm.weight"], eps)
    return _mm(x, w, "lm_head.weight", aq), rows


def logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax over the vocabulary, float64 (what vLLM's raw logprobs are)."""
    return torch.log_softmax(logits.to(F64), dim=-1)
