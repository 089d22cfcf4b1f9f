"""The runtime and driver API calls an nsys trace's memory events need: every allocation call
(failures, and the thread of each allocation for its site), the calls behind other allocation
events, and how many VMM calls there were, from CUPTI_ACTIVITY_KIND_RUNTIME (``reader`` reads
the rest).

A real export's runtime table is mostly kernel launches (millions of rows) and the rows needed
are few, so the table is scanned once for all of them, by SQLite (``_select``), in two row
ranges on two threads where the compiled reader serves. Where the memory table is as large as
the runtime table is long (a program that allocates for every call it makes), most rows are
needed and the page decoder (``sqlite_pages``) reads them at a third of SQLite's cost per row
kept (``_dense_select``).
"""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from nsysfrag import interpreted
from nsysfrag.events import I64
import nsysfrag.inputs.nsys.sqlite_columns as sqlite_columns
import nsysfrag.inputs.nsys.sqlite_pages as sqlite_pages
import nsysfrag.inputs.nsys.sqlite_tables as db
from nsysfrag.inputs.nsys.records import (
    ALLOCATION_CALLS,
    VMM_CALLS,
    ApiCalls,
    MemoryEvents,
    split_global_id,
)

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
# cheaper than a huge statement. Also the largest memory table whose allocations' calls are
# looked for in the one pass: a subquery of a few thousand ids costs nothing beside a scan of
# millions of launches, but one of a million ids costs more than the second pass it saves
# (where, as in most traces, the memory events' calls are allocation calls, there is none).
LITERAL_IDS = 20_000
# The flags column of a row read (``_select``).
_RUNTIME = 1  # a runtime (not driver) call
_FAILED = 2  # a failed allocation call
_ALLOCATION = 4  # an allocation call
_VMM = 8  # a VMM call (counted, not kept)
_VALID = 16  # start, thread and correlation id are integers (else the row is not kept)
# Rows per range below which one thread reads the table: a second costs more than it saves.
_SPLIT_ROWS = 1 << 20
# The page decoder decodes every row (about 0.15 us each), SQLite's filtered scan skips a row
# for a third of that but hands over each kept one value by value (about 0.5 us a row): the
# decoder wins once a quarter of the rows are kept. About half the memory events are
# allocations, each with its call, so that is a memory table of half the runtime table's rows.
_DENSE_MEMORY_ROWS_PER_CALL = 0.5


@dataclass(frozen=True)
class RuntimeCalls:
    """What the pass over the runtime table found."""

    allocations: ApiCalls  # every allocation call, in row order
    vmm_calls: int | None  # how many VMM calls; None: not counted (the table lacks a column)
    # Rows of other calls that an allocation of the memory table may name by correlation id
    # (read_correlated_api keeps those it needs), in row order; None: not read in the pass.
    correlated: ApiCalls | None = None


def read_runtime(
    con: sqlite3.Connection,
    tables: dict[str, str],
    names: dict[int, str],
    uri: str,
    memory_table: str | None = None,
    alloc_op_id: int = 0,
    dense: tuple[Path, int] | None = None,
) -> RuntimeCalls:
    """The allocation calls (for failures and sites) and the count of VMM calls, in one scan.
    With ``memory_table`` (a small memory table with correlation ids) the same scan reads the
    rows its allocations (operation ``alloc_op_id``) may be correlated with; otherwise
    :func:`read_correlated_api` reads those once the memory events are known. ``dense`` (the
    export's file and its memory table's row count) lets the page decoder read the rows where
    that count says most of them are needed."""
    if not db.has_columns(con, tables, RUNTIME_TABLE, *_API_COLUMNS):
        return RuntimeCalls(_NO_API, None)
    alloc_ids = _ids(names, ALLOCATION_CALLS)
    vmm_ids = _ids(names, VMM_CALLS)
    if memory_table is None and dense is not None:
        decoded = _dense_select(con, names, *dense)
        if decoded is not None:
            return _runtime_calls(*decoded, None)
    # One IN of every name wanted: SQLite looks each row's name up once (two lists: twice).
    wanted = [f"nameId IN ({alloc_ids if vmm_ids == 'NULL' else f'{alloc_ids},{vmm_ids}'})"]
    if memory_table is not None:
        allocations = f"FROM {memory_table} WHERE memoryOperationType = {int(alloc_op_id)}"
        lo, hi = db.query(
            con, f"SELECT min(correlationId), max(correlationId) {allocations}"
            " AND typeof(correlationId) = 'integer'",
        )[0]  # fmt: skip
        # Every row not named is looked up by its id; the ids' range first is two comparisons
        # (a run's allocations come early, its millions of launches after them). A row whose
        # id is not an integer is not kept whatever it matches (_VALID).
        if lo is not None:
            wanted.append(
                f"(correlationId BETWEEN {int(lo)} AND {int(hi)}"
                f" AND correlationId IN (SELECT correlationId {allocations}))"
            )
    # The rows kept are about as many as the memory events (each allocation's call, those its
    # events name): that, not the table's length, says whether the compiled reader pays.
    kept = dense[1] if dense is not None else None
    start, gtid, corr, flags = _select(con, " OR ".join(wanted), alloc_ids, vmm_ids, uri, kept=kept)
    return _runtime_calls(start, gtid, corr, flags, memory_table)


