"""scripts/gguf_merge.py on bad input: exit 1, one line `error: <file>: <problem>`, nothing left.

Each case asserts the exit code, the whole stderr line (file named, problem said) and that the
output directory is exactly as before (no OUTPUT, no OUTPUT.tmp).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gguf_merge
import pytest
import safe_files
from gguf import GGUFValueType
from support.gguf_fixtures import glm_dsa_metadata, glm_dsa_tensors, llama_split_keys, write_split

SCRIPT = Path(gguf_merge.__file__)
U16, I32, U32 = GGUFValueType.UINT16, GGUFValueType.INT32, GGUFValueType.UINT32


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path / "in", tmp_path / "out"


def _merge_fails(capsys, args: list[str], out_dir: Path, pattern: str) -> str:
    before = sorted(out_dir.iterdir())
    assert gguf_merge.main(args) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert re.fullmatch(pattern, err.rstrip("\n")), err
    assert sorted(out_dir.iterdir()) == before
    return err


def _set_fails(capsys, shard: Path, out_dir: Path, bad: Path, problem: str) -> str:
    """Merging the set of ``shard`` into out_dir/m.gguf fails naming ``bad`` with ``problem``
    (a regular expression)."""
    args = [str(shard), str(out_dir / "m.gguf")]
    return _merge_fails(capsys, args, out_dir, rf"error: {re.escape(str(bad))}: {problem}")


def _output_fails(capsys, shards: list[Path], out: Path, problem: str) -> str:
    """Merging SHARDS into OUT fails naming OUT with PROBLEM (a regular expression); OUT's
    directory is left as it was."""
    args = [str(shards[0]), str(out)]
    return _merge_fails(capsys, args, out.parent, rf"error: {re.escape(str(out))}: {problem}")


def _shards(in_dir: Path, n: int = 4, **kw) -> list[Path]:
    return write_split(in_dir, glm_dsa_tensors(), n, **kw)


# -- the set: names, missing and duplicate shards ----------------------------------------------


def test_missing_shard(dirs, capsys):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    shards[2].unlink()
    _set_fails(capsys, shards[0], out_dir, shards[2], r"missing shard 3 of 4")


def test_duplicate_shard_copied_over_another(dirs, capsys):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    shutil.copyfile(shards[1], shards[2])
    _set_fails(
        capsys, shards[0], out_dir, shards[2],
        r"split.no is 1 \(shard 2\) but the file name says "
        r"shard 3 of 4: a duplicate shard\?",
    )  # fmt: skip


def test_duplicate_shard_same_file_linked(dirs, capsys):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    shards[3].unlink()
    os.link(shards[1], shards[3])
    _set_fails(
        capsys, shards[0], out_dir, shards[3],
        r"duplicate shard: same file as shard 2 \(.*\)",
    )  # fmt: skip


@pytest.mark.parametrize("name", ["model.gguf", "model-1-of-4.gguf", "model-00005-of-00004.gguf"])
def test_wrong_file_name_pattern(dirs, capsys, name):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    bad = in_dir / name
    shutil.copyfile(shards[0], bad)
    _set_fails(
        capsys, bad, out_dir, bad,
        r"file name (does not match <prefix>-NNNNN-of-MMMMM\.gguf"
        r"|says shard 5 of 4)",
    )  # fmt: skip


def test_shard_does_not_exist(dirs, capsys):
    in_dir, out_dir = dirs
    missing = in_dir / "x-00001-of-00002.gguf"
    _set_fails(capsys, missing, out_dir, missing, r"no such file")


# -- split keys --------------------------------------------------------------------------------


def _keys_with(shard: int, change):
    def keys(index: int, count: int, n_tensors: int):
        kv = llama_split_keys(index, count, n_tensors)
        return change(kv) if index == shard else kv

    return keys


@pytest.mark.parametrize(
    ("shard", "change", "problem"),
    [
        (1, lambda kv: [kv[0], kv[1], ("split.count", 5, U16)],
         r"split\.count is 5 but the file name says 4 shards"),
        (2, lambda kv: [kv[0], ("split.tensors.count", 93, I32), kv[2]],
         r"split\.tensors\.count is 93 but shard 1 says 94"),
        (1, lambda kv: kv[1:], r"no split\.no key: not a shard of a split set"),
        (3, lambda kv: [("split.no", 3, U32), *kv[1:]], r"split\.no is uint32, expected uint16"),
        (0, lambda kv: [kv[0], ("split.tensors.count", 94, U32), kv[2]],
         r"split\.tensors\.count is uint32, expected int32"),
    ],
)  # fmt: skip
def test_inconsistent_split_keys(dirs, capsys, shard, change, problem):
    in_dir, out_dir = dirs
    shards = _shards(in_dir, split_keys=_keys_with(shard, change))
    _set_fails(capsys, shards[0], out_dir, shards[shard], problem)


def test_split_tensors_count_disagrees_with_the_tensors(dirs, capsys):
    in_dir, out_dir = dirs

    def keys(index: int, count: int, n_tensors: int):
        return llama_split_keys(index, count, n_tensors + 1)

    shards = _shards(in_dir, split_keys=keys)
    _set_fails(
        capsys, shards[0], out_dir, shards[0],
        r"split\.tensors\.count is 95 but the 4 shards hold "
        r"94 tensors",
    )  # fmt: skip


# -- file contents -----------------------------------------------------------------------------


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize(
    ("offset", "data", "problem"),
    [
        (0, b"GGUG", r"not a GGUF file: magic b'GGUG', expected b'GGUF'"),
        (4, struct.pack("<I", 1), r"unsupported GGUF version 1 \(supported: 2, 3\)"),
        (4, struct.pack("<I", 4), r"unsupported GGUF version 4 \(supported: 2, 3\)"),
        (4, struct.pack(">I", 3), r"big-endian GGUF \(byte-swapped version\) is not supported"),
        (8, struct.pack("<Q", 10**12),
         r"header truncated or corrupt: \d+ key/values and 1000000000000 tensors cannot fit in "
         r"\d+ bytes"),
    ],
)  # fmt: skip
def test_wrong_magic_version_or_counts(dirs, capsys, offset, data, problem):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    _patch(shards[1], offset, data)
    _set_fails(capsys, shards[0], out_dir, shards[1], problem)


def test_truncated_last_shard(dirs, capsys):
    """llama-gguf-split merges this with exit 0 and zeros in place of the missing bytes."""
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    size = shards[-1].stat().st_size
    os.truncate(shards[-1], size - 1000)
    _set_fails(
        capsys, shards[0], out_dir, shards[-1],
        rf"truncated: tensor data ends at byte \d+ but the "
        rf"file has {size - 1000} bytes \(tensor 'output\.weight' is incomplete\)",
    )  # fmt: skip


@pytest.mark.parametrize("keep", [0, 20, 300, 1000])
def test_truncated_header(dirs, capsys, keep):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    os.truncate(shards[2], keep)
    problem = (
        r"not a GGUF file: \d+ bytes, shorter than a GGUF header"
        if keep < 24
        else r"header truncated or corrupt: 3 key/values and 32 tensors cannot fit in 300 bytes"
        if keep == 300
        else r"header truncated or corrupt: \w+ of '.*' needs \d+ bytes at offset \d+, "
        r"file has 1000"
    )
    _set_fails(capsys, shards[0], out_dir, shards[2], problem)


def test_duplicate_tensor_across_shards(dirs, capsys):
    in_dir, out_dir = dirs
    tensors = glm_dsa_tensors()
    # the last shard's last tensor takes the name of one in shard 2
    tensors[-1] = dataclasses.replace(tensors[-1], name=tensors[3].name)
    shards = write_split(in_dir, tensors, 4)
    _set_fails(
        capsys, shards[0], out_dir, shards[3],
        rf"duplicate tensor '{re.escape(tensors[3].name)}': "
        rf"also in shard 2 \({re.escape(str(shards[1]))}\)",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "vtype", "problem"),
    [
        (48, U32, r"general\.alignment is 48, not a power of two"),
        (0, U32, r"general\.alignment is 0, not a power of two"),
        (64, GGUFValueType.UINT64, r"general\.alignment must be u32, is uint64"),
    ],
)
def test_bad_alignment(dirs, capsys, value, vtype, problem):
    in_dir, out_dir = dirs
    shards = _shards(in_dir, metadata=[*glm_dsa_metadata(), ("general.alignment", value, vtype)])
    _set_fails(capsys, shards[0], out_dir, shards[0], problem)


def test_alignment_declared_only_in_shard_one(dirs, capsys):
    """gguf-py's splitter lays every shard out at 64 but declares it only in shard 1."""
    in_dir, out_dir = dirs
    shards = _shards(in_dir, metadata=[*glm_dsa_metadata(), ("general.alignment", 64, U32)])
    problem = (
        r"no general\.alignment while shard 1 declares 64: "
        r"this shard's data layout is ambiguous \(read at 32, as llama\.cpp does\)"
    )
    _set_fails(capsys, shards[0], out_dir, shards[1], problem)


