"""vLLM 0.23.0 plugin: a sparse (DSA top-k) Triton MLA attention backend for GLM-5 on SM120.

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in every process it
starts (API server, engine core, each worker), before any model is built. Importing this package
loads nothing heavy: no torch, triton or vllm (a test checks ``sys.modules``).
"""

from __future__ import annotations

import logging
import os

__all__ = ["register"]

logger = logging.getLogger(__name__)

# The one vLLM release this plugin is written against (mirrors backend/pyproject.toml; a test
# checks they agree). Any other version: log both, register nothing.
_VLLM_VERSION = "0.23.0"
_BACKEND_PATH = "vllm_sparse_mla.backend.SparseTritonMLABackend"
# Test-only switch for the DSA indexer path (documented in the README, "Backend plugin"):
#   auto (default) - our Triton MQA-logits kernels only where DeepGEMM has none (CC 12.x);
#   triton         - our kernels on every GPU (lets the H200 proof exercise the SM120 path);
#   deepgemm       - never hand vLLM our kernels.
_INDEXER_ENV = "SPARSE_MLA_INDEXER"
_registered = False


def register() -> bool:
    """Register the backend as ``AttentionBackendEnum.CUSTOM``; idempotent.

    Also hands the indexer's MQA-logits kernels to vLLM's ``register_mqa_logits_impl`` hook when
    the patched vLLM has it (patch 0010). Returns True when the backend is registered, False on a
    vLLM version mismatch (logged with both versions) or a bad ``SPARSE_MLA_INDEXER`` value.
    """
    global _registered
    if _registered:
        return True

    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("vllm")
    except PackageNotFoundError:
        found = "not installed"
    if found != _VLLM_VERSION:
        logger.error(
            "vllm_sparse_mla needs vllm==%s but found vllm %s; backend CUSTOM not registered",
            _VLLM_VERSION,
            found,
        )
        return False

    mode = os.environ.get(_INDEXER_ENV, "auto")
    if mode not in ("auto", "triton", "deepgemm"):
        logger.error(
            "%s=%r is not one of auto, triton, deepgemm; backend CUSTOM not registered",
            _INDEXER_ENV,
            mode,
        )
        return False

    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, _BACKEND_PATH)

    if mode != "deepgemm":
        from vllm.utils import deep_gemm

        hook = getattr(deep_gemm, "register_mqa_logits_impl", None)
        if hook is None:
            logger.warning(
                "vLLM lacks register_mqa_logits_impl (patch 0010 not applied): the DSA indexer "
                "stays on DeepGEMM, which has no kernels for compute capability 12.x"
            )
        else:
            from vllm_sparse_mla import _indexer

            hook(_indexer.mqa_logits, _indexer.paged_mqa_logits, force=mode == "triton")
    _registered = True
    logger.info(
        "vllm_sparse_mla: registered %s as attention backend CUSTOM (indexer: %s)",
        _BACKEND_PATH,
        mode,
    )
    return True
