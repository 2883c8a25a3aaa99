"""A scripts/glm5_gguf_writer.py GGUF written with --nextn 1 is what patch 0009 drafts from.

benchmarks/bench_serve.py's MTP cases (`view:mix:backend:mtpK`) serve such files on a GPU; here
the tiny geometry with the Q4_K_M mix (K-quant experts, Q8_0 attention, Q6_K head) is loaded
by the patched vLLM on the CPU (tests/support/vllm_writer_mtp_load.py): the target from the
trunk and vLLM's DeepSeekMTP from blk.3, each through its loader's no-silent-gaps check, so a
missing or misnamed nextn tensor fails here rather than after a GPU machine's generation.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import glm5_gguf_writer as w
import pytest
import support
from support import patched_vllm

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
CHILD = Path(support.__file__).with_name("vllm_writer_mtp_load.py")
MTP = "model.layers.3."


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("writer-mtp")
    gguf_path, hf = tmp / "tiny-mtp.gguf", tmp / "hf"
    argv = ["--mix", "Q4_K_M", "--view", "tiny", "--layers", "3", "--experts", "8",
            "--nextn", "1", "--out", str(gguf_path), "--hf-dir", str(hf)]  # fmt: skip
    assert w.main(argv) == 0
    site = patched_vllm.patched_site(tmp / "site")
    out = tmp / "load.json"
    data = patched_vllm.run_child(CHILD, gguf_path, hf, out, out=out, site=site)
    return data | {"gguf": gguf_path}


def test_target_loads_the_trunk_and_skips_the_nextn_block(run: dict) -> None:
    assert run["target_class"] == "GlmMoeDsaForCausalLM"
    assert len(run["target_logs"]) == 1
    assert run["target_logs"][0].startswith(
        "Skipping 27 GGUF tensors of the MTP/nextn layer(s) blk.3 in the trunk"
    )


def test_draft_is_deepseek_mtp_with_every_nextn_tensor(run: dict) -> None:
    assert run["draft_model_type"] == "deepseek_mtp"
    assert run["draft_class"] == "DeepSeekMTP"
    m = run["map"]
    assert m["blk.3.nextn.eh_proj.weight"] == MTP + "eh_proj.weight"
    assert m["blk.3.nextn.enorm.weight"] == MTP + "enorm.weight"
    assert m["blk.3.nextn.hnorm.weight"] == MTP + "hnorm.weight"
    assert m["blk.3.nextn.shared_head_norm.weight"] == MTP + "shared_head.norm.weight"
    assert m["output.weight"] == MTP + "shared_head.head.weight"  # no nextn head in the file
    names = {t.name for t in gguf.GGUFReader(run["gguf"]).tensors}
    nextn = {n for n in names if n.startswith("blk.3.")}
    assert len(nextn) == 27  # the MoE layer's 23 + eh_proj, enorm, hnorm, shared_head_norm
    assert {g for g in m if g in names} == nextn | {"output.weight"}
    # the loader's gap check passed (else no model): the only parameter it leaves is the
    # embedding, which vLLM's MTP proposer takes from the target
    assert run["draft_logs"] == patched_vllm.TINY_MTP_DRAFT_LOGS


def test_draft_holds_the_files_eh_proj_and_head(run: dict) -> None:
    eh = run["eh_proj"]
    # Q8_0 in the file, dequantized by the loader (a plain nn.Linear) into fp16
    assert eh["dtype"] == "float16" and eh["shape"] == [512, 1024]
    assert eh["max_err"] <= w.WEIGHT_BOUND * 2**-10, eh
    assert run["head_is_output_weight"]  # the Q6_K bytes of the trunk's output.weight
