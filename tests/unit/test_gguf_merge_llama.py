"""Byte identity with the real `llama-gguf-split --merge`, built from llama.cpp's source.

The first run builds the binary (~5 min on 2 cores) into ~/.cache/glm5-sm120/; later runs reuse it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import gguf_format
import gguf_merge
import numpy as np
import pytest
from support.gguf_fixtures import (
    Q,
    assert_merged_matches,
    glm_dsa_tensors,
    write_native_split,
    write_raw_set,
    write_split,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama_gguf_split() -> Path:
    from support.llama_cpp import gguf_split_binary

    return gguf_split_binary()


def _both(llama: Path, shards: list[Path], out_dir: Path) -> tuple[bytes, bytes]:
    ours, theirs = out_dir / "ours.gguf", out_dir / "llama.gguf"
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(ours)]) == 0
    subprocess.run(
        [str(llama), "--merge", str(shards[0]), str(theirs)], check=True, capture_output=True
    )
    return ours.read_bytes(), theirs.read_bytes()


@pytest.mark.parametrize(
    ("n_shards", "metadata_only_first"), [(5, True), (11, True), (3, False), (2, False)]
)
def test_identical_to_llama_gguf_split(tmp_path, llama_gguf_split, n_shards, metadata_only_first):
    (tmp_path / "in").mkdir()
    tensors = glm_dsa_tensors(seed=n_shards)
    shards = write_split(
        tmp_path / "in", tensors, n_shards, metadata_only_first=metadata_only_first
    )
    ours, theirs = _both(llama_gguf_split, shards, tmp_path)
    assert len(ours) == len(theirs)
    assert ours == theirs
    assert_merged_matches(tmp_path / "ours.gguf", shards, tensors, 32)


def test_identical_for_gguf_writer_native_split(tmp_path, llama_gguf_split):
    (tmp_path / "in").mkdir()
    shards = write_native_split(tmp_path / "in" / "native.gguf", glm_dsa_tensors(seed=11), 40)
    ours, theirs = _both(llama_gguf_split, shards, tmp_path)
    assert ours == theirs


def test_alignment_64_is_honoured_where_llama_gguf_split_breaks_it(tmp_path, llama_gguf_split):
    """llama-gguf-split lays data at 32 whatever general.alignment says: its output is invalid."""
    (tmp_path / "in").mkdir()
    tensors = glm_dsa_tensors(seed=64)
    shards = write_split(tmp_path / "in", tensors, 4, alignment=64)
    ours, theirs = _both(llama_gguf_split, shards, tmp_path)
    assert ours != theirs
    assert_merged_matches(tmp_path / "ours.gguf", shards, tensors, 64)
    with pytest.raises(gguf_format.ShardError, match=r"expected \d+ \(tensor data must be contig"):
        gguf_format.read_header(tmp_path / "llama.gguf")


def test_llama_cpp_cuts_a_tensor_name_at_nul_which_the_merger_refuses(tmp_path, llama_gguf_split):
    """ggml names are C strings: llama-gguf-split writes 'blk.0.attn' for 'blk.0.attn\\0_q_a...'."""
    import dataclasses

    (tmp_path / "in").mkdir()
    tensors = glm_dsa_tensors()
    tensors[5] = dataclasses.replace(tensors[5], name="blk.0.attn\0_q_a.weight")
    shards = write_split(tmp_path / "in", tensors, 4)
    theirs = tmp_path / "llama.gguf"
    subprocess.run(
        [str(llama_gguf_split), "--merge", str(shards[0]), str(theirs)],
        check=True, capture_output=True,
    )  # fmt: skip
    names = [t.name for t in gguf_format.read_header(theirs).tensors]
    assert "blk.0.attn" in names and not any("\0" in n for n in names)
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(tmp_path / "ours.gguf")]) == 1


def test_llama_cpp_refuses_a_quantized_tensor_with_0_dimensions(tmp_path, llama_gguf_split):
    shards = write_raw_set(tmp_path, [("a.weight", np.zeros(34, np.int8), (), Q.Q8_0)])
    proc = subprocess.run(
        [str(llama_gguf_split), "--merge", str(shards[0]), str(tmp_path / "llama.gguf")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "has 1 elements per row, not a multiple of block size (32)" in proc.stderr
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(tmp_path / "ours.gguf")]) == 1


def test_f32_tensor_with_0_dimensions_identical_to_llama_gguf_split(tmp_path, llama_gguf_split):
    (tmp_path / "in").mkdir()
    shards = write_raw_set(tmp_path / "in", [("s.weight", np.arange(4, dtype=np.int8), (), Q.F32)])
    ours, theirs = _both(llama_gguf_split, shards, tmp_path)
    assert ours == theirs
