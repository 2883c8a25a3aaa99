"""fp8_ds_mla on a CUDA GPU at GLM-5 shapes: the Triton write kernel bit-exact against the torch
write (the real compiler's e4m3 path and IEEE division, every fp16 value in range and the edge
rows), written through vLLM-style slot mappings with -1 padding; the fp8-row attention against
the fp64/fp32 reference on the dequantized cache for H 8/16/64, decode batches and prefill
chunks, every launchable config variant, and CUDA-graph capture/replay of write + attention."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.fp8_cases import CASES  # noqa: E402
from support.kernel_inputs import SCALE, attn_inputs, check_close, nan_like  # noqa: E402

pytestmark = [pytest.mark.runtime(requires=("torch", "triton")), pytest.mark.gpu]

TOPK = 2048
NB = 2048  # cache blocks of 64: 131072 slots


@pytest.fixture(autouse=True)
def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _fp8_inputs(t, h, dtype, seed, **kw):
    """q, the fp8_ds_mla cache of attn_inputs' rows written by our write kernel on the GPU, idx."""
    from vllm_sparse_mla.kernels.fp8_ds_mla import write_fp8_ds_mla

    kw.setdefault("pad", 0.1)
    q, kv, idx = attn_inputs(t, h, TOPK, dtype, "cuda", num_blocks=NB, distinct=False, seed=seed,
                             **kw)  # fmt: skip
    flat = kv.reshape(-1, 576)
    cache = torch.empty(NB, 64, 656, dtype=torch.uint8, device="cuda")
    slots = torch.arange(NB * 64, device="cuda")
    write_fp8_ds_mla(flat[:, :512].contiguous(), flat[:, 512:].contiguous(), cache, slots)
    return q, cache, idx


def _ref(q, cache, idx, chunk=128):
    from vllm_sparse_mla.kernels import reference as ref
    from vllm_sparse_mla.kernels.fp8_ds_mla import dequantize_rows

    deq = dequantize_rows(cache, q.dtype).float()  # the GPU reference accumulates in fp32
    outs = [ref.sparse_mla(q[i : i + chunk], deq, idx[i : i + chunk], SCALE)[0]
            for i in range(0, q.shape[0], chunk)]  # fmt: skip
    return torch.cat(outs)


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("write_")])
def test_write_kernel_bit_exact_on_gpu(name):
    from support import fp8_cases

    r = fp8_cases.run_case(name, "cuda")
    flat, slots = r["cache"].view(-1, 656), r["slots"]
    live = slots >= 0
    bad = (flat[slots[live].long()] != r["ref"][live]).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} bytes differ, first (row, byte): {bad[:5].tolist()}"
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[slots[live].long()] = False
    assert torch.all(flat[untouched] == fp8_cases.POISON)


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith(("attn8_", "swapped", "exact"))])
def test_fp8_small_cases_on_gpu(name):
    from support import fp8_cases

    r = fp8_cases.run_case(name, "cuda")
    if name.startswith("exact_rows"):  # same values as 16-bit rows: same result, to rounding
        assert bool(r["roundtrip"])
        check_close(r["out8"], r["out16"])
    elif name == "swapped_scales":
        with pytest.raises(AssertionError):
            check_close(r["out"], r["ref"], torch.float16)
    else:
        check_close(r["out"], r["ref"], fp8_cases.FP8_ATTN_CASES[name[6:]][3])


@pytest.mark.parametrize("h", [8, 16, 64])
@pytest.mark.parametrize("t", [1, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_attention_real_shapes(h, t, dtype):
    from vllm_sparse_mla.kernels import sparse_mla_attention

    q, cache, idx = _fp8_inputs(t, h, dtype, seed=t + h)
    out = nan_like((t, h, 512), dtype, "cuda")
    sparse_mla_attention(q, cache, idx, SCALE, out=out)
    check_close(out, _ref(q, cache, idx))


@pytest.mark.parametrize("t", [2048])
def test_fp8_attention_prefill_chunk(t):
    from vllm_sparse_mla.kernels import sparse_mla_attention

    counts = [min(r + 1, TOPK) for r in range(t)]
    q, cache, idx = _fp8_inputs(t, 16, torch.bfloat16, seed=3, pad=0.0, valid_counts=counts)
    out = nan_like((t, 16, 512), torch.bfloat16, "cuda")
    sparse_mla_attention(q, cache, idx, SCALE, out=out)
    check_close(out, _ref(q, cache, idx))


VARIANTS = [(16, 32, 4, 3), (16, 16, 4, 3), (16, 64, 4, 3), (32, 16, 8, 4), (64, 64, 8, 2)]


@pytest.mark.parametrize("read", ["group/cvt", "group/bits", "group/f8", "tile/cvt", "tile/bits"])
@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: "bh{}_bn{}_w{}_ns{}".format(*c))
@pytest.mark.parametrize(("t", "h", "splits"), [(64, 16, 1), (3, 64, 3), (3, 8, 64)])
def test_fp8_config_variants(cfg, t, h, splits, read):
    from vllm_sparse_mla.kernels._configs import AttnConfig
    from vllm_sparse_mla.kernels.sparse_mla import Plan, _launch

    fp8_read, fp8_decode = read.split("/")
    c = AttnConfig(*cfg, fp8_read=fp8_read, fp8_decode=fp8_decode)
    q, cache, idx = _fp8_inputs(t, h, torch.float16, seed=11)
    out = nan_like((t, h, 512), torch.float16, "cuda")
    _launch(q, cache, idx, SCALE, out, None, Plan(c, -(-h // c.block_h), splits))
    check_close(out, _ref(q, cache, idx))


def test_fp8_write_and_attention_cuda_graph_replay():
    """Write (with -1 padded slots) + attention captured in one graph, replayed on new data."""
    from vllm_sparse_mla.kernels import make_workspace, sparse_mla_attention
    from vllm_sparse_mla.kernels.fp8_ds_mla import write_fp8_ds_mla

    t, h = 32, 16
    q, cache, idx = _fp8_inputs(t, h, torch.float16, seed=5)
    g = torch.Generator().manual_seed(1)
    new = torch.randn(t, 576, generator=g).to(torch.float16).cuda()
    slots = torch.randperm(NB * 64, generator=g)[:t].cuda()  # distinct: one writer per row
    slots[::4] = -1
    ws = make_workspace(256, h, TOPK, "cuda", torch.float16)
    out = torch.empty(t, h, 512, dtype=torch.float16, device="cuda")

    def step():
        write_fp8_ds_mla(new[:, :512], new[:, 512:], cache, slots)
        sparse_mla_attention(q, cache, idx, SCALE, out=out, workspace=ws)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    new.copy_(torch.randn(t, 576, generator=g).to(torch.float16))
    before = cache.clone()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    from vllm_sparse_mla.kernels.fp8_ds_mla import quantize_rows

    live = slots >= 0
    want = quantize_rows(new[:, :512].contiguous(), new[:, 512:].contiguous())
    flat = cache.view(-1, 656)
    assert torch.equal(flat[slots[live]], want[live])
    mask = torch.ones(flat.shape[0], dtype=torch.bool, device="cuda")
    mask[slots[live]] = False
    assert torch.equal(flat[mask], before.view(-1, 656)[mask])
    check_close(out, _ref(q, cache, idx))
