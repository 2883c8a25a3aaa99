"""Atomic file writes shared by the repository's tools: a fresh temp file, fsync, rename.

Every tool that writes a file the user keeps (the merged GGUF, patched vLLM sources, the smoke
report) goes through here, so the rules live in one place:
- the temp file is always new: created with O_EXCL | O_NOFOLLOW under a unique random name in the
  target's directory, so an existing path (a planted symlink, a hard link to a shard, a FIFO) is
  never opened, followed or truncated;
- the target is only replaced by a regular file that was fsynced, and the directory is fsynced
  after the rename, so a crash leaves either the old file or the new one, never half of either;
- a target that exists and is not a regular file (a FIFO, a device, a directory) is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

TEMP_SUFFIX = ".tmp"


class UnsafeTargetError(OSError):
    """The target exists and is not a regular file, or its directory cannot hold a temp file."""


def temp_name(target: Path) -> Path:
    """A fresh, unpredictable temp path beside TARGET: `.NAME.<16 hex>.tmp`."""
    return target.with_name(f".{target.name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")


def is_temp_of(candidate: Path, target: Path) -> bool:
    """Whether CANDIDATE is a temp file that `create_temp` made for TARGET (crash leftovers)."""
    name = candidate.name
    prefix = f".{target.name}."
    middle = name[len(prefix) : -len(TEMP_SUFFIX)]
    return (
        name.startswith(prefix)
        and name.endswith(TEMP_SUFFIX)
        and len(middle) == 16
        and all(c in "0123456789abcdef" for c in middle)
    )


def check_target(target: Path) -> None:
    """Refuse a TARGET that exists and is not a regular file (never follows a symlink)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeTargetError(errno.ELOOP, f"{target} is a symbolic link; refusing to replace it")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeTargetError(errno.EINVAL, f"{target} exists and is not a regular file")


def create_temp(target: Path, mode: int = 0o600) -> tuple[int, Path]:
    """Create a new temp file beside TARGET; return (fd, path). Never opens an existing path."""
    check_target(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(16):
        tmp = temp_name(target)
        try:
            fd = os.open(tmp, flags, mode)
        except FileExistsError:
            continue
        # O_CREAT applies the umask; the caller's mode is what it asked for (0600 for secrets).
        os.fchmod(fd, mode)
        return fd, tmp
    raise UnsafeTargetError(errno.EEXIST, f"could not create a fresh temp file beside {target}")


def fsync_dir(directory: Path) -> None:
    """Make a rename in DIRECTORY durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(fd: int, tmp: Path, target: Path) -> None:
    """fsync FD (the temp file's), rename TMP over TARGET, fsync the directory; closes FD."""
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    check_target(target)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def discard(tmp: Path) -> None:
    """Remove a temp file if it is still there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


@contextlib.contextmanager
def atomic_output(target: Path, mode: int = 0o644) -> Iterator[tuple[int, Path]]:
    """Yield (fd, tmp) for a fresh temp file; on a clean exit commit it over TARGET, else remove it.

    The caller writes through the fd and must not close it.
    """
    fd, tmp = create_temp(target, mode)
    try:
        yield fd, tmp
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        discard(tmp)
        raise
    try:
        commit(fd, tmp, target)
    except BaseException:
        discard(tmp)
        raise


def write_atomic(target: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace TARGET with DATA atomically (temp file + fsync + rename + directory fsync)."""
    with atomic_output(target, mode) as (fd, _tmp):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
