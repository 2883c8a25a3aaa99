"""scripts/gguf_merge.py on valid sets: the merged file read back with gguf-py's GGUFReader."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import gguf_merge
import numpy as np
import pytest
import safe_files
from gguf import GGUFReader
from support.gguf_fixtures import (
    Q,
    Tensor,
    assert_merged_matches,
    glm_dsa_tensors,
    write_native_split,
    write_split,
)

SCRIPT = Path(gguf_merge.__file__)


@pytest.mark.parametrize(
    ("alignment", "metadata_only_first", "n_shards"),
    [(32, True, 5), (64, True, 4), (32, False, 3), (64, False, 2)],
)
def test_merge_reads_back_with_gguf_reader(
    tmp_path, capsys, alignment, metadata_only_first, n_shards
):
    tensors = glm_dsa_tensors(seed=alignment + n_shards)
    shards = write_split(
        tmp_path, tensors, n_shards, alignment=alignment, metadata_only_first=metadata_only_first
    )
    if metadata_only_first:
        assert GGUFReader(shards[0]).tensors == []
    out = tmp_path / "merged.gguf"
    assert gguf_merge.main([str(shards[-1]), str(out)]) == 0
    stdout = capsys.readouterr().out
    assert f"merged {n_shards} shards, {len(tensors)} tensors" in stdout
    assert "via copy_file_range" in stdout
    assert_merged_matches(out, shards, tensors, alignment)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*(s.name for s in shards), out.name]
    )


def test_any_shard_gives_the_same_file(tmp_path):
    shards = write_split(tmp_path, glm_dsa_tensors(), 4)
    (tmp_path / "out").mkdir()
    outs = []
    for i, s in enumerate(shards):
        out = tmp_path / "out" / f"m{i}.gguf"
        assert gguf_merge.main(["--no-progress", str(s), str(out)]) == 0
        outs.append(out.read_bytes())
    assert all(o == outs[0] for o in outs)


def test_gguf_writer_native_split(tmp_path):
    """gguf-py's own splitter (small_first_shard = metadata-only first shard, as convert does)."""
    tensors = glm_dsa_tensors(seed=7)
    shards = write_native_split(tmp_path / "GLM-5-native.gguf", tensors, 30)
    assert len(shards) == 5 and shards[0].name == "GLM-5-native-00001-of-00005.gguf"
    out = tmp_path / "merged.gguf"
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(out)]) == 0
    assert_merged_matches(out, shards, tensors, 32)


def test_check_validates_and_writes_nothing(tmp_path, capsys):
    shards = write_split(tmp_path, glm_dsa_tensors(), 4)
    before = sorted(tmp_path.iterdir())
    assert gguf_merge.main(["--check", str(shards[1]), str(tmp_path / "m.gguf")]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("ok: 4 shards, 94 tensors") and out.err == ""
    assert sorted(tmp_path.iterdir()) == before


def test_force_replaces_existing_output(tmp_path):
    shards = write_split(tmp_path, glm_dsa_tensors(), 3)
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    assert gguf_merge.main(["--no-progress", "--force", str(shards[0]), str(out)]) == 0
    assert out.read_bytes()[:4] == b"GGUF"
    assert sorted(tmp_path.iterdir()) == sorted([*shards, out])


def test_stale_temp_file_is_removed_and_reported(tmp_path, capsys):
    shards = write_split(tmp_path, glm_dsa_tensors(), 3)
    out = tmp_path / "m.gguf"
    stale = safe_files.temp_name(out)
    stale.write_bytes(b"x" * 100_000)  # left by a SIGKILLed merge
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(out)]) == 0
    assert capsys.readouterr().err == (
        f"warning: {stale}: removed the temp file of an interrupted merge (100000 bytes)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*(s.name for s in shards), "m.gguf"]
    )
    assert_merged_matches(out, shards, glm_dsa_tensors(), 32)


