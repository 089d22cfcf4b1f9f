"""``cupy.cuda.runtime`` for tests: malloc, free and memGetInfo on a simulated device.

The device is the driver model the samples are made with (``sample_traces/driver_pages.py``:
large blocks on whole 2 MiB pages, small ones packed at 512-byte steps into partly used
chunks, a page given back when its last block is freed), with a context that holds some memory
from the start, as a real one does. Knobs, read when the module is imported:

  FAKE_CUPY_TOTAL_BYTES     the card's memory (default 16 GiB)
  FAKE_CUPY_OVERHEAD_BYTES  what the context holds before the first allocation (default 517 MiB)
  FAKE_CUPY_PHYSICAL_PAGE   the physical page behind small blocks (default 2 MiB, the model's;
                            65536 simulates a driver that backs its 2 MiB chunks in 64 KiB pages)
  FAKE_CUPY_KEEP_FREED=1    a driver that keeps every page it ever mapped (cudaMemGetInfo never
                            rises again; the pages are reused by later allocations)

The last two describe drivers unlike the model, so that tests can show the ground-truth checks
catch a model that is wrong.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from pathlib import Path
from typing import Any

_DRIVER_PAGES = Path(__file__).resolve().parents[4] / "sample_traces" / "driver_pages.py"


def _load_driver_pages() -> Any:
    spec = importlib.util.spec_from_file_location("fake_cupy_driver_pages", _DRIVER_PAGES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_pages = _load_driver_pages()
TOTAL = int(os.environ.get("FAKE_CUPY_TOTAL_BYTES", 16 << 30))
OVERHEAD = int(os.environ.get("FAKE_CUPY_OVERHEAD_BYTES", 517 << 20))
PHYSICAL_PAGE = int(os.environ.get("FAKE_CUPY_PHYSICAL_PAGE", _pages.PAGE))
KEEP_FREED = os.environ.get("FAKE_CUPY_KEEP_FREED") == "1"
ERROR_MEMORY_ALLOCATION = 2


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"cudaErrorMemoryAllocation: out of memory ({status})")


class _Device(_pages.DriverPages):  # type: ignore[misc,name-defined]
    """The driver model, with the physical accounting of the knobs above."""

    def __init__(self) -> None:
        super().__init__(TOTAL - OVERHEAD, 0x7F10_0000_0000, random.Random(0))
        self.small_pages: dict[int, int] = {}  # physical page under small blocks -> blocks
        self.held_bytes = 0  # pages ever mapped (KEEP_FREED)

    def physical_bytes(self) -> int:
        if PHYSICAL_PAGE == _pages.PAGE:
            return self.reserved_bytes
        chunks = self.reserved_bytes - sum(self._large.values())
        return self.reserved_bytes - chunks + len(self.small_pages) * PHYSICAL_PAGE

    @property
    def device_free_bytes(self) -> int:
        return self.capacity_bytes - self.physical_bytes()

    def _touch(self, address: int, end: int, change: int) -> None:
        for page in range(address // PHYSICAL_PAGE, -(-end // PHYSICAL_PAGE)):
            n = self.small_pages.get(page, 0) + change
            if n:
                self.small_pages[page] = n
            else:
                del self.small_pages[page]

    def _malloc_small(self, span: int) -> int:
        address = super()._malloc_small(span)
        if PHYSICAL_PAGE != _pages.PAGE:
            self._touch(address, address + span, 1)
        return address

    def _free_small(self, address: int) -> None:
        if PHYSICAL_PAGE != _pages.PAGE:
            self._touch(address, self._small[address][1], -1)
        super()._free_small(address)

    def free_reported(self) -> int:
        used = self.physical_bytes()
        self.held_bytes = max(self.held_bytes, used)
        return TOTAL - OVERHEAD - (self.held_bytes if KEEP_FREED else used)


_device = _Device()


def setDevice(device: int) -> None:
    if device != 0:
        raise CUDARuntimeError(101)  # cudaErrorInvalidDevice


def getDevice() -> int:
    return 0


def malloc(size: int) -> int:
    try:
        address = int(_device.malloc(size))
    except _pages.OutOfMemory:
        raise CUDARuntimeError(ERROR_MEMORY_ALLOCATION) from None
    _device.free_reported()  # the high-water mark of what a keeping driver holds
    return address


def free(ptr: int) -> None:
    if ptr:  # cudaFree(NULL) does nothing (but create the context)
        _device.free(ptr)


def memGetInfo() -> tuple[int, int]:
    return _device.free_reported(), TOTAL


def getDeviceProperties(device: int) -> dict[str, Any]:
    return {"name": b"Simulated GPU (tests/fake_cupy)", "totalGlobalMem": TOTAL}


def runtimeGetVersion() -> int:
    return 13000


def driverGetVersion() -> int:
    return 13000
