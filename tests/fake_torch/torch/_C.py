# ruff: noqa: N999  (torch names it so)
"""``torch._C`` of the fake torch: the calls nsysfrag record makes into PyTorch's C++ side."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from torch import _devices


def _cuda_init() -> None:
    """What ``torch.cuda._lazy_init`` calls first: the devices and their allocators exist."""
    _devices.create()


def _cuda_attach_out_of_memory_observer(observer: Callable[..., Any]) -> None:
    if _devices.async_backend():
        raise RuntimeError("cudaMallocAsync does not yet support attachOutOfMemoryObserver.")
    if not _devices.DEVICES:
        # PyTorch dereferences an allocator that does not exist yet (pytorch#107330).
        sys.stderr.write(
            "fake torch: _cuda_attach_out_of_memory_observer before CUDA initialization:"
            " Segmentation fault\n"
        )
        sys.stderr.flush()
        os._exit(139)
    _devices.OBSERVERS.append(observer)
