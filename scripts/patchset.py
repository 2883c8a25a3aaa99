"""The vLLM patch series: read and check it, and apply or revert it with GNU patch, all or nothing.

A series lives in `patches/vllm-<version>/`: `series` (quilt format: one patch per line, `#`
comments), `NNNN-<area>-<slug>.patch` files (DEP-3 header, then unified diffs with paths
`a/vllm/...`, `b/vllm/...`, applied with -p1 in the directory that holds `vllm/`), and `MANIFEST`
(sha256 of every touched file before and after the whole series). Used by scripts/vllm_patches.py.

How the work is done safely:
- every patch is split into per-file diffs (hunk counts are honoured, so a removed line that starts
  with `--` is never mistaken for a header), and each touched file is processed on its own copy in
  a temporary directory with `patch -p1 --dry-run` then the real `patch`, fuzz 0;
- the result must hash to MANIFEST's `after` (apply) or `before` (revert) before anything is
  installed; installation writes a fresh temp file beside each file (scripts/safe_files.py: unique
  name, O_EXCL | O_NOFOLLOW, fsynced) and renames, and if a rename fails the files already
  replaced get their old bytes back;
- the tree is locked (flock on DIR/vllm itself: shared to read, exclusive to change, a bounded
  wait), so concurrent runs serialise instead of racing;
- nothing outside DIR/vllm is read or written: versions, series entries, patch and MANIFEST paths
  are plain relative names (no `..`, no absolute path), a touched file must resolve inside
  DIR/vllm, and a symlinked touched file is refused rather than replaced by a regular file;
- temp files a killed run left beside touched files (`*.vllm-patches.tmp` of older versions, and
  safe_files temps) are found: apply/revert remove them, status/verify report them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import safe_files

PATCHES_ROOT = Path(__file__).resolve().parent.parent / "patches"
PRISTINE, PATCHED, DRIFTED, MISSING = "pristine", "patched", "drifted", "missing"
MANIFEST_HEADER = (
    "# sha256 of every file the series touches: before (pristine vLLM) and after (whole series).\n"
    "# Columns: before after path. Regenerate after changing the series (maintainers):\n"
    "#   python scripts/vllm_patches.py manifest --site-packages DIR  (DIR: a pristine vllm/)\n"
)
REQUIRED_FIELDS = ("Description", "Author", "Origin", "Upstream-Status", "Last-Update")
OPTIONAL_FIELDS = ("Bug", "Forwarded", "Applied-Upstream")
_ORIGIN = re.compile(r"^(vendor|upstream, \S+|backport, \S+)$")
_UPSTREAM_STATUS = re.compile(
    r"^(Pending|Submitted \[.+\]|Backport \[.+\]|Inappropriate \[.+\]|Accepted|Denied)$"
)
_PATCH_NAME = re.compile(r"^\d{4}-[a-z0-9]+(-[a-z0-9]+)*\.patch$")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_VERSION = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M)
# PEP 440 characters only: a version names a directory, so no separator and no `..`
_VERSION_STRING = re.compile(r"^[0-9]+(\.[0-9A-Za-z]+)*([+-][0-9A-Za-z.+-]*)?$")
LEGACY_TMP_SUFFIX = ".vllm-patches.tmp"  # the fixed temp name of versions before the lock
LOCK_TIMEOUT = 60.0  # seconds: a whole apply takes a few; longer means a stuck run


class PatchError(Exception):
    """An expected failure: bad input, a series problem, a hunk that does not apply."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_text(path: Path, what: str) -> str:
    """PATH as UTF-8 text; an unreadable or non-UTF-8 file is a PatchError naming it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PatchError(f"{path}: cannot read {what} ({exc.strerror})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(
            f"{path}: {what} is not UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})"
        ) from None


def vllm_version(site_packages: Path) -> str:
    """The version in DIR/vllm/_version.py, read as text (vllm is never imported)."""
    path = site_packages / "vllm" / "_version.py"
    match = _VERSION.search(read_text(path, "the vLLM version"))
    if not match:
        raise PatchError(f"{path}: no __version__ assignment found")
    version = match.group(1)
    if not _VERSION_STRING.match(version) or ".." in version:
        raise PatchError(f"{path}: {version!r} is not a version string")
    return version


def safe_relpath(path: str) -> bool:
    """A relative path under vllm/ with no empty, `.` or `..` component (confined to the tree)."""
    parts = path.split("/")
    return (
        len(parts) >= 2
        and parts[0] == "vllm"
        and all(p not in ("", ".", "..") for p in parts)
        and "\\" not in path
        and "\0" not in path
    )


def supported_versions(root: Path = PATCHES_ROOT) -> list[str]:
    return sorted(p.parent.name.removeprefix("vllm-") for p in root.glob("vllm-*/series"))


@dataclass
class FileDiff:
    """One file's part of one patch: `---`/`+++` headers and its hunks."""

    path: str  # relative to site-packages, e.g. vllm/config/model.py
    text: str


