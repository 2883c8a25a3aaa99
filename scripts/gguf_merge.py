"""Merge split GGUF shards into one file. Exit: 0 ok, 1 bad input or I/O failure, 2 usage.

SHARD is any file of a set `<prefix>-NNNNN-of-MMMMM.gguf`; its siblings are found by name. Every
shard is checked before a byte is written (magic and version, split.no / split.count /
split.tensors.count, missing or duplicate shards, truncated tensor data, duplicate tensor names,
alignment). OUTPUT is byte-identical to `llama-gguf-split --merge` for sets at the default
alignment of 32; at another alignment the file's own general.alignment is honoured. It is written
to OUTPUT.tmp beside OUTPUT, fsynced and renamed (the directory is fsynced too), so OUTPUT never
exists half-written; a failure or SIGINT/SIGTERM removes OUTPUT.tmp. Tensor data are streamed
with copy_file_range, else sendfile, else read/write: memory stays flat whatever the model size.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from gguf_format import MergePlan, ShardError, find_shards, plan_merge, read_set

EXAMPLES = """\
examples:
  python scripts/gguf_merge.py GLM-5-Q4_K_M-00001-of-00011.gguf GLM-5-Q4_K_M.gguf
  python scripts/gguf_merge.py --check /models/GLM-5-Q4_K_M-00003-of-00011.gguf unused.gguf
  make merge SHARD=/models/GLM-5-Q4_K_M-00001-of-00011.gguf OUT=/models/GLM-5-Q4_K_M.gguf
"""

CHUNK = 64 << 20  # bytes per copy call: keeps progress and signals responsive
RW_BUFFER = 8 << 20  # the read/write fallback's only buffer
# errors that mean "this kernel/filesystem cannot do it this way", not "the copy failed"
_UNSUPPORTED = {
    errno.EXDEV,
    errno.EINVAL,
    errno.ENOSYS,
    errno.EOPNOTSUPP,
    errno.ENOTSUP,
    errno.EBADF,
}
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while a step must not be cut in half (open+lock, rename, cleanup)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _duration(s: float) -> str:
    s = int(s + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """A bar with rate and ETA on a TTY; otherwise plain lines, one per shard and every 10 s."""

    def __init__(self, total: int, n_shards: int, stream: TextIO, enabled: bool) -> None:
        self.total, self.n_shards, self.stream = total, n_shards, stream
        self.enabled = enabled
        self.tty = enabled and stream.isatty()
        self.done = 0
        self.start = self.last = time.monotonic()

    def _stats(self) -> tuple[float, str, str]:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.done / elapsed
        eta = _duration((self.total - self.done) / rate) if rate > 0 else "?"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return pct, f"{_gb(rate)}/s", eta

    def advance(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty and now - self.last >= 0.2:
            self.last = now
            pct, rate, eta = self._stats()
            bar = "#" * int(pct / 4)
            self.stream.write(
                f"\r[{bar:<25}] {pct:5.1f}% {_gb(self.done)}/{_gb(self.total)} {rate} ETA {eta}  "
            )
            self.stream.flush()
        elif not self.tty and now - self.last >= 10:
            self.last = now
            self._line("")

    def shard_done(self, index: int) -> None:
        if self.enabled and not self.tty:
            self.last = time.monotonic()
            self._line(f"shard {index}/{self.n_shards} done, ")

    def _line(self, what: str) -> None:
        pct, rate, eta = self._stats()
        self.stream.write(
            f"merge: {what}{_gb(self.done)} of {_gb(self.total)} ({pct:.0f}%), {rate}, ETA {eta}\n"
        )
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.last = 0.0
            self.advance(0)
            self.stream.write("\n")
            self.stream.flush()


class Copier:
    """Copies byte ranges between files with the fastest call the kernel accepts for the pair."""

    METHODS = ("copy_file_range", "sendfile", "read/write")

    def __init__(self, method: str = "copy_file_range") -> None:
        self.method = method
        self.used: set[str] = set()
        self._buf: bytearray | None = None

    def copy(self, src: int, dst: int, src_off: int, dst_off: int, n: int) -> int:
        """Copy up to n bytes (one chunk); returns the count, 0 only at the source's end."""
        while True:
            try:
                got = self._copy_once(src, dst, src_off, dst_off, min(n, CHUNK))
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED or self.method == self.METHODS[-1]:
                    raise
                got = None
            if got:
                self.used.add(self.method)
                return got
            # refused, or 0 bytes (some filesystems report 0 instead of an error): next method
            if self.method == self.METHODS[-1]:
                return 0
            self.method = self.METHODS[self.METHODS.index(self.method) + 1]

    def _copy_once(self, src: int, dst: int, src_off: int, dst_off: int, n: int) -> int:
        if self.method == "copy_file_range":
            return os.copy_file_range(src, dst, n, src_off, dst_off)
        if self.method == "sendfile":
            os.lseek(dst, dst_off, os.SEEK_SET)
            return os.sendfile(dst, src, src_off, n)
        if self._buf is None:
            self._buf = bytearray(RW_BUFFER)
        view = memoryview(self._buf)[: min(n, RW_BUFFER)]
        got = os.preadv(src, [view], src_off)
        done = 0
        while done < got:
            done += os.pwrite(dst, view[done:got], dst_off + done)
        return got


