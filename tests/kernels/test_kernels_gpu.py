"""Real-shape kernel checks on a CUDA GPU: GLM-5 shards (H 8/16/64), top-k 2048, decode batches
1-256 and a prefill chunk, plus CUDA-graph capture and replay."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.runtime, pytest.mark.gpu]

SCALE = 1.0 / 16
TOPK = 2048
REL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _attn_inputs(t, h, dtype, n_blocks=2048, pad=0.1, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(t, h, 576, device="cuda", generator=g).to(dtype)
    kv = torch.randn(n_blocks, 64, 576, device="cuda", generator=g).to(dtype)
    n = n_blocks * 64
    idx = torch.randint(0, n, (t, TOPK), device="cuda", generator=g, dtype=torch.int32)
    idx[torch.rand(t, TOPK, device="cuda", generator=g) < pad] = -1
    if t > 1:
        idx[0, :] = -1  # an empty row
        idx[1, ::2] = idx[1, 1]  # repeats
    return q, kv, idx


def _rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("h", [8, 16, 64])
@pytest.mark.parametrize("t", [1, 7, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sparse_mla_real_shapes(h, t, dtype):
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention
    from vllm_sparse_mla.kernels import reference as ref

    q, kv, idx = _attn_inputs(t, h, dtype, seed=t * 100 + h)
    ws = make_workspace(256, h, TOPK, "cuda", dtype)
    out = torch.full((t, h, 512), float("nan"), dtype=dtype, device="cuda")
    sparse_mla_attention(q, kv, idx, SCALE, out=out, workspace=ws)
    expect, _ = ref.sparse_mla(q, kv, idx, SCALE)
    assert not out.isnan().any()
    if t > 1:
        assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert _rel(out, expect) < REL[dtype]


@pytest.mark.parametrize("h", [8, 64])
def test_sparse_mla_prefill_chunk(h):
    from vllm_sparse_mla.kernels import reference as ref
    from vllm_sparse_mla.kernels import sparse_mla_attention

    q, kv, idx = _attn_inputs(1024, h, torch.float16, seed=h)
    out = sparse_mla_attention(q, kv, idx, SCALE)
    expect, _ = ref.sparse_mla(q, kv, idx, SCALE)
    assert _rel(out, expect) < REL[torch.float16]


@pytest.mark.parametrize("t", [1, 32])
def test_sparse_mla_cuda_graph_replay(t):
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention

    q, kv, idx = _attn_inputs(t, 16, torch.float16, seed=7)
    ws = make_workspace(64, 16, TOPK, "cuda", torch.float16)
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
    q2, _, idx2 = _attn_inputs(t, 16, torch.float16, seed=8)
    q.copy_(q2)
    idx.copy_(idx2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, sparse_mla_attention(q, kv, idx, SCALE, workspace=ws))


def _fp8(x):
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def test_mqa_logits_real_shape():
    from vllm_sparse_mla.kernels import mqa_logits
    from vllm_sparse_mla.kernels import reference as ref

    m, n, h, d = 256, 8192, 32, 128
    q = _fp8(torch.randn(m, h, d, device="cuda"))
    k = _fp8(torch.randn(n, d, device="cuda"))
    sc = torch.exp2(torch.randint(-3, 2, (n,), device="cuda").float())
    w = torch.randn(m, h, device="cuda") * 0.1
    ke = torch.linspace(n // 2, n, m, device="cuda").to(torch.int32)
    ks = (ke - 3000).clamp_min(0).to(torch.int32)
    out = mqa_logits((q, None), (k, sc), w, ks, ke, clean_logits=True)
    expect = ref.mqa_logits(q, k, sc, w, ks, ke)
    assert torch.equal(torch.isneginf(out), torch.isneginf(expect))
    fin = torch.isfinite(expect)
    assert _rel(out[fin], expect[fin]) < 1e-3


@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_mqa_logits_real_shape_and_graph(next_n):
    from vllm_sparse_mla.kernels import paged_mqa_logits
    from vllm_sparse_mla.kernels import reference as ref

    b, h, d, bs, max_len = 16, 32, 128, 64, 8192
    nb = b * max_len // bs
    q = _fp8(torch.randn(b, next_n, h, d, device="cuda"))
    vals = _fp8(torch.randn(nb, bs * d, device="cuda")).view(torch.uint8)
    scales = torch.exp2(torch.randint(-3, 2, (nb, bs), device="cuda").float()).view(torch.uint8)
    cache = torch.cat([vals, scales], 1).view(nb, bs, 1, d + 4)
    bt = torch.randperm(nb, device="cuda").to(torch.int32).view(b, -1)
    ctx = torch.randint(1, max_len, (b,), device="cuda", dtype=torch.int32)
    w = torch.randn(b * next_n, h, device="cuda") * 0.1
    expect = ref.paged_mqa_logits(q, cache, w, ctx, bt, max_len)
    out = torch.empty(b * next_n, max_len, device="cuda")
    paged_mqa_logits((q, None), cache, w, ctx, bt, None, max_len, True, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_mqa_logits((q, None), cache, w, ctx, bt, None, max_len, True, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(torch.isneginf(out), torch.isneginf(expect))
    fin = torch.isfinite(expect)
    assert _rel(out[fin], expect[fin]) < 1e-3


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize(("t", "h", "splits"), [(64, 16, 4), (32, 64, 1), (3, 8, 64)])
def test_sparse_mla_kernel_variants(prefetch, chunked, t, h, splits):
    """Both gather paths and both latent layouts (what the benchmark sweeps) are correct."""
    from vllm_sparse_mla.kernels import make_workspace
    from vllm_sparse_mla.kernels import reference as ref
    from vllm_sparse_mla.kernels._configs import AttnConfig
    from vllm_sparse_mla.kernels.sparse_mla import _launch

    q, kv, idx = _attn_inputs(t, h, torch.float16, seed=11)
    cfg = AttnConfig(16 if h < 64 else 32, 16, 4 if h < 64 else 8, 2, prefetch, chunked)
    ws = make_workspace(256, h, TOPK, "cuda", torch.float16)
    out = torch.full((t, h, 512), float("nan"), dtype=torch.float16, device="cuda")
    _launch(q, kv, idx, SCALE, out, ws, cfg, -(-h // cfg.block_h), splits)
    expect, _ = ref.sparse_mla(q, kv, idx, SCALE)
    assert not out.isnan().any()
    assert _rel(out, expect) < REL[torch.float16]