def test_cross_filesystem_falls_back_to_sendfile(tmp_path, capsys):
    """copy_file_range between tmpfs and the disk fails with EXDEV: sendfile takes over."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than tmp_path")
    src = shm / f"gguf-merge-test-{os.getpid()}"
    src.mkdir()
    try:
        tensors = glm_dsa_tensors(seed=3)
        shards = write_split(src, tensors, 4)
        out = tmp_path / "m.gguf"
        assert gguf_merge.main(["--no-progress", str(shards[0]), str(out)]) == 0
        assert "via sendfile" in capsys.readouterr().out
        assert_merged_matches(out, shards, tensors, 32)
    finally:
        for p in src.iterdir():
            p.unlink()
        src.rmdir()


def test_read_write_fallback_simulated(tmp_path, capsys, monkeypatch):
    """A filesystem that refuses both copy_file_range and sendfile (simulated: ENOSYS)."""

    def refuse(*_args):
        raise OSError(38, "Function not implemented")

    tensors = glm_dsa_tensors(seed=4)
    shards = write_split(tmp_path, tensors, 4)
    monkeypatch.setattr(os, "copy_file_range", refuse)
    monkeypatch.setattr(os, "sendfile", refuse)
    out = tmp_path / "m.gguf"
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(out)]) == 0
    assert "via read/write" in capsys.readouterr().out
    assert_merged_matches(out, shards, tensors, 32)


def test_progress_bar_on_a_tty(tmp_path):
    shards = write_split(tmp_path, glm_dsa_tensors(), 3)
    master, slave = pty.openpty()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(shards[0]), str(tmp_path / "m.gguf")],
        stderr=slave, stdout=subprocess.PIPE, text=True, timeout=60,
    )  # fmt: skip
    os.close(slave)
    err = os.read(master, 65536).decode()
    os.close(master)
    assert proc.returncode == 0, err
    assert "\r[#########################] 100.0%" in err and "ETA 0:00:00" in err and "/s" in err


def test_plain_progress_lines_and_no_progress(tmp_path, capsys):
    shards = write_split(tmp_path, glm_dsa_tensors(), 3)
    assert gguf_merge.main([str(shards[0]), str(tmp_path / "a.gguf")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in err] == [f"merge: shard {i}/3 done" for i in (1, 2, 3)]
    assert re.fullmatch(
        r"merge: shard 3/3 done, (\S+ MB) of \1 \(100%\), \S+ [MG]B/s, ETA 0:00:00", err[-1]
    )
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(tmp_path / "b.gguf")]) == 0
    assert capsys.readouterr().err == ""


def test_memory_stays_flat_with_a_large_tensor(tmp_path):
    """A 107 MB tensor: the merger's peak RSS stays far below it (no tensor is read into memory)."""
    shape = (12, 2048, 4096 // 32 * 34)  # Q8_0 bytes of [12, 2048, 4096]: 107 MB
    big = Tensor("blk.0.ffn_up_exps.weight", Q.Q8_0, (12, 2048, 4096), _pattern(shape))
    tensors = [big, *glm_dsa_tensors()[:10]]
    shards = write_split(tmp_path, tensors, 3)
    del big, tensors
    base_kb = _peak_rss_kb(["--check", str(shards[0]), "x.gguf"])
    peak_kb = _peak_rss_kb(["--no-progress", str(shards[0]), str(tmp_path / "m.gguf")])
    assert (tmp_path / "m.gguf").stat().st_size > 107_000_000
    assert peak_kb < 64 * 1024, peak_kb
    assert peak_kb - base_kb < 16 * 1024, (base_kb, peak_kb)


def _pattern(shape: tuple[int, ...]) -> np.ndarray:
    return np.resize(np.arange(251, dtype=np.uint8), shape)


def _peak_rss_kb(args: list[str]) -> int:
    """The merger's peak RSS, from getrusage(RUSAGE_CHILDREN) in a small parent process.

    Linux carries a process's peak RSS across fork+exec, so the merger must not be forked from
    this (large) pytest process directly.
    """
    code = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, sys.executable, str(SCRIPT), *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(proc.stdout.split()[-1])
