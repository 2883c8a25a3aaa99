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


def _missing(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `runtime` selects the runtime tier; what a test needs from that env defaults to vLLM.
    # Kernel tests say `runtime(requires=("torch", "triton"))`: they know nothing of vLLM and
    # must run on a GPU host that has only torch and triton.
    missing_cache: dict[tuple[str, ...], list[str]] = {}
    has_cuda = None
    for item in items:
        marker = item.get_closest_marker("runtime")
        if marker is not None:
            needs = tuple(marker.kwargs.get("requires", ("vllm",)))
            missing = missing_cache.setdefault(needs, _missing(needs))
            if missing:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs {', '.join(missing)}: run `make test-runtime`")
                )
        if "gpu" in item.keywords:
            if has_cuda is None:
                has_cuda = _cuda_available()
            if not has_cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none visible)"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
