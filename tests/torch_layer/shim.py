"""Real torch's Python layer with only its C entry points that need a GPU replaced by the
simulated allocator of tests/fake_torch (``torch/_devices.py``, loaded on its own).

``install()`` in a program that imported the real torch (a CPU build) gives ``torch.cuda`` a
device count, ``_cuda_init``, the current device, device properties, ``cudaMemGetInfo``, memory
statistics, snapshots, history (both of its forms), the out-of-memory observer and a memory
fraction, all from the simulated devices: ``torch.cuda._lazy_init``, its ``_lazy_call`` queue and
lock, ``_record_memory_history``'s dispatch, ``memory_stats``'s flattening, ``memory_snapshot``
and ``_dump_snapshot``'s pickling are torch's own. Tensors stay on the CPU: a program allocates
on a device with ``malloc(n)`` and frees with ``free(block)``.

Each C call is logged in ``CALLS`` (name, arguments) so that a test can see what torch handed
the allocator (``memory_snapshot(include_traces=False)`` arrives as ``(0, 0, False)``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any

DEVICES_FILE = Path(__file__).resolve().parents[1] / "fake_torch" / "torch" / "_devices.py"
CALLS: list[tuple[str, tuple[Any, ...]]] = []
_current = threading.local()
sim: Any = None


def _load_devices() -> Any:
    name = "nsysfrag_simulated_devices"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DEVICES_FILE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _logged(name: str, fn: Any) -> Any:
    def call(*args: Any) -> Any:
        CALLS.append((name, args))
        return fn(*args)

    return call


class _Properties:
    def __init__(self, index: int) -> None:
        self.name = "NVIDIA H200 (simulated)"
        self.total_memory = sim.device(index).capacity
        self.major, self.minor = 9, 0
        self.multi_processor_count = 132


class _Cudart:
    """The ``torch._C._cudart`` calls the recorder reaches: ``cudaMemGetInfo``."""

    def cudaMemGetInfo(self, device: int) -> tuple[int, int]:  # noqa: N802  (CUDA's name)
        return sim.device(device).mem_get_info()


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``_cuda_memoryStats``'s nested dict, which torch's ``memory_stats`` flattens again."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _snapshot(arg: Any) -> dict[str, Any]:
    """``_cuda_memorySnapshot``: ``None`` (``_snapshot``) or ``(pool, pool, include_traces)``."""
    include_traces = arg[2] if isinstance(arg, tuple) and len(arg) == 3 else True
    if sim.async_backend():
        raise RuntimeError("cudaMallocAsync does not yet support snapshot.")
    devices = sim.DEVICES
    segments = sorted((s for d in devices for s in d.segments()), key=lambda s: s["address"])
    return {
        "segments": segments,
        "device_traces": [d.trace() for d in devices] if include_traces else [[] for _ in devices],
        "allocator_settings": devices[0].settings() if devices else {},
        "external_annotations": [],
    }


def _history(enabled: Any, context: Any, stacks: Any, max_entries: int, *rest: Any) -> None:
    """``_cuda_record_memory_history(enabled, context, stacks, max_entries, clear_history, …)``."""
    if sim.async_backend():
        raise RuntimeError("cudaMallocAsync does not yet support recordHistory.")
    h = sim.HISTORY
    h.enabled = enabled == "all"
    h.context = context
    h.cpp = stacks == "all"
    h.max_entries = max_entries if enabled == "all" else 1


def _history_legacy(enabled: bool, record_context: bool, max_entries: int, trace_context: bool,
                    cpp: bool, *rest: Any) -> None:  # fmt: skip
    h = sim.HISTORY
    h.enabled = bool(enabled) and max_entries > 0
    h.context = "all" if trace_context else None
    h.cpp = cpp
    h.max_entries = max(1, max_entries)


def _attach(observer: Any) -> None:
    if sim.async_backend():
        raise RuntimeError("cudaMallocAsync does not yet support attachOutOfMemoryObserver.")
    if not sim.DEVICES:  # PyTorch dereferences an allocator that does not exist (pytorch#107330)
        sys.stderr.write("simulated: observer attached before CUDA initialization: Segmentation fault\n")
        os._exit(139)
    sim.OBSERVERS.append(observer)


def install() -> Any:
    """Give the real torch (imported) the simulated devices; the torch module."""
    global sim
    import torch

    sim = _load_devices()
    c = torch._C
    entries = {
        "_cuda_getDeviceCount": sim.device_count,
        "_cuda_init": sim.create,
        "_cuda_getDevice": lambda: int(getattr(_current, "index", 0)),
        "_cuda_setDevice": lambda index: setattr(_current, "index", int(index)),
        "_cuda_getDeviceProperties": _Properties,
        "_cuda_memoryStats": lambda device: _nested(sim.device(device).stats()),
        "_cuda_memorySnapshot": _snapshot,
        "_cuda_record_memory_history": _history,
        "_cuda_record_memory_history_legacy": _history_legacy,
        "_cuda_attach_out_of_memory_observer": _attach,
        "_cuda_getAllocatorBackend": lambda: "cudaMallocAsync" if sim.async_backend() else "native",
        "_cuda_setMemoryFraction": lambda fraction, device: sim.device(device).set_memory_fraction(fraction),
        "_cuda_getMemoryFraction": lambda device: (sim.device(device).allocator.allowed or sim.device(device).capacity) / sim.device(device).capacity,
        "_cuda_emptyCache": lambda: [d.empty_cache() for d in sim.DEVICES],
    }  # fmt: skip
    for name, fn in entries.items():
        setattr(c, name, _logged(name, fn))
    torch.cuda._cudart = _Cudart()  # the CPU build has no libcudart
    torch.cuda._get_device_properties = _logged("_cuda_getDeviceProperties", _Properties)
    return torch


def malloc(nbytes: int) -> Any:
    """``nbytes`` on the current device (what a CUDA tensor's storage asks the allocator)."""
    import torch

    torch.cuda._lazy_init()
    return sim.device(torch.cuda.current_device()).malloc(nbytes)


def free(block: Any) -> None:
    for d in sim.DEVICES:
        if d.allocator.blocks.get(block.address) is block:
            d.free(block)
            return
