"""The fake CUDA devices: each one the sample generator's caching allocator
(``sample_traces/make_snapshots.py``: PyTorch's rules for rounding, pools, segments, splits,
merges, the OOM path and expandable segments), with real time stamps, PyTorch's history switches
and ring buffer, and the statistics ``memory_stats()`` derives from the same blocks.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
MiB, GiB = 1 << 20, 1 << 30


def _load_alloc_conf() -> Any:
    """The allocator settings' rules, loaded by path: this module also runs on its own under
    real torch (tests/torch_layer/shim.py), where ``torch`` is not the fake package."""
    name = "fake_torch_alloc_conf"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_alloc_conf.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_alloc_conf = _load_alloc_conf()


def _make_snapshots() -> Any:
    name = "fake_torch_make_snapshots"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "sample_traces" / "make_snapshots.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


ms = _make_snapshots()
DEVICES: list[FakeDevice] = []
OBSERVERS: list[Callable[..., Any]] = []


class History:
    """``_record_memory_history``'s settings, shared by every device as in PyTorch."""

    enabled = False
    context: str | None = None  # None: no stacks; "alloc"/"all": Python stacks
    cpp = False  # stacks="all": C++ frames too
    max_entries = 1


HISTORY = History()


def _env_bytes(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    return int(text) if text.isdigit() else default


def device_count() -> int:
    return _env_bytes("FAKE_TORCH_GPUS", 1)


def async_backend() -> bool:
    """``backend:cudaMallocAsync``: PyTorch's other allocator, which keeps no history."""
    return allocator_backend() == "cudaMallocAsync"


def version() -> tuple[int, int]:
    """The torch version the fake plays (FAKE_TORCH_VERSION, default 2.11)."""
    major, minor = (os.environ.get("FAKE_TORCH_VERSION", "2.11.0").split(".") + ["0"])[:2]
    return int(major), int(minor)


def create() -> None:
    if DEVICES:
        return
    capacity = _env_bytes("FAKE_TORCH_DEVICE_MEMORY", 8 * GiB)
    context = _env_bytes("FAKE_TORCH_CONTEXT_MEMORY", 512 * MiB)
    conf = _alloc_conf.parse(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    for index in range(device_count()):
        DEVICES.append(FakeDevice(index, capacity, context, conf))


def allocator_backend() -> str:
    """``torch.cuda.get_allocator_backend()``: the backend PYTORCH_CUDA_ALLOC_CONF names."""
    try:
        return _alloc_conf.parse(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")).backend
    except RuntimeError:
        return "native"


def device(index: int) -> FakeDevice:
    if not DEVICES:
        raise RuntimeError("fake torch: CUDA is not initialized")
    if not 0 <= index < len(DEVICES):
        raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
    return DEVICES[index]


# The history actions PyTorch's cumulative statistics count (Stat.allocated / Stat.freed).
COUNTED = {
    "alloc": "allocation.all.allocated", "free_completed": "allocation.all.freed",
    "segment_alloc": "segment.all.allocated", "segment_map": "segment.all.allocated",
    "segment_free": "segment.all.freed", "segment_unmap": "segment.all.freed",
}  # fmt: skip


class _Allocator(ms.CachingAllocator):  # type: ignore[misc,name-defined]
    """The generator's allocator with PyTorch's history switches and real time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retries = 0
        self._emptying = False
        self.counts = dict.fromkeys(COUNTED.values(), 0)  # memory_stats()'s cumulative counts

    def tick(self, us: float) -> None:
        self.now_us = max(self.now_us + 1, time.time_ns() // 1000)

    def _record(self, action: str, addr: int, size: int, frames: Any, **extra: Any) -> None:
        counted = COUNTED.get(action)
        if counted is not None:
            self.counts[counted] += 1
        if not HISTORY.enabled:
            self.tick(2)
            return
        super()._record(action, addr, size, frames, **extra)
        if len(self.trace) > 2 * HISTORY.max_entries:  # the ring buffer, amortized
            del self.trace[: -HISTORY.max_entries]

    def _release_cached(self) -> None:
        if not self._emptying:
            self.retries += 1  # the OOM path's release before its retry
        super()._release_cached()

    def _segments(self) -> list[dict[str, Any]]:
        """The generator's segment listing, in one sweep over the blocks in address order
        (the generator looks every segment's blocks up afresh: too slow to sample live)."""
        ranges = _ranges(self)
        blocks = sorted(self.blocks.values(), key=lambda b: b.address)
        out, i = [], 0
        for address, size, pool in sorted(ranges):
            while i < len(blocks) and blocks[i].address < address:
                i += 1
            inside = []
            while i < len(blocks) and blocks[i].address < address + size:
                inside.append(blocks[i])
                i += 1
            out.append({
                "device": 0,
                "address": address,
                "total_size": size,
                "allocated_size": sum(b.size for b in inside if b.allocated),
                "active_size": sum(b.size for b in inside if b.allocated or b.pending),
                "requested_size": sum(b.requested for b in inside if b.allocated or b.pending),
                "stream": 0,
                "segment_type": pool,
                "segment_pool_id": (0, 0),
                "is_expandable": self.expandable,
                "frames": [],
                "blocks": [
                    {
                        "address": b.address,
                        "size": b.size,
                        "requested_size": b.requested,
                        "state": "active_allocated" if b.allocated
                        else "active_pending_free" if b.pending else "inactive",
                        "frames": b.frames,
                    }
                    for b in inside
                ],
            })  # fmt: skip
        return out

    def empty_cache(self) -> None:
        self._emptying = True
        try:
            super().empty_cache()
        finally:
            self._emptying = False


class FakeDevice:
    def __init__(self, index: int, capacity: int, context: int, conf: _alloc_conf.AllocConf) -> None:
        self.index = index
        self.capacity = capacity
        self.conf = conf
        self.lock = threading.RLock()  # the allocator's mutex
        self.allocator = _alloc_conf.configure(_Allocator(
            capacity, context, expandable=conf.expandable,
            va_base=0x7F00_0000_0000 + index * (1 << 40), faithful=True,
        ), conf, ms)  # fmt: skip
        self.peaks: dict[str, int] = {}
        self.ooms = 0
        self.device_allocs = 0

    # -- the allocator's calls

    def malloc(self, nbytes: int) -> Any:
        frames = _frames()
        with self.lock:
            try:
                block = self.allocator.malloc(nbytes, frames)
            except ms.OutOfMemory:
                self.ooms += 1
                failed = self._oom_figures(nbytes)
            else:
                self._update_peaks()
                return block
        # PyTorch calls the observers without the allocator's lock, then raises.
        for observer in OBSERVERS:
            observer(self.index, failed["alloc"], failed["total"], failed["free"])
        from torch.cuda import OutOfMemoryError

        raise OutOfMemoryError(failed["message"])

    def free(self, block: Any) -> None:
        with self.lock:
            if block.allocated:
                self.allocator.free(block)
                self._update_peaks()

    def empty_cache(self) -> None:
        with self.lock:
            self.allocator.empty_cache()

    def set_memory_fraction(self, fraction: float) -> None:
        """``set_per_process_memory_fraction``: the allocator refuses beyond fraction x total,
        and its garbage collector (when configured) starts working."""
        with self.lock:
            _alloc_conf.set_memory_fraction(self.allocator, fraction)

    # -- what torch.cuda reads

    def mem_get_info(self) -> tuple[int, int]:
        with self.lock:
            return max(0, self.allocator.usable - self.allocator.reserved), self.capacity

    def segments(self) -> list[dict[str, Any]]:
        with self.lock:
            out = self.allocator._segments()
        for s in out:
            s["device"] = self.index
        return out

    def trace(self) -> list[dict[str, Any]]:
        """The history as ``_cuda_memorySnapshot`` hands it over: every entry and its frames
        made afresh as Python objects (what costs PyTorch the time, under the GIL)."""
        with self.lock:
            entries = self.allocator.trace[-HISTORY.max_entries :]
            return [{**e, "frames": [dict(f) for f in e["frames"]]} for e in entries]

    def settings(self) -> dict[str, Any]:
        return self.conf.settings()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            current = self._current()
            out: dict[str, Any] = {}
            for key, value in current.items():
                out[f"{key}.current"] = value
                out[f"{key}.peak"] = self.peaks.get(key, value)
            out.update(self.allocator.counts)
            out["num_alloc_retries"] = self.allocator.retries
            out["num_ooms"] = self.ooms
            # PyTorch counts as it goes: reading a statistic never walks the history.
            out["num_device_alloc"] = self.allocator.counts["segment.all.allocated"]
            out["num_sync_all_streams"] = 0
            out["max_split_size"] = self.conf.settings()["max_split_size"]
            return dict(sorted(out.items()))

    # -- internals

    def _current(self) -> dict[str, int]:
        a = self.allocator
        ranges = self._ranges()
        out: dict[str, int] = {}
        for pool in ("all", "large", "small"):
            key = "all" if pool == "all" else f"{pool}_pool"
            blocks = [b for b in a.blocks.values() if pool in ("all", b.pool)]
            live = [b for b in blocks if b.allocated]
            active = [b for b in blocks if b.allocated or b.pending]
            whole = {(start, size) for start, size, p in ranges if pool in ("all", p)}
            # PyTorch counts inactive split blocks of ordinary segments only.
            split_free = [
                b for b in blocks
                if b.reusable and not a.expandable and (b.address, b.size) not in whole
            ]  # fmt: skip
            out[f"allocated_bytes.{key}"] = sum(b.size for b in live)
            out[f"active_bytes.{key}"] = sum(b.size for b in active)
            out[f"requested_bytes.{key}"] = sum(b.requested for b in active)
            out[f"reserved_bytes.{key}"] = sum(size for _, size in whole)
            out[f"inactive_split_bytes.{key}"] = sum(b.size for b in split_free)
            out[f"allocation.{key}"] = len(live)
            out[f"active.{key}"] = len(active)
            out[f"segment.{key}"] = len(whole)
            out[f"inactive_split.{key}"] = len(split_free)
        return out

    def _ranges(self) -> list[tuple[int, int, str]]:
        return _ranges(self.allocator)


    def _update_peaks(self) -> None:
        for key, value in self._current().items():
            if value > self.peaks.get(key, 0):
                self.peaks[key] = value

    def _oom_figures(self, nbytes: int) -> dict[str, Any]:
        a = self.allocator
        size = ms.round_size(nbytes)
        alloc = ms.allocation_size(size)
        free = max(0, a.usable - a.reserved)
        allocated = sum(b.size for b in a.blocks.values() if b.allocated)
        message = (
            f"CUDA out of memory. Tried to allocate {_mib(alloc)}. GPU {self.index} has a total"
            f" capacity of {_gib(self.capacity)} of which {_mib(free)} is free. Of the allocated"
            f" memory {_mib(allocated)} is allocated by PyTorch, and {_mib(a.reserved - allocated)}"
            " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large"
            " try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        )
        # PyTorch's observer gets the allowed maximum where a memory fraction is set.
        total = a.allowed if a.allowed else self.capacity
        return {"alloc": alloc, "total": total, "free": free, "message": message}


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _frames() -> list[dict[str, Any]]:
    """The caller's stack as PyTorch records it: innermost first, C++ frames first with
    stacks="all"; nothing when history records no context."""
    if not HISTORY.enabled or HISTORY.context is None:
        return []
    frames = [dict(f) for f in ms._CPP_ALLOC] if HISTORY.cpp else []
    f = sys._getframe(2)
    depth = 0
    while f is not None and depth < 64:
        frames.append({"filename": f.f_code.co_filename, "line": f.f_lineno, "name": f.f_code.co_name})
        f = f.f_back
        depth += 1
    return frames


def _ranges(a: Any) -> list[tuple[int, int, str]]:
    """(address, size, pool) of every segment, as the snapshot lists them: a cudaMalloc
    segment, or a contiguous mapped range of an expandable one."""
    if not a.expandable:
        return [(address, size, a.blocks[address].pool) for address, size in a.segments.items()]
    out = []
    for pool, reservations in a.reservations.items():
        page = ms.PAGE[pool]
        for base, mapped in reservations:
            k = 0
            while k < len(mapped):
                if not mapped[k]:
                    k += 1
                    continue
                j = k
                while j < len(mapped) and mapped[j]:
                    j += 1
                out.append((base + k * page, (j - k) * page, pool))
                k = j
    return out
