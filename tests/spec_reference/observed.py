"""The observed model on the device's pages (SPEC 1.2 §1–§3), read straight from an nsys SQLite
export.

Deliberately plain: sqlite3, lists and loops; after every event the resident pages, the union
of the footprints and the free runs inside the pages are recomputed from the live blocks as
interval unions. Written from SPEC 1.2 and the project's README only; it shares no code with
nsysfrag.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from .summary import Moment, summarize

GRANULARITY = 512
PAGE = 2 << 20
ALLOC_CALLS = {
    "cudaMalloc", "cudaMallocAsync", "cudaMallocFromPoolAsync", "cudaMallocPitch", "cudaMalloc3D",
    "cudaMallocManaged", "cuMemAlloc", "cuMemAllocAsync", "cuMemAllocPitch",
    "cuMemAllocFromPoolAsync", "cuMemAllocManaged",
}  # fmt: skip
STATE_KEYS = (
    "time_ns", "global_frag", "local_frag", "free_blocks", "largest_free_bytes", "free_bytes",
    "live_bytes", "reserved_bytes", "allocated_bytes", "stranded_bytes", "releasable_bytes",
    "device_free_bytes", "largest_block_bytes",
)  # fmt: skip
POOL_COLUMNS = (
    "localMemoryPoolAddress", "localMemoryPoolSize", "localMemoryPoolUtilizedSize",
    "localMemoryPoolReleaseThreshold",
)  # fmt: skip
DEVICE_KIND_NAMES = {
    "CUDA_MEMOPR_MEMORY_KIND_DEVICE": 2,
    "CUDA_MEMOPR_MEMORY_KIND_ARRAY": 3,
    "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC": 5,
}


def _pid(global_id: int) -> int:
    return (global_id >> 24) & 0xFFFFFF


def _tid(global_id: int) -> int:
    return global_id & 0xFFFFFF


def _strip_version(name: str) -> str:
    return re.sub(r"_v\d+$", "", name)


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _device_kinds(con: sqlite3.Connection, tables: set[str]) -> set[int]:
    if "ENUM_CUDA_MEM_KIND" not in tables:
        return set(DEVICE_KIND_NAMES.values())
    rows = con.execute("SELECT id, name FROM ENUM_CUDA_MEM_KIND").fetchall()
    return {i for i, name in rows if name in DEVICE_KIND_NAMES}


def _operations(con: sqlite3.Connection, tables: set[str]) -> tuple[int, int]:
    if "ENUM_CUDA_DEV_MEM_EVENT_OPER" not in tables:
        return 0, 1
    ids = {name: i for i, name in con.execute("SELECT id, name FROM ENUM_CUDA_DEV_MEM_EVENT_OPER")}
    return ids["CUDA_DEV_MEM_EVENT_OPR_ALLOCATION"], ids["CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION"]


def _capacities(con: sqlite3.Connection, tables: set[str]) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
    total = {gid: mem for gid, mem in con.execute("SELECT id, totalMemory FROM TARGET_INFO_GPU")}
    mapping: dict[tuple[int, int], int] = {}
    if "TARGET_INFO_CUDA_DEVICE" in tables:
        for gpu_id, cuda_id, pid in con.execute("SELECT gpuId, cudaId, pid FROM TARGET_INFO_CUDA_DEVICE"):
            mapping[(pid, cuda_id)] = gpu_id
    return total, mapping


class _Space:
    def __init__(self, pid: int, device: int) -> None:
        self.pid, self.device = pid, device
        # (start, rowid, op, address, bytes, pool): pool is None or (address, size, kept)
        self.events: list[tuple[int, int, int, int, int, Any]] = []
        self.other_kind = 0
        self.failed: list[tuple[int, int]] = []  # (start, rowid) of failed calls charged here


def analyze_observed(path: str | Path, capacity: int | None = None) -> dict[str, Any]:
    """Per space (sorted by pid, device): counts, ooms, and the summary of SPEC §3."""
    con = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        return _analyze(con, capacity)
    finally:
        con.close()


def _analyze(con: sqlite3.Connection, capacity_override: int | None) -> dict[str, Any]:
    tables = _tables(con)
    device_kinds = _device_kinds(con, tables)
    op_alloc, op_free = _operations(con, tables)
    total_memory, cuda_to_gpu = _capacities(con, tables)

    rows = con.execute(
        "SELECT rowid, start, globalPid, deviceId, address, bytes, memKind, memoryOperationType,"
        " correlationId FROM CUDA_GPU_MEMORY_USAGE_EVENTS ORDER BY start, rowid"
    ).fetchall()
    pools = _pools(con)
    spaces: dict[tuple[int, int], _Space] = {}
    for rowid, start, gpid, dev, address, nbytes, kind, op, _corr in rows:
        if kind in device_kinds:
            key = (_pid(gpid), dev)
            space = spaces.setdefault(key, _Space(*key))
            space.events.append(
                (start, rowid, op, address & 0xFFFFFFFFFFFFFFFF, nbytes, pools.get(rowid))
            )
    for _rowid, _start, gpid, dev, _address, _nbytes, kind, _op, _corr in rows:
        if kind not in device_kinds and (_pid(gpid), dev) in spaces:
            spaces[(_pid(gpid), dev)].other_kind += 1

    _charge_failures(con, tables, rows, device_kinds, op_alloc, spaces)

    result = []
    for key in sorted(spaces):
        space = spaces[key]
        if capacity_override is not None:
            cap = capacity_override
        else:
            gpu = cuda_to_gpu.get(key, key[1])
            cap = total_memory[gpu]
        result.append(_replay(space, cap, op_alloc, op_free))
    return {"spaces": result}


def _pools(con: sqlite3.Connection) -> dict[int, tuple[int, int, int]]:
    """rowid -> (pool address, pool size, what a trim keeps) for rows from a memory pool."""
    columns = {r[1] for r in con.execute("PRAGMA table_info('CUDA_GPU_MEMORY_USAGE_EVENTS')")}
    if not set(POOL_COLUMNS) <= columns:
        return {}
    out = {}
    for rowid, address, size, used, threshold in con.execute(
        f"SELECT rowid, {', '.join(POOL_COLUMNS)} FROM CUDA_GPU_MEMORY_USAGE_EVENTS"
        " WHERE localMemoryPoolAddress IS NOT NULL"
    ):
        # A damaged (negative) size or use counts as none.
        out[rowid] = (address, max(size or 0, 0), max(used or 0, threshold or 0, 0))
    return out


def _charge_failures(
    con: sqlite3.Connection,
    tables: set[str],
    rows: list[tuple[Any, ...]],
    device_kinds: set[int],
    op_alloc: int,
    spaces: dict[tuple[int, int], _Space],
) -> None:
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    api = con.execute(
        "SELECT rowid, start, eventClass, globalTid, correlationId, nameId, returnValue"
        " FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start, rowid"
    ).fetchall()
    # The API row of an event: same pid and correlationId; the runtime row (class 0) first.
    by_corr: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, corr) -> (eventClass, globalTid)
    for _rowid, _start, event_class, gtid, corr, _name, _ret in api:
        if corr is None or gtid is None:
            continue
        key = (_pid(gtid), corr)
        if key not in by_corr or event_class < by_corr[key][0]:
            by_corr[key] = (event_class, gtid)
    # Successful allocations per thread: (pid, tid) -> [(start, device)].
    thread_allocs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for _rowid, start, gpid, dev, _address, nbytes, kind, op, corr in rows:
        if kind in device_kinds and op == op_alloc and nbytes > 0 and corr is not None:
            hit = by_corr.get((_pid(gpid), corr))
            if hit is not None:
                gtid = hit[1]
                thread_allocs.setdefault((_pid(gtid), _tid(gtid)), []).append((start, dev))
    for rowid, start, event_class, gtid, _corr, name_id, ret in api:
        if event_class not in (0, 1) or ret == 0 or gtid is None:
            continue
        if _strip_version(names.get(name_id, "")) not in ALLOC_CALLS:
            continue
        pid, tid = _pid(gtid), _tid(gtid)
        device = None
        for alloc_start, dev in thread_allocs.get((pid, tid), []):
            if alloc_start < start:  # "before it" (QUESTIONS.md Q5)
                device = dev  # rows are in time order: the last one wins
        if device is None:
            devices = sorted(d for p, d in spaces if p == pid)
            if not devices:
                continue  # unattributed: no space of that process
            device = devices[0]
        if (pid, device) in spaces:
            spaces[(pid, device)].failed.append((start, rowid))


def _footprint(nbytes: int) -> int:
    return -(-nbytes // GRANULARITY) * GRANULARITY


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The disjoint, sorted union of half-open intervals."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _minus(outer: list[tuple[int, int]], inner: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the disjoint sorted intervals ``outer`` that ``inner`` does not cover."""
    runs = []
    for a, b in outer:
        cursor = a
        for c, d in inner:
            if d <= cursor or c >= b:
                continue
            if c > cursor:
                runs.append((cursor, c))
            cursor = max(cursor, d)
        if cursor < b:
            runs.append((cursor, b))
    return runs


