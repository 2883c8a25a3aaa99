"""Write a tiny random-weight GLM-5 (glm_moe_dsa) Hugging Face checkpoint: the one test builder.

The attention geometry is GLM-5's own (kv_lora_rank 512, qk_nope 192, qk_rope 64, v_head 256,
DSA indexer 32 heads x 128, index_topk 128, interleaved indexer RoPE); everything else is small:
3 layers (layer 0 dense), 8 routed experts + 1 shared, vocab 512, and by default one MTP/nextn
layer appended after the trunk exactly as GLM-5 ships it (model.layers.<num_hidden_layers>.*).
Weights are bfloat16 safetensors in the original checkpoint naming (per-expert tensors), so
llama.cpp's convert_hf_to_gguf.py converts the folder like the real model. The tokenizer is a
byte-level BPE trained here with the `tokenizers` library (no hub access) that carries GLM's
special tokens (llama.cpp's GLM vocab writer looks them up).

Options cover every user: the patch proof (defaults), the GPU e2e serve run (`--serve`: no MTP
layer, no BOS token, and a wide lm_head whose special-token rows are zero, so sampled replies
never end at once), and the plugin proof's config-only models (`--config-only`, `--index-topk`,
`--arch deepseek_v3` for the dense reference: vLLM draws the weights there), and the GLM
generations (`--generation 5.2`: GLM-5.2's IndexShare, whose "shared" indexer layers carry no
indexer weights and reuse the top-k of the last "full" one; 5.1's config.json has GLM-5's keys,
so `5.1` writes what `5` writes). Without options the output is what it always was.

Needs torch, safetensors and tokenizers (the runtime env has them; --config-only needs only
tokenizers). Exit: 0 ok, 1 the output folder is not empty (use --force), 2 usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support import cli

EXAMPLES = """examples:
  PYTHONPATH=tests python -m support.tiny_glm5 --out /tmp/tiny-glm5 --seed 0
  PYTHONPATH=tests python -m support.tiny_glm5 --out /tmp/tiny-glm5 --seed 1 --mtp-layers 0 --force
  PYTHONPATH=tests python -m support.tiny_glm5 --out /tmp/e2e/ckpt --serve
  PYTHONPATH=tests python -m support.tiny_glm5 --out /tmp/m/dense --config-only --arch deepseek_v3
  PYTHONPATH=tests python -m support.tiny_glm5 --out /tmp/tiny-glm52 --generation 5.2 --layers 7
"""

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
]

CORPUS = [
    "GLM-5 is served by vLLM from a GGUF file on Blackwell GPUs.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "def main(argv: list[str] | None = None) -> int: return 0",
    "Sparse attention selects the top-k keys chosen by a lightweight indexer.",
]


ARCHS = ("glm_moe_dsa", "deepseek_v3")
# GLM generation -> IndexShare (index_topk_freq, index_skip_topk_offset); None: every layer full.
# GLM-5.2's config.json: freq 4, offset 3 (21 full / 57 shared of 78 layers).
GENERATIONS: dict[str, tuple[int, int] | None] = {"5": None, "5.1": None, "5.2": (4, 3)}
# Keys only the DSA (sparse attention) architecture has; a dense DeepSeek-V3 config drops them.
_DSA_KEYS = ("mlp_layer_types", "index_topk", "index_head_dim", "index_n_heads",
             "indexer_rope_interleave")  # fmt: skip


def config(
    num_layers: int = 3,
    mtp_layers: int = 1,
    *,
    index_topk: int = 128,
    arch: str = "glm_moe_dsa",
    bos: bool = True,
    generation: str = "5",
) -> dict:
    """The config.json of the tiny model (GLM-5 attention geometry, small everything else).

    ``arch="deepseek_v3"``: the same geometry as a dense-attention DeepSeek-V3 (no indexer), the
    plugin proof's reference for "sparse with index_topk >= context equals dense".
    """
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r}: choose one of {', '.join(ARCHS)}")
    if generation not in GENERATIONS:
        raise ValueError(f"generation {generation!r}: choose one of {', '.join(GENERATIONS)}")
    cfg = _glm5_config(num_layers, mtp_layers) | {"index_topk": index_topk}
    if (share := GENERATIONS[generation]) is not None:
        freq, offset = share
        # GLM-5.2's config.json carries both the rule and the list it expands to.
        cfg |= {
            "index_topk_freq": freq,
            "index_skip_topk_offset": offset,
            "index_topk_pattern": None,
            "indexer_types": index_share_types(num_layers, freq, offset),
        }
    if not bos:
        cfg["bos_token_id"] = None
    if arch == "deepseek_v3":
        cfg = {k: v for k, v in cfg.items() if k not in _DSA_KEYS}
        cfg |= {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    return cfg


def index_share_types(num_layers: int, freq: int, offset: int) -> list[str]:
    """Per-layer "full"/"shared" of IndexShare: vLLM 0.23.0's IndexCache rule (deepseek_v2.py
    `_skip_topk`), which yields llama.cpp's GLM_5_2_DEFAULT_INDEXER_TYPES for freq 4, offset 3."""
    return ["shared" if max(i - offset + 1, 0) % freq else "full" for i in range(num_layers)]


