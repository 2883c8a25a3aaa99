"""The metadata builder with vLLM's real config and metadata objects (CPU tensors)."""

from __future__ import annotations

import pytest
from support import tiny_glm5

pytestmark = pytest.mark.runtime
torch = pytest.importorskip("torch")  # collected by the controller venv too, which has none


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory):
    from vllm.config import DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    from vllm_sparse_mla.metadata import SparseTritonMLAMetadataBuilder

    folder = tmp_path_factory.mktemp("tiny-glm5-dsa")
    model = str(tiny_glm5.write_model_dir(folder, tiny_glm5.config(mtp_layers=0)))
    config = VllmConfig(
        model_config=ModelConfig(model=model, tokenizer=model, dtype="float16", max_model_len=1024),
        device_config=DeviceConfig(device="cpu"),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=256, max_num_seqs=8, max_model_len=1024, is_encoder_decoder=False
        ),
    )
    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.float16)
    return SparseTritonMLAMetadataBuilder(
        spec, ["model.layers.0.self_attn.attn"], config, torch.device("cpu")
    )


def test_builder_declares_uniform_batch_cuda_graphs(builder) -> None:
    from vllm.v1.attention.backend import AttentionCGSupport

    assert builder._cudagraph_support is AttentionCGSupport.UNIFORM_BATCH
    assert builder.reorder_batch_threshold == 1
    assert builder.topk_tokens == 128  # index_topk of the tiny GLM-5 config


def test_build_maps_tokens_to_requests_in_a_persistent_buffer(builder) -> None:
    from vllm.v1.attention.backend import CommonAttentionMetadata

    # One decode (seq 150) then a 3-token prefill chunk (seq 200): 4 tokens.
    qsl = torch.tensor([0, 1, 4], dtype=torch.int32)
    block_table = torch.tensor([[0, 2, 4, 0], [1, 3, 5, 6]], dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor([150, 200], dtype=torch.int32),
        num_reqs=2,
        num_actual_tokens=4,
        max_query_len=3,
        max_seq_len=200,
        block_table_tensor=block_table,
        slot_mapping=torch.tensor([149, 261, 262, 263], dtype=torch.int64),
    )
    builder.req_id_per_token_buffer.fill_(7)  # stale values from an earlier, larger batch
    md = builder.build(0, cm)
    assert md.req_id_per_token.tolist() == [0, 1, 1, 1]
    assert md.req_id_per_token.data_ptr() == builder.req_id_per_token_buffer.data_ptr()
    assert builder.req_id_per_token_buffer[4:].eq(0).all()  # padding rows name request 0
    assert (md.num_reqs, md.num_actual_tokens, md.block_size, md.topk_tokens) == (2, 4, 64, 128)
    assert md.block_table is block_table and md.query_start_loc is qsl
