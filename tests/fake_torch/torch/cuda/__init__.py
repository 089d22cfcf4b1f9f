"""``torch.cuda`` of the fake torch, lazily initialized the way PyTorch's is: nothing exists
until the first CUDA call runs ``_lazy_init``, which calls ``torch._C._cuda_init()`` and then
the calls queued with ``_lazy_call`` (while ``is_initialized()`` is still False), under
``_initialization_lock``."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import _devices

_initialized = False
_tls = threading.local()
_initialization_lock = threading.Lock()
_queued_calls: list[tuple[Callable[[], Any], list[str]]] = []
_current = threading.local()  # the current device is per thread, as CUDA's is


class OutOfMemoryError(RuntimeError):
    pass


class DeferredCudaCallError(Exception):
    pass


def is_available() -> bool:
    return _devices.device_count() > 0


def device_count() -> int:
    return _devices.device_count()


def is_initialized() -> bool:
    return _initialized


def _lazy_call(callable: Callable[[], Any], **kwargs: Any) -> None:
    with _initialization_lock:
        if is_initialized():
            callable()
        else:
            _queued_calls.append((callable, traceback.format_stack()))


def _lazy_init() -> None:
    global _initialized
    if is_initialized() or hasattr(_tls, "is_initializing"):
        return
    with _initialization_lock:
        if is_initialized():
            return
        if not is_available():
            raise RuntimeError("Found no NVIDIA driver on your system (fake torch: FAKE_TORCH_GPUS=0)")
        torch._C._cuda_init()
        _tls.is_initializing = True
        try:
            for queued_call, orig_traceback in _queued_calls:
                try:
                    queued_call()
                except Exception as e:
                    msg = (
                        f"CUDA call failed lazily at initialization with error: {e}\n\n"
                        f"CUDA call was originally invoked at:\n\n{''.join(orig_traceback)}"
                    )
                    raise DeferredCudaCallError(msg) from e
        finally:
            delattr(_tls, "is_initializing")
        _initialized = True


def init() -> None:
    _lazy_init()


def current_device() -> int:
    _lazy_init()
    return int(getattr(_current, "index", 0))


def set_device(index: Any) -> None:
    _lazy_init()
    _current.index = _index(index)


def _index(d: Any) -> int:
    if d is None:
        return int(getattr(_current, "index", 0))
    if isinstance(d, torch.device):
        return int(getattr(_current, "index", 0)) if d.index is None else d.index
    if isinstance(d, str):
        return _index(torch.device(d))
    return int(d)


class _Properties:
    def __init__(self, index: int) -> None:
        d = _devices.device(index)
        self.name = "NVIDIA H200 (fake)"
        self.total_memory = d.capacity
        self.major, self.minor = 9, 0
        self.multi_processor_count = 132


def get_device_properties(device: Any = None) -> _Properties:
    _lazy_init()
    return _Properties(_index(device))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_allocator_backend() -> str:
    return _devices.allocator_backend()


def synchronize(device: Any = None) -> None:
    _lazy_init()


from torch.cuda import memory
from torch.cuda.memory import (
    empty_cache,
    get_per_process_memory_fraction,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    set_per_process_memory_fraction,
)

__all__ = [
    "OutOfMemoryError", "current_device", "device_count", "empty_cache", "get_device_properties",
    "get_per_process_memory_fraction",
    "init", "is_available", "is_initialized", "mem_get_info", "memory", "memory_allocated",
    "memory_reserved", "memory_snapshot", "memory_stats", "set_device",
    "set_per_process_memory_fraction", "synchronize",
]  # fmt: skip
