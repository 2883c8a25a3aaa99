"""vLLM 0.23.0 plugin: a sparse (DSA top-k) Triton MLA attention backend for GLM-5 on SM120.

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in every process it
starts (API server, engine core, each worker), before any model is built. Importing this package
loads nothing heavy: no torch, triton or vllm (a test checks ``sys.modules``).
"""

from __future__ import annotations

import logging

__all__ = ["register"]

logger = logging.getLogger(__name__)

# The one vLLM release this plugin is written against (mirrors backend/pyproject.toml; a test
# checks they agree). Any other version: log both, register nothing.
_VLLM_VERSION = "0.23.0"
_BACKEND_PATH = "vllm_sparse_mla.backend.SparseTritonMLABackend"
_registered = False


def register() -> bool:
    """Register the backend as ``AttentionBackendEnum.CUSTOM``; idempotent.

    Also hands the indexer's MQA-logits kernels to vLLM's ``register_mqa_logits_impl`` hook when
    the patched vLLM has it (patch 0010), in the ``auto`` mode; the explicit choice
    (``--additional-config '{"sparse_mla_indexer": ...}'``) is applied when the backend's layers
    are built, see :mod:`vllm_sparse_mla.indexer_hook`. Returns True when the backend is
    registered, False on a vLLM version mismatch (logged with both versions).
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

    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, _BACKEND_PATH)

    from vllm_sparse_mla import indexer_hook

    indexer_hook.apply(indexer_hook.DEFAULT)
    _registered = True
    logger.info(
        "vllm_sparse_mla: registered %s as attention backend CUSTOM (indexer: %s until the "
        "config says otherwise)",
        _BACKEND_PATH,
        indexer_hook.DEFAULT,
    )
    return True
