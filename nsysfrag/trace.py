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
from typing import Any
from urllib.parse import quote

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nsysfrag.errors import InputError
from nsysfrag.events import (
    I64,
    ALLOCATION_CALLS,
    ALLOCATION_OPERATION_NAME,
    DEALLOCATION_OPERATION_NAME,
    DEFAULT_ALLOCATION_ID,
    DEFAULT_DEALLOCATION_ID,
    MODELLED_KIND_NAMES,
    NVTX_PUSH_POP,
    NVTX_START_END,
    VMM_CALLS,
    ApiCalls,
    Gpu,
    MemoryEvents,
    NvtxRanges,
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


def read_trace(path: str | Path, require_memory_events: bool = True) -> Trace:
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
            return _read(engine, con, path, require_memory_events)
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


def _read(engine: sa.Engine, con: Connection, path: Path, require_memory_events: bool) -> Trace:
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
    # SQLite releases the GIL while it scans, so a second connection reads the memory table
    # while this one reads the API calls and the smaller tables.
    with ThreadPoolExecutor(max_workers=1) as pool:
        reading = pool.submit(_read_on_own_connection, engine, query.read)
        names = _api_names(con, tables)
        api = _read_api(con, tables, names, query.alloc_op_id)
        nvtx = _read_nvtx(con, tables)
        counts = _count_calls(con, names, (ALLOCATION_CALLS, VMM_CALLS))
        memory = reading.result()
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
        allocation_calls=counts[0],
        vmm_calls=counts[1],
    )


def _read_on_own_connection(engine: sa.Engine, read: Callable[[Connection], MemoryEvents]) -> MemoryEvents:
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
    """nameId -> API name without its version suffix, for the names the runtime table uses."""
    if RUNTIME_TABLE not in tables or "StringIds" not in tables:
        return {}
    rows = _rows(
        con,
        f"SELECT id, value FROM StringIds WHERE id IN (SELECT DISTINCT nameId FROM {RUNTIME_TABLE})",
    )
    return {i: api_base_name(v) for i, v in rows if isinstance(v, str)}


def _count_calls(
    con: Connection, names: dict[int, str], groups: tuple[frozenset[str], ...]
) -> list[int]:
    """How many runtime rows call a name of each group, in one scan."""
    sums = []
    for wanted in groups:
        ids = ",".join(str(i) for i, n in names.items() if n in wanted)
        sums.append(f"coalesce(sum(nameId IN ({ids})), 0)" if ids else "0")
    if not names:
        return [0] * len(groups)
    return [int(v) for v in _rows(con, f"SELECT {', '.join(sums)} FROM {RUNTIME_TABLE}")[0]]


def _enum_ids(con: Connection, tables: set[str], table: str) -> dict[str, int]:
    if table not in tables or not {"id", "name"} <= _columns(con, table):
        return {}
    return {n: i for i, n in _rows(con, f"SELECT id, name FROM {table}") if isinstance(n, str)}