@dataclass
class Patch:
    name: str
    header: dict[str, str]
    diffs: list[FileDiff]


@dataclass
class Series:
    directory: Path
    version: str
    patches: list[Patch]
    manifest: dict[str, tuple[str, str]]  # path -> (before, after)
    problems: list[str] = field(default_factory=list)  # series/header problems (verify fails)

    @property
    def files(self) -> list[str]:
        seen: dict[str, None] = {}
        for patch in self.patches:
            for diff in patch.diffs:
                seen.setdefault(diff.path, None)
        return list(seen)

    def diffs_for(self, path: str) -> list[FileDiff]:
        return [d for p in self.patches for d in p.diffs if d.path == path]


def parse_header(text: str) -> tuple[dict[str, str], list[str]]:
    """DEP-3 fields before the first `---` line; continuation lines start with a space."""
    fields: dict[str, str] = {}
    problems: list[str] = []
    last = None
    for line in text.splitlines():
        if line == "---" or line.startswith("--- "):
            break
        if line.startswith((" ", "\t")) and last:
            fields[last] += "\n" + line.strip()
            continue
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            problems.append(f"header line is not 'Field: value': {line!r}")
            continue
        if key in fields:
            problems.append(f"duplicate header field {key}")
        fields[key] = value.strip()
        last = key
    return fields, problems


def check_header(fields: dict[str, str]) -> list[str]:
    problems = [f"missing header field {f}" for f in REQUIRED_FIELDS if f not in fields]
    for key in fields:
        if key not in REQUIRED_FIELDS + OPTIONAL_FIELDS:
            problems.append(f"unknown header field {key}")
    if "Description" in fields:
        summary, _, body = fields["Description"].partition("\n")
        if not summary or len(summary) > 72:
            problems.append(f"Description summary must be 1-72 characters, got {len(summary)}")
        if not body:
            problems.append("Description has no indented why/what/how-tested lines")
    if "Origin" in fields and not _ORIGIN.match(fields["Origin"]):
        problems.append(f"Origin {fields['Origin']!r} is not vendor|upstream, URL|backport, URL")
    if "Upstream-Status" in fields and not _UPSTREAM_STATUS.match(fields["Upstream-Status"]):
        problems.append(f"Upstream-Status {fields['Upstream-Status']!r} is not OE vocabulary")
    if "Last-Update" in fields:
        try:
            dt.date.fromisoformat(fields["Last-Update"])
        except ValueError:
            problems.append(f"Last-Update {fields['Last-Update']!r} is not YYYY-MM-DD")
    return problems


def split_diffs(text: str, name: str) -> list[FileDiff]:
    """Split a unified diff into per-file parts, counting hunk lines."""
    lines = text.splitlines(keepends=True)
    diffs: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old, new = line[4:].split("\t")[0].strip(), lines[i + 1][4:].split("\t")[0].strip()
        if not (old.startswith("a/vllm/") and new.startswith("b/vllm/")) or old[2:] != new[2:]:
            raise PatchError(f"{name}: paths must be a/vllm/... and b/vllm/...: {old} {new}")
        if not safe_relpath(old[2:]):
            raise PatchError(f"{name}: path {old!r} leaves the vllm/ tree (`..`, `.` or empty)")
        start, i = i, i + 2
        while i < len(lines) and (match := _HUNK.match(lines[i])):
            n_old = int(match.group(1) or 1)
            n_new = int(match.group(2) or 1)
            i += 1
            while (n_old > 0 or n_new > 0) and i < len(lines):
                tag = lines[i][:1]
                if tag in (" ", "\n"):
                    n_old, n_new = n_old - 1, n_new - 1
                elif tag == "-":
                    n_old -= 1
                elif tag == "+":
                    n_new -= 1
                elif tag != "\\":
                    raise PatchError(f"{name}: malformed hunk line {i + 1}: {lines[i]!r}")
                i += 1
            if n_old or n_new:
                raise PatchError(f"{name}: truncated hunk for {old[2:]}")
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
        if i == start + 2:
            raise PatchError(f"{name}: no hunks for {old[2:]}")
        diffs.append(FileDiff(old[2:], "".join(lines[start:i])))
    if not diffs:
        raise PatchError(f"{name}: no file diffs")
    return diffs