def _state(live: dict[int, tuple[int, int, Any]], pools: dict[int, tuple[int, int]],
           cap: int) -> dict[str, Any]:
    """SPEC 1.2 §2 after one event; ``live``: start -> (footprint end, bytes, pool address)."""
    page_blocks = [(s, e) for s, (e, _n, pool) in live.items() if pool is None]
    pages = _union([(s // PAGE * PAGE, -(-e // PAGE) * PAGE) for s, e in page_blocks])
    footprints = _union([(s, e) for s, (e, _n, _pool) in live.items()])
    allocated = sum(b - a for a, b in footprints)
    reserved = sum(b - a for a, b in pages) + sum(size for size, _kept in pools.values())
    releasable = sum(max(0, size - kept) for size, kept in pools.values())
    stranded = max(0, reserved - allocated - releasable)
    device_free = max(0, cap - reserved)
    runs = [b - a for a, b in _minus(pages, _union(page_blocks))]
    largest = max(runs, default=0)
    free = device_free + stranded + releasable
    usable = max(largest, device_free + releasable)
    return {
        "global_frag": min(1.0, (free - usable) / cap),
        "local_frag": 0.0 if free == 0 else 1 - usable / free,
        "free_blocks": len(runs) + (1 if device_free >= PAGE else 0),
        "largest_free_bytes": usable,
        "free_bytes": free,
        "live_bytes": sum(n for _e, n, _pool in live.values()),
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "stranded_bytes": stranded,
        "releasable_bytes": releasable,
        "device_free_bytes": device_free,
        "largest_block_bytes": largest,
        "material": free >= 0.05 * cap,
    }


def _replay(space: _Space, cap: int, op_alloc: int, op_free: int) -> dict[str, Any]:
    placed = [(a, n) for _s, _r, op, a, n, _p in space.events if op == op_alloc and n > 0]
    base = min(a for a, _n in placed) if placed else min(e[3] for e in space.events)
    # SPEC 1.2 §1: a space whose events all share one start has no times: event numbers.
    timed = len({e[0] for e in space.events}) > 1
    counts = dict.fromkeys(
        ("allocations", "frees", "unmatched_frees", "overlaps", "zero_size_allocs"), 0
    )
    live: dict[int, tuple[int, int, Any]] = {}  # start -> (footprint end, bytes, pool address)
    pools: dict[int, tuple[int, int]] = {}  # pool address -> (latest size, what a trim keeps)
    moments: list[Moment] = []
    after: list[tuple[int, int, dict[str, Any]]] = []  # (start, number, state) for the ooms
    for number, (start, _rowid, op, address, nbytes, pool) in enumerate(space.events):
        if pool is not None:
            pools[pool[0]] = (pool[1], pool[2])
        if op == op_alloc:
            if nbytes == 0:
                counts["zero_size_allocs"] += 1
            else:
                counts["allocations"] += 1
                stop = address + nbytes  # overlaps are judged on bytes, not footprints
                hit = [s for s, (_e, n, _p) in live.items() if s < stop and address < s + n]
                if hit:
                    counts["overlaps"] += 1
                    for s in hit:
                        del live[s]
                live[address] = (address + _footprint(nbytes), nbytes,
                                 None if pool is None else pool[0])  # fmt: skip
        elif op == op_free:
            if address in live:
                counts["frees"] += 1
                del live[address]
            else:
                counts["unmatched_frees"] += 1
        state = _state(live, pools, cap)
        moments.append({"time_ns": start if timed else number, **state})
        after.append((start, number, state))

    empty = _state({}, {}, cap)
    ooms = []
    for fail_start, _fail_rowid in sorted(space.failed):
        at, at_number = empty, 0
        for start, number, state in after:
            if start <= fail_start:
                at, at_number = state, number
        ooms.append(
            {
                "time_ns": fail_start if timed else at_number,
                "requested_bytes": None,
                **{k: at[k] for k in STATE_KEYS if k != "time_ns"},
                "verdict": "unknown",
            }
        )
    counts["failed_allocations"] = len(space.failed)
    counts["other_kind_events"] = space.other_kind
    allocs, failed = counts["allocations"], counts["failed_allocations"]
    return {
        "pid": space.pid,
        "device": space.device,
        "capacity_bytes": cap,
        "base_address": base,
        "span_mode": False,
        "counts": counts,
        "alloc_failure_rate": failed / (failed + allocs) if failed + allocs else 0.0,
        **summarize(moments, STATE_KEYS),
        "ooms": ooms,
    }
