"""Write nsys-shaped SQLite exports from plain rows.

Used by the sample-trace script, the tests and the benchmarks, so every trace we make ourselves
has the DDL that nsys itself writes (copied from real 2025.3 exports and, for the memory table
that no public export carries, from NVIDIA's schema reference, schema 3.28.1).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEVICE = 2
ARRAY = 3
DEVICE_STATIC = 5
PINNED = 1
MANAGED = 4
ALLOC = 0
FREE = 1
PUSH_POP = 59
START_END = 60

DDL = {
    "StringIds": """CREATE TABLE StringIds (
    -- Consolidation of repetitive string values.

    id                          INTEGER   NOT NULL   PRIMARY KEY,      -- ID reference value.
    value                       TEXT      NOT NULL                     -- String value.
)""",
    "PROCESSES": """CREATE TABLE PROCESSES (
    -- Names and identifiers of processes captured in the report.

    globalPid                   INTEGER,                               -- Serialized GlobalId.
    pid                         INTEGER,                               -- The process ID.
    name                        TEXT                                   -- The process name.
)""",
    "CUPTI_ACTIVITY_KIND_RUNTIME": """CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    eventClass                  INTEGER   NOT NULL,                    -- REFERENCES ENUM_NSYS_EVENT_CLASS(id)
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    correlationId               INTEGER,                               -- ID used to identify events that this function call has triggered.
    nameId                      INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Function name
    returnValue                 INTEGER   NOT NULL,                    -- Return value of the function call.
    callchainId                 INTEGER                                -- REFERENCES CUDA_CALLCHAINS(id)
)""",
    "NVTX_EVENTS": """CREATE TABLE NVTX_EVENTS (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER,                               -- Event end timestamp (ns).
    eventType                   INTEGER   NOT NULL,                    -- REFERENCES ENUM_NSYS_EVENT_TYPE(id)
    rangeId                     INTEGER,                               -- Correlation ID returned from a nvtxRangeStart call.
    category                    INTEGER,                               -- User-controlled ID that can be used to group events.
    color                       INTEGER,                               -- Encoded ARGB color value.
    text                        TEXT,                                  -- Optional text message for non registered strings.
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    endGlobalTid                INTEGER,                               -- Serialized GlobalId.
    textId                      INTEGER,                               -- REFERENCES StringIds(id) -- Registered NVTX domain
    domainId                    INTEGER,                               -- User-controlled ID that can be used to group events.
    uint64Value                 INTEGER,                               -- One of possible payload value union members.
    int64Value                  INTEGER,                               -- One of possible payload value union members.
    doubleValue                 REAL,                                  -- One of possible payload value union members.
    uint32Value                 INTEGER,                               -- One of possible payload value union members.
    int32Value                  INTEGER,                               -- One of possible payload value union members.
    floatValue                  REAL,                                  -- One of possible payload value union members.
    jsonTextId                  INTEGER,                               -- One of possible payload value union members.
    jsonText                    TEXT,                                  -- One of possible payload value union members.
    binaryData                  TEXT                                   -- Binary payload.
)""",
    "CUDA_GPU_MEMORY_USAGE_EVENTS": """CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    globalPid                   INTEGER   NOT NULL,                    -- Serialized GlobalId.
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    address                     INTEGER   NOT NULL,                    -- Virtual address of the allocation/deallocation.
    pc                          INTEGER   NOT NULL,                    -- Program counter of the allocation/deallocation.
    bytes                       INTEGER   NOT NULL,                    -- Number of bytes allocated/deallocated (B).
    memKind                     INTEGER   NOT NULL,                    -- REFERENCES ENUM_CUDA_MEM_KIND(id)
    memoryOperationType         INTEGER   NOT NULL,                    -- REFERENCES ENUM_CUDA_DEV_MEM_EVENT_OPER(id)
    name                        TEXT,                                  -- Variable name, if available.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    streamId                    INTEGER,                               -- Stream ID.
    localMemoryPoolAddress      INTEGER,                               -- Base address of the local memory pool used
    localMemoryPoolReleaseThreshold INTEGER,                           -- Release threshold of the local memory pool used
    localMemoryPoolSize         INTEGER,                               -- Size of the local memory pool used
    localMemoryPoolUtilizedSize INTEGER,                               -- Utilized size of the local memory pool used
    importedMemoryPoolAddress   INTEGER,                               -- Base address of the imported memory pool used
    importedMemoryPoolProcessId INTEGER                                -- Process ID of the imported memory pool used
)""",
    "TARGET_INFO_GPU": """CREATE TABLE TARGET_INFO_GPU (
    vmId                        INTEGER   NOT NULL,                    -- Serialized GlobalId.
    id                          INTEGER   NOT NULL,                    -- Device ID.
    name                        TEXT,                                  -- Device name.
    busLocation                 TEXT,                                  -- PCI bus location.
    isDiscrete                  INTEGER,                               -- True if discrete, false if integrated.
    l2CacheSize                 INTEGER,                               -- Size of L2 cache (B).
    totalMemory                 INTEGER,                               -- Total amount of memory on the device (B).
    memoryBandwidth             INTEGER,                               -- Amount of memory transferred (B).
    clockRate                   INTEGER,                               -- Clock frequency (Hz).
    smCount                     INTEGER,                               -- Number of multiprocessors on the device.
    pwGpuId                     INTEGER,                               -- PerfWorks GPU ID.
    uuid                        TEXT,                                  -- Device UUID.
    luid                        INTEGER,                               -- Device LUID.
    chipName                    TEXT,                                  -- Chip name.
    cuDevice                    INTEGER                                -- CUDA device ID.
)""",
    "TARGET_INFO_CUDA_DEVICE": """CREATE TABLE TARGET_INFO_CUDA_DEVICE (
    gpuId                       INTEGER,                               -- GPU ID.
    cudaId                      INTEGER   NOT NULL,                    -- CUDA device ID.
    pid                         INTEGER   NOT NULL                     -- Process ID.
)""",
    "META_DATA_CAPTURE": """CREATE TABLE META_DATA_CAPTURE (
    -- information about nsys capture parameters

    name                        TEXT      NOT NULL,                    -- Name of meta-data record
    value                       TEXT                                   -- Value of meta-data record
)""",
    "META_DATA_EXPORT": """CREATE TABLE META_DATA_EXPORT (
    -- information about nsys export process

    name                        TEXT      NOT NULL,                    -- Name of meta-data record
    value                       TEXT                                   -- Value of meta-data record
)""",
}

_ENUM_DDL = """CREATE TABLE {name} (
    -- {comment}

    id                          INTEGER   NOT NULL   PRIMARY KEY,      -- Enum numerical value.
    name                        TEXT,                                  -- Enum symbol name.
    label                       TEXT                                   -- Enum human name.
)"""

MEM_KINDS = [
    (0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"),
    (1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
    (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"),
    (3, "CUDA_MEMOPR_MEMORY_KIND_ARRAY", "Array"),
    (4, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed"),
    (5, "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC", "Device Static"),
    (6, "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", "Managed Static"),
    (7, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown"),
]
MEM_OPERS = [
    (0, "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", "Allocation"),
    (1, "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION", "Deallocation"),
]


def global_tid(pid: int, tid: int) -> int:
    """Serialize (pid, tid) the way nsys does: hw 0, vm 1, then 24 bits each."""
    return (1 << 48) | ((pid & 0xFFFFFF) << 24) | (tid & 0xFFFFFF)


def global_pid(pid: int) -> int:
    return global_tid(pid, 0)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    start: int
    pid: int
    device: int
    address: int
    bytes: int
    op: int = ALLOC
    kind: int = DEVICE
    correlation_id: int | None = None
    # A block from a memory pool (cudaMallocAsync): the pool's base address, and its size,
    # bytes in use and release threshold as this row records them.
    pool: tuple[int, int, int, int] | None = None


def _signed_pool(pool: tuple[int, int, int, int] | None) -> tuple[int | None, ...]:
    """A pool's columns as SQLite stores them: its address signed, as nsys writes addresses."""
    if pool is None:
        return (None, None, None, None)
    address, *rest = pool
    return (address - (1 << 64) if address >= 1 << 63 else address, *rest)


