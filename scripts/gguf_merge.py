"""Merge split GGUF shards into one file. Exit: 0 ok, 1 bad input or I/O failure, 2 usage.

SHARD is any file of a set `<prefix>-NNNNN-of-MMMMM.gguf`; its siblings are found by name. Every
shard is checked before a byte is written (magic and version, split.no / split.count /
split.tensors.count, missing or duplicate shards, truncated tensor data, duplicate tensor names,
alignment). OUTPUT is byte-identical to `llama-gguf-split --merge` for sets at the default
alignment of 32; at another alignment the file's own general.alignment is honoured. Tensor data
are streamed with copy_file_range, else sendfile, else read/write: memory stays flat whatever the
model size.

Safety against a hostile or changing file system:
- the shards are opened once, without blocking and only if they are regular files, and the copy
  reads from those same descriptors; a shard whose path now names another file, or whose size
  changed, before or after the copy, is an error;
- the output is written to a fresh temp file beside OUTPUT (scripts/safe_files.py: a unique name,
  O_EXCL | O_NOFOLLOW, so no existing path is opened, followed or truncated), fsynced, checked
  and renamed; an OUTPUT that is a FIFO, device, socket or directory is refused without opening it;
- temp files left by a merge that was killed (SIGKILL, power loss) are removed by the next merge
  to the same OUTPUT and reported; one still locked by a running merge is an error;
- SIGINT, SIGTERM, SIGHUP (a dropped SSH session) and SIGQUIT stop the merge at any stage and
  remove the temp file; OUTPUT never exists half-written;
- a closed stdout after a successful merge does not change the exit status.

Exit: 0 ok (also when stdout is closed before the summary is printed); 1 bad input, unsafe or
existing OUTPUT, I/O failure, a shard changed during the merge, or a stop signal; 2 usage.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

import cli_args
import safe_files
from gguf_format import (
    MergePlan,
    ShardError,
    ShardPlan,
    find_shards,
    one_line,
    open_shard,
    plan_merge,
    read_set,
)

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
# SIGHUP: the SSH session running a 400 GB merge dropped; SIGQUIT: Ctrl-\\. Both must clean up.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold the stop signals while a step must not be cut in half (create+lock, rename, cleanup).

    Only steps that cannot block run inside: the temp file is created O_EXCL (never a FIFO open).
    """
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
            self._write(
                f"\r[{bar:<25}] {pct:5.1f}% {_gb(self.done)}/{_gb(self.total)} {rate} ETA {eta}  "
            )
        elif not self.tty and now - self.last >= 10:
            self.last = now
            self._line("")

    def shard_done(self, index: int) -> None:
        if self.enabled and not self.tty:
            self.last = time.monotonic()
            self._line(f"shard {index}/{self.n_shards} done, ")

    def _line(self, what: str) -> None:
        pct, rate, eta = self._stats()
        self._write(
            f"merge: {what}{_gb(self.done)} of {_gb(self.total)} ({pct:.0f}%), {rate}, ETA {eta}\n"
        )

    def _write(self, text: str) -> None:
        # a closed or broken stderr (the terminal went away) stops the progress, not the merge
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = self.tty = False

    def finish(self) -> None:
        if self.tty:
            self.last = 0.0
            self.advance(0)
            self._write("\n")


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


def _check_output(plan: MergePlan, output: Path, force: bool) -> None:
    """Refuse an OUTPUT that is unsafe to replace; lstat only, so a FIFO there cannot block."""
    try:
        st = os.lstat(output)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ShardError(output, f"cannot inspect: {exc.strerror}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise ShardError(output, "is a directory")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise ShardError(
                output, "exists and is not a regular file (FIFO, device or socket); refusing it"
            )
        for i, sp in enumerate(plan.shards, start=1):
            if (st.st_dev, st.st_ino) == sp.identity[:2]:
                raise ShardError(output, f"is one of the input shards (shard {i})")
        if not force:
            raise ShardError(output, "already exists; pass --force to replace it")
        if stat.S_ISLNK(st.st_mode):
            raise ShardError(output, "is a symbolic link; refusing to replace it")
    directory = output.parent
    if not directory.is_dir():
        raise ShardError(output, f"directory {directory} does not exist")