def _open_tmp(tmp: Path) -> tuple[int, bool]:
    """Create (or take over a stale) OUTPUT.tmp, locked; returns (fd, was_stale)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ShardError(tmp, "another merge is writing this file") from None
    stale = os.fstat(fd).st_size > 0
    os.ftruncate(fd, 0)
    return fd, stale


def _check_output(plan: MergePlan, output: Path, force: bool, inputs: list[Path]) -> None:
    if output.is_dir():
        raise ShardError(output, "is a directory")
    if output.exists():
        if any(output.resolve() == p.resolve() for p in inputs):
            raise ShardError(output, "is one of the input shards")
        if not force:
            raise ShardError(output, "already exists; pass --force to replace it")
    directory = output.parent
    if not directory.is_dir():
        raise ShardError(output, f"directory {directory} does not exist")
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    tmp = output.with_name(output.name + ".tmp")
    with contextlib.suppress(OSError):
        free += os.stat(tmp).st_blocks * 512  # a stale temporary file is reused
    if free < plan.total_size:
        raise ShardError(
            output,
            f"not enough free space in {directory}: the merged file needs {_gb(plan.total_size)}"
            f" ({plan.total_size} bytes), {_gb(free)} available",
        )


def write_merged(plan: MergePlan, output: Path, progress: Progress, copier: Copier) -> None:
    """Write the merged file to OUTPUT.tmp, fsync, verify, rename, fsync the directory."""
    tmp = output.with_name(output.name + ".tmp")
    fd, created = -1, False
    try:
        with _signals_blocked():  # a signal cannot land between creating the file and owning it
            try:
                fd, stale = _open_tmp(tmp)
            except OSError as exc:
                raise ShardError(output, f"cannot create {tmp.name}: {exc.strerror}") from None
            created = True
        if stale:
            print(
                f"warning: {tmp}: replacing a stale file of an interrupted merge", file=sys.stderr
            )
        _write_all(plan, fd, tmp, output, progress, copier)
        with _signals_blocked():
            os.replace(tmp, output)
            created = False
            # done: a SIGINT/SIGTERM still pending must not turn success into an error
            with contextlib.suppress(ValueError):  # ValueError: not the main thread
                for s in _STOP_SIGNALS:
                    signal.signal(s, signal.SIG_IGN)
        try:
            _fsync_dir(output.parent)
        except OSError as exc:  # the file is complete and in place; only its durability is unsure
            print(f"warning: {output.parent}: fsync failed: {exc.strerror}", file=sys.stderr)
    finally:
        with _signals_blocked():
            if fd >= 0:
                os.close(fd)
            if created:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)


def _write_all(
    plan: MergePlan, fd: int, tmp: Path, output: Path, progress: Progress, copier: Copier
) -> None:
    def out_error(exc: OSError, what: str) -> ShardError:
        return ShardError(output, f"{what} {tmp.name} failed: {exc.strerror}; removed it")

    try:
        os.pwrite(fd, plan.header, 0)
    except OSError as exc:
        raise out_error(exc, "writing") from None
    progress.advance(len(plan.header))
    for index, shard in enumerate(plan.shards, start=1):
        try:
            src = os.open(shard.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ShardError(shard.path, f"cannot open: {exc.strerror}") from None
        try:
            for c in shard.copies:
                done = 0
                while done < c.nbytes:
                    try:
                        got = copier.copy(
                            src, fd, c.src_offset + done, c.dst_offset + done, c.nbytes - done
                        )
                    except OSError as exc:
                        raise _blame(exc, shard.path, output, tmp) from None
                    if got == 0:
                        raise ShardError(
                            shard.path,
                            "truncated while merging (the file changed after validation)",
                        )
                    done += got
                    progress.advance(got)
                if c.padding:
                    try:
                        os.pwrite(fd, bytes(c.padding), c.dst_offset + c.nbytes)
                    except OSError as exc:
                        raise out_error(exc, "writing") from None
                    progress.advance(c.padding)
        finally:
            os.close(src)
        progress.shard_done(index)
    progress.finish()
    try:
        os.fsync(fd)
    except OSError as exc:
        raise out_error(exc, "syncing") from None
    _verify(plan, fd, tmp, output)


def _blame(exc: OSError, shard: Path, output: Path, tmp: Path) -> ShardError:
    """A failed copy names the output for write-side errors and the shard otherwise."""
    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS):
        return ShardError(output, f"writing {tmp.name} failed: {exc.strerror}; removed it")
    return ShardError(shard, f"reading failed: {exc.strerror}")


def _verify(plan: MergePlan, fd: int, tmp: Path, output: Path) -> None:
    """The synced file has the planned size and header bytes (re-parsing the header would walk
    the whole vocabulary again: as long as validating the shards)."""
    size = os.fstat(fd).st_size
    if size != plan.total_size:
        raise ShardError(output, f"{tmp.name} has {size} bytes, expected {plan.total_size}")
    with open(tmp, "rb") as fh:
        if fh.read(len(plan.header)) != plan.header:
            raise ShardError(output, f"{tmp.name} does not read back with the planned header")


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _install_handlers() -> Callable[[], None]:
    """SIGINT/SIGTERM raise Interrupted (so cleanup runs); SIGXFSZ is ignored (write gets EFBIG)."""
    try:
        old = {s: signal.signal(s, _raise_interrupted) for s in _STOP_SIGNALS}
        old[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave signals alone
        return lambda: None

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "shard", type=Path, help="any shard of the set, e.g. GLM-5-Q4_K_M-00001-of-00011.gguf"
    )
    p.add_argument("output", type=Path, help="merged file to write (temp file + fsync + rename)")
    p.add_argument("--check", action="store_true", help="validate every shard, write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing OUTPUT")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar or progress lines on stderr"
    )
    args = p.parse_args(argv)

    restore = _install_handlers()
    try:
        t0 = time.monotonic()
        paths = find_shards(args.shard)
        plan = plan_merge(read_set(paths))
        checked = time.monotonic() - t0
        summary = (
            f"{len(paths)} shards, {plan.n_tensors} tensors, {_gb(plan.data_bytes)} of tensor data"
            f", alignment {plan.alignment}"
        )
        if args.check:
            print(f"ok: {summary}; validated in {checked:.2f} s; merged size {plan.total_size}")
            return 0
        _check_output(plan, args.output, args.force, paths)
        progress = Progress(plan.total_size, len(paths), sys.stderr, not args.no_progress)
        copier = Copier()
        t1 = time.monotonic()
        write_merged(plan, args.output, progress, copier)
        took = time.monotonic() - t1
        methods = "+".join(m for m in Copier.METHODS if m in copier.used) or "none"
        print(
            f"merged {summary} into {args.output} ({plan.total_size} bytes) in {took:.1f} s, "
            f"{plan.total_size / max(took, 1e-9) / 1e9:.2f} GB/s via {methods}"
        )
        return 0
    except ShardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(
            f"error: {args.output}: interrupted by {exc}; not written, no temporary file left",
            file=sys.stderr,
        )
        return 1
    finally:
        restore()


if __name__ == "__main__":
    sys.exit(main())
