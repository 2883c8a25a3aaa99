"""One source of truth for pins: inventory/group_vars/all.yml; everything else must agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _group_vars() -> dict[str, str]:
    pins = {}
    for line in (REPO / "inventory/group_vars/all.yml").read_text().splitlines():
        m = re.match(r'^(glm5_\w+_version):\s*"([^"]+)"', line)
        if m:
            pins[m.group(1)] = m.group(2)
    return pins


def _requirements(path: Path) -> dict[str, str]:
    reqs = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line)
        if m:
            reqs[m.group(1).lower()] = m.group(2)
    return reqs


@pytest.mark.parametrize("package", ["vllm", "transformers", "gguf"])
def test_runtime_requirements_match_group_vars(package: str) -> None:
    assert (
        _requirements(REPO / "requirements/runtime.in")[package]
        == _group_vars()[f"glm5_{package}_version"]
    )


def test_controller_gguf_matches_group_vars() -> None:
    assert (
        _requirements(REPO / "requirements/controller.txt")["gguf"]
        == _group_vars()["glm5_gguf_version"]
    )


def test_controller_lock_covers_every_direct_pin() -> None:
    lock = _requirements(REPO / "requirements/controller.txt")
    for name, version in _requirements(REPO / "requirements/controller.in").items():
        assert lock.get(name) == version, f"{name}=={version} missing from controller.txt"


def test_plugin_distribution_pins_the_same_vllm() -> None:
    text = (REPO / "backend/pyproject.toml").read_text()
    assert re.findall(r'"vllm==([^"]+)"', text) == [_group_vars()["glm5_vllm_version"]]


def test_patch_series_exists_for_the_pinned_vllm() -> None:
    version = _group_vars()["glm5_vllm_version"]
    assert (REPO / f"patches/vllm-{version}/series").is_file()
