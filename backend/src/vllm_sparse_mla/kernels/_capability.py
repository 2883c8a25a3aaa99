"""Cached device queries (SM count, shared memory, capability) for launch-config choice.

Queried once per device and cached, so launchers never touch the driver on the hot path. CPU
tensors (the ``TRITON_INTERPRET=1`` test path) get a small fixed stand-in device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceInfo:
    capability: tuple[int, int]
    num_sms: int
    max_shared_mem: int


# Stand-in for CPU tensors under the Triton interpreter: few SMs keeps split counts (and thus
# interpreter time) small while still exercising the split-K + combine path.
CPU_DEVICE = DeviceInfo(capability=(0, 0), num_sms=4, max_shared_mem=101376)


@functools.cache
def _cuda_device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    try:
        import triton

        shared = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    except Exception:  # fall back to torch's (smaller, static) figure
        shared = getattr(props, "shared_memory_per_block_optin", 49152)
    return DeviceInfo(
        capability=(props.major, props.minor),
        num_sms=props.multi_processor_count,
        max_shared_mem=int(shared),
    )


def device_info(device: torch.device) -> DeviceInfo:
    """Return cached facts about ``device`` (CPU: the interpreter stand-in)."""
    if device.type != "cuda":
        return CPU_DEVICE
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_device_info(index)
