"""Read an nsys SQLite export into columnar events.

The only module that knows nsys table and column names. It discovers tables and columns rather
than assuming them, because nsys creates tables lazily and has renamed some across versions
(see NSYS_SCHEMA.md), and it opens the file read-only: a user's trace is never modified.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nsysfrag.errors import InputError
from nsysfrag.inputs.nsys import sqlite_columns
from nsysfrag.inputs.nsys.records import (
    ALLOCATION_CALLS,
    ALLOCATION_OPERATION_NAME,
    DEALLOCATION_OPERATION_NAME,
    DEFAULT_ALLOCATION_ID,
    DEFAULT_DEALLOCATION_ID,
    I64,
    MODELLED_KIND_NAMES,
    NVTX_PUSH_POP,
    NVTX_START_END,
    VMM_CALLS,
    ApiCalls,
    Gpu,
    MemoryEvents,
    NvtxRanges,
    ProgressCallback,
    Trace,
    api_base_name,
    split_global_id,
)

MEMORY_TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
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
_SQLITE_MAGIC = b"SQLite format 3\x00"


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
    _check_file(path)
    engine = sa.create_engine(
        "sqlite://",
        creator=lambda: sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True),
        poolclass=sa.pool.NullPool,
    )
    try:
        with engine.connect() as con:
            return _read(engine, con, path, require_memory_events, progress)
    except sa.exc.DatabaseError as err:
        raise InputError(
            f"{path}: the SQLite database is corrupt or truncated ({_reason(err)});"
            " re-export it with `nsys export --type sqlite --force-overwrite=true`"
        ) from None
    finally:
        engine.dispose()


def _reason(err: sa.exc.DBAPIError) -> str:
    return str(err.orig).splitlines()[0] if err.orig is not None else "unknown error"


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file; pass the .sqlite that `nsys export` wrote")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass a trace file (.sqlite or .nsys-rep)")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied; make the file readable")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty; record and export the trace again")
    with path.open("rb") as f:
        head = f.read(len(_SQLITE_MAGIC))
    if head != _SQLITE_MAGIC:
        if path.suffix in {".nsys-rep", ".qdrep"}:
            raise InputError(
                f"{path}: this is an nsys report, not its SQLite export; run"
                f" `nsys export --type sqlite {path}` and analyze the .sqlite"
            )
        raise InputError(
            f"{path}: not an SQLite database; pass the .sqlite written by"
            " `nsys export --type sqlite`"
        )


# Where nsys records the report it exported, most specific first: 2022.x wrote EXPORT_INPUT_*,
# 2023.3 and later EXPORT_PARAM_INPUT_*; *_PATH is relative in some versions.
_INPUT_KEYS = (
    "EXPORT_PARAM_INPUT_PATH_ABS",
    "EXPORT_INPUT_PATH_ABS",
    "EXPORT_PARAM_INPUT_PATH",
    "EXPORT_INPUT_PATH",
    "EXPORT_PARAM_INPUT_FILE",
    "EXPORT_INPUT_FILE",
)


def export_inputs(export: Path) -> list[str]:
    """The report paths an export's metadata names as its input, most specific first; empty
    for a file that is not an nsys export (read-only: it may be a user's unrelated database)."""
    try:
        con = sqlite3.connect(f"file:{quote(str(export.resolve()))}?mode=ro", uri=True)
    except sqlite3.Error:
        return []
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        values: dict[str, str] = {}
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if table in tables:
                for name, value in con.execute(f"SELECT name, value FROM {table}"):
                    if name in _INPUT_KEYS and isinstance(value, str) and value:
                        values.setdefault(name, value)
        return [values[k] for k in _INPUT_KEYS if k in values]
    except sqlite3.Error:
        return []
    finally:
        con.close()


def _tables(con: Connection) -> set[str]:
    rows = con.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    return {r[0] for r in rows}


def _columns(con: Connection, table: str) -> set[str]:
    return {r[1] for r in con.exec_driver_sql(f"PRAGMA table_info('{table}')").fetchall()}


def _rows(con: Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    return list(con.exec_driver_sql(sql, tuple(params)).fetchall())


def _read(
    engine: sa.Engine,
    con: Connection,
    path: Path,
    require_memory_events: bool,
    progress: ProgressCallback | None,
) -> Trace:
    tables = _tables(con)
    metadata = _metadata(con, tables)
    if MEMORY_TABLE not in tables:
        if require_memory_events:
            raise InputError(_no_memory_table_message(con, tables, path, metadata))
    elif missing := [c for c in REQUIRED_MEMORY_COLUMNS if c not in _columns(con, MEMORY_TABLE)]:
        raise InputError(
            f"{path}: {MEMORY_TABLE} lacks column(s) {', '.join(missing)}; this is not an"
            " export nsysfrag understands — re-export it with a current `nsys export --type sqlite`"
        )
    query = _MemoryQuery.plan(con, tables)
    # SQLite releases the GIL while it scans, so two halves of the memory table's columns and
    # the API calls are read on connections of their own, in parallel, while this one reads the
    # small tables.
    names = _api_names(con, tables)
    with ThreadPoolExecutor(max_workers=4) as pool:
        calls = pool.submit(_on_own_connection, engine, lambda c: _read_api(c, tables, names))
        compiled = pool.submit(
            _on_own_connection, engine, lambda c: query.compiled(c, path, pool, progress)
        )
        nvtx = _read_nvtx(con, tables)
        vmm_calls = _count_calls(con, names, (VMM_CALLS,))[0]
        halves = compiled.result()
        if halves is None:
            positions = pool.submit(
                _on_own_connection, engine, lambda c: query.positions(c, progress)
            )
            kinds = pool.submit(_on_own_connection, engine, query.kinds)
            try:
                halves = positions.result(), kinds.result()
                if len({len(a) for half in halves for a in half}) > 1:
                    raise _NotAllIntegers()
            except _NotAllIntegers:
                halves = query.filtered(con)
        memory = query.events(*halves)
        allocation_calls = calls.result()
        api = _read_correlated_api(
            con, tables, names, memory, allocation_calls, query.alloc_op_id
        )
    return Trace(
        path=str(path),
        nsys_version=metadata.get("EXPORT_PRODUCT_VERSION"),
        memory=memory,
        api=api,
        nvtx=nvtx,
        gpus=_read_gpus(con, tables),
        cuda_devices=_read_cuda_devices(con, tables),
        process_names=_read_process_names(con, tables),
        skipped_rows=query.total_rows - len(memory),
        # Every row of an allocation call was read (those with a NULL start, thread or
        # correlation id aside).
        allocation_calls=len(allocation_calls.start_ns),
        vmm_calls=vmm_calls,
    )


T = TypeVar("T")


def _on_own_connection(engine: sa.Engine, read: Callable[[Connection], T]) -> T:
    with engine.connect() as con:
        return read(con)


def _metadata(con: Connection, tables: set[str]) -> dict[str, str]:
    """Export and capture metadata; the export table was renamed in nsys 2023.3."""
    found: dict[str, str] = {}
    for table in ("EXPORT_META_DATA", "META_DATA_EXPORT", "META_DATA_CAPTURE"):
        if table in tables and {"name", "value"} <= _columns(con, table):
            for name, value in _rows(con, f"SELECT name, value FROM {table}"):
                if isinstance(name, str) and value is not None:
                    found.setdefault(name, str(value))
    return found


def _no_memory_table_message(
    con: Connection, tables: set[str], path: Path, metadata: dict[str, str]
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


def _api_names(con: Connection, tables: set[str]) -> dict[int, str]:
    """nameId -> API name without its version suffix, for the allocation and VMM calls (the
    only names we look for; the string table is small next to the runtime table)."""
    if RUNTIME_TABLE not in tables or "StringIds" not in tables:
        return {}
    wanted = ALLOCATION_CALLS | VMM_CALLS
    names = {}
    for i, value in _rows(con, "SELECT id, value FROM StringIds"):
        if isinstance(value, str) and (name := api_base_name(value)) in wanted:
            names[i] = name
    return names


def _count_calls(
    con: Connection, names: dict[int, str], groups: tuple[frozenset[str], ...]
) -> list[int]:
    """How many runtime rows call a name of each group, in one scan."""
    sums = []
    for wanted in groups:
        ids = ",".join(str(i) for i, n in names.items() if n in wanted)
        sums.append(f"coalesce(sum(nameId IN ({ids})), 0)" if ids else "0")
    if all(s == "0" for s in sums):  # no such name in the trace: no need to scan it
        return [0] * len(groups)
    return [int(v) for v in _rows(con, f"SELECT {', '.join(sums)} FROM {RUNTIME_TABLE}")[0]]


def _enum_ids(con: Connection, tables: set[str], table: str) -> dict[str, int]:
    if table not in tables or not {"id", "name"} <= _columns(con, table):
        return {}
    return {n: i for i, n in _rows(con, f"SELECT id, name FROM {table}") if isinstance(n, str)}


@dataclass(frozen=True)
class _MemoryQuery:
    """How to read the memory table of this export into arrays."""

    has_correlation: bool
    total_rows: int
    modelled_kinds: tuple[int, ...] = ()
    alloc_op_id: int = DEFAULT_ALLOCATION_ID
    free_op_id: int = DEFAULT_DEALLOCATION_ID

    @classmethod
    def plan(cls, con: Connection, tables: set[str]) -> _MemoryQuery:
        if MEMORY_TABLE not in tables:
            return cls(False, 0)
        kinds = _enum_ids(con, tables, "ENUM_CUDA_MEM_KIND")
        modelled = (
            [kinds[n] for n in MODELLED_KIND_NAMES if n in kinds]
            if kinds
            else list(MODELLED_KIND_NAMES.values())
        )
        opers = _enum_ids(con, tables, "ENUM_CUDA_DEV_MEM_EVENT_OPER")
        return cls(
            has_correlation="correlationId" in _columns(con, MEMORY_TABLE),
            total_rows=int(_rows(con, f"SELECT count(*) FROM {MEMORY_TABLE}")[0][0]),
            modelled_kinds=tuple(modelled),
            alloc_op_id=opers.get(ALLOCATION_OPERATION_NAME, DEFAULT_ALLOCATION_ID),
            free_op_id=opers.get(DEALLOCATION_OPERATION_NAME, DEFAULT_DEALLOCATION_ID),
        )

    # The columns, in two halves that separate connections read in parallel.
    _POSITIONS = ("start", "address", "bytes")
    _KINDS = ("globalPid", "deviceId", "memKind", "memoryOperationType")

    def _correlation(self) -> str:
        return "coalesce(correlationId, -1)" if self.has_correlation else "-1"

    def positions(self, con: Connection, progress: ProgressCallback | None = None) -> list[I64]:
        total = self.total_rows

        def loaded(rows: int) -> None:
            if progress is not None:
                progress("loading rows", rows, total)

        if self.total_rows == 0:
            return []
        columns = [*self._POSITIONS, self._correlation()]
        return _int_columns(con, columns, MEMORY_TABLE, on_rows=loaded)

    def kinds(self, con: Connection) -> list[I64]:
        if self.total_rows == 0:
            return []
        return _int_columns(con, list(self._KINDS), MEMORY_TABLE)

    def compiled(
        self,
        con: Connection,
        path: Path,
        pool: ThreadPoolExecutor,
        progress: ProgressCallback | None,
    ) -> tuple[list[I64], list[I64]] | None:
        """Both halves through SQLite's C API (``sqlite_columns``), two row ranges on two
        threads; None when that path is not available or meets anything unusual."""
        if self.total_rows == 0 or not sqlite_columns.available():
            return None
        lo, hi = _rows(con, f"SELECT (SELECT min(rowid) FROM {MEMORY_TABLE}), (SELECT max(rowid) FROM {MEMORY_TABLE})")[0]
        if lo is None:
            return None
        lo, hi = int(lo), int(hi)
        mid = (lo + hi) // 2
        columns = ", ".join([*self._POSITIONS, self._correlation(), *self._KINDS])
        loaded = [0, 0]
        # nsys writes rowids 1..N without gaps; then each half's row count is known and both
        # threads fill one shared array, with no concatenation afterwards.
        gapless = hi - lo + 1 == self.total_rows
        shared = np.empty((8, self.total_rows), dtype=np.int64) if gapless else None

        def reader(part: int, first: int, last: int) -> list[I64] | None:
            def on_rows(rows: int) -> None:
                loaded[part] = rows
                if progress is not None:
                    progress("loading rows", sum(loaded), self.total_rows)

            sql = f"SELECT {columns} FROM {MEMORY_TABLE} WHERE rowid BETWEEN {first} AND {last}"
            window = None if shared is None else shared[:, first - lo : last - lo + 1]
            rows = last - first + 1 if gapless else self.total_rows // 2 + 1
            return sqlite_columns.read_int_columns(path, sql, 8, rows, on_rows, window)

        halves = [pool.submit(reader, 0, lo, mid), pool.submit(reader, 1, mid + 1, hi)]
        parts = [h.result() for h in halves]
        if parts[0] is None or parts[1] is None:
            return None
        if shared is not None:
            arrays = list(shared)
        else:
            arrays = [np.concatenate([parts[0][c], parts[1][c]]) for c in range(8)]
        return arrays[:4], arrays[4:]

    def filtered(self, con: Connection) -> tuple[list[I64], list[I64]]:
        """Both halves in one scan that skips rows with a NULL or non-integer where the replay
        needs a number: slower, so only for a trace that needs it."""
        valid = " AND ".join(f"typeof({c}) = 'integer'" for c in REQUIRED_MEMORY_COLUMNS)
        if self.has_correlation:
            valid += " AND typeof(coalesce(correlationId, 0)) = 'integer'"
        columns = [*self._POSITIONS, self._correlation(), *self._KINDS]
        arrays = _int_columns(con, columns, MEMORY_TABLE, valid)
        return arrays[:4], arrays[4:]

    def events(self, positions: list[I64], kinds: list[I64]) -> MemoryEvents:
        if self.total_rows == 0:
            return _no_memory_events()
        start, address, nbytes, corr = positions
        gpid, device, kind, op = kinds
        # Negative sizes and unknown operations are skipped (and counted) too.
        keep = (nbytes >= 0) & ((op == self.alloc_op_id) | (op == self.free_op_id))
        if not keep.all():
            start, address, nbytes, corr, gpid, device, kind, op = (
                a[keep] for a in (start, address, nbytes, corr, gpid, device, kind, op)
            )
        # SPEC §1: events are ordered by start, ties by row order. A table scan returns rows in
        # rowid order, so a stable sort on start is enough, and none when nsys wrote them in
        # time order already (the usual case: no copy then).
        if np.any(start[1:] < start[:-1]):
            order = np.argsort(start, kind="stable")
            start, address, nbytes, corr, gpid, device, kind, op = (
                a[order] for a in (start, address, nbytes, corr, gpid, device, kind, op)
            )
        pid, _ = split_global_id(gpid)
        return MemoryEvents(
            start_ns=start,
            pid=pid,
            device=device,
            # Reinterpret the signed 64-bit value as the unsigned address it stands for.
            address=address.view(np.uint64),
            bytes=nbytes,
            is_free=op == self.free_op_id,
            modelled=np.isin(kind, self.modelled_kinds),
            correlation_id=corr,
        )


def _no_memory_events() -> MemoryEvents:
    empty = np.zeros(0, dtype=np.int64)
    no = empty.astype(np.bool_)
    return MemoryEvents(empty, empty, empty, empty.view(np.uint64), empty, no, no, empty)


class _NotAllIntegers(Exception):
    pass


CHUNK_ROWS = 250_000


def _int_columns(
    con: Connection,
    expressions: list[str],
    table: str,
    where: str = "1",
    chunked: bool = True,
    on_rows: Callable[[int], None] | None = None,
) -> list[I64]:
    """Integer columns of ``SELECT expressions FROM table WHERE where`` as arrays, in row order.

    Traces run to millions of rows, and a Python tuple per row is what makes the obvious
    ``fetchall`` slow: here SQLite joins each column into one text in C and numpy parses it.
    Rowid ranges of CHUNK_ROWS keep those texts, and so the peak memory, small; ``chunked=False``
    reads in one statement, for a ``where`` with a subquery SQLite would otherwise rebuild per
    chunk. Every expression must yield an integer on every row.
    """
    lo, hi = _rows(con, f"SELECT (SELECT min(rowid) FROM {table}), (SELECT max(rowid) FROM {table})")[0]
    if lo is None:
        return [np.zeros(0, dtype=np.int64) for _ in expressions]
    step = CHUNK_ROWS if chunked else int(hi) - int(lo) + 1
    inner = ", ".join(f"{e} AS c{i}" for i, e in enumerate(expressions))
    outer = ", ".join(f"group_concat(c{i})" for i in range(len(expressions)))
    parts: list[list[I64]] = [[] for _ in expressions]
    for first in range(int(lo), int(hi) + 1, step):
        row = _rows(
            con,
            f"SELECT count(*), {outer} FROM (SELECT {inner} FROM {table}"
            f" WHERE rowid BETWEEN {first} AND {first + step - 1} AND ({where}))",
        )[0]
        n = int(row[0])
        if n == 0:
            continue
        texts = list(row[1:])
        del row
        for i, column in enumerate(parts):
            try:
                values = np.fromstring(texts[i] or "", dtype=np.int64, sep=",")
            except ValueError:  # numpy met a value that is not an integer
                raise _NotAllIntegers() from None
            texts[i] = None
            if len(values) != n:
                # group_concat skips NULLs and numpy stops at text: columns no longer line up.
                raise _NotAllIntegers()
            column.append(values)
        if on_rows is not None:
            on_rows(sum(len(v) for v in parts[0]))
    return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in parts]


_NO_API = ApiCalls(*(np.zeros(0, dtype=np.int64),) * 4, *(np.zeros(0, dtype=np.bool_),) * 2)
_API_REQUIRED = ("start", "globalTid", "correlationId")
# Correlation ids listed literally in a query; beyond this a subquery over the memory table is
# cheaper than a huge statement.
_LITERAL_IDS = 20_000


def _read_api(con: Connection, tables: set[str], names: dict[int, str]) -> ApiCalls:
    """The allocation calls (for failures and sites). Rows correlated with other memory events
    come from :func:`_read_correlated_api` once the memory events are known."""
    need = {"start", "eventClass", "globalTid", "correlationId", "nameId", "returnValue"}
    if RUNTIME_TABLE not in tables or not need <= _columns(con, RUNTIME_TABLE):
        return _NO_API
    alloc_ids = ",".join(str(i) for i, n in names.items() if n in ALLOCATION_CALLS) or "NULL"
    return _api_rows(con, f"nameId IN ({alloc_ids})", alloc_ids)


def _read_correlated_api(
    con: Connection, tables: set[str], names: dict[int, str], memory: MemoryEvents, api: ApiCalls,
    alloc_op_id: int,
) -> ApiCalls:
    """Add the API rows of allocation events whose call is not an allocation call (static
    memory at module load, arrays, ...): usually few, so they are fetched by id."""
    need = {"start", "eventClass", "globalTid", "correlationId", "nameId", "returnValue"}
    if RUNTIME_TABLE not in tables or not need <= _columns(con, RUNTIME_TABLE):
        return api
    allocs = ~memory.is_free & (memory.correlation_id >= 0)
    wanted = (memory.pid[allocs] << 32) | memory.correlation_id[allocs]
    found = (api.pid << 32) | api.correlation_id
    if len(found) and len(wanted):
        # Correlation ids are small and dense: a lookup table beats sorting a million keys.
        span = int(max(wanted.max(), found.max()) - min(wanted.min(), found.min()))
        kind: Literal["table", "sort"] = "table" if span < 1 << 26 else "sort"
        wanted = wanted[~np.isin(wanted, found, kind=kind)]
    missing = np.unique(wanted & 0xFFFFFFFF)
    if len(missing) == 0:
        return api
    alloc_ids = ",".join(str(i) for i, n in names.items() if n in ALLOCATION_CALLS) or "NULL"
    if len(missing) <= _LITERAL_IDS:
        ids = ",".join(str(int(c)) for c in missing)
    else:
        ids = f"SELECT correlationId FROM {MEMORY_TABLE} WHERE memoryOperationType = {alloc_op_id}"
    extra = _api_rows(
        con, f"correlationId IN ({ids}) AND coalesce(nameId NOT IN ({alloc_ids}), 1)", alloc_ids,
        chunked=len(missing) <= _LITERAL_IDS,
    )
    return ApiCalls(
        *(np.concatenate([a, b]) for a, b in zip(
            (api.start_ns, api.pid, api.tid, api.correlation_id, api.is_runtime, api.is_failed_allocation),
            (extra.start_ns, extra.pid, extra.tid, extra.correlation_id, extra.is_runtime, extra.is_failed_allocation),
            strict=True,
        ))
    )


def _api_rows(con: Connection, where: str, alloc_ids: str, chunked: bool = True) -> ApiCalls:
    columns = [
        "start",
        "globalTid",
        "correlationId",
        (
            f"coalesce(eventClass = 0, 0)"
            f" + 2 * coalesce(nameId IN ({alloc_ids}) AND returnValue != 0, 0)"
        ),
    ]
    path = _database_path(con)
    compiled = (
        sqlite_columns.read_int_columns(
            path, f"SELECT {', '.join(columns)} FROM {RUNTIME_TABLE} WHERE {where}", 4, 1 << 16
        )
        if path is not None
        else None
    )
    start, gtid, corr, flags = compiled or _read_integers(
        con, columns, RUNTIME_TABLE, where, _API_REQUIRED, chunked
    )
    pid, tid = split_global_id(gtid)
    return ApiCalls(
        start_ns=start,
        pid=pid,
        tid=tid,
        correlation_id=corr,
        is_runtime=(flags & 1).astype(np.bool_),
        is_failed_allocation=(flags & 2).astype(np.bool_),
    )


def _database_path(con: Connection) -> Path | None:
    """The file behind ``con`` (for the compiled reader), from SQLite's own database list."""
    for _, name, file in _rows(con, "PRAGMA database_list"):
        if name == "main" and file:
            return Path(file)
    return None


def _read_integers(
    con: Connection,
    expressions: list[str],
    table: str,
    where: str,
    required: Sequence[str],
    chunked: bool = True,
    on_rows: Callable[[int], None] | None = None,
) -> list[I64]:
    """:func:`_int_columns`, skipping rows whose ``required`` columns hold a NULL or a
    non-integer. The check costs a slower second scan, so only a trace that needs it pays."""
    try:
        return _int_columns(con, expressions, table, where, chunked, on_rows)
    except _NotAllIntegers:
        valid = " AND ".join(f"typeof({c}) = 'integer'" for c in required)
        return _int_columns(con, expressions, table, f"({where}) AND {valid}", chunked, on_rows)


def _read_nvtx(con: Connection, tables: set[str]) -> NvtxRanges:
    cols = _columns(con, "NVTX_EVENTS") if "NVTX_EVENTS" in tables else set()
    if not {"start", "end", "eventType", "globalTid"} <= cols:
        empty = np.zeros(0, dtype=np.int64)
        return NvtxRanges(empty, empty, empty, empty, empty.astype(bool), [])
    # Unregistered strings are in `text`, registered ones (nvtxDomainRegisterString) in `textId`.
    text = "n.text" if "text" in cols else "NULL"
    if "textId" in cols and "StringIds" in tables:
        text = f"coalesce({text}, (SELECT value FROM StringIds s WHERE s.id = n.textId))"
    rows = _rows(
        con,
        f"SELECT n.start, n.end, n.globalTid, n.eventType = {NVTX_PUSH_POP}, {text}"
        f" FROM NVTX_EVENTS n WHERE n.eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END})"
        " AND typeof(n.start) = 'integer' AND typeof(n.end) = 'integer'"
        " AND typeof(n.globalTid) = 'integer' AND n.end > n.start ORDER BY n.rowid",
    )
    c = list(zip(*rows)) if rows else [()] * 5
    pid, tid = split_global_id(np.asarray(c[2], dtype=np.int64))
    return NvtxRanges(
        start_ns=np.asarray(c[0], dtype=np.int64),
        end_ns=np.asarray(c[1], dtype=np.int64),
        pid=pid,
        tid=tid,
        is_push_pop=np.asarray(c[3], dtype=np.bool_),
        text=[t if isinstance(t, str) else "(unnamed range)" for t in c[4]],
    )


def _read_gpus(con: Connection, tables: set[str]) -> dict[int, Gpu]:
    if "TARGET_INFO_GPU" not in tables or "id" not in _columns(con, "TARGET_INFO_GPU"):
        return {}
    cols = _columns(con, "TARGET_INFO_GPU")
    name = "name" if "name" in cols else "NULL"
    total = "totalMemory" if "totalMemory" in cols else "NULL"
    gpus: dict[int, Gpu] = {}
    for gid, gname, mem in _rows(con, f"SELECT id, {name}, {total} FROM TARGET_INFO_GPU ORDER BY rowid"):
        if isinstance(gid, int) and gid not in gpus:
            memory = mem if isinstance(mem, int) and mem > 0 else None
            gpus[gid] = Gpu(gid, gname if isinstance(gname, str) else f"GPU {gid}", memory)
    return gpus


def _read_cuda_devices(con: Connection, tables: set[str]) -> dict[tuple[int, int], int]:
    table = "TARGET_INFO_CUDA_DEVICE"
    if table not in tables or not {"gpuId", "cudaId", "pid"} <= _columns(con, table):
        return {}
    found: dict[tuple[int, int], int] = {}
    for gpu, cuda, pid in _rows(con, f"SELECT gpuId, cudaId, pid FROM {table} ORDER BY rowid"):
        if all(isinstance(v, int) for v in (gpu, cuda, pid)):
            found.setdefault((pid, cuda), gpu)
    return found


def _read_process_names(con: Connection, tables: set[str]) -> dict[int, str]:
    if "PROCESSES" not in tables or not {"pid", "name"} <= _columns(con, "PROCESSES"):
        return {}
    rows = _rows(con, "SELECT pid, name FROM PROCESSES")
    return {p: n for p, n in rows if isinstance(p, int) and isinstance(n, str)}