# -- the output --------------------------------------------------------------------------------


def test_existing_output_is_refused(dirs, capsys):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    out = out_dir / "m.gguf"
    out.write_bytes(b"precious")
    _output_fails(
        capsys, shards, out,
        r"already exists; pass --force to replace it",
    )  # fmt: skip
    assert out.read_bytes() == b"precious"


def test_output_is_an_input_shard(dirs, capsys):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    before = shards[2].read_bytes()
    _merge_fails(
        capsys, ["--force", str(shards[0]), str(shards[2])], in_dir,
        rf"error: {re.escape(str(shards[2]))}: is one of the input shards \(shard 3\)",
    )  # fmt: skip
    assert shards[2].read_bytes() == before


def test_output_directory_missing(dirs, capsys):
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    out = out_dir / "nope" / "m.gguf"
    _merge_fails(
        capsys, [str(shards[0]), str(out)], out_dir,
        rf"error: {re.escape(str(out))}: directory {re.escape(str(out.parent))} does not exist",
    )  # fmt: skip


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_unwritable_directory(dirs, capsys, tmp_path):
    in_dir, _ = dirs
    shards = _shards(in_dir)
    if os.geteuid() != 0:  # permissions stop a normal user; root needs a read-only filesystem
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        ctx: contextlib.AbstractContextManager[Path] = contextlib.nullcontext(ro)
        problem = "Permission denied"
    else:
        ctx = _tmpfs(tmp_path / "ro", "ro,size=64m")
        problem = "Read-only file system"
    with ctx as ro:
        out = ro / "m.gguf"
        _output_fails(
            capsys, shards, out,
            rf"cannot create a temp file in {re.escape(str(ro))}: "
            rf"{problem}",
        )  # fmt: skip


