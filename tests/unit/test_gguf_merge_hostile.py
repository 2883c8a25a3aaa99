"""scripts/gguf_merge.py against a hostile or changing file system (issue 16, the merger).

Planted links and FIFOs where the temp file or OUTPUT goes, shards swapped or resized between
validation and copy, stop signals, closed stdout/stderr, and names llama.cpp refuses. Every case
asserts the exit code, the exact `error:`/`warning:` text and the bytes left on disk: the planted
victim untouched, no OUTPUT, no temp file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import gguf_format
import gguf_merge
import numpy as np
import pytest
import safe_files
from gguf import GGMLQuantizationType
from support.gguf_fixtures import (
    assert_merged_matches,
    glm_dsa_tensors,
    write_raw_set,
    write_split,
)

SCRIPT = Path(gguf_merge.__file__)
Q = GGMLQuantizationType


@pytest.fixture
def set4(tmp_path: Path) -> tuple[list[Path], Path]:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    return write_split(tmp_path / "in", glm_dsa_tensors(), 4), tmp_path / "out"


def _snapshot(*dirs: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry's kind and content (a link's target), without following links."""
    snap: dict[str, tuple[str, bytes | str]] = {}
    for d in dirs:
        for p in sorted(d.iterdir()):
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                snap[str(p)] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                snap[str(p)] = ("file", p.read_bytes())
            else:
                snap[str(p)] = (stat.filemode(st.st_mode)[0], "")
    return snap


def _temps(out: Path) -> list[Path]:
    return [p for p in out.parent.iterdir() if safe_files.is_temp_of(p, out)]


def _fails(capsys, argv: list[str], pattern: str) -> str:
    assert gguf_merge.main(["--no-progress", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert re.fullmatch(pattern, err.rstrip("\n")), err
    return err


def _names(capsys, shards: list[Path], out: Path, bad: Path | str, problem: str) -> None:
    """Merging SHARDS into OUT fails naming BAD with PROBLEM (a regular expression)."""
    _fails(capsys, [str(shards[0]), str(out)], rf"error: {re.escape(str(bad))}: {problem}")


def _set_fails(capsys, shards: list[Path], out_dir: Path, bad: Path, problem: str) -> None:
    """_names() with OUT_DIR/m.gguf, and OUT_DIR left empty."""
    _names(capsys, shards, out_dir / "m.gguf", bad, problem)
    assert list(out_dir.iterdir()) == []


def _replaced(when: str) -> str:
    """The merger's message for a shard path that names another file WHEN (a pattern)."""
    return rf"replaced {when} \(validated inode \d+, the path now names inode \d+\); not written"


def _resized(when: str, size: int, now: int) -> str:
    """The merger's message for a shard of SIZE bytes that has NOW bytes WHEN (a pattern)."""
    return rf"changed size {when} \(validated {size} bytes, now {now}\); not written"


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    # the timeout only keeps a regression (an open() blocked on a FIFO) from hanging the suite
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--no-progress", *argv],
        capture_output=True, text=True, timeout=60, **kw,
    )  # fmt: skip


# -- links and FIFOs where the temp file or OUTPUT goes ----------------------------------------


@pytest.mark.parametrize("kind", ["symlink-to-shard", "hardlink-to-shard", "symlink-elsewhere"])
def test_planted_legacy_temp_name_is_never_opened(set4, tmp_path, capsys, kind):
    """The old merger opened OUTPUT.tmp O_WRONLY|O_CREAT and truncated whatever it named."""
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    planted = out_dir / "m.gguf.tmp"
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious" * 1000)
    if kind == "symlink-to-shard":
        planted.symlink_to(shards[2])
    elif kind == "hardlink-to-shard":
        os.link(shards[2], planted)
    else:
        planted.symlink_to(victim)
    before = _snapshot(shards[0].parent) | {str(victim): ("file", victim.read_bytes())}
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(out)]) == 0
    assert capsys.readouterr().err == ""
    after = _snapshot(shards[0].parent) | {str(victim): ("file", victim.read_bytes())}
    assert after == before
    assert os.path.lexists(planted) and not _temps(out)
    assert_merged_matches(out, shards, glm_dsa_tensors(), 32)


def test_planted_fifo_at_legacy_temp_name_does_not_block(set4):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    os.mkfifo(out_dir / "m.gguf.tmp")
    proc = _run([str(shards[0]), str(out)])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert stat.S_ISFIFO(os.lstat(out_dir / "m.gguf.tmp").st_mode)
    assert_merged_matches(out, shards, glm_dsa_tensors(), 32)


