"""A traced process, as nsys records it: CUDA API rows with CUPTI correlation ids, memory rows
stamped inside their calls, NVTX ranges per thread, and the driver's pages (``driver_pages.py``)
behind every cudaMalloc. The sample workloads (``make_samples.py``) run on it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from driver_pages import DriverPages, MemoryPool, OutOfMemory

from nsysfrag.testing.nsys_export import (
    ALLOC,
    DEVICE,
    DEVICE_STATIC,
    FREE,
    MANAGED,
    PINNED,
    START_END,
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
    write_export,
)

# Where Trace.write puts the exports (make_samples.py --out changes it).
OUT_DIR = Path(__file__).resolve().parent
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


class GpuModel(NamedTuple):
    name: str
    total_memory: int


A100_80GB = GpuModel("NVIDIA A100-SXM4-80GB", 85_899_345_920)
A100_40GB = GpuModel("NVIDIA A100-SXM4-40GB", 42_505_273_344)
# totalMemory as a genuine nsys 2024.2 export of this card records it.
A100_PCIE_40GB = GpuModel("NVIDIA A100-PCIE-40GB", 42_411_098_112)
H100_80GB = GpuModel("NVIDIA H100 80GB HBM3", 85_520_809_984)

# nsys names API rows by their exported symbol, hence the version suffixes.
MALLOC, FREE_API = "cudaMalloc_v3020", "cudaFree_v3020"
MALLOC_ASYNC, FREE_ASYNC = "cudaMallocAsync_v11020", "cudaFreeAsync_v11020"
CU_MEM_ALLOC, CU_MEM_FREE = "cuMemAlloc_v2", "cuMemFree_v2"
HOST_ALLOC, FREE_HOST = "cudaHostAlloc_v3020", "cudaFreeHost_v3020"
MALLOC_MANAGED = "cudaMallocManaged_v6000"
MALLOC_ARRAY, FREE_ARRAY = "cudaMallocArray_v3020", "cudaFreeArray_v3020"
LAUNCH = "cudaLaunchKernel_v7000"
SET_DEVICE = "cudaSetDevice_v3020"
SYNC = "cudaDeviceSynchronize_v3020"
STREAM_SYNC = "cudaStreamSynchronize_v3020"
MODULE_LOAD = "cuModuleLoadData"

# The free call CUDA requires for memory obtained from each allocation call.
FREE_FOR = {
    MALLOC: FREE_API,
    MALLOC_ASYNC: FREE_ASYNC,
    CU_MEM_ALLOC: CU_MEM_FREE,
    HOST_ALLOC: FREE_HOST,
    MALLOC_MANAGED: FREE_API,
    MALLOC_ARRAY: FREE_ARRAY,
}
ASYNC_APIS = {MALLOC_ASYNC, FREE_ASYNC}

# cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY share the value 2.
OUT_OF_MEMORY = 2


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    """Allocation sizes in real programs spread over decades, not evenly over a range."""
    return int(lo * (hi / lo) ** rng.random())


def host_heap(top: int, capacity: int, rng: random.Random) -> DriverPages:
    """Pinned or managed memory: not the device's pages, but mapped by the same driver, so its
    addresses follow the same rules (the genuine exports' cudaHostAlloc blocks are 2 MiB-aligned
    and placed downwards too)."""
    return DriverPages(capacity, top, rng)


@dataclass
class Trace:
    """The rows of one export, from any number of processes."""

    memory: list[MemoryRow] = field(default_factory=list)
    api: list[ApiRow] = field(default_factory=list)
    nvtx: list[NvtxRow] = field(default_factory=list)

    def write(self, name: str, gpus: list[Gpu], options: ExportOptions) -> Path:
        # nsys writes each table in time order; the analyzer breaks start ties by rowid.
        return write_export(
            OUT_DIR / name,
            sorted(self.memory, key=lambda r: r.start),
            sorted(self.api, key=lambda r: r.start),
            sorted(self.nvtx, key=lambda r: r.start),
            gpus,
            options,
        )


@dataclass
class Block:
    heap: DriverPages
    device: int
    kind: int
    nbytes: int
    free_api: str
    pool: MemoryPool | None = None


class Process:
    """One traced process: a clock, CUPTI correlation ids, the driver's pages of each of its
    devices (and of host and managed memory), its live blocks."""

    def __init__(
        self,
        trace: Trace,
        pid: int,
        seed: int,
        start_ns: int,
        devices: dict[int, tuple[int, int]],
        host_top: int | None = None,
    ) -> None:
        """``devices`` maps a CUDA device id to (its memory, the top of its virtual window)."""
        self.trace, self.pid = trace, pid
        self.rng = random.Random(seed)
        self.now = start_ns
        self.heaps: dict[int | str, DriverPages] = {
            dev: DriverPages(memory, top, self.rng) for dev, (memory, top) in devices.items()
        }
        if host_top is not None:
            self.heaps["host"] = host_heap(host_top, 256 * GiB, self.rng)
            self.heaps["managed"] = host_heap(host_top - (1 << 40), 256 * GiB, self.rng)
        self.blocks: dict[int, Block] = {}
        self._next_correlation = 1
        self.main = Thread(self, pid)

    def idle(self, lo_us: float, hi_us: float) -> None:
        self.now += int(self.rng.uniform(lo_us, hi_us) * 1000)

    def api_call(self, tid: int, name: str, duration_ns: int, ret: int = 0) -> tuple[int, int, int]:
        start, end = self.now, self.now + duration_ns
        # Untraced internal calls consume correlation ids too, so real ids have gaps.
        corr = self._next_correlation
        self._next_correlation += 1 if self.rng.random() < 0.8 else self.rng.randint(2, 6)
        event_class = 1 if name.startswith("cu") and not name.startswith("cuda") else 0
        self.trace.api.append(ApiRow(start, end, self.pid, tid, name, corr, ret, event_class))
        self.now = end + self.rng.randint(300, 3000)
        return corr, start, end

    def inside(self, start: int, end: int) -> int:
        """The moment within an API call at which CUPTI stamps the memory event."""
        return start + (end - start) * self.rng.randint(30, 85) // 100


class Thread:
    """API calls and NVTX ranges on one thread of a Process."""

    def __init__(self, proc: Process, tid: int) -> None:
        self.proc, self.tid = proc, tid

    def call(self, name: str, lo_us: float = 2.0, hi_us: float = 8.0, ret: int = 0) -> int:
        duration = int(self.proc.rng.uniform(lo_us, hi_us) * 1000)
        return self.proc.api_call(self.tid, name, duration, ret)[0]

    def launch(self, n: int = 1) -> None:
        for _ in range(n):
            self.call(LAUNCH, 3, 9)
            self.proc.idle(2, 40)

    @contextmanager
    def range(self, text: str) -> Iterator[None]:
        start = self.proc.now
        self.proc.idle(0.5, 3)
        try:
            yield
        finally:
            self.proc.idle(0.5, 3)
            self.proc.trace.nvtx.append(
                NvtxRow(start, self.proc.now, self.proc.pid, self.tid, text)
            )

    def start_range(self, text: str) -> tuple[str, int]:
        """nvtxRangeStart: unlike push/pop, these need not nest and may outlive the caller."""
        return text, self.proc.now

    def end_range(self, handle: tuple[str, int]) -> None:
        text, start = handle
        self.proc.trace.nvtx.append(
            NvtxRow(start, self.proc.now, self.proc.pid, self.tid, text, START_END)
        )

    def _duration(self, api: str, nbytes: int) -> int:
        rng = self.proc.rng
        if api in ASYNC_APIS:
            return int(rng.uniform(1, 4) * 1000)
        # Mapping pages dominates large cudaMalloc/cudaFree: about a millisecond per GiB.
        return int(rng.uniform(4, 15) * 1000) + nbytes * 1_000_000 // GiB

    def _heap(self, kind: int, device: int) -> DriverPages:
        heaps = self.proc.heaps
        return heaps["host" if kind == PINNED else "managed" if kind == MANAGED else device]

    def malloc(
        self,
        nbytes: int,
        api: str = MALLOC,
        kind: int = DEVICE,
        device: int = 0,
        correlated: bool = True,
        pool: MemoryPool | None = None,
        at: int | None = None,
    ) -> int:
        """Allocate through the driver; on OutOfMemory the failed call is recorded (return 2,
        no memory row) and the exception goes to the workload. ``at`` forces a large block's
        address (the driver reusing the pages of a block whose free the trace missed)."""
        proc = self.proc
        heap = self._heap(kind, device)
        try:
            if nbytes == 0:
                addr = heap.would_place_small(0)  # a pointer, no memory
            elif at is not None:
                heap.place_large_at(at, nbytes)
                addr = at
            else:
                addr = pool.malloc(nbytes) if pool else heap.malloc(nbytes)
        except OutOfMemory:
            proc.api_call(self.tid, api, self._duration(api, 0), ret=OUT_OF_MEMORY)
            raise
        corr: int | None = None
        if correlated:
            corr, start, end = proc.api_call(self.tid, api, self._duration(api, nbytes))
            when = proc.inside(start, end)
        else:
            when = proc.now
            proc.idle(1, 5)
        figures = pool.figures if pool else None
        proc.trace.memory.append(
            MemoryRow(when, proc.pid, device, addr, nbytes, ALLOC, kind, corr, figures)
        )
        if nbytes:
            proc.blocks[addr] = Block(heap, device, kind, nbytes, FREE_FOR.get(api, FREE_API), pool)
        return addr

    def free(self, addr: int, *, recorded: bool = True) -> None:
        """Free a block; ``recorded=False`` frees it where nsys could not see (a missed free)."""
        proc = self.proc
        block = proc.blocks.pop(addr)
        (block.pool or block.heap).free(addr)
        if not recorded:
            return
        corr, start, end = proc.api_call(
            self.tid, block.free_api, self._duration(block.free_api, block.nbytes // 4)
        )
        proc.trace.memory.append(
            MemoryRow(
                proc.inside(start, end),
                proc.pid,
                block.device,
                addr,
                block.nbytes,
                FREE,
                block.kind,
                corr,
                block.pool.figures if block.pool else None,
            )
        )

    def load_module(self, sizes: list[int], api: str = MODULE_LOAD, us: float = 180) -> None:
        """A module load reports its static ``__device__`` symbols as memory rows (DEVICE_STATIC),
        packed at 256-byte steps; they stay for the process's life."""
        proc = self.proc
        corr, start, end = proc.api_call(self.tid, api, int(us * 1000))
        for addr, n in zip(proc.heaps[0].module_data(sizes), sizes):
            row = MemoryRow(proc.inside(start, end), proc.pid, 0, addr, n, ALLOC, DEVICE_STATIC, corr)
            proc.trace.memory.append(row)