@dataclass(frozen=True, slots=True)
class ApiRow:
    start: int
    end: int
    pid: int
    tid: int
    name: str
    correlation_id: int
    return_value: int = 0
    event_class: int = 0


@dataclass(frozen=True, slots=True)
class NvtxRow:
    start: int
    end: int | None
    pid: int
    tid: int
    text: str
    event_type: int = PUSH_POP


@dataclass(frozen=True, slots=True)
class Gpu:
    id: int
    name: str = "NVIDIA A100-SXM4-80GB"
    total_memory: int = 85_899_345_920


@dataclass
class ExportOptions:
    nsys_version: str = "2025.3.2.367"
    schema_version: str = "3.20.3"
    collect_memory: bool = True
    # (pid, cudaId, gpuId) rows; nsys writes TARGET_INFO_CUDA_DEVICE from 2025.1 on.
    cuda_devices: Sequence[tuple[int, int, int]] = ()
    processes: Sequence[tuple[int, str]] = ()
    # nsys creates the memory table lazily; False writes an export recorded without tracking.
    with_memory_table: bool = True
    registered_nvtx_strings: bool = field(default=False)


def write_export(
    path: str | Path,
    memory: Iterable[MemoryRow],
    api: Iterable[ApiRow] = (),
    nvtx: Iterable[NvtxRow] = (),
    gpus: Sequence[Gpu] = (Gpu(0),),
    options: ExportOptions | None = None,
) -> Path:
    """Write an nsys-shaped SQLite export at ``path`` (replacing any file there)."""
    opts = options or ExportOptions()
    path = Path(path)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    try:
        _write(con, list(memory), list(api), list(nvtx), gpus, opts)
        con.commit()
    finally:
        con.close()
    return path


