"""``torch.cuda.memory`` of the fake torch: statistics, snapshots and history, all read from
the devices' allocators (``torch._devices``).

The Python API is that of the torch FAKE_TORCH_VERSION names (default 2.11), where the recorder
meets a difference: ``memory_snapshot(include_traces=False)`` from 2.11; before it the history is
converted for every call; ``_record_memory_history``'s string form and ``_dump_snapshot`` from
2.1 (2.0.1: only the bool form with ``trace_alloc_*``, no ``record_context_cpp``; 1.13.1: only
``(enabled, device)``), the bool form kept as ``_record_memory_history_legacy`` after it.
"""

from __future__ import annotations

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
    if _devices.async_backend():
        raise RuntimeError("cudaMallocAsync does not yet support snapshot.")
    devices = _devices.DEVICES
    segments = sorted((s for d in devices for s in d.segments()), key=lambda s: s["address"])
    return {
        "segments": segments,
        "device_traces": [d.trace() for d in devices],
        "allocator_settings": devices[0].settings() if devices else {},
        "external_annotations": [],
    }


def _segments_only() -> list[dict[str, Any]]:
    devices = _devices.DEVICES
    return sorted((s for d in devices for s in d.segments()), key=lambda s: s["address"])


def _memory_snapshot_2_11(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
    return _snapshot()["segments"] if include_traces else _segments_only()


def _memory_snapshot_before_2_11(mempool_id: Any = None) -> list[dict[str, Any]]:
    return _snapshot()["segments"]  # PyTorch builds the traces too, then drops them


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    s = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(s, f)


def _record_memory_history_legacy(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    device: Any = None,
    record_context_cpp: bool = False,
    clear_history: bool = False,
) -> None:
    _refuse_async()
    h = _devices.HISTORY
    h.enabled = bool(enabled) and bool(trace_alloc_max_entries)
    h.context = "all" if trace_alloc_record_context else None
    h.cpp = record_context_cpp
    h.max_entries = max(1, trace_alloc_max_entries)


def _record_memory_history_2_0(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    device: Any = None,
) -> None:
    _record_memory_history_legacy(enabled, record_context, trace_alloc_max_entries,
                                  trace_alloc_record_context, device)  # fmt: skip


def _record_memory_history_1_13(enabled: bool, device: Any = None) -> None:
    _record_memory_history_legacy(enabled, trace_alloc_max_entries=1)


def _refuse_async() -> None:
    if _devices.async_backend():
        # PyTorch's cudaMallocAsync backend records no history (CUDAMallocAsyncAllocator.cpp).
        raise RuntimeError(
            "cudaMallocAsync does not yet support recordHistory. If you need it, please file an"
            " issue describing your use case."
        )


def _record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
    """PyTorch 2.1's dispatch: a bool is the first form, anything else the current one."""
    if isinstance(enabled, bool):
        _record_memory_history_legacy(enabled, *args, **kwargs)
    else:
        _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(
    enabled: Any = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
) -> None:
    _refuse_async()
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


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    torch.cuda._lazy_init()
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _devices.device(torch.cuda._index(device)).set_memory_fraction(fraction)


def get_per_process_memory_fraction(device: Any = None) -> float:
    torch.cuda._lazy_init()
    d = _devices.device(torch.cuda._index(device))
    allowed = d.allocator.allowed
    return allowed / d.capacity if allowed else 1.0


# The API of the torch the fake plays (the module's docstring).
if _devices.version() >= (2, 11):
    memory_snapshot = _memory_snapshot_2_11
else:
    memory_snapshot = _memory_snapshot_before_2_11
if _devices.version() < (2, 1):
    del _dump_snapshot
    if _devices.version() >= (2, 0):
        _record_memory_history = _record_memory_history_2_0  # type: ignore[assignment]
    else:
        _record_memory_history = _record_memory_history_1_13  # type: ignore[assignment]