def _runtime_calls(
    start: I64, gtid: I64, corr: I64, flags: I64, memory_table: str | None
) -> RuntimeCalls:
    """What the pass found, from the rows it read (flags ``_RUNTIME`` ...)."""
    valid = (flags & _VALID) != 0
    allocation = valid & ((flags & _ALLOCATION) != 0)
    correlated = None
    if memory_table is not None:
        other = valid & ((flags & _ALLOCATION) == 0)
        correlated = _api_calls(start[other], gtid[other], corr[other], flags[other])
    return RuntimeCalls(
        allocations=_api_calls(start[allocation], gtid[allocation], corr[allocation], flags[allocation]),
        vmm_calls=int(np.count_nonzero(flags & _VMM)),
        correlated=correlated,
    )


def _dense_select(
    con: sqlite3.Connection, names: dict[int, str], path: Path, memory_rows: int
) -> list[I64] | None:
    """:func:`_select`'s columns of the allocation and VMM calls by the page decoder, where the
    memory table (``memory_rows``) says most runtime rows are allocation calls; None where it
    is not so or the decoder declines (it declines a NULL or a non-integer where SQLite's
    pass would flag the row invalid, so that pass reads such a table)."""
    key = db.row_order(con, RUNTIME_TABLE)
    span = _row_range(con, RUNTIME_TABLE, key) if key is not None else None
    if span is None or memory_rows < _DENSE_MEMORY_ROWS_PER_CALL * (span[1] - span[0] + 1):
        return None
    index = sqlite_pages.record_columns(con, RUNTIME_TABLE)
    if index is None:
        return None
    at = {c: index.get(c.lower(), -1) for c in (*_API_COLUMNS,)}
    if any(i < 0 for i in at.values()):
        return None
    alloc = [i for i, n in names.items() if n in ALLOCATION_CALLS]
    vmm = [i for i, n in names.items() if n in VMM_CALLS]
    rows = int(db.query(con, f"SELECT count(*) FROM {RUNTIME_TABLE}")[0][0])
    columns = [
        *(sqlite_pages.Column(at[c]) for c in _API_REQUIRED),
        # coalesce(eventClass = 0, 0) + 2 * coalesce(returnValue != 0, 0): _RUNTIME, _FAILED
        sqlite_pages.Column(at["eventClass"], sqlite_pages.CALL_FLAGS, at["returnValue"]),
        sqlite_pages.Column(at["nameId"]),
    ]
    read = sqlite_pages.read_columns(
        path.resolve(), con, RUNTIME_TABLE, columns, rows, (at["nameId"], alloc + vmm)
    )
    if read is None:
        return None
    start, gtid, corr, call_flags, name = read
    allocation = np.isin(name, alloc)
    # Every value read is an integer (the decoder declines others): every row is valid.
    flags = (
        (call_flags & _RUNTIME)
        | np.where(allocation, (call_flags & _FAILED) | _ALLOCATION, 0)
        | np.where(np.isin(name, vmm), _VMM, 0)
        | _VALID
    )
    return [start, gtid, corr, flags]


