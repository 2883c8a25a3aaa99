"""scripts/vllm_patches.py against broken series, hostile trees and concurrent runs (issue 16).

A small vllm/ tree and a two-patch series are built in tmp_path (diffs from difflib, MANIFEST from
the known bytes) and changed with the real GNU patch, so this runs on the controller tier; the
real 0.23.0 series is exercised by tests/patches/test_vllm_patches_manager.py. Every case asserts
the exit code, the JSON report (stable keys), the one `error:` line, and the tree's bytes.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import patchset as ps
import pytest
import safe_files
import vllm_patches

SCRIPT = Path(vllm_patches.__file__)
JSON_KEYS = set(vllm_patches.JSON_KEYS)
VERSION = '__version__ = version = "0.23.0"\n'
MODEL = "".join(f"line {i} of model.py\n" for i in range(40))
LOADER = "".join(f"loader line {i}\n" for i in range(30))
HEADER = """Description: {summary}
 Why: a test series. What: one line changes. Tested by test_vllm_patches_hostile.py.
Author: Test <test@example.invalid>
Origin: vendor
Upstream-Status: Inappropriate [test fixture]
Last-Update: 2026-12-04
---
"""


def _diff(path: str, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True),
            f"a/{path}", f"b/{path}",
        )
    )  # fmt: skip


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Tree:
    """site/vllm/{_version.py, config/model.py, loader.py} and patches/vllm-0.23.0/."""

    def __init__(self, tmp: Path) -> None:
        self.site = tmp / "site"
        self.root = tmp / "patches"
        self.series_dir = self.root / "vllm-0.23.0"
        self.model = self.site / "vllm/config/model.py"
        self.loader = self.site / "vllm/loader.py"
        self.model.parent.mkdir(parents=True)
        (self.site / "vllm/_version.py").write_text(VERSION)
        self.model.write_text(MODEL)
        self.loader.write_text(LOADER)
        mid = MODEL.replace("line 5 of", "LINE 5 (patch 1) of")
        self.model_after = mid.replace("line 30 of", "LINE 30 (patch 2) of")
        self.loader_after = LOADER.replace("loader line 9", "patched loader line 9")
        self.series_dir.mkdir(parents=True)
        self.write_patch("0001-config-one.patch", _diff("vllm/config/model.py", MODEL, mid))
        self.write_patch(
            "0002-loader-two.patch",
            _diff("vllm/loader.py", LOADER, self.loader_after)
            + _diff("vllm/config/model.py", mid, self.model_after),
        )
        (self.series_dir / "series").write_text(
            "# test series\n0001-config-one.patch\n0002-loader-two.patch\n"
        )
        self.manifest = {
            "vllm/config/model.py": (_sha(MODEL), _sha(self.model_after)),
            "vllm/loader.py": (_sha(LOADER), _sha(self.loader_after)),
        }
        self.write_manifest()

    def write_patch(self, name: str, diff: str) -> None:
        summary = name.removesuffix(".patch")[5:].replace("-", " ")
        (self.series_dir / name).write_text(HEADER.format(summary=summary) + diff)

    def write_manifest(self) -> None:
        (self.series_dir / "MANIFEST").write_text(ps.format_manifest(self.manifest))

    def argv(self, command: str, *extra: str) -> list[str]:
        return [command, "--site-packages", str(self.site), "--patches-dir", str(self.root),
                "--json", *extra]  # fmt: skip

    def snapshot(self) -> dict[str, tuple[str, bytes | str]]:
        snap: dict[str, tuple[str, bytes | str]] = {}
        for p in sorted(self.site.rglob("*")):
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                snap[str(p)] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                snap[str(p)] = ("file", p.read_bytes())
        return snap


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


def _json(capsys, argv: list[str]) -> tuple[int, dict, str]:
    rc = vllm_patches.main(argv)
    out, err = capsys.readouterr()
    report = json.loads(out)  # exactly one JSON object on stdout
    assert set(report) == JSON_KEYS, sorted(report)
    return rc, report, err


def _fails(capsys, tree: Tree, command: str, message: str, *extra: str) -> dict:
    before = tree.snapshot()
    rc, rep, err = _json(capsys, tree.argv(command, *extra))
    assert rc == 1 and rep["ok"] is False and rep["command"] == command, rep
    assert rep["message"] == message, rep["message"]
    assert err == f"error: {message}\n"
    assert tree.snapshot() == before
    return rep


def test_the_fixture_series_round_trips(tree: Tree, capsys) -> None:
    pristine = tree.snapshot()
    rc, rep, _ = _json(capsys, tree.argv("apply"))
    assert rc == 0 and rep["changed"] and rep["state"] == "patched", rep
    assert tree.model.read_text() == tree.model_after
    assert tree.loader.read_text() == tree.loader_after
    assert _json(capsys, tree.argv("verify"))[0] == 0
    rc, rep, _ = _json(capsys, tree.argv("revert"))
    assert rc == 0 and rep["state"] == "pristine"
    assert tree.snapshot() == pristine


# -- incomplete or inconsistent series: an error for every command -----------------------------

COMMANDS = ["status", "verify", "apply", "revert"]


@pytest.mark.parametrize("command", COMMANDS)
def test_series_missing_a_patch_is_an_error(tree: Tree, capsys, command: str) -> None:
    """The attack: revert said `ok, pristine` while loader.py stayed patched."""
    assert vllm_patches.main(tree.argv("apply")) == 0
    capsys.readouterr()
    (tree.series_dir / "0002-loader-two.patch").unlink()
    rep = _fails(
        capsys, tree, command,
        "series is inconsistent: 0002-loader-two.patch: listed in series but missing; "
        "MANIFEST: vllm/loader.py is touched by no patch",
    )  # fmt: skip
    assert rep["problems"] == [
        "0002-loader-two.patch: listed in series but missing",
        "MANIFEST: vllm/loader.py is touched by no patch",
    ]
    assert tree.loader.read_text() == tree.loader_after  # still patched, and nobody said otherwise


@pytest.mark.parametrize("command", COMMANDS)
def test_unlisted_patch_is_an_error(tree: Tree, capsys, command: str) -> None:
    shutil.copy(tree.series_dir / "0001-config-one.patch", tree.series_dir / "0003-x-y.patch")
    _fails(
        capsys, tree, command,
        "series is inconsistent: 0003-x-y.patch: not listed in series (unused patch)",
    )  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_manifest_without_an_entry_is_an_error(tree: Tree, capsys, command: str) -> None:
    del tree.manifest["vllm/loader.py"]
    tree.write_manifest()
    _fails(
        capsys, tree, command,
        "series is inconsistent: MANIFEST: no entry for vllm/loader.py (regenerate it)",
    )  # fmt: skip


# -- confinement: versions, series entries, patch and MANIFEST paths, symlinks -----------------


def test_version_with_a_path_is_refused(tree: Tree, capsys) -> None:
    evil = tree.root / "x"
    shutil.copytree(tree.series_dir, evil)  # what `vllm-0.23.0/../x` would have picked
    (tree.site / "vllm/_version.py").write_text('__version__ = "0.23.0/../../x"\n')
    _fails(
        capsys, tree, "apply",
        f"{tree.site}/vllm/_version.py: '0.23.0/../../x' is not a version string",
    )  # fmt: skip
    assert tree.model.read_text() == MODEL


def test_patch_path_leaving_the_tree_is_refused(tree: Tree, tmp_path: Path, capsys) -> None:
    victim = tmp_path / "victim.py"
    victim.write_text(LOADER)
    path = "vllm/../../victim.py"  # site/vllm/../../victim.py is tmp_path/victim.py
    tree.write_patch("0002-loader-two.patch", _diff(path, LOADER, tree.loader_after))
    tree.manifest = {"vllm/config/model.py": tree.manifest["vllm/config/model.py"]}
    tree.write_manifest()
    _fails(
        capsys, tree, "apply",
        f"0002-loader-two.patch: path 'a/{path}' leaves the vllm/ tree (`..`, `.` or empty)",
    )  # fmt: skip
    assert victim.read_text() == LOADER


def test_series_entry_outside_the_series_directory_is_never_read(tree: Tree, capsys) -> None:
    outside = tree.root / "0009-evil-x.patch"
    outside.write_bytes(b"\xff not even text")
    (tree.series_dir / "series").write_text("0001-config-one.patch\n../0009-evil-x.patch\n")
    _fails(
        capsys, tree, "apply",
        "series is inconsistent: ../0009-evil-x.patch: file name is not NNNN-<area>-<slug>.patch; "
        "0002-loader-two.patch: not listed in series (unused patch); MANIFEST: vllm/loader.py is "
        "touched by no patch",
    )  # fmt: skip


def test_manifest_path_leaving_the_tree_is_refused(tree: Tree, capsys) -> None:
    tree.manifest["vllm/../../etc/x"] = tree.manifest["vllm/loader.py"]
    tree.write_manifest()
    _fails(
        capsys, tree, "status",
        f"{tree.series_dir}/MANIFEST:4: path 'vllm/../../etc/x' leaves the vllm/ tree",
    )  # fmt: skip


@pytest.mark.parametrize("command", ["apply", "revert"])
def test_symlinked_target_file_is_refused_and_kept(
    tree: Tree, tmp_path: Path, capsys, command: str
) -> None:
    """The old install replaced the link with a regular file; revert never brought it back."""
    if command == "revert":
        assert vllm_patches.main(tree.argv("apply")) == 0
        capsys.readouterr()
    real = tmp_path / "real_loader.py"
    real.write_bytes(tree.loader.read_bytes())
    tree.loader.unlink()
    tree.loader.symlink_to(real)
    content = real.read_bytes()
    _fails(
        capsys, tree, command,
        f"{tree.loader} is a symbolic link; refusing to replace it with a regular file "
        "(reinstall vllm so that it is a plain file, or patch the tree it points into)",
    )  # fmt: skip
    assert os.readlink(tree.loader) == str(real) and real.read_bytes() == content


def test_directory_symlink_out_of_the_tree_is_refused(tree: Tree, tmp_path: Path, capsys) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.move(tree.model.parent, elsewhere)
    (tree.site / "vllm/config").symlink_to(elsewhere)
    _fails(
        capsys, tree, "apply",
        f"{tree.model} resolves outside {tree.site.resolve()}/vllm; refusing it",
    )  # fmt: skip
    assert (elsewhere / "model.py").read_text() == MODEL


# -- --json on every failure --------------------------------------------------------------------


def _non_utf8_version(tree: Tree) -> tuple[str, str]:
    (tree.site / "vllm/_version.py").write_bytes(b'__version__ = "0.23.0\xff"\n')
    return (
        "status",
        f"{tree.site}/vllm/_version.py: the vLLM version is not UTF-8 (byte 0xff at offset 21)",
    )


def _non_utf8_patch(tree: Tree) -> tuple[str, str]:
    patch = tree.series_dir / "0001-config-one.patch"
    patch.write_bytes(patch.read_bytes().replace(b"Test <", b"T\xe9st <"))  # latin-1, not UTF-8
    at = patch.read_bytes().index(0xE9)
    return "apply", f"{patch}: the patch is not UTF-8 (byte 0xe9 at offset {at})"


def _non_utf8_series(tree: Tree) -> tuple[str, str]:
    (tree.series_dir / "series").write_bytes(b"0001-config-one.patch\n\x80\n")
    return "verify", f"{tree.series_dir}/series: the series is not UTF-8 (byte 0x80 at offset 22)"


@pytest.mark.parametrize("spoil", [_non_utf8_version, _non_utf8_patch, _non_utf8_series])
def test_non_utf8_file(tree: Tree, capsys, spoil) -> None:
    command, message = spoil(tree)
    _fails(capsys, tree, command, message)


def test_touched_path_is_a_directory(tree: Tree, capsys) -> None:
    tree.loader.unlink()
    tree.loader.mkdir()
    _fails(capsys, tree, "apply", f"{tree.loader} is not a regular file")


def test_no_vllm_tree(tmp_path: Path, capsys) -> None:
    site = tmp_path / "empty"
    site.mkdir()
    rc, rep, err = _json(capsys, ["revert", "--site-packages", str(site), "--json"])
    assert rc == 1 and rep["ok"] is False
    assert rep["message"] == (
        f"{site}/vllm/_version.py: cannot read the vLLM version (No such file or directory)"
    )
    assert err == f"error: {rep['message']}\n"


def test_read_only_tree_is_a_json_error_and_nothing_changes(tree: Tree, capsys) -> None:
    """A real EROFS: the tree on a tmpfs remounted read-only (root), or a 0555 dir (non-root)."""
    if os.geteuid() == 0:
        if not shutil.which("mount"):
            pytest.skip("needs mount")
        mnt = tree.site.parent / "ro"
        mnt.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)]).returncode:
            pytest.skip("cannot mount a tmpfs here")
        try:
            shutil.copytree(tree.site, mnt / "site", symlinks=True)
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
            tree.site = mnt / "site"
            tree.model = tree.site / "vllm/config/model.py"
            problem = "Read-only file system"
            rep = _fails(
                capsys,
                tree,
                "apply",
                f"{tree.model}: cannot write a temp file beside it ({problem})",
            )
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    else:
        os.chmod(tree.model.parent, 0o555)
        try:
            rep = _fails(
                capsys, tree, "apply",
                f"{tree.model}: cannot write a temp file beside it (Permission denied)",
            )  # fmt: skip
        finally:
            os.chmod(tree.model.parent, 0o755)
    assert rep["changed"] is False


def test_failed_rename_is_a_json_error_with_old_bytes_back(tree: Tree, capsys, monkeypatch):
    real_replace = os.replace
    calls = {"n": 0}

    def flaky(src, dst):
        calls["n"] += 1
        if calls["n"] == 2:  # the second file: the first was already replaced
            raise OSError(28, "No space left on device", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(ps.os, "replace", flaky)
    _fails(capsys, tree, "apply", f"{tree.loader}: No space left on device")
    assert tree.model.read_text() == MODEL


# -- locking, concurrency, crash leftovers -----------------------------------------------------


@pytest.mark.parametrize("command", ["apply", "status"])
def test_lock_held_by_another_run_is_a_bounded_wait(tree: Tree, capsys, command: str) -> None:
    fd = os.open(tree.site / "vllm", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running apply/revert holds
        _fails(
            capsys, tree, command,
            f"{tree.site}/vllm: another vllm_patches run holds the lock; gave up after 0.3 s",
            "--lock-timeout", "0.3",
        )  # fmt: skip
    finally:
        os.close(fd)


def test_status_runs_beside_another_reader(tree: Tree, capsys) -> None:
    fd = os.open(tree.site / "vllm", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a concurrent status/verify
        rc, rep, _ = _json(capsys, tree.argv("status", "--lock-timeout", "0.3"))
        assert rc == 0 and rep["state"] == "pristine"
    finally:
        os.close(fd)


@pytest.mark.parametrize("round_", range(5))
def test_four_concurrent_applies_end_patched_with_one_change(tree: Tree, round_: int) -> None:
    """Real processes, started together: one patches, three wait and find it done."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parent)}
    procs = [
        subprocess.Popen([sys.executable, str(SCRIPT), *tree.argv("apply")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(4)
    ]  # fmt: skip
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert [rc for rc, _, _ in results] == [0] * 4, [err for _, _, err in results]
    reports = [json.loads(out) for _, out, _ in results]
    assert sorted(r["changed"] for r in reports) == [False, False, False, True]
    assert all(r["state"] == "patched" for r in reports)
    assert tree.model.read_text() == tree.model_after
    assert tree.loader.read_text() == tree.loader_after
    names = sorted(p.name for p in tree.site.rglob("*"))
    assert names == sorted(["vllm", "_version.py", "config", "model.py", "loader.py"])


def _plant_leftovers(tree: Tree) -> list[Path]:
    legacy = tree.model.with_name("model.py.vllm-patches.tmp")  # older versions' fixed name
    legacy.write_text(tree.model_after[:100])
    fresh = safe_files.temp_name(tree.loader)
    fresh.write_text(tree.loader_after[:50])
    return sorted([legacy, fresh])


@pytest.mark.parametrize("command", ["status", "verify"])
def test_crash_leftovers_are_reported_by_checks(tree: Tree, capsys, command: str) -> None:
    left = _plant_leftovers(tree)
    _fails(
        capsys, tree, command,
        "temp files of an interrupted apply/revert are in the tree (apply or revert removes "
        "them): " + ", ".join(str(p) for p in sorted(left, key=lambda p: (p.parent, p.name))),
    )  # fmt: skip


@pytest.mark.parametrize("command", ["apply", "revert"])
def test_crash_leftovers_are_removed_by_apply_and_revert(tree: Tree, capsys, command: str) -> None:
    if command == "revert":
        assert vllm_patches.main(tree.argv("apply")) == 0
        capsys.readouterr()
    left = sorted(_plant_leftovers(tree), key=lambda p: (p.parent, p.name))
    rc, rep, err = _json(capsys, tree.argv(command))
    assert rc == 0 and rep["ok"] and rep["changed"] and err == "", rep
    assert rep["message"].endswith(
        f"; removed {len(left)} leftover temp files: " + ", ".join(str(p) for p in left)
    )
    assert not any(p.exists() for p in left)
    assert tree.model.read_text() == (tree.model_after if command == "apply" else MODEL)


KILL_ON_SECOND_RENAME = """
import os, signal, sys
import vllm_patches
real = os.replace
calls = []
def replace(src, dst):
    calls.append(dst)
    if len(calls) == 2:  # one file replaced, the other staged: the worst moment
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
os.replace = replace
sys.exit(vllm_patches.main(sys.argv[1:]))
"""


def test_kill_9_mid_install_is_reported_then_finished(tree: Tree, capsys) -> None:
    """A real SIGKILL between the two renames of an apply; the next runs see and mend it."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parent)}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_ON_SECOND_RENAME, *tree.argv("apply")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr
    assert tree.model.read_text() == tree.model_after and tree.loader.read_text() == LOADER
    (left,) = [p for p in tree.loader.parent.iterdir() if safe_files.is_temp_of(p, tree.loader)]
    assert left.read_text() == tree.loader_after  # the staged, never renamed copy
    _fails(
        capsys, tree, "verify",
        "temp files of an interrupted apply/revert are in the tree (apply or revert removes "
        f"them): {left}",
    )  # fmt: skip
    rc, rep, _ = _json(capsys, tree.argv("apply"))
    assert rc == 0 and rep["message"] == (
        f"patched 1 files: vllm/loader.py; removed 1 leftover temp files: {left}"
    )
    assert _json(capsys, tree.argv("verify"))[0] == 0
    names = sorted(p.name for p in tree.site.rglob("*"))
    assert names == sorted(["vllm", "_version.py", "config", "model.py", "loader.py"])