def read_manifest(path: Path) -> dict[str, tuple[str, str]]:
    manifest: dict[str, tuple[str, str]] = {}
    if not path.is_file():
        return manifest
    for n, line in enumerate(read_text(path, "MANIFEST").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3 or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in parts[:2]):
            raise PatchError(f"{path}:{n}: expected 'BEFORE_SHA256 AFTER_SHA256 vllm/PATH'")
        if not safe_relpath(parts[2]):
            raise PatchError(f"{path}:{n}: path {parts[2]!r} leaves the vllm/ tree")
        manifest[parts[2]] = (parts[0], parts[1])
    return manifest


def format_manifest(entries: dict[str, tuple[str, str]]) -> str:
    rows = [f"{b}  {a}  {p}\n" for p, (b, a) in sorted(entries.items())]
    return MANIFEST_HEADER + "".join(rows)


def load_series(version: str, root: Path = PATCHES_ROOT) -> Series:
    directory = root / f"vllm-{version}"
    if not (directory / "series").is_file():
        supported = ", ".join(supported_versions(root)) or "none"
        raise PatchError(f"no patch series for vLLM {version} (supported: {supported})")
    problems: list[str] = []
    names: list[str] = []
    for line in read_text(directory / "series", "the series").splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        name, *opts = entry.split()
        if opts and opts != ["-p1"]:
            problems.append(f"series: {name}: only -p1 is supported, got {' '.join(opts)}")
        if name in names:
            problems.append(f"series: {name} is listed twice")
        names.append(name)
    patches: list[Patch] = []
    numbers: set[str] = set()
    for name in dict.fromkeys(names):
        path = directory / name
        if not _PATCH_NAME.match(name):
            problems.append(f"{name}: file name is not NNNN-<area>-<slug>.patch")
            continue  # never read it: `../x.patch` would be outside the series directory
        if name[:4] in numbers:
            problems.append(f"{name}: patch number {name[:4]} is used twice")
        numbers.add(name[:4])
        if not path.is_file():
            problems.append(f"{name}: listed in series but missing")
            continue
        text = read_text(path, "the patch")
        fields, header_problems = parse_header(text)
        problems += [f"{name}: {p}" for p in header_problems + check_header(fields)]
        patches.append(Patch(name, fields, split_diffs(text, name)))
    for path in sorted(directory.glob("*.patch")):
        if path.name not in names:
            problems.append(f"{path.name}: not listed in series (unused patch)")
    manifest = read_manifest(directory / "MANIFEST")
    series = Series(directory, version, patches, manifest, problems)
    for path in series.files:
        if path not in manifest:
            problems.append(f"MANIFEST: no entry for {path} (regenerate it)")
    for path in manifest:
        if path not in series.files:
            problems.append(f"MANIFEST: {path} is touched by no patch")
    return series


def file_state(series: Series, site_packages: Path, path: str) -> tuple[str, str | None]:
    target = site_packages / path
    if not target.is_file():
        return MISSING, None
    try:
        data = target.read_bytes()
    except OSError as exc:
        raise PatchError(f"{target}: cannot read ({exc.strerror})") from exc
    digest = sha256(data)
    before, after = series.manifest.get(path, ("", ""))
    if digest == after:
        return PATCHED, digest
    if digest == before:
        return PRISTINE, digest
    return DRIFTED, digest


def _run_patch(workdir: Path, diff: FileDiff, *, reverse: bool, dry_run: bool) -> None:
    patch = shutil.which("patch")
    if patch is None:
        raise PatchError("GNU patch is not installed (Debian/Ubuntu: apt-get install patch)")
    cmd = [patch, "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch",
           "--reject-file=-", "-d", str(workdir)]  # fmt: skip
    if reverse:
        cmd.append("--reverse")
    if dry_run:
        cmd.append("--dry-run")
    res = subprocess.run(
        cmd, input=diff.text, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}
    )
    if res.returncode != 0:
        out = " ".join((res.stdout + res.stderr).split())
        raise PatchError(f"{diff.path}: {'reverse ' if reverse else ''}patch failed: {out}")


