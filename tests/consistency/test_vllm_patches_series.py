"""The patch series is consistent (series, DEP-3 headers, MANIFEST) and the checker catches faults.

Pure text checks (milliseconds, no vLLM needed); that the series applies to the real vLLM 0.23.0 is
proven in test_vllm_patches_manager.py and test_vllm_patches_proof.py.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import patchset as ps
import pytest
import vllm_patches

REPO = Path(__file__).resolve().parents[2]
SERIES_DIR = REPO / "patches" / "vllm-0.23.0"


def pin(name: str) -> str:
    text = (REPO / "inventory/group_vars/all.yml").read_text()
    return re.search(rf'^glm5_{name}_version:\s*"([^"]+)"', text, re.M).group(1)


def test_series_is_consistent() -> None:
    series = ps.load_series("0.23.0")
    assert series.problems == []
    assert [p.name for p in series.patches][:5] == [
        "0001-config-gguf-arch-unknown-to-transformers.patch",
        "0002-config-explicit-float16-for-glm-dsa-gguf.patch",
        "0003-gguf-loader-map-glm-dsa-tensors.patch",
        "0004-weight-utils-rebuild-kv-b-and-dequantize.patch",
        "0005-gguf-loader-no-silent-gaps.patch",
    ]
    assert set(series.manifest) == set(series.files)
    for path in series.files:
        assert path.startswith("vllm/") and path.endswith(".py")


def test_series_matches_the_vllm_pin() -> None:
    assert ps.supported_versions() == [pin("vllm")]


def test_patch_text_has_no_timestamps_or_trailing_space_in_headers() -> None:
    for patch in sorted(SERIES_DIR.glob("*.patch")):
        text = patch.read_text()
        header = text[: text.index("\n---\n")]
        assert not re.search(r"[ \t]$", header, re.M), patch.name
        for line in text.splitlines():
            if line.startswith(("--- a/", "+++ b/")):
                assert "\t" not in line, f"{patch.name}: timestamp in {line!r}"


def test_header_checker_flags_each_bad_field() -> None:
    fields, problems = ps.parse_header(
        "Description: " + "x" * 73 + "\nOrigin: somewhere\nUpstream-Status: Maybe\n"
        "Last-Update: 03/12/2026\nColour: blue\n---\n"
    )
    problems += ps.check_header(fields)
    assert problems == [
        "missing header field Author",
        "unknown header field Colour",
        "Description summary must be 1-72 characters, got 73",
        "Description has no indented why/what/how-tested lines",
        "Origin 'somewhere' is not vendor|upstream, URL|backport, URL",
        "Upstream-Status 'Maybe' is not OE vocabulary",
        "Last-Update '03/12/2026' is not YYYY-MM-DD",
    ]


def test_missing_duplicate_and_unused_patches_are_reported(tmp_path: Path) -> None:
    shutil.copytree(SERIES_DIR, tmp_path / "vllm-0.23.0")
    d = tmp_path / "vllm-0.23.0"
    names = [ln for ln in (d / "series").read_text().splitlines() if not ln.startswith("#")]
    (d / "series").write_text("\n".join([names[0], names[0], "0099-missing-patch.patch"]) + "\n")
    problems = ps.load_series("0.23.0", tmp_path).problems
    assert f"series: {names[0]} is listed twice" in problems
    assert "0099-missing-patch.patch: listed in series but missing" in problems
    assert f"{names[1]}: not listed in series (unused patch)" in problems
    assert any(p.startswith("MANIFEST: ") and "touched by no patch" in p for p in problems)


def test_split_diffs_counts_hunk_lines() -> None:
    text = (
        "Description: x\n---\n--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,2 +1,2 @@\n"
        " keep\n--- removed line that looks like a header\n+++ added\n"
        "--- a/vllm/b.py\n+++ b/vllm/b.py\n@@ -3 +3 @@\n-old\n+new\n"
    )
    diffs = ps.split_diffs(text, "t.patch")
    assert [d.path for d in diffs] == ["vllm/a.py", "vllm/b.py"]
    assert diffs[0].text.endswith("+++ added\n")
    with pytest.raises(ps.PatchError, match="paths must be a/vllm/"):
        ps.split_diffs("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n", "t.patch")


def test_wrong_version_lists_supported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "_version.py").write_text("__version__ = version = '0.22.0'\n")
    for cmd in ("status", "verify", "apply", "revert"):
        assert vllm_patches.main([cmd, "--site-packages", str(tmp_path)]) == 1
        assert capsys.readouterr().err == (
            "error: no patch series for vLLM 0.22.0 (supported: 0.23.0)\n"
        )


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        vllm_patches.main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
