"""Write a tiny random-weight GLM-5-architecture Hugging Face checkpoint for the GPU e2e run.

`scripts/tiny_glm5.py` writes a similar model (with an MTP layer) for the patch and plugin tests;
this one is made for serving: no MTP layer, and the special tokens' lm_head rows are zero under a
wide lm_head, so sampled replies never end at once. It has GLM-5's attention geometry
(kv_lora_rank 512 + rope 64 = head size 576, qk_nope 192, v_head 256), a DSA indexer (32 heads x
128, index_topk 128, a multiple of 128 as vLLM's index conversion asserts), 3 layers (1 dense + 2
MoE with 8 routed experts and 1 shared), tensors named as in GLM-5's own safetensors (one tensor
per routed expert), a byte-level BPE tokenizer that carries GLM's special tokens (llama.cpp's
converter looks them up), a chat template and a generation config.

Needs torch, safetensors, tokenizers and transformers (the runtime venv or the staged vLLM).

    python tests/e2e/tiny_ckpt.py --out /tmp/tiny-glm5 --seed 0
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

EXAMPLES = """examples:
  python tests/e2e/tiny_ckpt.py --out /tmp/tiny-glm5
  python tests/e2e/tiny_ckpt.py --out /tmp/tiny-glm5 --seed 1 --layers 4
"""

REPO = Path(__file__).resolve().parents[2]
VOCAB = 512
SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
           "<|user|>", "<|assistant|>", "<|observation|>"]  # fmt: skip
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TEXT = (
    "The quick brown fox jumps over the lazy dog. " * 20
    + "Hello, my name is GLM and I run on vLLM with a sparse MLA backend. " * 20
    + "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}-_+=/\\ "
)


def make_config(layers: int) -> dict:
    """scripts/tiny_glm5.py's config (one source for the geometry), without MTP or a BOS token."""
    spec = importlib.util.spec_from_file_location("tiny_glm5", REPO / "scripts/tiny_glm5.py")
    assert spec is not None and spec.loader is not None
    tiny_glm5 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny_glm5)
    return tiny_glm5.config(num_layers=layers, mtp_layers=0) | {
        "vocab_size": VOCAB,
        "bos_token_id": None,
    }


def write_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def state_dict(cfg: dict, seed: int) -> dict:
    """GLM-5's HF tensor names and shapes: normal(0, 0.02) weights, norms 1, biases 0."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    nh, ql, kl = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    inter, moe, ne = cfg["intermediate_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    sd = {"model.embed_tokens.weight": w(v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        sd |= {
            a + "q_a_proj.weight": w(ql, h),
            a + "q_a_layernorm.weight": ones(ql),
            a + "q_b_proj.weight": w(nh * (nope + rope), ql),
            a + "kv_a_proj_with_mqa.weight": w(kl + rope, h),
            a + "kv_a_layernorm.weight": ones(kl),
            a + "kv_b_proj.weight": w(nh * (nope + vd), kl),
            a + "o_proj.weight": w(h, nh * vd),
            a + "indexer.wq_b.weight": w(ih * idim, ql),
            a + "indexer.wk.weight": w(idim, h),
            a + "indexer.k_norm.weight": ones(idim),
            a + "indexer.k_norm.bias": torch.zeros(idim, dtype=torch.bfloat16),
            a + "indexer.weights_proj.weight": w(ih, h),
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        }
        m = p + "mlp."
        if i < cfg["first_k_dense_replace"]:
            sd |= {
                m + "gate_proj.weight": w(inter, h),
                m + "up_proj.weight": w(inter, h),
                m + "down_proj.weight": w(h, inter),
            }
            continue
        sd[m + "gate.weight"] = w(ne, h)
        sd[m + "gate.e_score_correction_bias"] = torch.zeros(ne, dtype=torch.float32)
        for e in range(ne):
            x = f"{m}experts.{e}."
            sd |= {
                x + "gate_proj.weight": w(moe, h),
                x + "up_proj.weight": w(moe, h),
                x + "down_proj.weight": w(h, moe),
            }
        shared = moe * cfg["n_shared_experts"]
        sd |= {
            m + "shared_experts.gate_proj.weight": w(shared, h),
            m + "shared_experts.up_proj.weight": w(shared, h),
            m + "shared_experts.down_proj.weight": w(h, shared),
        }
    sd["model.norm.weight"] = ones(h)
    # A wide lm_head (logits std ~4.5) with zero rows for the special tokens: random text never
    # stops at once on an end-of-text token, so every request returns max_tokens of text.
    lm_head = (torch.randn(v, h, generator=gen) * 0.2).to(torch.bfloat16)
    lm_head[: len(SPECIAL)] = 0
    sd["lm_head.weight"] = lm_head
    return sd


def build(out: Path, seed: int, layers: int) -> int:
    from safetensors.torch import save_file

    cfg = make_config(layers)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen_cfg = {"eos_token_id": cfg["eos_token_id"], "pad_token_id": 0, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    n_tok = write_tokenizer(out)
    if n_tok > VOCAB:
        raise ValueError(f"tokenizer has {n_tok} tokens, more than vocab_size {VOCAB}")
    sd = state_dict(cfg, seed)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    n = sum(t.numel() for t in sd.values())
    print(f"wrote {out}: {len(sd)} tensors, {n / 1e6:.1f} M parameters, {n_tok} tokens")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default %(default)s)")
    p.add_argument("--layers", type=int, default=3, help="layers, >= 2 (default %(default)s)")
    args = p.parse_args(argv)
    if args.layers < 2:
        p.error("--layers must be >= 2 (one dense layer, then MoE layers)")
    return build(args.out, args.seed, args.layers)


if __name__ == "__main__":
    sys.exit(main())
