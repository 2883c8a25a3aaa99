"""scripts/vllm_patches.py on a small site-packages built from the installed vLLM's real files."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import patchset as ps
import pytest
import vllm_patches

pytestmark = pytest.mark.runtime
REPO = Path(__file__).resolve().parents[2]
JSON_KEYS = set(vllm_patches.JSON_KEYS)


def real_site() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))).parent


@pytest.fixture(scope="module")
def series() -> ps.Series:
    return ps.load_series(ps.vllm_version(real_site()))


@pytest.fixture
def site(tmp_path: Path, series: ps.Series) -> Path:
    """A fake site-packages: vllm/_version.py and every touched file, copied from the real one."""
    src = real_site()
    for rel in ["vllm/_version.py", *series.files]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, tmp_path / rel)
    return tmp_path


def snapshot(site: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()
    }


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    rc = vllm_patches.main([*argv, "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_pristine_install_matches_manifest_before(site: Path, series: ps.Series) -> None:
    for path in series.files:
        assert ps.sha256((site / path).read_bytes()) == series.manifest[path][0], path


def test_status_apply_verify_revert_round_trip(
    site: Path, series: ps.Series, capsys: pytest.CaptureFixture[str]
) -> None:
    pristine = snapshot(site)
    rc, rep, _ = run_json(capsys, "status", "--site-packages", str(site))
    assert rc == 0 and set(rep) == JSON_KEYS
    assert rep["state"] == "pristine" and rep["vllm_version"] == "0.23.0"
    assert [f["state"] for f in rep["files"]] == ["pristine"] * len(series.files)

    rc, rep, err = run_json(capsys, "verify", "--site-packages", str(site))
    assert rc == 1 and not rep["ok"] and err.startswith("error: not patched: ")

    rc, rep, _ = run_json(capsys, "apply", "--site-packages", str(site))
    assert rc == 0 and rep["changed"] and rep["state"] == "patched"
    assert {f["path"]: f["sha256"] for f in rep["files"]} == {
        p: after for p, (_, after) in series.manifest.items()
    }
    rc, rep, _ = run_json(capsys, "verify", "--site-packages", str(site))
    assert (
        rc == 0
        and rep["ok"]
        and rep["message"] == f"vLLM 0.23.0: all {len(series.files)} files patched"
    )

    rc, rep, _ = run_json(capsys, "revert", "--site-packages", str(site))
    assert rc == 0 and rep["changed"] and rep["state"] == "pristine"
    assert snapshot(site) == pristine  # pristine bytes exactly, no temp files left


def test_apply_and_revert_are_idempotent(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_patches.main(["apply", "--site-packages", str(site)]) == 0
    patched = snapshot(site)
    mtimes = {p: os.stat(site / p).st_mtime_ns for p in patched}
    capsys.readouterr()
    rc, rep, _ = run_json(capsys, "apply", "--site-packages", str(site))
    assert rc == 0 and not rep["changed"]
    assert rep["message"].startswith("already patched: all ")
    assert snapshot(site) == patched
    assert {p: os.stat(site / p).st_mtime_ns for p in patched} == mtimes
    assert vllm_patches.main(["revert", "--site-packages", str(site)]) == 0
    capsys.readouterr()
    rc, rep, _ = run_json(capsys, "revert", "--site-packages", str(site))
    assert rc == 0 and not rep["changed"] and rep["message"].startswith("already pristine: all ")


def test_drifted_file_is_reported_and_refused(
    site: Path, series: ps.Series, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = site / series.files[-1]
    victim.write_bytes(victim.read_bytes() + b"# local edit\n")
    before = snapshot(site)
    rc, rep, _ = run_json(capsys, "status", "--site-packages", str(site))
    assert rc == 0 and rep["state"] == "drifted"
    states = {f["path"]: f["state"] for f in rep["files"]}
    assert states.pop(series.files[-1]) == "drifted"
    assert set(states.values()) == {"pristine"}
    rc, rep, err = run_json(capsys, "apply", "--site-packages", str(site))
    assert rc == 1 and not rep["changed"]
    assert err.startswith("error: refusing to patch; these files match neither MANIFEST hash")
    assert series.files[-1] in err
    assert snapshot(site) == before  # nothing written, not even the pristine files


def test_failing_hunk_leaves_every_file_untouched(
    site: Path, series: ps.Series, tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # A copy of the series whose LAST patch has a hunk whose context cannot match.
    root = tmp_path_factory.mktemp("broken")
    broken = root / "vllm-0.23.0"
    shutil.copytree(series.directory, broken)
    last = broken / series.patches[-1].name
    lines = last.read_text().splitlines(keepends=True)
    hunk = max(i for i, line in enumerate(lines) if line.startswith("@@ "))
    ctx = next(i for i in range(hunk + 1, len(lines)) if lines[i].startswith(" "))
    lines[ctx] = " this context line is not in vLLM 0.23.0\n"
    last.write_text("".join(lines))
    before = snapshot(site)
    rc, rep, err = run_json(
        capsys, "apply", "--site-packages", str(site), "--patches-dir", str(root)
    )
    assert rc == 1 and not rep["changed"]
    assert err.startswith("error: ") and "patch failed" in err
    assert snapshot(site) == before


def test_failed_rename_mid_install_restores_old_bytes_simulated(
    site: Path, series: ps.Series, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    before = snapshot(site)
    calls = {"n": 0}
    real_replace = os.replace

    def flaky_replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        calls["n"] += 1
        if calls["n"] == len(series.files):  # the last file: disk full, say
            raise OSError(28, "No space left on device (simulated)")
        real_replace(src, dst)

    monkeypatch.setattr(ps.os, "replace", flaky_replace)
    assert vllm_patches.main(["apply", "--site-packages", str(site)]) == 1
    assert capsys.readouterr().err == "error: No space left on device (simulated)\n"
    assert snapshot(site) == before


def test_partial_state_apply_patches_only_the_pristine_files(
    site: Path, series: ps.Series, capsys: pytest.CaptureFixture[str]
) -> None:
    first = series.files[0]
    original = (site / first).read_bytes()
    assert vllm_patches.main(["apply", "--site-packages", str(site)]) == 0
    (site / first).write_bytes(original)  # e.g. a reinstall of one file
    capsys.readouterr()
    rc, rep, _ = run_json(capsys, "status", "--site-packages", str(site))
    assert rep["state"] == "partial"
    rc, rep, _ = run_json(capsys, "apply", "--site-packages", str(site))
    assert rc == 0 and rep["changed"] and rep["message"] == f"patched 1 files: {first}"
    assert vllm_patches.main(["verify", "--site-packages", str(site)]) == 0


def test_error_report_has_the_same_json_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, rep, err = run_json(capsys, "status", "--site-packages", str(tmp_path))
    assert rc == 1 and set(rep) == JSON_KEYS and rep["ok"] is False
    assert err.startswith("error: ")


def test_missing_vllm_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_patches.main(["status", "--site-packages", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}/vllm/_version.py: cannot read")


def test_default_site_packages_is_the_interpreters(series: ps.Series) -> None:
    assert vllm_patches.default_site_packages() == real_site()
    # and the real runtime env itself is pristine or patched, never drifted
    states = {ps.file_state(series, real_site(), p)[0] for p in series.files}
    assert states <= {"pristine", "patched"}


def test_makefile_verify_patches_target(repo: Path) -> None:
    text = (repo / "Makefile").read_text()
    assert "verify-patches:" in text
    assert "scripts/vllm_patches.py verify --site-packages" in text
