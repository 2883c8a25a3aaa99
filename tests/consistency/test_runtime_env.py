"""The cached runtime env is the one the pins describe."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime
REPO = Path(__file__).resolve().parents[2]


def _pin(name: str) -> str:
    text = (REPO / "inventory/group_vars/all.yml").read_text()
    return re.search(rf'^glm5_{name}_version:\s*"([^"]+)"', text, re.M).group(1)


@pytest.mark.parametrize("dist", ["vllm", "transformers", "gguf"])
def test_installed_version_matches_pin(dist: str) -> None:
    assert importlib.metadata.version(dist) == _pin(dist)


def test_torch_is_the_version_vllm_brings() -> None:
    assert importlib.metadata.version("torch").split("+")[0] == _pin("torch")
