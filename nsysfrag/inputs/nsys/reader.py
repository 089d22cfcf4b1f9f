"""Read an nsys SQLite export into columnar events.

With ``api_calls`` (the runtime table), the only module that knows nsys table and column names. It discovers tables and columns rather
than assuming them, because nsys creates tables lazily and has renamed some across versions
(see NSYS_SCHEMA.md), and it opens the file read-only: a user's trace is never modified.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from nsysfrag import interpreted
from nsysfrag.errors import InputError
from nsysfrag.events import I64, ProgressCallback
from nsysfrag.inputs.files import display_path
import nsysfrag.inputs.nsys.export_file as export_file
import nsysfrag.inputs.nsys.sqlite_columns as sqlite_columns
import nsysfrag.inputs.nsys.sqlite_pages as sqlite_pages
import nsysfrag.inputs.nsys.target_info as target_info
import nsysfrag.inputs.nsys.sqlite_tables as db
from nsysfrag.inputs.nsys.api_calls import (
    LITERAL_IDS,
    RUNTIME_TABLE,
    correlation_ids,
    read_correlated_api,
    read_runtime,
)
from nsysfrag.inputs.nsys.records import (
    ALLOCATION_CALLS,
    ALLOCATION_OPERATION_NAME,
    DEALLOCATION_OPERATION_NAME,
    DEFAULT_ALLOCATION_ID,
    DEFAULT_DEALLOCATION_ID,
    MODELLED_KIND_NAMES,
    NVTX_PUSH_POP,
    NVTX_START_END,
    VMM_CALLS,
    MemoryEvents,
    NvtxRanges,
    PoolRecords,
    Trace,
    api_base_name,
    split_global_id,
)

MEMORY_TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
# A memory pool's columns (nsys 2022.4 on), in the order ``_MemoryQuery.pools`` reads them.
POOL_COLUMNS = (
    "localMemoryPoolAddress",
    "localMemoryPoolReleaseThreshold",
    "localMemoryPoolSize",
    "localMemoryPoolUtilizedSize",
)
_POOLED_BIT = 62  # of the memory kind as read: the row's block came from a memory pool
REQUIRED_MEMORY_COLUMNS = (
    "start",
    "globalPid",
    "deviceId",
    "address",
    "bytes",
    "memKind",
    "memoryOperationType",
)
RECORD_COMMAND = (
    "nsys profile --trace=cuda,nvtx,osrt --cuda-memory-usage=true -o run <your program>"
    " && nsys export --type sqlite run.nsys-rep (or: nsysfrag profile -- <your program>)"
)


def read_trace(
    path: str | Path,
    require_memory_events: bool = True,
    progress: ProgressCallback | None = None,
) -> Trace:
    """Read the export at ``path``; raise :class:`InputError` with a fix for anything unusable.

    With ``require_memory_events=False`` an export recorded without memory tracking still reads
    (with no memory events), so its GPUs, API calls and NVTX ranges can be inspected.
    """
    path = Path(path)
    uri = export_file.database_uri(path, export_file.check_export_file(path))
    budget = export_file.WorkBudget(path)

    def connect() -> sqlite3.Connection:
        return budget.connect(uri)

    try:
        with closing(connect()) as con:
            return _read(connect, con, path, uri, require_memory_events, progress)
    except export_file.SQLITE_ERRORS as err:
        refused = budget.failure(path, err) or export_file.hot_journal(path, err)
        if refused is not None:
            raise InputError(refused) from None
        raise InputError(
            f"{path}: the SQLite database is corrupt or truncated ({_reason(err)});"
            " re-export it with `nsys export --type sqlite --force-overwrite=true`"
        ) from None
    finally:
        budget.close()


def _reason(err: BaseException) -> str:
    return export_file.error_text(err)


def _read(
    connect: Callable[[], sqlite3.Connection],
    con: sqlite3.Connection,
    path: Path,
    uri: str,
    require_memory_events: bool,
    progress: ProgressCallback | None,
) -> Trace:
    tables = db.table_kinds(con)
    if MEMORY_TABLE not in tables and not any(t.startswith(_NSYS_TABLE_PREFIXES) for t in tables):
        raise InputError(
            f"{path}: not an Nsight Systems export (it has none of the tables nsys writes);"
            " pass the .sqlite written by `nsys export --type sqlite`"
        )
    metadata = target_info.read_metadata(con, tables)
    if MEMORY_TABLE not in tables:
        if require_memory_events:
            raise InputError(_no_memory_table_message(con, tables, path, metadata))
    elif missing := [c for c in REQUIRED_MEMORY_COLUMNS if c not in db.column_names(con, MEMORY_TABLE)]:
        raise InputError(
            f"{path}: {MEMORY_TABLE} lacks column(s) {', '.join(missing)}; this is not an"
            " export nsysfrag understands — re-export it with a current `nsys export --type sqlite`"
        )
    query = _MemoryQuery.plan(con, tables)
    # SQLite releases the GIL while it scans, so two halves of the memory table's columns and
    # the API calls are read on connections of their own, in parallel, while this one reads the
    # small tables.
    names = _api_names(con, tables)
    # One pass over the runtime table reads every call needed; with a small memory table it
    # includes the calls its allocations name by correlation id (a real export's table is
    # mostly launches: a second pass would cost as much as the first).
    correlated_from = (
        MEMORY_TABLE if query.has_correlation and query.total_rows <= LITERAL_IDS else None
    )
    with ThreadPoolExecutor(max_workers=4) as pool:
        calls = pool.submit(
            _on_own_connection, connect,
            lambda c: read_runtime(
                c, tables, names, uri, correlated_from, query.alloc_op_id, (path, query.total_rows)
            ),
        )
        compiled = pool.submit(
            _on_own_connection, connect, lambda c: query.compiled(c, uri, pool, progress, path)
        )
        nvtx = _read_nvtx(con, tables)
        halves = compiled.result()
        if halves is None:
            positions = pool.submit(
                _on_own_connection, connect, lambda c: query.positions(c, progress)
            )
            kinds = pool.submit(_on_own_connection, connect, query.kinds)
            try:
                halves = positions.result(), kinds.result()
                if len({len(a) for half in halves for a in half}) > 1:
                    raise db.NotAllIntegers()
                where = "1"
            except db.NotAllIntegers:
                halves = query.filtered(con)
                where = query.valid_rows()
        else:
            where = "1"
        # Some row's block came from a pool (its memory kind has the bit set).
        pooled = bool(query.has_pools and halves[1] and (halves[1][2] >= 1 << _POOLED_BIT).any())
        memory = query.events(*halves, pools=query.pools(con, where) if pooled else None)
        del halves  # the scan's array: MemoryEvents keeps what it needs
        runtime = calls.result()
        api = read_correlated_api(
            con, tables, names, memory, runtime, query.alloc_op_id, uri, MEMORY_TABLE
        )
    vmm_calls = runtime.vmm_calls
    if vmm_calls is None:  # the table lacks a column the pass reads, maybe not nameId
        vmm_calls = _count_calls(con, names, (VMM_CALLS,))[0]
    return Trace(
        path=display_path(path),
        nsys_version=metadata.get("EXPORT_PRODUCT_VERSION"),
        memory=memory,
        api=api,
        nvtx=nvtx,
        gpus=target_info.read_gpus(con, tables),
        cuda_devices=target_info.read_cuda_devices(con, tables),
        process_names=target_info.read_process_names(con, tables),
        skipped_rows=query.total_rows - len(memory),
        # Every row of an allocation call was read (those with a NULL start, thread or
        # correlation id aside).
        allocation_calls=len(runtime.allocations.start_ns),
        vmm_calls=vmm_calls,
    )


T = TypeVar("T")


def _on_own_connection(
    connect: Callable[[], sqlite3.Connection], read: Callable[[sqlite3.Connection], T]
) -> T:
    with closing(connect()) as con:
        return read(con)


# Every nsys export has TARGET_INFO_* tables and export metadata (checked on every real export
# from 2022.2 to 2026.1); a database with none of them comes from another program.
_NSYS_TABLE_PREFIXES = ("TARGET_INFO_", "META_DATA_", "EXPORT_META_DATA")


def _no_memory_table_message(
    con: sqlite3.Connection, tables: dict[str, str], path: Path, metadata: dict[str, str]
) -> str:
    flags = [v for k, v in metadata.items() if k.endswith("COLLECT_GPU_MEMORY_USAGE")]
    if flags and all(v.lower() == "false" for v in flags):
        why = "it was recorded without --cuda-memory-usage=true (META_DATA_CAPTURE says so)"
    elif flags:
        why = "memory tracking was on but no allocation was recorded in the capture range"
    else:
        why = "it has no CUDA memory events; it was probably recorded without --cuda-memory-usage=true"
    seen = _count_calls(con, _api_names(con, tables), (ALLOCATION_CALLS,))[0]
    calls = f" ({seen} allocation API call(s) were traced but not their memory)" if seen else ""
    return f"{path}: {why}{calls}; record it again with: {RECORD_COMMAND}"


def _api_names(con: sqlite3.Connection, tables: dict[str, str]) -> dict[int, str]:
    """nameId -> API name without its version suffix, for the allocation and VMM calls (the
    only names we look for; the string table is small next to the runtime table)."""
    # Names are only looked for where they can be counted (_count_calls reads nameId).
    if not (db.has_columns(con, tables, RUNTIME_TABLE, "nameId") and db.has_columns(con, tables, "StringIds", "id", "value")):
        return {}
    wanted = ALLOCATION_CALLS | VMM_CALLS
    names = {}
    # Every wanted name starts with "cu" and is short: the filter keeps the (possibly huge)
    # other strings in SQLite. Ids go into SQL text later, so only integers are kept.
    for i, value in db.query(
        con, "SELECT id, value FROM StringIds WHERE value GLOB 'cu*' AND length(value) <= 128"
    ):
        if isinstance(i, int) and isinstance(value, str) and (name := api_base_name(value)) in wanted:
            names[i] = name
    return names


def _count_calls(
    con: sqlite3.Connection, names: dict[int, str], groups: tuple[frozenset[str], ...]
) -> list[int]:
    """How many runtime rows call a name of each group, in one scan."""
    sums = []
    for wanted in groups:
        ids = ",".join(str(i) for i, n in names.items() if n in wanted)
        sums.append(f"coalesce(sum(nameId IN ({ids})), 0)" if ids else "0")
    if all(s == "0" for s in sums):  # no such name in the trace: no need to scan it
        return [0] * len(groups)
    return [int(v) for v in db.query(con, f"SELECT {', '.join(sums)} FROM {RUNTIME_TABLE}")[0]]


def _enum_ids(con: sqlite3.Connection, tables: dict[str, str], table: str) -> dict[str, int]:
    if not db.has_columns(con, tables, table, "id", "name"):
        return {}
    # Ids go into SQL text and numpy arrays: only integers count.
    return {
        n: i
        for i, n in db.query(con, f"SELECT id, name FROM {table}")
        if isinstance(n, str) and isinstance(i, int)
    }


@dataclass(frozen=True)
class _MemoryQuery:
    """How to read the memory table of this export into arrays."""

    has_correlation: bool
    total_rows: int
    has_pools: bool = False  # the table has the local memory pool columns (nsys 2022.4 on)
    modelled_kinds: tuple[int, ...] = ()
    alloc_op_id: int = DEFAULT_ALLOCATION_ID
    free_op_id: int = DEFAULT_DEALLOCATION_ID

    @classmethod
    def plan(cls, con: sqlite3.Connection, tables: dict[str, str]) -> _MemoryQuery:
        if MEMORY_TABLE not in tables:
            return cls(False, 0)
        kinds = _enum_ids(con, tables, "ENUM_CUDA_MEM_KIND")
        # By name; a name the table lacks (schema 2.x has no table; a damaged one lost the row)
        # keeps its usual id, unless the table gives that id to another kind.
        modelled = [
            kinds.get(name, usual)
            for name, usual in MODELLED_KIND_NAMES.items()
            if name in kinds or usual not in kinds.values()
        ]
        opers = _enum_ids(con, tables, "ENUM_CUDA_DEV_MEM_EVENT_OPER")
        columns = db.column_names(con, MEMORY_TABLE)
        return cls(
            has_correlation="correlationId" in columns,
            has_pools=set(POOL_COLUMNS) <= columns,
            total_rows=int(db.query(con, f"SELECT count(*) FROM {MEMORY_TABLE}")[0][0]),
            modelled_kinds=tuple(modelled),
            alloc_op_id=opers.get(ALLOCATION_OPERATION_NAME, DEFAULT_ALLOCATION_ID),
            free_op_id=opers.get(DEALLOCATION_OPERATION_NAME, DEFAULT_DEALLOCATION_ID),
        )

    # The columns, in two halves that separate connections read in parallel.
    _POSITIONS = ("start", "address", "bytes")
    _KINDS = ("globalPid", "deviceId", "memKind", "memoryOperationType")

    def _correlation(self) -> str:
        return "coalesce(correlationId, -1)" if self.has_correlation else "-1"

    def _kinds(self) -> list[str]:
        # Whether a row's block came from a pool rides in the memory kind's bit 62: no column
        # more to hold (16 MB per 2 M rows), and no query of its own (half a scan more). A
        # bitwise OR cannot overflow; memory kinds are small enum ids.
        if not self.has_pools:
            return list(self._KINDS)
        return [*self._KINDS[:2], f"(memKind | (({POOL_COLUMNS[0]} IS NOT NULL) << {_POOLED_BIT}))",
                *self._KINDS[3:]]  # fmt: skip

    def pools(self, con: sqlite3.Connection, where: str) -> list[I64]:
        """The pool columns of every row ``where`` selects (NULL: 0), in row order: read only
        when some row came from a pool."""
        integer = [f"CASE WHEN typeof({c}) = 'integer' THEN {c} ELSE 0 END" for c in POOL_COLUMNS]
        return db.int_columns(con, integer, MEMORY_TABLE, where)

    def positions(self, con: sqlite3.Connection, progress: ProgressCallback | None = None) -> list[I64]:
        total = self.total_rows

        def loaded(rows: int) -> None:
            if progress is not None:
                progress("loading rows", rows, total)

        if self.total_rows == 0:
            return []
        columns = [*self._POSITIONS, self._correlation()]
        return db.int_columns(con, columns, MEMORY_TABLE, on_rows=loaded)

    def kinds(self, con: sqlite3.Connection) -> list[I64]:
        if self.total_rows == 0:
            return []
        return db.int_columns(con, self._kinds(), MEMORY_TABLE)

    def compiled(
        self,
        con: sqlite3.Connection,
        uri: str,
        pool: ThreadPoolExecutor,
        progress: ProgressCallback | None,
        path: Path,
    ) -> tuple[list[I64], list[I64]] | None:
        """Both halves from the file's pages (``sqlite_pages``), else through SQLite's C API
        (``sqlite_columns``), two row ranges on two threads; None when neither path is
        available or meets anything unusual."""
        key = db.row_order(con, MEMORY_TABLE)
        if self.total_rows == 0 or key is None:
            return None
        arrays = self._from_pages(con, path)
        if arrays is not None:
            if progress is not None:
                progress("loading rows", self.total_rows, self.total_rows)
            return arrays[:4], arrays[4:]
        if interpreted.interpret(self.total_rows):  # the portable path is done before it compiles
            return None
        if not sqlite_columns.available():
            return None
        lo, hi = db.query(
            con, f"SELECT (SELECT min({key}) FROM {MEMORY_TABLE}), (SELECT max({key}) FROM {MEMORY_TABLE})"
        )[0]
        if lo is None:
            return None
        lo, hi = int(lo), int(hi)
        # Each half's row count is known, so both threads fill one shared array, with no
        # concatenation afterwards. nsys writes rowids 1..N without gaps, where the split is
        # plain arithmetic; otherwise SQLite finds the middle rowid by walking its index.
        first_rows = (self.total_rows + 1) // 2
        if hi - lo + 1 == self.total_rows:
            mid = lo + first_rows - 1
        else:
            mid = int(
                db.query(
                    con,
                    f"SELECT {key} FROM {MEMORY_TABLE} ORDER BY {key} LIMIT 1 OFFSET {first_rows - 1}",
                )[0][0]
            )
        columns = ", ".join([*self._POSITIONS, self._correlation(), *self._kinds()])
        loaded = [0, 0]
        shared = np.empty((8, self.total_rows), dtype=np.int64)

        def reader(part: int, first: int, last: int, rows: slice) -> list[I64] | None:
            def on_rows(n: int) -> None:
                loaded[part] = n
                if progress is not None:
                    progress("loading rows", sum(loaded), self.total_rows)

            sql = f"SELECT {columns} FROM {MEMORY_TABLE} WHERE {key} BETWEEN {first} AND {last}"
            window = shared[:, rows]
            return sqlite_columns.read_int_columns(uri, sql, 8, window.shape[1], on_rows, window)

        halves = [
            pool.submit(reader, 0, lo, mid, slice(0, first_rows)),
            pool.submit(reader, 1, mid + 1, hi, slice(first_rows, self.total_rows)),
        ]
        if any(h.result() is None for h in halves):
            return None
        arrays = list(shared)
        return arrays[:4], arrays[4:]

    def _from_pages(self, con: sqlite3.Connection, path: Path) -> list[I64] | None:
        """Every column the halves hold, decoded from the table's pages; None where the
        table's records may not hold exactly its declared columns in order (generated or
        rowid-alias columns) or ``sqlite_pages`` declines."""
        index = sqlite_pages.record_columns(con, MEMORY_TABLE)
        if index is None:
            return None

        def at(name: str) -> int:
            return index.get(name.lower(), -1)

        columns = [sqlite_pages.Column(at(c)) for c in self._POSITIONS]
        if self.has_correlation:
            columns.append(sqlite_pages.Column(at("correlationId"), sqlite_pages.INTEGER_OR_MINUS_ONE))
        kinds = [sqlite_pages.Column(at(c)) for c in self._KINDS]
        if self.has_pools:
            kinds[2] = sqlite_pages.Column(at("memKind"), sqlite_pages.FLAGGED, at(POOL_COLUMNS[0]))
        wanted = [*columns, *kinds]
        if any(c.index < 0 or c.other < 0 for c in wanted):
            return None
        arrays = sqlite_pages.read_columns(path.resolve(), con, MEMORY_TABLE, wanted, self.total_rows)
        if arrays is None:
            return None
        if not self.has_correlation:
            arrays.insert(3, np.full(self.total_rows, -1, dtype=np.int64))
        return arrays

    def valid_rows(self) -> str:
        """The rows whose columns the replay needs are all integers (NULL correlation ids
        aside)."""
        valid = " AND ".join(f"typeof({c}) = 'integer'" for c in REQUIRED_MEMORY_COLUMNS)
        if self.has_correlation:
            valid += " AND typeof(coalesce(correlationId, 0)) = 'integer'"
        return valid

    def filtered(self, con: sqlite3.Connection) -> tuple[list[I64], list[I64]]:
        """Both halves in one scan that skips rows with a NULL or non-integer where the replay
        needs a number: slower, so only for a trace that needs it."""
        columns = [*self._POSITIONS, self._correlation(), *self._kinds()]
        arrays = db.int_columns(con, columns, MEMORY_TABLE, self.valid_rows())
        return arrays[:4], arrays[4:]

    def events(
        self, positions: list[I64], kinds: list[I64], pools: list[I64] | None = None
    ) -> MemoryEvents:
        """The memory events from the columns read, and ``pools`` (the pool columns of the
        same rows, when some row came from a pool)."""
        if self.total_rows == 0:
            return _no_memory_events()
        start, address, nbytes, corr = positions
        gpid, device, kind, op = kinds
        columns = [start, address, nbytes, corr, gpid, device, kind, op]
        if pools and len(pools[0]) == len(start):
            pooled = kind >> _POOLED_BIT & 1
            columns[6] = kind & ~(1 << _POOLED_BIT)
            columns += [pooled, *pools]
        # Negative sizes and unknown operations are skipped (and counted) too.
        keep = (nbytes >= 0) & ((op == self.alloc_op_id) | (op == self.free_op_id))
        if not keep.all():
            columns = [a[keep] for a in columns]
        # Events are ordered by start, ties by row order. A table scan returns rows in
        # rowid order, so a stable sort on start is enough, and none when nsys wrote them in
        # time order already (the usual case: no copy then).
        start = columns[0]
        if np.any(start[1:] < start[:-1]):
            order = np.argsort(start, kind="stable")
            columns = [a[order] for a in columns]
        start, address, nbytes, corr, gpid, device, kind, op = columns[:8]
        pid, _ = split_global_id(gpid)
        if start.base is not None and start.base is kind.base:
            # Rows of the one array SQLite's reader filled: the kept ones are copied out so
            # that the rest (process ids, kinds, operations: 48 MB per 2 M rows) is freed. The
            # page decoder gives each column an array of its own: nothing to copy.
            start, address, nbytes, corr, device = (
                np.array(a) for a in (start, address, nbytes, corr, device)
            )
        return MemoryEvents(
            start_ns=start,
            pid=pid,
            device=device,
            # Reinterpret the signed 64-bit value as the unsigned address it stands for.
            address=address.view(np.uint64),
            bytes=nbytes,
            is_free=op == self.free_op_id,
            modelled=np.isin(kind, self.modelled_kinds),
            correlation_id=correlation_ids(corr),
            pools=_pool_records(*columns[8:]) if len(columns) > 8 else None,
        )


def _pool_records(
    pooled: I64, address: I64, threshold: I64, size: I64, utilized: I64
) -> PoolRecords:
    """The pool of each row (-1: none; else a code per distinct pool address) and its sizes."""
    flagged = pooled != 0
    codes = np.full(len(address), -1, dtype=np.int64)
    if flagged.any():
        _, codes[flagged] = np.unique(address[flagged], return_inverse=True)
    # What a trim keeps: the bytes in use, and the release threshold the pool keeps anyway. A
    # damaged (negative) figure counts as none.
    kept = np.maximum(np.maximum(utilized, threshold), 0)
    return PoolRecords(codes, np.maximum(size, 0), kept)


def _no_memory_events() -> MemoryEvents:
    empty = np.zeros(0, dtype=np.int64)
    no = empty.astype(np.bool_)
    return MemoryEvents(empty, empty, empty, empty.view(np.uint64), empty, no, no, empty)


def _read_nvtx(con: sqlite3.Connection, tables: dict[str, str]) -> NvtxRanges:
    cols = db.column_names(con, "NVTX_EVENTS") if "NVTX_EVENTS" in tables else set()
    if not {"start", "end", "eventType", "globalTid"} <= cols:
        empty = np.zeros(0, dtype=np.int64)
        return NvtxRanges(empty, empty, empty, empty, empty.astype(bool), [])
    # Unregistered strings are in `text`, registered ones (nvtxDomainRegisterString) in `textId`.
    text = "n.text" if "text" in cols else "NULL"
    text_id = "n.textId" if "textId" in cols and db.has_columns(con, tables, "StringIds", "id", "value") else "NULL"
    ranges = (
        f"n.eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END})"
        " AND typeof(n.start) = 'integer' AND typeof(n.end) = 'integer'"
        " AND typeof(n.globalTid) = 'integer' AND n.end > n.start"
    )
    rows = db.query(
        con,
        f"SELECT n.start, n.end, n.globalTid, n.eventType = {NVTX_PUSH_POP}, {text}, {text_id}"
        f" FROM NVTX_EVENTS n WHERE {ranges}{db.order_by(con, 'NVTX_EVENTS', 'n.')}",
    )
    # Each registered string once (many ranges share one, and it may be huge), not per range.
    registered: dict[int, str] = {}
    if text_id != "NULL":
        for i, value in db.query(
            con,
            "SELECT id, value FROM StringIds WHERE id IN"
            f" (SELECT n.textId FROM NVTX_EVENTS n WHERE {text} IS NULL AND {ranges})"
            f"{db.order_by(con, 'StringIds')}",
        ):
            if isinstance(value, str):
                registered.setdefault(i, value)
    c = list(zip(*rows)) if rows else [()] * 6
    pid, tid = split_global_id(np.asarray(c[2], dtype=np.int64))
    return NvtxRanges(
        start_ns=np.asarray(c[0], dtype=np.int64),
        end_ns=np.asarray(c[1], dtype=np.int64),
        pid=pid,
        tid=tid,
        is_push_pop=np.asarray(c[3], dtype=np.bool_),
        text=[
            t if isinstance(t, str) else registered.get(i, _UNNAMED) if t is None else _UNNAMED
            for t, i in zip(c[4], c[5], strict=True)
        ],
    )


_UNNAMED = "(unnamed range)"
