"""The plain-torch GLM-5 reference (tests/support/glm5_reference.py) is right (CPU, float64).

1. Tiny GLM-5: its logits equal transformers' own GlmMoeDsaForCausalLM (the runtime env's
   transformers, an independent implementation) on the same weights within 1e-5. transformers
   5.5 applies split-half RoPE where vLLM applies interleaved pairs, so transformers gets the
   weights with their rope rows permuted (pair (2i, 2i+1) -> (i, i + d/2)): the same function
   then, which proves the reference's interleaved (vLLM) form; unpermuted, they differ.
2. Tiny GLM-5.2 (7 layers: 0-2 full, 3-5 shared, 6 full): the shared layers attend exactly the
   last full layer's top-k (layer 2's), which a per-layer indexer on the same weights would not
   pick, and they read no indexer weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import tiny_glm5

pytestmark = pytest.mark.runtime(requires=("torch", "transformers", "safetensors"))
pytest.importorskip("torch")  # collected by the controller venv too, which has none
from support import glm5_reference as ref  # noqa: E402  (imports torch)

TOKENS = 160  # > index_topk 128: the indexer really selects


def _prompt(n: int, seed: int = 1) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(16, 512) for _ in range(n)]


def _rope_rows_to_neox(cfg: dict, w: dict) -> dict:
    """The same model for split-half RoPE: every rope output row reordered evens-then-odds."""
    import torch

    rd = cfg["qk_rope_head_dim"]
    perm = torch.cat([torch.arange(0, rd, 2), torch.arange(1, rd, 2)])
    nh, nope, kvl = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["kv_lora_rank"]
    out = dict(w)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        q_b = w[p + "q_b_proj.weight"].view(nh, nope + rd, -1).clone()
        q_b[:, nope:] = q_b[:, nope:][:, perm]
        out[p + "q_b_proj.weight"] = q_b.reshape(w[p + "q_b_proj.weight"].shape)
        kv_a = w[p + "kv_a_proj_with_mqa.weight"].clone()
        kv_a[kvl:] = kv_a[kvl:][perm]
        out[p + "kv_a_proj_with_mqa.weight"] = kv_a
        if cfg["indexer_rope_interleave"] and p + "indexer.wk.weight" in w:
            ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
            wq = w[p + "indexer.wq_b.weight"].view(ih, idim, -1).clone()
            wq[:, :rd] = wq[:, :rd][:, perm]
            out[p + "indexer.wq_b.weight"] = wq.reshape(w[p + "indexer.wq_b.weight"].shape)
            for n in ("wk.weight", "k_norm.weight", "k_norm.bias"):  # LayerNorm: permute along
                t = w[p + "indexer." + n].clone()
                t[:rd] = t[:rd][perm]
                out[p + "indexer." + n] = t
    return out


def _transformers_logits(tmp: Path, cfg: dict, w: dict, ids: list[int]):
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    tmp.mkdir()
    (tmp / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in w.items()}, str(tmp / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(
        str(tmp), dtype=torch.float64, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_reference_equals_transformers_glm5(tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(2)
    cfg = tiny_glm5.config(3, 0)
    raw = tiny_glm5.random_weights(cfg, seed=3)
    tiny_glm5.write_checkpoint(tmp_path / "ckpt", 3, num_layers=3, mtp_layers=0)
    w = ref.load_hf(tmp_path / "ckpt")  # the same seeded weights, through the loader
    assert torch.equal(w["model.layers.1.mlp.experts.up_proj.weight"][5],
                       raw["model.layers.1.mlp.experts.5.up_proj.weight"].double())  # fmt: skip
    ids = _prompt(TOKENS)
    # transformers 5.5's q_a/kv_a RMSNorms use eps 1e-6 (vLLM: rms_norm_eps)
    ours, rows = ref.forward(cfg, w, ids, lora_norm_eps=1e-6)
    assert rows[0].shape == (TOKENS, 128) and int((rows[0][-1] >= 0).sum()) == 128
    assert int((rows[0][10] >= 0).sum()) == 11  # causal: query 10 has 11 keys, -1 for the rest

    theirs = _transformers_logits(tmp_path / "hf", cfg, _rope_rows_to_neox(cfg, raw), ids)
    diff = float((ours - theirs).abs().max())
    print(f"reference vs transformers: max |logit diff| {diff:.2e}")
    assert diff < 1e-5, diff
    assert float(ours.abs().max()) > 1.0  # logits of a size a wrong layer would change

    # The permutation is what makes them equal: the unpermuted model is another function.
    plain = _transformers_logits(tmp_path / "hf-plain", cfg, raw, ids)
    assert float((ours - plain).abs().max()) > 1e-2
    # ... and the reference's split-half form is transformers' on the unpermuted weights.
    neox, _ = ref.forward(cfg, w, ids, lora_norm_eps=1e-6, rope="neox")
    assert float((neox - plain).abs().max()) < 1e-5


def test_glm52_shared_layers_reuse_last_full_topk() -> None:
    import torch

    torch.set_num_threads(2)
    cfg52 = tiny_glm5.config(7, 0, generation="5.2")
    assert ref.layer_types(cfg52) == ["full"] * 3 + ["shared"] * 3 + ["full"]
    # Weights with an indexer in every layer (GLM-5's layout), so a per-layer indexer exists.
    w = {k: v.double() for k, v in tiny_glm5.random_weights(tiny_glm5.config(7, 0), 4).items()}
    for i in range(7):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            p = f"model.layers.{i}.mlp.experts."
            if i >= 1:
                w[f"{p}{proj}.weight"] = torch.stack([w.pop(f"{p}{e}.{proj}.weight")
                                                      for e in range(8)])  # fmt: skip
    ids = _prompt(TOKENS, seed=2)
    logits, rows = ref.forward(cfg52, w, ids)
    for layer in (3, 4, 5):
        assert torch.equal(rows[layer], rows[2])
    sets = {i: rows[i].sort(dim=1).values for i in rows}
    assert int((sets[6] != sets[2]).any(dim=1).sum()) > 0  # the next full layer selects anew

    # A per-layer indexer (index_share off) picks other keys in the shared layers ...
    own_logits, own = ref.forward(cfg52, w, ids, index_share=False)
    for layer in (3, 4, 5):
        differ = int((own[layer].sort(dim=1).values != sets[2]).any(dim=1).sum())
        assert differ > 0, layer
    assert float((own_logits - logits).abs().max()) > 1e-6
    # ... and the IndexShare forward never reads a shared layer's indexer weights.
    stripped = {k: v for k, v in w.items()
                if not any(f"layers.{i}.self_attn.indexer." in k for i in (3, 4, 5))}  # fmt: skip
    again, _ = ref.forward(cfg52, stripped, ids)
    assert torch.equal(again, logits)
    with pytest.raises(KeyError):
        ref.forward(cfg52, stripped, ids, index_share=False)