def test_temp_name_collision_is_skipped_never_followed(set4, monkeypatch, capsys):
    """The random temp name guessed and planted as a link to a shard: O_EXCL skips it."""
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    names = iter(["0" * 16, "1" * 16])
    monkeypatch.setattr(safe_files.secrets, "token_hex", lambda _n: next(names))
    planted = out_dir / f".m.gguf.{'0' * 16}.tmp"
    planted.symlink_to(shards[1])
    before = _snapshot(shards[0].parent)
    # the planted name looks like a leftover temp: the sweep must not follow it either
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(out)]) == 0
    assert capsys.readouterr().err == (
        f"warning: {planted}: leftover temp file not removed (Too many levels of symbolic "
        "links); remove it by hand\n"
    )
    assert _snapshot(shards[0].parent) == before
    assert os.readlink(planted) == str(shards[1])
    assert_merged_matches(out, shards, glm_dsa_tensors(), 32)


@pytest.mark.parametrize("force", [False, True])
def test_fifo_as_output_is_refused_without_blocking(set4, force):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    os.mkfifo(out)
    proc = _run([*(["--force"] if force else []), str(shards[0]), str(out)])
    assert proc.returncode == 1
    assert proc.stderr == (
        f"error: {out}: exists and is not a regular file (FIFO, device or socket); refusing it\n"
    )
    assert stat.S_ISFIFO(os.lstat(out).st_mode) and not _temps(out)


def test_device_as_output_is_refused(set4, capsys):
    shards, out_dir = set4
    out = out_dir / "null"
    try:
        os.mknod(out, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    _fails(
        capsys, ["--force", str(shards[0]), str(out)],
        rf"error: {re.escape(str(out))}: exists and is not a regular file \(FIFO, device or "
        r"socket\); refusing it",
    )  # fmt: skip
    assert stat.S_ISCHR(os.lstat(out).st_mode) and not _temps(out)


def test_symlink_as_output_is_not_replaced_even_with_force(set4, tmp_path, capsys):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    target = tmp_path / "elsewhere.gguf"
    target.write_bytes(b"old model")
    out.symlink_to(target)
    _fails(
        capsys, ["--force", str(shards[0]), str(out)],
        rf"error: {re.escape(str(out))}: is a symbolic link; refusing to replace it",
    )  # fmt: skip
    assert os.readlink(out) == str(target) and target.read_bytes() == b"old model"


def test_hard_link_to_a_shard_as_output_is_refused(set4, capsys):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    os.link(shards[1], out)
    before = shards[1].read_bytes()
    _fails(
        capsys, ["--force", str(shards[0]), str(out)],
        rf"error: {re.escape(str(out))}: is one of the input shards \(shard 2\)",
    )  # fmt: skip
    assert shards[1].read_bytes() == before and os.path.samefile(out, shards[1])


def test_fifo_planted_as_a_shard_is_not_opened(set4, capsys):
    shards, out_dir = set4
    shards[2].unlink()
    os.mkfifo(shards[2])
    _set_fails(
        capsys, shards, out_dir, shards[2],
        r"shard 3 of 4 is not a regular file",
    )  # fmt: skip


def test_open_shard_refuses_a_fifo_without_blocking(tmp_path):
    """The window between find_shards' check and the open: O_NONBLOCK + fstat."""
    fifo = tmp_path / "x-00001-of-00001.gguf"
    os.mkfifo(fifo)
    with pytest.raises(gguf_format.ShardError, match=r": not a regular file$"):
        gguf_format.open_shard(fifo)


# -- crash leftovers and a concurrent merge ----------------------------------------------------


def test_leftover_temp_of_a_running_merge_is_an_error(set4, capsys):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    busy = safe_files.temp_name(out)
    busy.write_bytes(b"half a model")
    with open(busy, "rb") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # what a running merge holds on its temp file
        _fails(
            capsys, [str(shards[0]), str(out)],
            rf"error: {re.escape(str(out))}: another merge is writing this file \(its temp file "
            rf"{re.escape(busy.name)} is locked\)",
        )  # fmt: skip
    assert [p.name for p in out_dir.iterdir()] == [busy.name]
    assert busy.read_bytes() == b"half a model"


def test_leftovers_of_killed_merges_are_removed_and_the_merge_succeeds(set4):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    stale = [safe_files.temp_name(out) for _ in range(2)]
    for p in stale:
        p.write_bytes(b"x" * 1000)
    other = safe_files.temp_name(out_dir / "other.gguf")  # another output's temp: not ours
    other.write_bytes(b"y")
    proc = _run([str(shards[0]), str(out)])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stderr.splitlines()) == sorted(
        f"warning: {p}: removed the temp file of an interrupted merge (1000 bytes)" for p in stale
    )
    assert sorted(out_dir.iterdir()) == sorted([out, other])


