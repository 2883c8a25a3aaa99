"""Debug hook: save the top-k rows each layer's sparse attention reads (GLM-5.2 IndexShare proof).

Off unless the serving process has ``VLLM_SPARSE_MLA_DUMP_TOPK=DIR:N``. Then every forward of
N query tokens (one prefill of an N-token prompt, perhaps padded by fewer than PAD rows; pick an
N far from every warm-up or capture batch size) outside a CUDA-graph capture saves the
``[N, index_topk]`` rows the layer's attention reads from the indexer's buffer to
``DIR/<layer name>.pt`` (replaced each time). On a
GLM-5.2 model the first "shared" layer's file must equal the last "full" layer's
(tests/e2e/index_share_check.py compares them); a later full layer's differs. It syncs the GPU
for each saved layer, so it is for proofs, never for serving.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

ENV = "VLLM_SPARSE_MLA_DUMP_TOPK"
PAD = 16


def target(value: str | None = None) -> tuple[Path, int] | None:
    """(DIR, N) from ``DIR:N`` (the environment's value by default); None when unset or empty."""
    value = os.environ.get(ENV) if value is None else value
    if not value:
        return None
    folder, sep, count = value.rpartition(":")
    if not sep or not folder or not count.isdigit() or int(count) < 1:
        raise ValueError(f"{ENV} must be DIR:N with N >= 1 query tokens, got {value!r}")
    return Path(folder), int(count)


def maybe_dump(where: tuple[Path, int] | None, layer: str, topk: torch.Tensor) -> bool:
    """Save ``topk[:N]`` as ``DIR/<layer>.pt`` for a forward of N (+ < PAD) rows; True if saved."""
    # A batch padded past N (up to PAD rows) still holds the prompt's N rows first.
    if where is None or not where[1] <= topk.shape[0] < where[1] + PAD:
        return False
    if topk.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    folder, n = where
    topk = topk[:n]
    folder.mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in layer) or "layer"
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    torch.save(topk.detach().to("cpu", copy=True), tmp)
    os.replace(tmp, folder / f"{name}.pt")
    return True