def shared_indexer_layers(cfg: dict) -> list[int]:
    """Trunk layers without indexer weights (GLM-5.2 "shared"); [] for GLM-5 / 5.1."""
    return [i for i, t in enumerate(cfg.get("indexer_types") or []) if t == "shared"]


def _glm5_config(num_layers: int, mtp_layers: int) -> dict:
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "hidden_size": 512,
        "intermediate_size": 1024,
        "moe_intermediate_size": 256,
        "num_hidden_layers": num_layers,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "mlp_layer_types": ["dense"] + ["sparse"] * (num_layers - 1),
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": 256,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "qk_head_dim": 256,
        "v_head_dim": 256,
        "head_dim": 64,
        "index_topk": 128,
        "index_head_dim": 128,
        "index_n_heads": 32,
        "indexer_rope_interleave": True,
        "rope_interleave": True,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "attention_bias": False,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "vocab_size": 512,
        "tie_word_embeddings": False,
        "bos_token_id": 2,
        "eos_token_id": [0, 7, 9],
        "pad_token_id": 0,
        "num_nextn_predict_layers": mtp_layers,
        "torch_dtype": "bfloat16",
    }


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF checkpoint tensor names and shapes, original (unfused) naming like GLM-5's files."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    nh, ql, kvl = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    inter, moe_inter = cfg["intermediate_size"], cfg["moe_intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    n_main = cfg["num_hidden_layers"]
    shared = set(shared_indexer_layers(cfg))
    for i in range(n_main + cfg["num_nextn_predict_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_a_proj.weight": (ql, h),
            p + "self_attn.q_a_layernorm.weight": (ql,),
            p + "self_attn.q_b_proj.weight": (nh * (nope + rope), ql),
            p + "self_attn.kv_a_proj_with_mqa.weight": (kvl + rope, h),
            p + "self_attn.kv_a_layernorm.weight": (kvl,),
            p + "self_attn.kv_b_proj.weight": (nh * (nope + vd), kvl),
            p + "self_attn.o_proj.weight": (h, nh * vd),
        }
        if i not in shared:
            shapes |= {
                p + "self_attn.indexer.wq_b.weight": (ih * idim, ql),
                p + "self_attn.indexer.wk.weight": (idim, h),
                p + "self_attn.indexer.k_norm.weight": (idim,),
                p + "self_attn.indexer.k_norm.bias": (idim,),
                p + "self_attn.indexer.weights_proj.weight": (ih, h),
            }
        if i < cfg["first_k_dense_replace"]:
            shapes |= {
                p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
            }
        else:
            shapes |= {
                p + "mlp.gate.weight": (cfg["n_routed_experts"], h),
                p + "mlp.gate.e_score_correction_bias": (cfg["n_routed_experts"],),
                p + "mlp.shared_experts.gate_proj.weight": (moe_inter, h),
                p + "mlp.shared_experts.up_proj.weight": (moe_inter, h),
                p + "mlp.shared_experts.down_proj.weight": (h, moe_inter),
            }
            for e in range(cfg["n_routed_experts"]):
                q = f"{p}mlp.experts.{e}."
                shapes |= {
                    q + "gate_proj.weight": (moe_inter, h),
                    q + "up_proj.weight": (moe_inter, h),
                    q + "down_proj.weight": (h, moe_inter),
                }
        if i >= n_main:  # the MTP/nextn block GLM-5 appends after its trunk
            shapes |= {
                p + "enorm.weight": (h,),
                p + "hnorm.weight": (h,),
                p + "eh_proj.weight": (h, 2 * h),
                p + "shared_head.norm.weight": (h,),
            }
    return shapes


def random_weights(cfg: dict, seed: int, *, serve_head: bool = False) -> dict:
    """Seeded random bfloat16 tensors (float32 for the router bias, as GLM-5 stores it).

    ``serve_head``: a wide lm_head (logits std ~4.5) with zero rows for the special tokens, so
    random text never stops at once on an end-of-text token and every request returns
    max_tokens of text.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in sorted(tensor_shapes(cfg).items()):
        if name.endswith("e_score_correction_bias"):
            out[name] = (torch.randn(shape, generator=gen) * 0.01).float()
            continue
        if len(shape) == 1:  # norms: near 1 (biases near 0)
            base = 0.0 if name.endswith(".bias") else 1.0
            t = base + 0.05 * torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) * 0.05
        out[name] = t.to(torch.bfloat16).contiguous()
    if serve_head:
        v, h = tensor_shapes(cfg)["lm_head.weight"]
        lm_head = (torch.randn(v, h, generator=gen) * 0.2).to(torch.bfloat16)
        lm_head[: len(SPECIAL_TOKENS)] = 0
        out["lm_head.weight"] = lm_head
    return out


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=480,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 8, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {
        "backend": "tokenizers",
        "tokenizer_class": "TokenizersBackend",
        "bos_token": "[gMASK]",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
        "chat_template": (
            "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
        ),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")


def write_model_dir(out: Path, cfg: dict) -> Path:
    """config.json, generation_config.json and the tokenizer: a model folder without weights."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen_cfg = {"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"]}
    if cfg.get("bos_token_id") is not None:
        gen_cfg = {"bos_token_id": cfg["bos_token_id"]} | gen_cfg
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    write_tokenizer(out)
    return out


def write_checkpoint(
    out: Path,
    seed: int,
    *,
    num_layers: int = 3,
    mtp_layers: int = 1,
    serve: bool = False,
    index_topk: int = 128,
    generation: str = "5",
) -> Path:
    """Write config.json, model.safetensors, tokenizer files and generation_config.json.

    ``serve``: the e2e serve model (no MTP layer, no BOS token, wide lm_head, see random_weights).
    """
    from safetensors.torch import save_file

    if serve:
        mtp_layers = 0
    cfg = config(
        num_layers, mtp_layers, index_topk=index_topk, bos=not serve, generation=generation
    )
    write_model_dir(out, cfg)
    weights = random_weights(cfg, seed, serve_head=serve)
    save_file(weights, str(out / "model.safetensors"), {"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, EXAMPLES, prog="python -m support.tiny_glm5")
    p.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--layers", type=int, default=3, help="trunk layers (default: %(default)s)")
    p.add_argument(
        "--mtp-layers",
        type=int,
        default=1,
        help="MTP/nextn layers appended after the trunk (default: %(default)s)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="the e2e serve model: no MTP layer, no BOS, special tokens' lm_head rows zero",
    )
    p.add_argument(
        "--index-topk", type=int, default=128, help="DSA index_topk (default: %(default)s)"
    )
    p.add_argument("--arch", choices=ARCHS, default=ARCHS[0], help="default: %(default)s")
    p.add_argument(
        "--generation",
        choices=tuple(GENERATIONS),
        default="5",
        help="GLM generation; 5.2 adds IndexShare (default: %(default)s)",
    )
    p.add_argument(
        "--config-only", action="store_true", help="config + tokenizer, no weights (no torch)"
    )
    p.add_argument("--force", action="store_true", help="write into a non-empty folder")
    args = p.parse_args(argv)
    if args.layers < 2:
        p.error("--layers must be at least 2 (one dense layer, then MoE layers)")
    if args.index_topk < 1 or args.index_topk % 128:
        p.error("--index-topk must be a positive multiple of 128 (vLLM's index conversion)")
    if args.generation != "5" and args.arch != "glm_moe_dsa":
        p.error("--generation needs --arch glm_moe_dsa (the indexer is DSA's)")
    if args.arch != "glm_moe_dsa" and not args.config_only:
        p.error("--arch deepseek_v3 needs --config-only (the weights are GLM-5's)")
    if args.out.exists() and any(args.out.iterdir()) and not args.force:
        print(f"error: {args.out} is not empty (use --force)", file=sys.stderr)
        return 1
    if args.config_only:
        mtp = 0 if args.serve else args.mtp_layers
        cfg = config(
            args.layers, mtp, index_topk=args.index_topk, arch=args.arch,
            generation=args.generation,
        )  # fmt: skip
        write_model_dir(args.out, cfg)
    else:
        write_checkpoint(
            args.out,
            args.seed,
            num_layers=args.layers,
            mtp_layers=args.mtp_layers,
            serve=args.serve,
            index_topk=args.index_topk,
            generation=args.generation,
        )
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