def _ids(names: dict[int, str], group: frozenset[str]) -> str:
    return ",".join(str(i) for i, n in names.items() if n in group) or "NULL"


def read_correlated_api(
    con: sqlite3.Connection, tables: dict[str, str], names: dict[int, str], memory: MemoryEvents,
    calls: RuntimeCalls, alloc_op_id: int, uri: str, memory_table: str,
) -> ApiCalls:
    """Add the API rows of allocation events whose call is not an allocation call (static
    memory at module load, arrays, ...): usually few, so they are kept from the rows the one
    pass read (``calls.correlated``), else fetched by id (or by a subquery of
    ``memory_table``, the memory events' table, when there are many)."""
    api = calls.allocations
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
    if calls.correlated is not None:
        # Read in the pass already, with more (each id of an allocation): keep the rows a
        # query by the missing ids would have returned, in the same (row) order.
        extra = _take(calls.correlated, np.isin(calls.correlated.correlation_id, missing))
    else:
        extra = _correlated_rows(con, names, missing, alloc_op_id, uri, memory_table)
    return ApiCalls(
        *(np.concatenate([a, b]) for a, b in zip(
            (api.start_ns, api.pid, api.tid, api.correlation_id, api.is_runtime, api.is_failed_allocation),
            (extra.start_ns, extra.pid, extra.tid, extra.correlation_id, extra.is_runtime, extra.is_failed_allocation),
            strict=True,
        ))
    )


def _correlated_rows(
    con: sqlite3.Connection, names: dict[int, str], missing: I64, alloc_op_id: int, uri: str,
    memory_table: str,
) -> ApiCalls:
    """The rows of calls other than allocation calls with the ``missing`` correlation ids: a
    second pass, for a memory table too large to fold into the first."""
    alloc_ids = _ids(names, ALLOCATION_CALLS)
    if len(missing) <= LITERAL_IDS:
        ids = ",".join(str(int(c)) for c in missing)
    else:
        ids = f"SELECT correlationId FROM {memory_table} WHERE memoryOperationType = {alloc_op_id}"
    start, gtid, corr, flags = _select(
        con, f"correlationId IN ({ids}) AND coalesce(nameId NOT IN ({alloc_ids}), 1)", alloc_ids,
        "NULL", uri, chunked=len(missing) <= LITERAL_IDS, kept=len(missing),
    )
    kept = (flags & _VALID) != 0
    return _api_calls(start[kept], gtid[kept], corr[kept], flags[kept])


def _take(api: ApiCalls, kept: np.ndarray) -> ApiCalls:
    return ApiCalls(
        api.start_ns[kept], api.pid[kept], api.tid[kept], api.correlation_id[kept],
        api.is_runtime[kept], api.is_failed_allocation[kept],
    )


def _row_range(con: sqlite3.Connection, table: str, key: str) -> tuple[int, int] | None:
    """``table``'s first and last ``key``: an index lookup each (SQLite looks a min() or a
    max() up in the b-tree only when it is alone in its SELECT; both in one scan the table)."""
    lo, hi = db.query(con, f"SELECT (SELECT min({key}) FROM {table}), (SELECT max({key}) FROM {table})")[0]
    return None if lo is None else (int(lo), int(hi))


