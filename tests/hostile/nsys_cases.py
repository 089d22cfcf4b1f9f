"""Hostile and unlucky nsys exports, built at test time from rows or from the samples.

Each builder writes one case into a folder and returns its path; none is committed as a blob.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from nsysfrag.testing.nsys_export import (
    FREE,
    ApiRow,
    ExportOptions,
    Gpu,
    MemoryRow,
    NvtxRow,
    write_export,
)
from tests.conftest import BASE, SAMPLES, MiB

MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"
MAX_ROWID = (1 << 63) - 1
CALL = "cudaMalloc_v3020"


def sql(path: Path, *statements: str) -> Path:
    """Run ``statements`` on ``path`` as its own application would, and commit."""
    con = sqlite3.connect(path)
    try:
        for s in statements:
            con.execute(s)
        con.commit()
    finally:
        con.close()
    return path


def sample_copy(folder: Path, name: str = "caching_allocator.sqlite") -> Path:
    return Path(shutil.copy(SAMPLES / name, folder / name))


def small_trace(
    path: Path,
    memory: Sequence[MemoryRow] | None = None,
    api: Iterable[ApiRow] | None = None,
    nvtx: Iterable[NvtxRow] = (),
    gpus: Sequence[Gpu] = (Gpu(0, total_memory=64 * MiB),),
    options: ExportOptions | None = None,
) -> Path:
    """Three blocks, the middle one freed first (a hole), each with an API row and a site."""
    if memory is None:
        memory = [
            MemoryRow(10, 1, 0, BASE, MiB, correlation_id=1),
            MemoryRow(20, 1, 0, BASE + MiB, MiB, correlation_id=2),
            MemoryRow(30, 1, 0, BASE + 2 * MiB, MiB, correlation_id=3),
            MemoryRow(40, 1, 0, BASE + MiB, MiB, op=FREE),
        ]
    if api is None:
        api = [ApiRow(r.start - 1, r.start + 1, 1, 7, CALL, r.correlation_id)
               for r in memory if r.correlation_id is not None]
    return write_export(path, memory, api, nvtx or [NvtxRow(0, 100, 1, 7, "step")], gpus, options)


def rowid_gap(folder: Path) -> Path:
    """The last memory row at rowid 2**63 - 1, and one text cell: the portable reader's case."""
    path = small_trace(folder / "rowid_gap.sqlite")
    return sql(
        path,
        f"UPDATE {MEMORY} SET rowid = {MAX_ROWID} WHERE rowid = 4",
        f"UPDATE {MEMORY} SET rowid = {-MAX_ROWID - 1} WHERE rowid = 1",
        f"UPDATE {MEMORY} SET pc = 'text' WHERE rowid = 2",
        f"UPDATE {MEMORY} SET address = 'not a number' WHERE rowid = 3",
    )


def high_addresses(path: Path, base: int) -> Path:
    """The small trace's layout at ``base`` (2**63 and above is stored negative by SQLite)."""
    rows = [
        MemoryRow(10, 1, 0, base, MiB, correlation_id=1),
        MemoryRow(20, 1, 0, base + MiB, MiB, correlation_id=2),
        MemoryRow(30, 1, 0, base + 2 * MiB, MiB, correlation_id=3),
        MemoryRow(40, 1, 0, base + MiB, MiB, op=FREE),
        MemoryRow(50, 1, 0, base + 5 * MiB, MiB, op=FREE),  # a free of no block
    ]
    return small_trace(path, rows)


def view_memory_table(path: Path, body: str = "SELECT * FROM recorded") -> Path:
    """The memory table renamed and a view of the same name over it (``body``)."""
    small_trace(path)
    return sql(path, f"ALTER TABLE {MEMORY} RENAME TO recorded", f"CREATE VIEW {MEMORY} AS {body}")


ENDLESS_VIEW = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)"
    " SELECT r.start + n.i AS start, r.globalPid, r.deviceId, r.contextId,"
    " r.address + n.i * 4096 AS address, r.pc, r.bytes, r.memKind, r.memoryOperationType,"
    " r.correlationId FROM n, recorded r"
)


def not_nsys(path: Path) -> Path:
    """An SQLite database of another application."""
    path.unlink(missing_ok=True)
    return sql(
        path,
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)",
        "CREATE TABLE tags (note INTEGER, tag TEXT)",
        "INSERT INTO notes VALUES (1, 'buy milk')",
    )


