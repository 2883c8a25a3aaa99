"""Shared pytest setup: marker policy and repository paths."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_runtime = importlib.util.find_spec("vllm") is not None
    has_cuda = None
    for item in items:
        if "runtime" in item.keywords and not has_runtime:
            item.add_marker(
                pytest.mark.skip(reason="needs the runtime env: run `make test-runtime`")
            )
        if "gpu" in item.keywords:
            if has_cuda is None:
                has_cuda = _cuda_available()
            if not has_cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none visible)"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