def test_not_enough_free_space(dirs, capsys, tmp_path):
    """A 1 MiB tmpfs: the free-space check refuses before writing a byte."""
    in_dir, _ = dirs
    shards = _shards(in_dir)
    with _tmpfs(tmp_path / "small", "size=1m") as small:
        out = small / "m.gguf"
        _output_fails(
            capsys, shards, out,
            rf"not enough free space in {re.escape(str(small))}: "
            r"the merged file needs 1\.3 MB \(\d+ bytes\), 1\.0 MB available",
        )  # fmt: skip


def _subprocess_fails(args: list[str], out_dir: Path, pattern: str, **kw) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-progress", *args],
        capture_output=True, text=True, timeout=120, **kw,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert re.fullmatch(pattern, proc.stderr.rstrip("\n")), proc.stderr
    assert list(out_dir.iterdir()) == []


def test_disk_full_mid_write_rlimit_fsize(dirs):
    """RLIMIT_FSIZE stops the write half-way (EFBIG): the partial temp file is removed."""
    import resource

    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    out = out_dir / "m.gguf"
    limit = 600_000  # about half of the merged file

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    _subprocess_fails(
        [str(shards[0]), str(out)], out_dir,
        rf"error: {re.escape(str(out))}: writing \.m\.gguf\.[0-9a-f]{{16}}\.tmp failed: File too "
        r"large; removed it",
        preexec_fn=limit_file_size,
    )  # fmt: skip


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_signal_mid_merge_removes_the_temp_file(dirs, signum):
    """Signalled while the temp file is half-written: it is removed and OUTPUT never appears.

    SIGHUP is what a dropped SSH session sends; SIGQUIT is Ctrl-\\. The merger writes its first
    plain progress line after shard 1's data; stderr is a pipe that the test has filled, so that
    write blocks and the merge is caught, deterministically, in the middle with the temp file on
    disk.
    """
    in_dir, out_dir = dirs
    shards = _shards(in_dir)
    out = out_dir / "m.gguf"
    r, w = os.pipe()
    filler = _fill(w)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(shards[0]), str(out)],
        stdout=subprocess.PIPE, stderr=w, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not any(safe_files.is_temp_of(p, out) for p in out_dir.iterdir()):
            assert proc.poll() is None, "the merger ended before it was interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)  # let it reach the blocked write
        assert proc.poll() is None
        proc.send_signal(signum)
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(r, chunks))
        reader.start()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(w)
    reader.join(timeout=10)
    os.close(r)
    err = b"".join(chunks)[filler:].decode()
    assert rc == 1, err
    name = signal.Signals(signum).name
    assert err.splitlines()[-1] == (
        f"error: {out}: interrupted by {name}; not written, no temporary file left"
    )
    assert all(line.startswith("merge: shard ") for line in err.splitlines()[:-1]), err
    assert proc.stdout is not None and proc.stdout.read() == ""
    assert list(out_dir.iterdir()) == []


def _fill(fd: int) -> int:
    """Fill a pipe to the last byte; returns how many bytes that took."""
    os.set_blocking(fd, False)
    total = 0
    for size in (65536, 4096, 256, 16, 1):
        with contextlib.suppress(BlockingIOError):
            while True:
                total += os.write(fd, b"." * size)
    os.set_blocking(fd, True)
    return total


def _drain(fd: int, chunks: list[bytes]) -> None:
    while data := os.read(fd, 65536):
        chunks.append(data)