def _write(
    con: sqlite3.Connection,
    memory: list[MemoryRow],
    api: list[ApiRow],
    nvtx: list[NvtxRow],
    gpus: Sequence[Gpu],
    opts: ExportOptions,
) -> None:
    strings: dict[str, int] = {}

    def string_id(value: str) -> int:
        return strings.setdefault(value, len(strings) + 1)

    con.execute(DDL["StringIds"])
    con.execute(_ENUM_DDL.format(name="ENUM_CUDA_MEM_KIND", comment="CUDA memory kind labels"))
    con.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?,?,?)", MEM_KINDS)
    con.execute(
        _ENUM_DDL.format(
            name="ENUM_CUDA_DEV_MEM_EVENT_OPER", comment="CUDA device mem event operation labels"
        )
    )
    con.executemany("INSERT INTO ENUM_CUDA_DEV_MEM_EVENT_OPER VALUES (?,?,?)", MEM_OPERS)

    con.execute(DDL["META_DATA_EXPORT"])
    con.executemany(
        "INSERT INTO META_DATA_EXPORT VALUES (?,?)",
        [
            ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
            ("EXPORT_PRODUCT_VERSION", opts.nsys_version),
            ("EXPORT_SCHEMA_VERSION", opts.schema_version),
            ("EXPORT_PARAM_LAZY", "true"),
        ],
    )
    con.execute(DDL["META_DATA_CAPTURE"])
    con.executemany(
        "INSERT INTO META_DATA_CAPTURE VALUES (?,?)",
        [
            ("PROCESS_0:COLLECT_CUDA_TRACE", "true"),
            ("PROCESS_0:COLLECT_GPU_MEMORY_USAGE", "true" if opts.collect_memory else "false"),
        ],
    )

    con.execute(DDL["TARGET_INFO_GPU"])
    con.executemany(
        "INSERT INTO TARGET_INFO_GPU (vmId, id, name, totalMemory, cuDevice) VALUES (?,?,?,?,?)",
        [(1 << 48, g.id, g.name, g.total_memory, g.id) for g in gpus],
    )
    if opts.cuda_devices:
        con.execute(DDL["TARGET_INFO_CUDA_DEVICE"])
        con.executemany(
            "INSERT INTO TARGET_INFO_CUDA_DEVICE (pid, cudaId, gpuId) VALUES (?,?,?)",
            opts.cuda_devices,
        )
    pids = sorted({r.pid for r in memory} | {r.pid for r in api})
    names = dict(opts.processes)
    con.execute(DDL["PROCESSES"])
    con.executemany(
        "INSERT INTO PROCESSES VALUES (?,?,?)",
        [(global_pid(p), p, names.get(p, "python3")) for p in pids],
    )

    if opts.with_memory_table:
        con.execute(DDL["CUDA_GPU_MEMORY_USAGE_EVENTS"])
        con.executemany(
            "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId,"
            " address, pc, bytes, memKind, memoryOperationType, correlationId,"
            " localMemoryPoolAddress, localMemoryPoolSize, localMemoryPoolUtilizedSize,"
            " localMemoryPoolReleaseThreshold) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    r.start,
                    global_pid(r.pid),
                    r.device,
                    1,
                    # SQLite INTEGER is signed: nsys stores addresses >= 2**63 as negatives.
                    r.address - (1 << 64) if r.address >= 1 << 63 else r.address,
                    0,
                    r.bytes,
                    r.kind,
                    r.op,
                    r.correlation_id,
                    *_signed_pool(r.pool),
                )
                for r in memory
            ],
        )
    if api:
        con.execute(DDL["CUPTI_ACTIVITY_KIND_RUNTIME"])
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,NULL)",
            [
                (
                    r.start,
                    r.end,
                    r.event_class,
                    global_tid(r.pid, r.tid),
                    r.correlation_id,
                    string_id(r.name),
                    r.return_value,
                )
                for r in api
            ],
        )
    if nvtx:
        con.execute(DDL["NVTX_EVENTS"])
        rows = []
        for r in nvtx:
            # Registered strings (nvtxDomainRegisterString) land in textId, the rest in text.
            text, text_id = (
                (None, string_id(r.text)) if opts.registered_nvtx_strings else (r.text, None)
            )
            rows.append((r.start, r.end, r.event_type, text, global_tid(r.pid, r.tid), text_id))
        con.executemany(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId)"
            " VALUES (?,?,?,?,?,?)",
            rows,
        )
    con.executemany("INSERT INTO StringIds VALUES (?,?)", [(i, s) for s, i in strings.items()])