@dataclass(frozen=True)
class _MemoryQuery:
    """How to read the memory table of this export into arrays."""

    correlation: str
    packed: str
    total_rows: int
    alloc_op_id: int = DEFAULT_ALLOCATION_ID

    @classmethod
    def plan(cls, con: Connection, tables: set[str]) -> _MemoryQuery:
        if MEMORY_TABLE not in tables:
            return cls("-1", "0", 0)
        kinds = _enum_ids(con, tables, "ENUM_CUDA_MEM_KIND")
        modelled = (
            [kinds[n] for n in MODELLED_KIND_NAMES if n in kinds]
            if kinds
            else list(MODELLED_KIND_NAMES.values())
        )
        opers = _enum_ids(con, tables, "ENUM_CUDA_DEV_MEM_EVENT_OPER")
        alloc_id = opers.get(ALLOCATION_OPERATION_NAME, DEFAULT_ALLOCATION_ID)
        free_id = opers.get(DEALLOCATION_OPERATION_NAME, DEFAULT_DEALLOCATION_ID)
        has_corr = "correlationId" in _columns(con, MEMORY_TABLE)
        kinds_sql = ",".join(str(k) for k in modelled) or "NULL"
        return cls(
            correlation="coalesce(correlationId, -1)" if has_corr else "-1",
            # pid (24 bits), device and three flag bits packed into one integer: one column to
            # read instead of four.
            packed=f"((globalPid >> 24) & 16777215) * 4294967296 + deviceId * 8"
            f" + (memoryOperationType = {free_id}) + 2 * (memKind IN ({kinds_sql}))"
            f" + 4 * (memoryOperationType IN ({alloc_id}, {free_id}))",
            total_rows=int(_rows(con, f"SELECT count(*) FROM {MEMORY_TABLE}")[0][0]),
            alloc_op_id=alloc_id,
        )

    def read(self, con: Connection) -> MemoryEvents:
        if self.total_rows == 0:
            return _no_memory_events()
        columns = ["start", "address", "bytes", self.correlation, self.packed]
        try:
            start, address, nbytes, correlation, packed = _int_columns(con, columns, MEMORY_TABLE)
        except _NotAllIntegers:
            # Some row holds a NULL or a non-integer: filter such rows in SQL, which costs a
            # second, slower scan, rather than on every well-formed trace.
            valid = " AND ".join(f"typeof({c}) = 'integer'" for c in REQUIRED_MEMORY_COLUMNS)
            if self.correlation != "-1":
                valid += " AND (correlationId IS NULL OR typeof(correlationId) = 'integer')"
            start, address, nbytes, correlation, packed = _int_columns(
                con, columns, MEMORY_TABLE, valid
            )
        # Negative sizes and unknown operations are skipped (and counted) too.
        keep = (nbytes >= 0) & ((packed & 4) != 0)
        if not keep.all():
            start, address, nbytes, correlation, packed = (
                a[keep] for a in (start, address, nbytes, correlation, packed)
            )
        # SPEC §1: events are ordered by start, ties by row order. A table scan returns rows in
        # rowid order, so a stable sort on start is enough.
        order = np.argsort(start, kind="stable")
        packed = packed[order]
        return MemoryEvents(
            start_ns=start[order],
            pid=packed >> 32,
            device=(packed & 0xFFFFFFFF) >> 3,
            # Reinterpret the signed 64-bit value as the unsigned address it stands for.
            address=address[order].view(np.uint64),
            bytes=nbytes[order],
            is_free=(packed & 1).astype(np.bool_),
            modelled=(packed & 2).astype(np.bool_),
            correlation_id=correlation[order],
        )


def _no_memory_events() -> MemoryEvents:
    empty = np.zeros(0, dtype=np.int64)
    no = empty.astype(np.bool_)
    return MemoryEvents(empty, empty, empty, empty.view(np.uint64), empty, no, no, empty)


class _NotAllIntegers(Exception):
    pass


CHUNK_ROWS = 250_000


def _int_columns(
    con: Connection, expressions: list[str], table: str, where: str = "1", chunked: bool = True
) -> list[I64]:
    """Integer columns of ``SELECT expressions FROM table WHERE where`` as arrays, in row order.

    Traces run to millions of rows, and a Python tuple per row is what makes the obvious
    ``fetchall`` slow: here SQLite joins each column into one text in C and numpy parses it.
    Rowid ranges of CHUNK_ROWS keep those texts, and so the peak memory, small; ``chunked=False``
    reads in one statement, for a ``where`` with a subquery SQLite would otherwise rebuild per
    chunk. Every expression must yield an integer on every row.
    """
    lo, hi = _rows(con, f"SELECT min(rowid), max(rowid) FROM {table}")[0]
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
    return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in parts]


def _read_api(con: Connection, tables: set[str], names: dict[int, str], alloc_op_id: int) -> ApiCalls:
    need = {"start", "eventClass", "globalTid", "correlationId", "nameId", "returnValue"}
    if RUNTIME_TABLE not in tables or not need <= _columns(con, RUNTIME_TABLE):
        empty = np.zeros(0, dtype=np.int64)
        return ApiCalls(empty, empty, empty, empty, empty.astype(bool), empty.astype(bool))
    alloc_ids = [i for i, n in names.items() if n in ALLOCATION_CALLS]
    id_list = ",".join(str(i) for i in alloc_ids) or "NULL"
    correlated = (
        f" OR correlationId IN (SELECT correlationId FROM {MEMORY_TABLE}"
        f" WHERE memoryOperationType = {alloc_op_id})"
        if MEMORY_TABLE in tables
        else ""
    )
    # Only the rows we use: allocation calls (for failures and sites) and rows correlated with
    # an allocation event; a long run has millions of kernel launches we never need.
    start, gtid, corr, flags = _int_columns(
        con,
        [
            "start",
            "globalTid",
            "correlationId",
            f"coalesce(eventClass = 0, 0)"
            f" + 2 * coalesce(nameId IN ({id_list}) AND returnValue != 0, 0)",
        ],
        RUNTIME_TABLE,
        f"typeof(start) = 'integer' AND typeof(globalTid) = 'integer'"
        f" AND typeof(correlationId) = 'integer' AND (nameId IN ({id_list}){correlated})",
        chunked=False,
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
