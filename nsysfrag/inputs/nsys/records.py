"""The columnar records an nsys trace is read into (``reader``), before ``spaces`` turns them
into the one event model; no I/O here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nsysfrag.events import I64, U64, BoolArray

# nsys's own ENUM_CUDA_MEM_KIND names (not CUPTI's numbering) of the kinds that live in device
# memory; the fallback ids are for schema 2.x exports, which have no ENUM tables.
MODELLED_KIND_NAMES = {
    "CUDA_MEMOPR_MEMORY_KIND_DEVICE": 2,
    "CUDA_MEMOPR_MEMORY_KIND_ARRAY": 3,
    "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC": 5,
}
ALLOCATION_OPERATION_NAME = "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION"
DEALLOCATION_OPERATION_NAME = "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION"
DEFAULT_ALLOCATION_ID = 0
DEFAULT_DEALLOCATION_ID = 1

# API calls whose non-zero return value is an allocation failure.
ALLOCATION_CALLS = frozenset(
    {
        "cudaMalloc",
        "cudaMallocAsync",
        "cudaMallocFromPoolAsync",
        "cudaMallocPitch",
        "cudaMalloc3D",
        "cudaMallocManaged",
        "cuMemAlloc",
        "cuMemAllocAsync",
        "cuMemAllocPitch",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocManaged",
    }
)
# Virtual-memory-management calls: nsys exports neither their sizes nor (as far as anyone has
# documented) memory events for them, so a trace using them may be missing blocks.
VMM_CALLS = frozenset({"cuMemCreate", "cuMemMap", "cuMemAddressReserve"})

NVTX_PUSH_POP = 59
NVTX_START_END = 60

_VERSION_SUFFIX = re.compile(r"_v\d+$")


def api_base_name(name: str) -> str:
    """``cudaMalloc_v3020`` -> ``cudaMalloc``: real exports carry the API version suffix."""
    return _VERSION_SUFFIX.sub("", name)


def split_global_id(global_id: I64) -> tuple[I64, I64]:
    """nsys serializes ids as <hw:8><vm:8><pid:24><tid:24>; return (pid, tid)."""
    return (global_id >> 24) & 0xFFFFFF, global_id & 0xFFFFFF


@dataclass(frozen=True, slots=True)
class PoolRecords:
    """Per memory event: its block's memory pool and the pool's figures then (cudaMallocAsync)."""

    pool: I64  # a code per distinct localMemoryPoolAddress, or -1: not from a pool
    size_bytes: I64  # localMemoryPoolSize
    kept_bytes: I64  # what a trim keeps: max(localMemoryPoolUtilizedSize, release threshold)


@dataclass(frozen=True, slots=True)
class MemoryEvents:
    """Every row of CUDA_GPU_MEMORY_USAGE_EVENTS that we could read, ordered by (start, rowid)."""

    start_ns: I64
    pid: I64
    device: I64
    address: U64  # unsigned: nsys stores addresses >= 2**63 as negative SQLite integers
    bytes: I64
    is_free: BoolArray
    modelled: BoolArray  # device, array or device-static memory (docs/metrics.md)
    correlation_id: I64  # -1 where the row has none
    pools: PoolRecords | None = None  # where some row's block came from a memory pool

    def __len__(self) -> int:
        return len(self.start_ns)


@dataclass(frozen=True, slots=True)
class ApiCalls:
    """Runtime and driver API rows we need: allocation calls and those correlated to events."""

    start_ns: I64
    pid: I64
    tid: I64
    correlation_id: I64
    is_runtime: BoolArray
    is_failed_allocation: BoolArray


@dataclass(frozen=True, slots=True)
class NvtxRanges:
    """Closed push/pop and start/end ranges (marks and unclosed ranges enclose nothing)."""

    start_ns: I64
    end_ns: I64
    pid: I64
    tid: I64
    is_push_pop: BoolArray
    text: list[str]


@dataclass(frozen=True, slots=True)
class Gpu:
    id: int
    name: str
    total_memory: int | None


@dataclass(frozen=True, slots=True)
class Trace:
    path: str
    nsys_version: str | None
    memory: MemoryEvents
    api: ApiCalls
    nvtx: NvtxRanges
    gpus: dict[int, Gpu]
    # (pid, CUDA device id as the process saw it) -> nsys GPU id
    cuda_devices: dict[tuple[int, int], int]
    process_names: dict[int, str] = field(default_factory=dict)
    skipped_rows: int = 0
    vmm_calls: int = 0
    allocation_calls: int = 0