def _select(
    con: sqlite3.Connection, where: str, alloc_ids: str, vmm_ids: str, uri: str,
    chunked: bool = True, kept: int | None = None,
) -> list[I64]:
    """start, globalTid, correlationId and the flags (``_RUNTIME`` ...) of the rows ``where``
    selects, in row order. A NULL or a non-integer start, thread or correlation id reads as 0
    without ``_VALID``: every value is an integer, so the compiled reader never gives up on
    one, and a VMM call is counted whatever its other columns hold. ``kept`` is about how many
    rows ``where`` keeps, when known: SQLite skips the others as fast in either reader, so
    where few are kept its own query (no compiler to import) is as soon done as the compiled one
    (6 M launches and 7 rows kept: 0.66 s against 1.5 s, the compiler's import included, and 37
    against 148 MiB, at load 10)."""
    checked = [f"CASE WHEN typeof({c}) = 'integer' THEN {c} ELSE 0 END" for c in _API_REQUIRED]
    valid = " AND ".join(f"typeof({c}) = 'integer'" for c in _API_REQUIRED)
    flags = (
        f"coalesce(eventClass = 0, 0) * {_RUNTIME}"
        f" + coalesce(nameId IN ({alloc_ids}) AND returnValue != 0, 0) * {_FAILED}"
        f" + coalesce(nameId IN ({alloc_ids}), 0) * {_ALLOCATION}"
        f" + coalesce(nameId IN ({vmm_ids}), 0) * {_VMM}"
        f" + ({valid}) * {_VALID}"
    )
    columns = [*checked, flags]
    # The compiled reader has no work budget (export_file.WorkBudget): it reads tables, not views.
    key = db.row_order(con, RUNTIME_TABLE)
    rows = _row_range(con, RUNTIME_TABLE, key) if key is not None else None
    if rows is not None:
        length = rows[1] - rows[0] + 1
        if not interpreted.interpret(length if kept is None else kept):
            compiled = _compiled_select(uri, columns, where, key, *rows)  # type: ignore[arg-type]
            if compiled is not None:
                return compiled
        if length >= 2 * _SPLIT_ROWS:
            return _split_select(uri, columns, where, key, *rows, chunked)  # type: ignore[arg-type]
    return db.int_columns(con, columns, RUNTIME_TABLE, where, chunked)


def _split_select(
    uri: str, columns: list[str], where: str, key: str, lo: int, hi: int, chunked: bool
) -> list[I64]:
    """:func:`_select` through SQLite's own queries, the rowids' two halves on two threads and
    connections of their own (Python's sqlite3 releases the GIL while SQLite steps), joined in
    order: a table, as for the compiled reader, never a view."""

    def half(span: tuple[int, int]) -> list[I64]:
        with closing(sqlite3.connect(uri, uri=True)) as own:
            where_span = f"({where}) AND {key} BETWEEN {span[0]} AND {span[1]}"
            return db.int_columns(own, columns, RUNTIME_TABLE, where_span, chunked)

    with ThreadPoolExecutor(max_workers=2) as pool:
        first, second = pool.map(half, _halves(lo, hi))
    return [np.concatenate([a, b]) for a, b in zip(first, second, strict=True)]


def _halves(lo: int, hi: int) -> list[tuple[int, int]]:
    mid = lo + (hi - lo) // 2
    return [(lo, mid), (mid + 1, hi)]


def _compiled_select(
    uri: str, columns: list[str], where: str, key: str, lo: int, hi: int
) -> list[I64] | None:
    """:func:`_select` by the compiled reader: the rowids' two halves on two threads (SQLite
    releases the GIL while it steps), joined in order; None where the reader declines."""
    select = f"SELECT {', '.join(columns)} FROM {RUNTIME_TABLE} WHERE ({where})"
    if hi - lo + 1 < 2 * _SPLIT_ROWS:
        return sqlite_columns.read_int_columns(uri, select, len(columns), 1 << 16)
    with ThreadPoolExecutor(max_workers=2) as pool:
        halves = list(pool.map(
            lambda r: sqlite_columns.read_int_columns(
                uri, f"{select} AND {key} BETWEEN {r[0]} AND {r[1]}", len(columns), 1 << 14
            ),
            _halves(lo, hi),
        ))
    if any(h is None for h in halves):
        return None
    return [np.concatenate([a, b]) for a, b in zip(*halves, strict=True)]  # type: ignore[misc]


def _api_calls(start: I64, gtid: I64, corr: I64, flags: I64) -> ApiCalls:
    """API rows from their columns: start, globalTid, correlationId, and flags (``_RUNTIME``,
    ``_FAILED``)."""
    pid, tid = split_global_id(gtid)
    return ApiCalls(
        start_ns=start,
        pid=pid,
        tid=tid,
        correlation_id=correlation_ids(corr),
        is_runtime=(flags & _RUNTIME).astype(np.bool_),
        is_failed_allocation=(flags & _FAILED).astype(np.bool_),
    )