def test_sigkill_mid_merge_leftover_is_cleaned_by_the_next_run(set4):
    """A real kill -9 while the temp file is half-written (stderr blocked on a full pipe)."""
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    r, w = os.pipe()
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"." * 4096)
    os.set_blocking(w, True)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(shards[0]), str(out)], stderr=w)
    try:
        for _ in range(6000):
            if _temps(out) and _temps(out)[0].stat().st_size > 0:
                break
            assert proc.poll() is None
            time.sleep(0.01)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        os.close(w)
        os.close(r)
    (left,) = _temps(out)
    size = left.stat().st_size
    again = _run([str(shards[0]), str(out)])
    assert again.returncode == 0, again.stderr
    assert again.stderr == (
        f"warning: {left}: removed the temp file of an interrupted merge ({size} bytes)\n"
    )
    assert list(out_dir.iterdir()) == [out]
    assert_merged_matches(out, shards, glm_dsa_tensors(), 32)


# -- shards swapped or resized after validation ------------------------------------------------


def _after_validation(monkeypatch, action) -> None:
    real = gguf_merge.plan_merge

    def plan_then_act(headers):
        plan = real(headers)
        action()
        return plan

    monkeypatch.setattr(gguf_merge, "plan_merge", plan_then_act)


def test_shard_replaced_after_validation(set4, tmp_path, monkeypatch, capsys):
    shards, out_dir = set4
    other = write_split(tmp_path / "out", glm_dsa_tensors(seed=9), 4, prefix="other")
    _after_validation(monkeypatch, lambda: os.replace(other[2], shards[2]))
    for p in other[:2] + other[3:]:
        p.unlink()
    _set_fails(capsys, shards, out_dir, shards[2], _replaced("after validation"))


@pytest.mark.parametrize("delta", [-1000, 4096])
def test_shard_resized_in_place_after_validation(set4, monkeypatch, capsys, delta):
    shards, out_dir = set4
    size = shards[3].stat().st_size
    _after_validation(monkeypatch, lambda: os.truncate(shards[3], size + delta))
    _set_fails(capsys, shards, out_dir, shards[3], _resized("after validation", size, size + delta))


def _during_copy(monkeypatch, shard_fd_index: int, action) -> None:
    """Run ACTION once, right after the first chunk read from shard number SHARD_FD_INDEX."""
    real = gguf_merge.Copier.copy
    state = {"done": False}

    def copy(self, src, dst, src_off, dst_off, n):
        got = real(self, src, dst, src_off, dst_off, n)
        if not state["done"] and src == state.get("fd"):
            state["done"] = True
            action()
        return got

    real_read_set = gguf_merge.read_set

    def read_set(paths, fds=None):
        state["fd"] = fds[shard_fd_index]
        return real_read_set(paths, fds)

    monkeypatch.setattr(gguf_merge.Copier, "copy", copy)
    monkeypatch.setattr(gguf_merge, "read_set", read_set)


def test_shard_replaced_while_merging(set4, tmp_path, monkeypatch, capsys):
    """Shard 2 is swapped after its data were copied: the final check catches it."""
    shards, out_dir = set4
    twin = tmp_path / "twin.gguf"
    twin.write_bytes(shards[1].read_bytes())  # same bytes, another file
    _during_copy(monkeypatch, 3, lambda: os.replace(twin, shards[1]))
    _set_fails(capsys, shards, out_dir, shards[1], _replaced("while merging"))


def test_shard_grown_while_merging(set4, monkeypatch, capsys):
    shards, out_dir = set4
    size = shards[3].stat().st_size

    def append() -> None:
        with open(shards[3], "ab") as fh:
            fh.write(b"\0" * 64)

    _during_copy(monkeypatch, 3, append)
    _set_fails(capsys, shards, out_dir, shards[3], _resized("while merging", size, size + 64))


def test_output_created_while_merging_is_not_clobbered(set4, monkeypatch, capsys):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    _during_copy(monkeypatch, 2, lambda: out.write_bytes(b"someone else's"))
    _fails(
        capsys, [str(shards[0]), str(out)],
        rf"error: {re.escape(str(out))}: appeared while merging; pass --force to replace it",
    )  # fmt: skip
    assert out.read_bytes() == b"someone else's" and not _temps(out)


def test_temp_file_removed_by_someone_else_is_an_error(set4, monkeypatch, capsys):
    """E.g. a concurrent merge's sweep, or an admin's `rm`: no traceback, no OUTPUT."""
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    _during_copy(monkeypatch, 3, lambda: [p.unlink() for p in _temps(out)])
    _fails(
        capsys, [str(shards[0]), str(out)],
        rf"error: {re.escape(str(out))}: cannot read back \.m\.gguf\.[0-9a-f]{{16}}\.tmp: No such "
        r"file or directory",
    )  # fmt: skip
    assert list(out_dir.iterdir()) == []


# -- closed stdout / stderr --------------------------------------------------------------------


