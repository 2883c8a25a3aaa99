"""Real-shape kernel checks on a CUDA GPU: GLM-5 shards (H 8/16/64, odd 24/48), top-k 2048,
decode batches 1-256 and 2 tokens per request (MTP), prefill chunks up to 8192 tokens with the
-1 tails of a chunk that starts at position 0, every launchable config/split form, CUDA-graph
capture and replay; outputs NaN-poisoned first. One metric: support.kernel_inputs.check_close."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.kernel_inputs import (  # noqa: E402
    SCALE,
    attn_inputs,
    check_close,
    fp8,
    nan_like,
)

pytestmark = [pytest.mark.runtime(requires=("torch", "triton")), pytest.mark.gpu]

TOPK = 2048
NB = 2048  # cache blocks of 64: 131072 slots


@pytest.fixture(autouse=True)
def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _inputs(t, h, dtype, seed, **kw):
    kw.setdefault("pad", 0.1)
    return attn_inputs(t, h, TOPK, dtype, "cuda", num_blocks=NB, distinct=False, seed=seed, **kw)


def _ref(q, kv, idx, chunk=256):
    from vllm_sparse_mla.kernels import reference as ref

    outs = [ref.sparse_mla(q[i : i + chunk], kv, idx[i : i + chunk], SCALE)[0]
            for i in range(0, q.shape[0], chunk)]  # fmt: skip
    return torch.cat(outs)


def _chunk_counts(t, start=0):
    """Valid indices per token of a prefill chunk at ``start``: position + 1, capped at top-k."""
    return [min(start + r + 1, TOPK) for r in range(t)]


@pytest.mark.parametrize("h", [8, 16, 24, 48, 64])
@pytest.mark.parametrize("t", [1, 7, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sparse_mla_real_shapes(h, t, dtype):
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention

    empty = (0,) if t > 1 else ()
    q, kv, idx = _inputs(t, h, dtype, t * 100 + h, empty_rows=empty, repeat=t > 1, tail=17)
    ws = make_workspace(256, h, TOPK, "cuda", dtype)
    out = nan_like((t, h, 512), dtype, "cuda")
    sparse_mla_attention(q, kv, idx, SCALE, out=out, workspace=ws)
    check_close(out, _ref(q, kv, idx), dtype)
    if t > 1:
        assert torch.equal(out[0], torch.zeros_like(out[0]))


@pytest.mark.parametrize(
    ("h", "t", "dtype"),
    [(8, 8192, torch.float16), (16, 4096, torch.bfloat16), (64, 4096, torch.float16)],
)
def test_sparse_mla_prefill_chunk_from_zero(h, t, dtype):
    """A chunk starting at position 0: token r sees r + 1 keys (the rest -1), ~25% padding."""
    from vllm_sparse_mla.kernels import sparse_mla_attention

    q, kv, idx = _inputs(t, h, dtype, h, pad=0.0, valid_counts=_chunk_counts(t))
    out = nan_like((t, h, 512), dtype, "cuda")
    sparse_mla_attention(q, kv, idx, SCALE, out=out)
    sel = torch.randperm(t, device="cuda")[:512].sort().values  # reference on a sample of rows
    check_close(out[sel], _ref(q[sel], kv, idx[sel]), dtype)


@pytest.mark.parametrize("b", [1, 32, 128])
def test_sparse_mla_mtp_decode(b):
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention

    q, kv, idx = _inputs(2 * b, 16, torch.float16, b, mtp=2)
    ws = make_workspace(512, 16, TOPK, "cuda", torch.float16)
    out = nan_like((2 * b, 16, 512), torch.float16, "cuda")
    sparse_mla_attention(q, kv, idx, SCALE, out=out, workspace=ws)
    check_close(out, _ref(q, kv, idx))


@pytest.mark.parametrize("t", [1, 32, 128])
def test_sparse_mla_cuda_graph_replay(t):
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention

    q, kv, idx = _inputs(t, 16, torch.float16, 7)
    ws = make_workspace(256, 16, TOPK, "cuda", torch.float16)
    out = torch.empty(t, 16, 512, dtype=torch.float16, device="cuda")
    eager = sparse_mla_attention(q, kv, idx, SCALE, workspace=ws).clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparse_mla_attention(q, kv, idx, SCALE, out=out, workspace=ws)  # warm-up / compile
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla_attention(q, kv, idx, SCALE, out=out, workspace=ws)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    q2, _, idx2 = _inputs(t, 16, torch.float16, 8, tail=300)
    q.copy_(q2)
    idx.copy_(idx2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, sparse_mla_attention(q, kv, idx, SCALE, workspace=ws))
    check_close(out, _ref(q, kv, idx))


VARIANTS = [  # (block_h, block_n, num_warps, num_stages)
    (16, 32, 4, 3), (16, 32, 8, 3), (16, 16, 4, 3), (16, 64, 8, 3), (16, 64, 4, 3),
    (16, 64, 4, 2), (32, 16, 8, 4), (32, 32, 8, 3), (32, 64, 8, 3), (64, 32, 8, 3),
    (64, 64, 8, 2),
]  # fmt: skip


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: "bh{}_bn{}_w{}_ns{}".format(*c))
@pytest.mark.parametrize(("t", "h", "splits"), [(64, 16, 1), (32, 64, 3), (3, 8, 64)])
def test_sparse_mla_config_variants(cfg, t, h, splits):
    """Every config the tables or the benchmark sweep can launch, with 1, 3 and 64 splits."""
    from vllm_sparse_mla.kernels._configs import AttnConfig
    from vllm_sparse_mla.kernels.sparse_mla import Plan, _launch

    c = AttnConfig(*cfg)
    q, kv, idx = _inputs(t, h, torch.float16, 11, tail=100)
    out = nan_like((t, h, 512), torch.float16, "cuda")
    _launch(q, kv, idx, SCALE, out, None, Plan(c, -(-h // c.block_h), splits))
    check_close(out, _ref(q, kv, idx))


def test_mqa_logits_real_shape():
    from vllm_sparse_mla.kernels import mqa_logits
    from vllm_sparse_mla.kernels import reference as ref

    m, n, h, d = 256, 8192, 32, 128
    q = fp8(torch.randn(m, h, d, device="cuda"))
    k = fp8(torch.randn(n, d, device="cuda"))
    sc = torch.exp2(torch.randint(-3, 2, (n,), device="cuda").float())
    w = torch.randn(m, h, device="cuda") * 0.1
    ke = torch.linspace(n // 2, n, m, device="cuda").to(torch.int32)
    ks = (ke - 3000).clamp_min(0).to(torch.int32)
    out = mqa_logits((q, None), (k, sc), w, ks, ke, clean_logits=True)
    expect = ref.mqa_logits(q, k, sc, w, ks, ke)
    assert torch.equal(torch.isneginf(out), torch.isneginf(expect))
    fin = torch.isfinite(expect)
    check_close(out[fin], expect[fin], torch.float32)


def _paged_configs():
    from vllm_sparse_mla.kernels._configs import PAGED_LOGITS_CONFIG, PAGED_LOGITS_VARIANTS

    return [PAGED_LOGITS_CONFIG, *PAGED_LOGITS_VARIANTS]


@pytest.mark.parametrize(
    "cfg",
    _paged_configs(),
    ids=lambda c: f"tiles{c.tiles_per_program}_ns{c.num_stages}",
)
@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_mqa_logits_real_shape_and_graph(next_n, cfg):
    """The default and every swept candidate (several key tiles per program)."""
    from vllm_sparse_mla.kernels import paged_mqa_logits
    from vllm_sparse_mla.kernels import reference as ref

    b, h, d, bs, max_len = 16, 32, 128, 64, 8192
    nb = b * max_len // bs
    q = fp8(torch.randn(b, next_n, h, d, device="cuda"))
    vals = fp8(torch.randn(nb, bs * d, device="cuda")).view(torch.uint8)
    scales = torch.exp2(torch.randint(-3, 2, (nb, bs), device="cuda").float()).view(torch.uint8)
    cache = torch.cat([vals, scales], 1).view(nb, bs, 1, d + 4)
    bt = torch.randperm(nb, device="cuda").to(torch.int32).view(b, -1)
    ctx = torch.randint(1, max_len, (b,), device="cuda", dtype=torch.int32)
    w = torch.randn(b * next_n, h, device="cuda") * 0.1
    expect = ref.paged_mqa_logits(q, cache, w, ctx, bt, max_len)
    out = torch.empty(b * next_n, max_len, device="cuda")
    paged_mqa_logits((q, None), cache, w, ctx, bt, None, max_len, True, out=out, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_mqa_logits((q, None), cache, w, ctx, bt, None, max_len, True, out=out, config=cfg)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(torch.isneginf(out), torch.isneginf(expect))
    fin = torch.isfinite(expect)
    check_close(out[fin], expect[fin], torch.float32)


@pytest.mark.parametrize(
    ("b", "n", "ties"), [(8, 32768, False), (64, 32768, True), (3, 131072, False)]
)
def test_triton_topk_real_shape_and_graph(b, n, ties):
    from support.kernel_inputs import check_topk, topk_logits
    from vllm_sparse_mla.kernels import topk_indices

    logits = topk_logits(b, n, "cuda", ties=ties, neg_inf=0.01)
    ends = torch.randint(1, n, (b,), dtype=torch.int32, device="cuda")
    ends[0] = 100  # shorter than top-k
    out = torch.empty(b, TOPK, dtype=torch.int32, device="cuda")
    topk_indices(logits, TOPK, None, ends, out=out, impl="triton")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_indices(logits, TOPK, None, ends, out=out, impl="triton")
    out.fill_(12345)
    graph.replay()
    torch.cuda.synchronize()
    check_topk(out.cpu(), logits.cpu(), TOPK, None, ends.cpu())