def transform(
    series: Series, site_packages: Path, paths: list[str], *, reverse: bool, check: bool = True
) -> dict[str, bytes]:
    """New bytes of each path after applying (or reversing) the series, on temporary copies.

    Each per-file diff is dry-run, then applied, in series order (reverse order to revert); the
    result must hash to MANIFEST's after (apply) or before (revert). Nothing in DIR is written.
    """
    result: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-patches-") as tmp:
        work = Path(tmp)
        for path in paths:
            copy = work / path
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(site_packages / path, copy)
            diffs = series.diffs_for(path)
            for diff in reversed(diffs) if reverse else diffs:
                _run_patch(work, diff, reverse=reverse, dry_run=True)
                _run_patch(work, diff, reverse=reverse, dry_run=False)
            data = copy.read_bytes()
            result[path] = data
            if not check:
                continue
            before, after = series.manifest[path]
            want = before if reverse else after
            if sha256(data) != want:
                raise PatchError(
                    f"{path}: result of the series does not match MANIFEST "
                    f"({'before' if reverse else 'after'} {want[:12]}..., got "
                    f"{sha256(data)[:12]}...)"
                )
    return result


def check_targets(site_packages: Path, paths: list[str]) -> None:
    """Refuse touched files that are symlinks or resolve outside DIR/vllm (before any work)."""
    root = (site_packages / "vllm").resolve()
    for path in paths:
        target = site_packages / path
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            continue  # reported as missing by file_state
        except OSError as exc:
            raise PatchError(f"{target}: cannot inspect ({exc.strerror})") from exc
        if stat.S_ISLNK(st.st_mode):
            raise PatchError(
                f"{target} is a symbolic link; refusing to replace it with a regular file "
                "(reinstall vllm so that it is a plain file, or patch the tree it points into)"
            )
        if not stat.S_ISREG(st.st_mode):
            raise PatchError(f"{target} is not a regular file")
        if not target.resolve().is_relative_to(root):
            raise PatchError(f"{target} resolves outside {root}; refusing it")


def leftovers(site_packages: Path, paths: list[str]) -> list[Path]:
    """Temp files that a killed run left beside the touched files."""
    targets = [site_packages / p for p in paths]
    found: list[Path] = []
    for directory in sorted({t.parent for t in targets}):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            cand = directory / name
            legacy = name.endswith(LEGACY_TMP_SUFFIX)
            if legacy or any(safe_files.is_temp_of(cand, t) for t in targets):
                found.append(cand)
    return found


@contextlib.contextmanager
def locked(
    site_packages: Path, *, exclusive: bool, timeout: float = LOCK_TIMEOUT
) -> Iterator[None]:
    """flock DIR/vllm (the directory itself: no lock file left in site-packages for pip).

    Shared for status/verify, exclusive for apply/revert; waits up to TIMEOUT seconds.
    """
    tree = site_packages / "vllm"
    try:
        fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise PatchError(f"{tree}: cannot open to lock it ({exc.strerror})") from exc
    try:
        deadline = time.monotonic() + timeout
        op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        while True:
            try:
                fcntl.flock(fd, op)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PatchError(
                        f"{tree}: another vllm_patches run holds the lock; gave up after "
                        f"{timeout:g} s"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def install(site_packages: Path, new_bytes: dict[str, bytes]) -> None:
    """Replace the files all together: fsynced temp files first, then renames; undo on failure."""
    staged: list[tuple[Path, Path, int]] = []
    done: list[tuple[Path, bytes, int]] = []
    try:
        for path, data in new_bytes.items():
            target = site_packages / path
            mode = stat.S_IMODE(os.lstat(target).st_mode)
            try:
                fd, tmp = safe_files.create_temp(target, mode)
            except OSError as exc:
                raise PatchError(
                    f"{target}: cannot write a temp file beside it ({exc.strerror})"
                ) from exc
            staged.append((tmp, target, mode))
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        for tmp, target, mode in staged:
            old = target.read_bytes()
            safe_files.check_target(target)
            os.replace(tmp, target)
            done.append((target, old, mode))
        for directory in sorted({t.parent for _, t, _ in staged}):
            safe_files.fsync_dir(directory)
    except BaseException:
        for target, old, mode in reversed(done):
            safe_files.write_atomic(target, old, mode)
        for tmp, _, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
