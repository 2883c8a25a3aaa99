"""scripts/safe_files.py: fresh temp files only, links and special files refused, atomic replace."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import safe_files


def test_write_atomic_replaces_and_sets_mode(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_bytes(b"old")
    safe_files.write_atomic(target, b"new bytes", mode=0o600)
    assert target.read_bytes() == b"new bytes"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_temp_names_are_fresh_and_recognised(tmp_path: Path) -> None:
    target = tmp_path / "model.gguf"
    names = {safe_files.temp_name(target) for _ in range(50)}
    assert len(names) == 50
    assert all(safe_files.is_temp_of(n, target) for n in names)
    assert not safe_files.is_temp_of(tmp_path / "model.gguf.tmp", target)
    assert not safe_files.is_temp_of(tmp_path / ".model.gguf.zzzzzzzzzzzzzzzz.tmp", target)


def test_planted_links_at_old_temp_name_are_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "shard.gguf"
    victim.write_bytes(b"precious")
    target = tmp_path / "out.gguf"
    (tmp_path / "out.gguf.tmp").symlink_to(victim)
    os.link(victim, tmp_path / ".out.gguf.tmp")
    safe_files.write_atomic(target, b"merged")
    assert victim.read_bytes() == b"precious"
    assert target.read_bytes() == b"merged"


def test_symlink_target_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    target = tmp_path / "out"
    target.symlink_to(victim)
    with pytest.raises(safe_files.UnsafeTargetError, match="symbolic link"):
        safe_files.write_atomic(target, b"x")
    assert victim.read_bytes() == b"keep"
    assert target.is_symlink()


def test_fifo_target_is_refused_without_blocking(tmp_path: Path) -> None:
    target = tmp_path / "fifo"
    os.mkfifo(target)
    with pytest.raises(safe_files.UnsafeTargetError, match="not a regular file"):
        safe_files.write_atomic(target, b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_failure_inside_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"), safe_files.atomic_output(target) as (fd, _):
        os.write(fd, b"partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
