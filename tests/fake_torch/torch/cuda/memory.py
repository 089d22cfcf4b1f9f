"""``torch.cuda.memory`` of the fake torch: statistics, snapshots and history, all read from
the devices' allocators (``torch._devices``)."""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

import torch
from torch import _devices


def memory_stats(device: Any = None) -> dict[str, Any]:
    if not torch.cuda.is_initialized():
        return {}  # as PyTorch: no figures before CUDA is initialized
    return _devices.device(torch.cuda._index(device)).stats()


def memory_reserved(device: Any = None) -> int:
    return int(memory_stats(device).get("reserved_bytes.all.current", 0))


def memory_allocated(device: Any = None) -> int:
    return int(memory_stats(device).get("allocated_bytes.all.current", 0))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    torch.cuda._lazy_init()
    return _devices.device(torch.cuda._index(device)).mem_get_info()


def empty_cache() -> None:
    if torch.cuda.is_initialized():
        for d in _devices.DEVICES:
            d.empty_cache()


def _snapshot(device: Any = None) -> dict[str, Any]:
    """The dict ``torch._C._cuda_memorySnapshot`` builds: every device's segments (sorted by
    address), a trace per device, the allocator's settings."""
    devices = _devices.DEVICES
    segments = sorted((s for d in devices for s in d.segments()), key=lambda s: s["address"])
    return {
        "segments": segments,
        "device_traces": [d.trace() for d in devices],
        "allocator_settings": devices[0].settings() if devices else {},
        "external_annotations": [],
    }


def memory_snapshot(mempool_id: Any = None) -> list[dict[str, Any]]:
    return _snapshot()["segments"]


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    s = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(s, f)


def _record_memory_history(
    enabled: Any = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
) -> None:
    if "backend:cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        # PyTorch's cudaMallocAsync backend records no history (CUDAMallocAsyncAllocator.cpp).
        raise RuntimeError(
            "cudaMallocAsync does not yet support recordHistory. If you need it, please file an"
            " issue describing your use case."
        )
    if isinstance(enabled, bool):
        raise TypeError("fake torch: only the current form of _record_memory_history is modelled")
    if enabled not in (None, "state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all', not {enabled!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
    h = _devices.HISTORY
    h.enabled = enabled == "all"
    h.context = context
    h.cpp = stacks == "all"
    h.max_entries = max_entries if enabled == "all" else 1
    if clear_history:
        for d in _devices.DEVICES:
            d.allocator.trace.clear()
