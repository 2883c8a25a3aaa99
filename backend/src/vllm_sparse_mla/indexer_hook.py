"""The DSA indexer's MQA-logits kernels for vLLM's ``register_mqa_logits_impl`` hook (patch 0010),
and the explicit choice of which indexer runs.

The choice is a plugin setting in vLLM's own config, set on the command line as
``--additional-config '{"sparse_mla_indexer": "auto|triton|deepgemm"}'`` (the vllm_service role
renders it from ``vllm_service_sparse_mla_indexer``):

- ``auto`` (default, also when the key is absent): our Triton MQA-logits kernels only where
  DeepGEMM has none (compute capability 12.x);
- ``triton``: our kernels on every GPU (lets the H200 proof exercise the SM120 path);
- ``deepgemm``: vLLM's DeepGEMM kernels only.

It is read when the CUSTOM backend's attention layers are built (``SparseTritonMLAImpl``, inside
vLLM's ``set_current_vllm_config``), so a bad value fails the model build with a ValueError naming
the value and the choices. :func:`register` (plugin load, no config yet) installs the ``auto``
default. Same signatures and semantics as ``fp8_fp4_mqa_logits`` / ``fp8_fp4_paged_mqa_logits`` in
``vllm/utils/deep_gemm.py`` (0.23.0). The Triton kernels are imported on first call, so
registering them at plugin load loads no torch or triton; vllm is imported only inside functions.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

CONFIG_KEY = "sparse_mla_indexer"
CHOICES = ("auto", "triton", "deepgemm")
DEFAULT = "auto"


def mqa_logits(*args: Any, **kwargs: Any) -> Any:
    """Prefill logits ``[M, N]`` fp32; see ``vllm_sparse_mla.kernels.mqa_logits``."""
    from vllm_sparse_mla.kernels import mqa_logits as impl

    return impl(*args, **kwargs)


def paged_mqa_logits(*args: Any, **kwargs: Any) -> Any:
    """Decode logits ``[B * next_n, max_model_len]`` fp32 over the paged fp8 indexer cache."""
    from vllm_sparse_mla.kernels import paged_mqa_logits as impl

    return impl(*args, **kwargs)


def indexer_choice(additional_config: Any) -> str:
    """The validated ``sparse_mla_indexer`` of vLLM's ``additional_config`` (default auto)."""
    # additional_config is a dict from --additional-config, or a plugin's own hashable object,
    # which cannot carry our key.
    value = (
        additional_config.get(CONFIG_KEY, DEFAULT)
        if isinstance(additional_config, dict)
        else DEFAULT
    )
    if value not in CHOICES:
        raise ValueError(
            f"additional_config {CONFIG_KEY}={value!r} is not one of {', '.join(CHOICES)}"
        )
    return value


def apply(choice: str) -> bool:
    """Point vLLM's deep_gemm wrappers at the chosen indexer kernels; idempotent.

    Returns True when our kernels are registered (used where DeepGEMM has none, or always for
    ``triton``). Without patch 0010 ``auto`` logs a warning (the indexer stays on DeepGEMM, which
    has no kernels for 12.x) and ``triton`` raises: it was asked for and cannot happen.
    """
    if choice not in CHOICES:
        raise ValueError(f"{CONFIG_KEY}={choice!r} is not one of {', '.join(CHOICES)}")
    from vllm.utils import deep_gemm

    hook = getattr(deep_gemm, "register_mqa_logits_impl", None)
    if hook is None:
        if choice == "triton":
            raise ValueError(
                f"{CONFIG_KEY}=triton needs vLLM's register_mqa_logits_impl (patch 0010), "
                "which this vLLM lacks"
            )
        if choice == "auto":
            logger.warning(
                "vLLM lacks register_mqa_logits_impl (patch 0010 not applied): the DSA indexer "
                "stays on DeepGEMM, which has no kernels for compute capability 12.x"
            )
        return False
    if choice == "deepgemm":
        # An earlier engine in this process may have registered ours; None switches them off
        # (the patched wrappers test the impl for None).
        hook(None, None)
        return False
    hook(mqa_logits, paged_mqa_logits, force=choice == "triton")
    return True
