"""The small tables of an nsys export: its metadata (the nsys version, the capture flags, the
report it was exported from), its GPUs, the CUDA devices each process saw and process names.

Read whole and checked value by value: a cell of the wrong type is left out, never fatal.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nsysfrag.errors import InputError
import nsysfrag.inputs.nsys.export_file as export_file
import nsysfrag.inputs.nsys.sqlite_tables as db
from nsysfrag.inputs.nsys.records import Gpu

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
    if not export.is_file():  # a FIFO would block the open below
        return []
    try:
        con = export_file.connect_read_only(export)
    except (OSError, InputError, *export_file.SQLITE_ERRORS):
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
    except export_file.SQLITE_ERRORS:
        return []
    finally:
        con.close()


def read_metadata(con: sqlite3.Connection, tables: dict[str, str]) -> dict[str, str]:
    """Export and capture metadata; the export table was renamed in nsys 2023.3."""
    found: dict[str, str] = {}
    for table in ("EXPORT_META_DATA", "META_DATA_EXPORT", "META_DATA_CAPTURE"):
        if db.has_columns(con, tables, table, "name", "value"):
            for name, value in db.query(con, f"SELECT name, value FROM {table}"):
                if isinstance(name, str) and isinstance(value, (str, int)):
                    found.setdefault(name, str(value))
    return found


def read_gpus(con: sqlite3.Connection, tables: dict[str, str]) -> dict[int, Gpu]:
    if "TARGET_INFO_GPU" not in tables or "id" not in db.column_names(con, "TARGET_INFO_GPU"):
        return {}
    cols = db.column_names(con, "TARGET_INFO_GPU")
    name = "name" if "name" in cols else "NULL"
    total = "totalMemory" if "totalMemory" in cols else "NULL"
    gpus: dict[int, Gpu] = {}
    order = db.order_by(con, "TARGET_INFO_GPU")
    for gid, gname, mem in db.query(con, f"SELECT id, {name}, {total} FROM TARGET_INFO_GPU{order}"):
        if isinstance(gid, int) and gid not in gpus:
            memory = mem if isinstance(mem, int) and mem > 0 else None
            gpus[gid] = Gpu(gid, gname if isinstance(gname, str) else f"GPU {gid}", memory)
    return gpus


def read_cuda_devices(con: sqlite3.Connection, tables: dict[str, str]) -> dict[tuple[int, int], int]:
    table = "TARGET_INFO_CUDA_DEVICE"
    if not db.has_columns(con, tables, table, "gpuId", "cudaId", "pid"):
        return {}
    found: dict[tuple[int, int], int] = {}
    for gpu, cuda, pid in db.query(con, f"SELECT gpuId, cudaId, pid FROM {table}{db.order_by(con, table)}"):
        if all(isinstance(v, int) for v in (gpu, cuda, pid)):
            found.setdefault((pid, cuda), gpu)
    return found


def read_process_names(con: sqlite3.Connection, tables: dict[str, str]) -> dict[int, str]:
    if not db.has_columns(con, tables, "PROCESSES", "pid", "name"):
        return {}
    rows = db.query(con, "SELECT pid, name FROM PROCESSES")
    return {p: n for p, n in rows if isinstance(p, int) and isinstance(n, str)}