def not_utf8(path: Path) -> Path:
    """Bytes that are not UTF-8 in the schema (a table, its column and its DDL comment) and in
    every text cell the reader looks at: NVTX text, registered strings, GPU name, metadata."""
    small_trace(path, nvtx=[NvtxRow(0, 100, 1, 7, "step"), NvtxRow(0, 100, 1, 8, "other")])
    bad = "CAST(X'FF6E6F' AS TEXT)"  # \xff, then "no"
    return sql(
        path,
        "CREATE TABLE scratch (a INTEGER)",
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_master SET name = 'scr' || CAST(X'E9' AS TEXT),"
        " tbl_name = 'scr' || CAST(X'E9' AS TEXT),"
        " sql = 'CREATE TABLE \"scr' || CAST(X'E9' AS TEXT) || '\" (a' || CAST(X'FF' AS TEXT) ||"
        " ' INTEGER)' WHERE name = 'scratch'",
        f"UPDATE sqlite_master SET sql = sql || ' -- ' || {bad} WHERE name = '{MEMORY}'",
        "PRAGMA writable_schema = OFF",
        f"UPDATE NVTX_EVENTS SET text = {bad} WHERE text = 'step'",
        "UPDATE NVTX_EVENTS SET text = NULL, textId = 999 WHERE text = 'other'",
        f"INSERT INTO StringIds VALUES (999, {bad})",
        f"INSERT INTO StringIds VALUES (998, 'cu' || {bad})",
        f"UPDATE TARGET_INFO_GPU SET name = {bad}",
        f"UPDATE META_DATA_EXPORT SET value = {bad} WHERE name = 'EXPORT_PRODUCT_VERSION'",
        f"INSERT INTO PROCESSES VALUES (0, 1, {bad})",
    )


def bad_device_ids(path: Path) -> Path:
    """One process allocating on devices -1, 0 and 2**32 (which a packed key confuses)."""
    rows = [
        MemoryRow(10, 1, -1, BASE, MiB),
        MemoryRow(20, 1, 0, BASE, 2 * MiB),
        MemoryRow(30, 1, 1 << 32, BASE, 3 * MiB),
        MemoryRow(40, 1, 1 << 32, BASE + 3 * MiB, MiB),
    ]
    gpus = [Gpu(-1, total_memory=64 * MiB), Gpu(0, total_memory=64 * MiB),
            Gpu(1 << 32, total_memory=64 * MiB)]
    return write_export(path, rows, [], [], gpus)


def extreme_correlation_ids(path: Path) -> Path:
    """Runtime and memory rows whose correlationId is -2**63, -1 or 2**32 + k (CUPTI's are
    32-bit) beside ordinary ones; masked to 32 bits, 2**32 + 2 would pass for call 2."""
    small_trace(path)
    runtime = "CUPTI_ACTIVITY_KIND_RUNTIME"

    def copy_call(corr: int, new: int) -> str:
        return (
            f"INSERT INTO {runtime} SELECT start, end, eventClass, globalTid, {new}, nameId,"
            f" returnValue, callchainId FROM {runtime} WHERE correlationId = {corr}"
        )

    return sql(
        path,
        copy_call(1, -(1 << 63)),
        copy_call(3, (1 << 32) + 3),
        f"UPDATE {MEMORY} SET correlationId = {(1 << 32) + 2} WHERE correlationId = 2",
        f"UPDATE {MEMORY} SET correlationId = -1 WHERE correlationId = 3",
        f"INSERT INTO {MEMORY} (start, globalPid, deviceId, contextId, address, pc, bytes, memKind,"
        f" memoryOperationType, correlationId) SELECT 50, globalPid, deviceId, contextId,"
        f" address + 16777216, pc, bytes, memKind, memoryOperationType, {-(1 << 63)} FROM {MEMORY}"
        " WHERE rowid = 1",
    )


def wal_mode(folder: Path, pending: bool) -> Path:
    """A copy of a sample switched to WAL mode; with ``pending`` its -wal file holds a commit
    not yet merged into the database (copied while the writer still had it open)."""
    (folder / "writer").mkdir()
    source = sql(sample_copy(folder / "writer"), "PRAGMA journal_mode = WAL")
    target = folder / "wal.sqlite"
    if not pending:
        shutil.copy(source, target)
        return target
    con = sqlite3.connect(source)
    try:
        con.execute("PRAGMA wal_autocheckpoint = 0")
        con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_NOTE', 'written after the export')")
        con.commit()
        shutil.copy(source, target)
        shutil.copy(source.with_name(source.name + "-wal"), folder / "wal.sqlite-wal")
    finally:
        con.close()
    return target


def corrupt_page(folder: Path, page: int = 12, fill: bytes = b"\xa5") -> Path:
    """A sample with page ``page`` (1-based, 4 KiB) overwritten."""
    path = sample_copy(folder)
    data = bytearray(path.read_bytes())
    data[(page - 1) * 4096 : page * 4096] = fill * 4096
    path.write_bytes(bytes(data))
    return path


def huge_string(path: Path, chars: int = 64 << 20, ranges: int = 100) -> Path:
    """A registered string of ``chars`` characters that ``ranges`` NVTX ranges name (the reader
    used to copy it once per range), and one in StringIds that nothing names."""
    nvtx = [NvtxRow(i, 1000 - i, 1, 7, "big") for i in range(ranges)]
    small_trace(path, nvtx=nvtx, options=ExportOptions(registered_nvtx_strings=True))
    return sql(
        path,
        f"UPDATE StringIds SET value = 'big' || hex(zeroblob({chars // 2})) WHERE value = 'big'",
        f"INSERT INTO StringIds VALUES (100000, 'cudaMalloc' || hex(zeroblob({chars // 2})))",
    )


def zero_size_rows(path: Path, rows: int) -> Path:
    """``rows`` zero-byte allocations and nothing else."""
    return write_export(
        path,
        (MemoryRow(i, 1, 0, BASE + 512 * (i % 64), 0) for i in range(rows)),
        [],
        [],
        [Gpu(0, total_memory=64 * MiB)],
    )
