"""The observed address-space model (SPEC §1–§3), read straight from an nsys SQLite export.

Deliberately plain: sqlite3, lists and loops, the free blocks recomputed from the sorted live
blocks after every event. Written from SPEC 1.1 and the project's README only; it shares no code
with nsysfrag.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from .summary import Moment, summarize

GRANULARITY = 512
ALLOC_CALLS = {
    "cudaMalloc", "cudaMallocAsync", "cudaMallocFromPoolAsync", "cudaMallocPitch", "cudaMalloc3D",
    "cudaMallocManaged", "cuMemAlloc", "cuMemAllocAsync", "cuMemAllocPitch",
    "cuMemAllocFromPoolAsync", "cuMemAllocManaged",
}  # fmt: skip
STATE_KEYS = (
    "time_ns", "global_frag", "local_frag", "free_blocks", "largest_free_bytes", "free_bytes",
    "live_bytes",
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
        self.events: list[tuple[int, int, int, int, int]] = []  # (start, rowid, op, address, bytes)
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
    spaces: dict[tuple[int, int], _Space] = {}
    for rowid, start, gpid, dev, address, nbytes, kind, op, _corr in rows:
        if kind in device_kinds:
            key = (_pid(gpid), dev)
            space = spaces.setdefault(key, _Space(*key))
            space.events.append((start, rowid, op, address & 0xFFFFFFFFFFFFFFFF, nbytes))
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


def _free_ranges(live: dict[int, tuple[int, int]], base: int, end: int) -> list[tuple[int, int]]:
    """Maximal ranges of [base, end) covered by no live footprint."""
    gaps = []
    cursor = base
    for start in sorted(live):
        stop = live[start][0]
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, stop)
    if end > cursor:
        gaps.append((cursor, end))
    return gaps


def _state(live: dict[int, tuple[int, int]], base: int, end: int, cap: int) -> dict[str, Any]:
    gaps = _free_ranges(live, base, end)
    free = sum(b - a for a, b in gaps)
    largest = max((b - a for a, b in gaps), default=0)
    return {
        "global_frag": (free - largest) / cap,
        "local_frag": 0.0 if free == 0 else 1 - largest / free,
        "free_blocks": len(gaps),
        "largest_free_bytes": largest,
        "free_bytes": free,
        "live_bytes": sum(nbytes for _stop, nbytes in live.values()),
        "material": free >= 0.05 * cap,
    }


def _replay(space: _Space, cap: int, op_alloc: int, op_free: int) -> dict[str, Any]:
    placed = [(a, n) for _s, _r, op, a, n in space.events if op == op_alloc and n > 0]
    if placed:
        base = min(a for a, _n in placed)
        end = max(base + cap, max(a + _footprint(n) for a, n in placed))
    else:  # README: the lowest address seen
        base = min(a for _s, _r, _op, a, _n in space.events)
        end = base + cap
    counts = dict.fromkeys(
        ("allocations", "frees", "unmatched_frees", "overlaps", "zero_size_allocs"), 0
    )
    live: dict[int, tuple[int, int]] = {}  # start -> (footprint end, bytes)
    moments: list[Moment] = []
    after: list[tuple[int, int, dict[str, Any]]] = []  # (start, rowid, state) for the ooms
    for start, rowid, op, address, nbytes in space.events:
        if op == op_alloc:
            if nbytes == 0:
                counts["zero_size_allocs"] += 1
            else:
                counts["allocations"] += 1
                stop = address + _footprint(nbytes)
                hit = [s for s, (e, _n) in live.items() if s < stop and address < e]
                if hit:
                    counts["overlaps"] += 1
                    for s in hit:
                        del live[s]
                live[address] = (stop, nbytes)
        elif op == op_free:
            if address in live:
                counts["frees"] += 1
                del live[address]
            else:
                counts["unmatched_frees"] += 1
        state = _state(live, base, end, cap)
        moments.append({"time_ns": start, **state})
        after.append((start, rowid, state))

    empty = _state({}, base, end, cap)
    ooms = []
    for fail_start, _fail_rowid in sorted(space.failed):
        at = empty
        for start, _rowid, state in after:
            if start <= fail_start:
                at = state
        ooms.append(
            {
                "time_ns": fail_start,
                "requested_bytes": None,
                "free_bytes": at["free_bytes"],
                "largest_free_bytes": at["largest_free_bytes"],
                "free_blocks": at["free_blocks"],
                "live_bytes": at["live_bytes"],
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
        "span_mode": end > base + cap,
        "counts": counts,
        "alloc_failure_rate": failed / (failed + allocs) if failed + allocs else 0.0,
        **summarize(moments, STATE_KEYS),
        "ooms": ooms,
    }