def nested_nvtx_export(
    path: str | Path, ranges: int, name_chars: int, every_depth: bool = True
) -> Path:
    """``ranges`` NVTX push/pop ranges nested inside each other on one thread, with names of
    ``name_chars`` characters, and an allocation at every depth (or only the innermost); every
    other block is freed out of order at the end, so hotspots name the sites. The worst case
    for site resolution: a naive sweep builds a site string per range per depth."""
    nvtx = [
        NvtxRow(10 * i, 10 * (2 * ranges - i) + 5, 1, 7, f"{i:06d}" + "n" * (name_chars - 6))
        for i in range(ranges)
    ]
    depths = range(ranges) if every_depth else [ranges - 1]
    base = 0x7F00_0000_0000
    memory, api = [], []
    for k, depth in enumerate(depths):
        t = 10 * depth + 2
        memory.append(MemoryRow(t, 1, 0, base + k * 4096, 1024, correlation_id=k + 1))
        api.append(ApiRow(t - 1, t + 1, 1, 7, "cudaMalloc_v3020", k + 1))
    end = 30 * ranges
    memory += [
        MemoryRow(end + k, 1, 0, base + k * 4096, 1024, op=FREE) for k in range(0, len(depths), 2)
    ]
    return write_export(path, memory, api, nvtx, [Gpu(0, total_memory=1 << 30)])