def _check_space(plan: MergePlan, output: Path) -> None:
    directory = output.parent
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    if free < plan.total_size:
        raise ShardError(
            output,
            f"not enough free space in {directory}: the merged file needs {_gb(plan.total_size)}"
            f" ({plan.total_size} bytes), {_gb(free)} available",
        )


def _sweep_stale(output: Path, own: Path) -> None:
    """Remove the temp files that killed merges to OUTPUT left behind; refuse a running one.

    A merge holds an exclusive flock on its temp file from the moment it creates it, so a temp
    file whose lock can be taken belongs to a process that is gone. It is opened O_NOFOLLOW and
    O_NONBLOCK and unlinked only if the name still refers to the file that was locked. (A merge
    to the same OUTPUT started in the very same instant, between its O_EXCL create and its flock,
    can lose its temp file this way; its rename then fails with an error, OUTPUT is untouched.)
    """
    try:
        names = sorted(os.listdir(output.parent))
    except OSError:
        return
    for name in names:
        cand = output.parent / name
        if cand == own or not safe_files.is_temp_of(cand, output):
            continue
        try:
            fd = os.open(cand, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            _warn(f"{cand}: leftover temp file not removed ({exc.strerror}); remove it by hand")
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                _warn(f"{cand}: leftover temp name is not a regular file; remove it by hand")
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ShardError(
                    output, f"another merge is writing this file (its temp file {name} is locked)"
                ) from None
            lst = os.lstat(cand)
            if (lst.st_dev, lst.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(cand)
                _warn(f"{cand}: removed the temp file of an interrupted merge ({st.st_size} bytes)")
        finally:
            os.close(fd)


def _check_unchanged(sp: ShardPlan, index: int, when: str) -> None:
    """The shard's path still names the validated file, and neither has changed size."""
    try:
        now, held = os.stat(sp.path), os.fstat(sp.fd)
    except OSError as exc:
        raise ShardError(sp.path, f"cannot stat shard {index} {when}: {exc.strerror}") from None
    dev, ino, size = sp.identity
    if (now.st_dev, now.st_ino) != (dev, ino):
        raise ShardError(
            sp.path,
            f"replaced {when} (validated inode {ino}, the path now names inode {now.st_ino}); "
            "not written",
        )
    if held.st_size != size:
        raise ShardError(
            sp.path,
            f"changed size {when} (validated {size} bytes, now {held.st_size}); not written",
        )


def write_merged(
    plan: MergePlan, output: Path, progress: Progress, copier: Copier, force: bool = False
) -> None:
    """Write the merged file to a fresh temp file, fsync, verify, rename, fsync the directory."""
    fd, tmp = -1, None
    try:
        with _signals_blocked():  # a signal cannot land between creating the file and owning it
            try:
                fd, tmp = safe_files.create_temp(output, 0o644)
            except OSError as exc:
                raise ShardError(
                    output, f"cannot create a temp file in {output.parent}: {exc.strerror}"
                ) from None
            # marks the temp file as in use, for the stale-file sweep of a concurrent merge
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _sweep_stale(output, tmp)
        _check_space(plan, output)
        _write_all(plan, fd, tmp, output, progress, copier)
        with _signals_blocked():
            # the merger fsynced and verified the temp file itself, so safe_files.commit's steps
            # are taken one by one: a failed directory fsync after the rename is only a warning
            if not force and os.path.lexists(output):
                raise ShardError(output, "appeared while merging; pass --force to replace it")
            try:
                safe_files.check_target(output)
            except safe_files.UnsafeTargetError as exc:
                raise ShardError(output, f"{exc.strerror}; not replaced") from None
            try:
                os.replace(tmp, output)
            except OSError as exc:
                raise ShardError(
                    output, f"renaming {tmp.name} failed: {exc.strerror}; not written"
                ) from None
            tmp = None
            # done: a stop signal still pending must not turn success into an error
            with contextlib.suppress(ValueError):  # ValueError: not the main thread
                for s in _STOP_SIGNALS:
                    signal.signal(s, signal.SIG_IGN)
        try:
            safe_files.fsync_dir(output.parent)
        except OSError as exc:  # the file is complete and in place; only its durability is unsure
            _warn(f"{output.parent}: fsync failed: {exc.strerror}")
    finally:
        with _signals_blocked():
            if fd >= 0:
                os.close(fd)
            if tmp is not None:
                safe_files.discard(tmp)


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
        _check_unchanged(shard, index, "after validation")
        src = shard.fd
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
                        shard.path, "truncated while merging (the file changed after validation)"
                    )
                done += got
                progress.advance(got)
            if c.padding:
                try:
                    os.pwrite(fd, bytes(c.padding), c.dst_offset + c.nbytes)
                except OSError as exc:
                    raise out_error(exc, "writing") from None
                progress.advance(c.padding)
        progress.shard_done(index)
    progress.finish()
    for index, shard in enumerate(plan.shards, start=1):
        _check_unchanged(shard, index, "while merging")
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
    st = os.fstat(fd)
    if st.st_size != plan.total_size:
        raise ShardError(output, f"{tmp.name} has {st.st_size} bytes, expected {plan.total_size}")
    # the temp fd is write-only (safe_files); read back through the name, checked to be that file
    try:
        rfd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:  # removed or replaced by someone else meanwhile
        raise ShardError(output, f"cannot read back {tmp.name}: {exc.strerror}") from None
    try:
        back = os.fstat(rfd)
        same = (back.st_dev, back.st_ino) == (st.st_dev, st.st_ino)
        if not same or os.pread(rfd, len(plan.header), 0) != plan.header:
            raise ShardError(output, f"{tmp.name} does not read back with the planned header")
    finally:
        os.close(rfd)


def _warn(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"warning: {one_line(text)}", file=sys.stderr)


def _error(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr may be gone with the session
        print(f"error: {one_line(text)}", file=sys.stderr)


def _result(text: str) -> None:
    """Print the summary; a closed stdout (`| head -0`, a dropped session) is not a failure."""
    try:
        print(text)
        sys.stdout.flush()
    except (OSError, ValueError):
        # point fd 1 at /dev/null so the interpreter's own flush at exit cannot fail either
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


def _install_handlers() -> Callable[[], None]:
    """Stop signals raise Interrupted (so cleanup runs); SIGXFSZ is ignored (write gets EFBIG)."""
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
    p = cli_args.parser(__doc__, EXAMPLES)
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
    fds: list[int] = []
    try:
        t0 = time.monotonic()
        paths = find_shards(args.shard)
        for path in paths:  # kept open: the copy reads the very files that were validated
            fds.append(open_shard(path))
        plan = plan_merge(read_set(paths, fds))
        checked = time.monotonic() - t0
        summary = (
            f"{len(paths)} shards, {plan.n_tensors} tensors, {_gb(plan.data_bytes)} of tensor data"
            f", alignment {plan.alignment}"
        )
        if args.check:
            _result(f"ok: {summary}; validated in {checked:.2f} s; merged size {plan.total_size}")
            return 0
        _check_output(plan, args.output, args.force)
        progress = Progress(plan.total_size, len(paths), sys.stderr, not args.no_progress)
        copier = Copier()
        t1 = time.monotonic()
        write_merged(plan, args.output, progress, copier, args.force)
        took = time.monotonic() - t1
        methods = "+".join(m for m in Copier.METHODS if m in copier.used) or "none"
        _result(
            f"merged {summary} into {one_line(str(args.output))} ({plan.total_size} bytes) in "
            f"{took:.1f} s, {plan.total_size / max(took, 1e-9) / 1e9:.2f} GB/s via {methods}"
        )
        return 0
    except ShardError as exc:
        _error(str(exc))
        return 1
    except Interrupted as exc:
        with contextlib.suppress(ValueError):  # a second signal must not cut the message short
            for s in _STOP_SIGNALS:
                signal.signal(s, signal.SIG_IGN)
        _error(f"{args.output}: interrupted by {exc}; not written, no temporary file left")
        return 1
    finally:
        for fd in fds:
            os.close(fd)
        restore()


if __name__ == "__main__":
    sys.exit(main())
