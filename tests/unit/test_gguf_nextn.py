"""scripts/gguf_nextn.py: whether a GGUF carries GLM-5's MTP/nextn layer (what the vllm_service
role checks before it renders a unit with MTP speculative decoding on).

GGUF files are written with gguf-py's GGUFWriter, with llama.cpp's key and tensor names
(glm-dsa.block_count counts the nextn block, glm-dsa.nextn_predict_layers, blk.<i>.nextn.*).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import gguf_nextn
import numpy as np
import pytest


def write(path: Path, blocks: int, nextn: int | None, tensor_blocks: list[int]) -> Path:
    w = gguf.GGUFWriter(str(path), "glm-dsa")
    w.add_block_count(blocks)
    if nextn is not None:
        w.add_uint32("glm-dsa.nextn_predict_layers", nextn)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    for i in range(blocks):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(8, dtype=np.float32))
    for i in tensor_blocks:
        w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", np.zeros((8, 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_glm5_layout_with_its_nextn_block(tmp_path: Path, capsys) -> None:
    path = write(tmp_path / "m.gguf", blocks=4, nextn=1, tensor_blocks=[3])
    assert gguf_nextn.main([str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "arch": "glm-dsa", "block_count": 4, "nextn_predict_layers": 1, "nextn_blocks": [3],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("nextn", "tensor_blocks", "why"),
    [
        (0, [], "glm-dsa.nextn_predict_layers=0, nextn eh_proj tensors in blocks [] of 4"),
        (None, [], "glm-dsa.nextn_predict_layers=0, nextn eh_proj tensors in blocks [] of 4"),
        # the key says one nextn block, but its tensors were dropped (a re-packed file)
        (1, [], "glm-dsa.nextn_predict_layers=1, nextn eh_proj tensors in blocks [] of 4"),
        # a nextn tensor in a trunk block is not the last block the header announces
        (1, [2], "glm-dsa.nextn_predict_layers=1, nextn eh_proj tensors in blocks [2] of 4"),
    ],
)
def test_refuses_a_gguf_without_its_nextn_layer(
    tmp_path: Path, capsys, nextn: int | None, tensor_blocks: list[int], why: str
) -> None:
    path = write(tmp_path / "m.gguf", blocks=4, nextn=nextn, tensor_blocks=tensor_blocks)
    assert gguf_nextn.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: {path} has no complete MTP/nextn layer ({why}): MTP speculative decoding needs "
        "it; set vllm_service_speculative_tokens: 0 or use a GGUF converted with the nextn "
        "layer\n"
    )


def test_unreadable_file_is_a_usage_error(tmp_path: Path, capsys) -> None:
    path = tmp_path / "not.gguf"
    path.write_bytes(b"NOPE" + bytes(60))
    assert gguf_nextn.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot read {path} as GGUF: ") and err.count("\n") == 1