def _closed_pipe() -> int:
    r, w = os.pipe()
    os.close(r)
    return w


@pytest.mark.parametrize("check", [False, True])
def test_closed_stdout_after_success_keeps_exit_0(set4, check):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    w = _closed_pipe()
    try:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "--no-progress", *(["--check"] if check else []),
             str(shards[0]), str(out)],
            stdout=w, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(w)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    if not check:
        assert_merged_matches(out, shards, glm_dsa_tensors(), 32)


def test_closed_stderr_stops_the_progress_not_the_merge(set4):
    shards, out_dir = set4
    out = out_dir / "m.gguf"
    w = _closed_pipe()
    try:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), str(shards[0]), str(out)],
            stdout=subprocess.PIPE, stderr=w, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(w)
    assert proc.returncode == 0
    assert proc.stdout.startswith(
        f"merged 4 shards, 94 tensors, 1.3 MB of tensor data, alignment 32 into {out} "
    )  # noqa: E501
    assert_merged_matches(out, shards, glm_dsa_tensors(), 32)


# -- names that would split the error line, and names llama.cpp refuses ------------------------


def _renamed_set(directory: Path, names: dict[int, str]) -> list[Path]:
    """The 4-shard set in DIRECTORY, the tensors at the indices of NAMES renamed so."""
    tensors = glm_dsa_tensors()
    for index, name in names.items():
        tensors[index] = dataclasses.replace(tensors[index], name=name)
    return write_split(directory, tensors, 4)


def test_tensor_name_with_a_newline_stays_on_one_line(tmp_path, capsys):
    evil = "blk.0.x\nerror: forged"
    shards = _renamed_set(tmp_path, {3: evil, -1: evil})
    first = re.escape(str(shards[1]))
    duplicate = rf"duplicate tensor 'blk\.0\.x\\nerror: forged': also in shard 2 \({first}\)"
    _names(capsys, shards, tmp_path / "m.gguf", shards[3], duplicate)


def test_shard_path_with_a_newline_stays_on_one_line(tmp_path, capsys):
    shards = write_split(tmp_path, glm_dsa_tensors(), 3, prefix="GLM\nerror: forged")
    shards[1].unlink()
    escaped = str(shards[1]).replace("\n", "\\n")
    _names(capsys, shards, tmp_path / "m.gguf", escaped, "missing shard 2 of 3")


def test_nul_byte_in_a_tensor_name_is_refused(tmp_path, capsys):
    """llama.cpp keeps names as C strings: it cuts this one at the NUL (test_gguf_merge_llama)."""
    shards = _renamed_set(tmp_path, {5: "blk.0.attn\0_q_a.weight"})
    nul = r"tensor name 'blk\.0\.attn\\x00_q_a\.weight' contains a NUL byte"
    _names(capsys, shards, tmp_path / "m.gguf", shards[1], nul)
    assert sorted(tmp_path.iterdir()) == sorted(shards)


def test_nul_byte_in_a_key_is_refused(tmp_path, capsys):
    from gguf import GGUFValueType
    from support.gguf_fixtures import glm_dsa_metadata

    meta = [*glm_dsa_metadata(), ("general.name\0x", "forged", GGUFValueType.STRING)]
    shards = write_split(tmp_path, glm_dsa_tensors(), 4, metadata=meta)
    _names(
        capsys, shards, tmp_path / "m.gguf", shards[0],
        r"key 'general\.name\\x00x' contains a NUL byte",
    )  # fmt: skip


def test_quantized_tensor_with_0_dimensions_is_refused(tmp_path, capsys):
    """llama.cpp reads 0 dimensions as ne = [1, 1, 1, 1]: a Q8_0 row of 1 is not a block of 32.

    The old parser skipped the block check for an empty shape and then blamed the next tensor's
    offset."""
    shards = write_raw_set(
        tmp_path,
        [("a.weight", np.zeros(34, np.int8), (), Q.Q8_0),
         ("b.weight", np.zeros(4, np.int8), (), Q.F32)],
    )  # fmt: skip
    _names(
        capsys, shards, tmp_path / "m.gguf", shards[1],
        r"tensor 'a\.weight' rows of 1 are not a multiple "
        r"of the block size 32 \(0 dimensions: a row of 1 element\)",
    )  # fmt: skip


def test_f32_tensor_with_0_dimensions_merges_as_one_element(tmp_path):
    shards = write_raw_set(tmp_path, [("s.weight", np.arange(4, dtype=np.int8), (), Q.F32)])
    out = tmp_path / "m.gguf"
    assert gguf_merge.main(["--no-progress", str(shards[0]), str(out)]) == 0
    (t,) = gguf_format.read_header(out).tensors
    assert (t.name, t.ne, t.nbytes) == ("s.weight", (1,), 4)  # ggml_n_dims() writes 1 dimension
