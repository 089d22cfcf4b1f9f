"""The runtime and driver API calls an nsys trace's memory events need: every allocation call
(failures, and the thread of each allocation for its site) and the calls behind other
allocation events, from CUPTI_ACTIVITY_KIND_RUNTIME (``reader`` reads the rest).
"""

from __future__ import annotations

import sqlite3
from typing import Literal

import numpy as np

from nsysfrag import interpreted
from nsysfrag.events import I64
from nsysfrag.inputs.nsys import sqlite_columns
from nsysfrag.inputs.nsys import sqlite_tables as db
from nsysfrag.inputs.nsys.records import ALLOCATION_CALLS, ApiCalls, MemoryEvents, split_global_id

RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"


def correlation_ids(corr: I64) -> I64:
    """CUPTI correlation ids are 32-bit and never negative: any other value matches no call, so
    it reads as "none" (-1), and the (pid, id) keys built from them cannot overflow."""
    valid = (corr >= 0) & (corr <= _MAX_CORRELATION_ID)
    return corr if valid.all() else np.where(valid, corr, -1)


_MAX_CORRELATION_ID = 0xFFFFFFFF


_NO_API = ApiCalls(*(np.zeros(0, dtype=np.int64),) * 4, *(np.zeros(0, dtype=np.bool_),) * 2)
_API_REQUIRED = ("start", "globalTid", "correlationId")
_API_COLUMNS = (*_API_REQUIRED, "eventClass", "nameId", "returnValue")
# Correlation ids listed literally in a query; beyond this a subquery over the memory table is
# cheaper than a huge statement.
_LITERAL_IDS = 20_000


def read_api(
    con: sqlite3.Connection, tables: dict[str, str], names: dict[int, str], uri: str
) -> ApiCalls:
    """The allocation calls (for failures and sites). Rows correlated with other memory events
    come from :func:`read_correlated_api` once the memory events are known."""
    if not db.has_columns(con, tables, RUNTIME_TABLE, *_API_COLUMNS):
        return _NO_API
    # SQLite's own filtered scan, through its C API (``_api_rows``): on a real export's
    # millions of launches it costs a third of decoding every record from the pages (0.28 s
    # against 0.92 s of CPU for 6 M rows, benchmarks/bench_real_shaped.py), and it keeps no
    # more of the file in memory than its page cache.
    alloc_ids = ",".join(str(i) for i, n in names.items() if n in ALLOCATION_CALLS) or "NULL"
    return _api_rows(con, f"nameId IN ({alloc_ids})", alloc_ids, uri)


def read_correlated_api(
    con: sqlite3.Connection, tables: dict[str, str], names: dict[int, str], memory: MemoryEvents, api: ApiCalls,
    alloc_op_id: int, uri: str, memory_table: str,
) -> ApiCalls:
    """Add the API rows of allocation events whose call is not an allocation call (static
    memory at module load, arrays, ...): usually few, so they are fetched by id (or by a
    subquery of ``memory_table``, the memory events' table, when there are many)."""
    if not db.has_columns(con, tables, RUNTIME_TABLE, *_API_COLUMNS):
        return api
    allocs = ~memory.is_free & (memory.correlation_id >= 0)
    wanted = (memory.pid[allocs] << 32) | memory.correlation_id[allocs]
    found = (api.pid << 32) | api.correlation_id
    if len(found) and len(wanted):
        # Correlation ids are small and dense: a lookup table beats sorting a million keys.
        # (Python ints: no overflow whatever the ids.)
        span = max(int(wanted.max()), int(found.max())) - min(int(wanted.min()), int(found.min()))
        kind: Literal["table", "sort"] = "table" if span < 1 << 26 else "sort"
        wanted = wanted[~np.isin(wanted, found, kind=kind)]
    missing = np.unique(wanted & 0xFFFFFFFF)
    if len(missing) == 0:
        return api
    alloc_ids = ",".join(str(i) for i, n in names.items() if n in ALLOCATION_CALLS) or "NULL"
    if len(missing) <= _LITERAL_IDS:
        ids = ",".join(str(int(c)) for c in missing)
    else:
        ids = f"SELECT correlationId FROM {memory_table} WHERE memoryOperationType = {alloc_op_id}"
    extra = _api_rows(
        con, f"correlationId IN ({ids}) AND coalesce(nameId NOT IN ({alloc_ids}), 1)", alloc_ids,
        uri, chunked=len(missing) <= _LITERAL_IDS,
    )
    return ApiCalls(
        *(np.concatenate([a, b]) for a, b in zip(
            (api.start_ns, api.pid, api.tid, api.correlation_id, api.is_runtime, api.is_failed_allocation),
            (extra.start_ns, extra.pid, extra.tid, extra.correlation_id, extra.is_runtime, extra.is_failed_allocation),
            strict=True,
        ))
    )


def _row_span(con: sqlite3.Connection, table: str, key: str) -> int:
    """How many rows ``table`` has at most (its first to last ``key``, an index lookup each)."""
    lo, hi = db.query(con, f"SELECT min({key}), max({key}) FROM {table}")[0]
    return 0 if lo is None else int(hi) - int(lo) + 1


def _api_rows(
    con: sqlite3.Connection, where: str, alloc_ids: str, uri: str, chunked: bool = True
) -> ApiCalls:
    columns = [
        "start",
        "globalTid",
        "correlationId",
        (
            f"coalesce(eventClass = 0, 0)"
            f" + 2 * coalesce(nameId IN ({alloc_ids}) AND returnValue != 0, 0)"
        ),
    ]
    # The compiled reader has no work budget (export_file.WorkBudget): it reads tables, not views.
    key = db.row_order(con, RUNTIME_TABLE)
    compiled = (
        sqlite_columns.read_int_columns(
            uri, f"SELECT {', '.join(columns)} FROM {RUNTIME_TABLE} WHERE {where}", 4, 1 << 16
        )
        if key is not None and not interpreted.interpret(_row_span(con, RUNTIME_TABLE, key))
        else None
    )
    start, gtid, corr, flags = compiled or db.read_integers(
        con, columns, RUNTIME_TABLE, where, _API_REQUIRED, chunked
    )
    return _api_calls(start, gtid, corr, flags)


def _api_calls(start: I64, gtid: I64, corr: I64, flags: I64) -> ApiCalls:
    """API rows from their columns: start, globalTid, correlationId, and flags (1: a runtime
    call, 2: a failed allocation)."""
    pid, tid = split_global_id(gtid)
    return ApiCalls(
        start_ns=start,
        pid=pid,
        tid=tid,
        correlation_id=correlation_ids(corr),
        is_runtime=(flags & 1).astype(np.bool_),
        is_failed_allocation=(flags & 2).astype(np.bool_),
    )
