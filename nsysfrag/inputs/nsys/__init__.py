"""Nsight Systems traces: ``reader`` reads an SQLite export into ``records`` (``export_file``
opens it without ever writing, ``sqlite_pages`` decodes its big tables from the file's pages,
``sqlite_tables`` and ``sqlite_columns`` read them through SQLite,
``target_info`` its small ones), ``sites`` finds each allocation's NVTX ranges, ``spaces`` turns
a trace into one space per (process, device), and ``runner`` runs nsys itself to record or
export.

What kind of file a path names is ``file_kinds`` (the modules here name each other directly,
never through this package). Only the reader loads on use: recognising a path imports none of it.
"""

from __future__ import annotations

from pathlib import Path

from nsysfrag.inputs.nsys.file_kinds import REPORT_SUFFIXES, TRACE_FILE, is_report
from nsysfrag.inputs.recording import InputFormat, InputOptions, Recording

__all__ = ["NSYS_EXPORT", "REPORT_SUFFIXES", "TRACE_FILE", "is_report", "read_export"]

def read_export(path: Path, options: InputOptions | None = None) -> Recording:
    """Read the SQLite export at ``path`` into a recording."""
    from nsysfrag.inputs.nsys.reader import read_trace
    from nsysfrag.inputs.nsys.spaces import recording_of

    options = options or InputOptions()
    return recording_of(read_trace(path, progress=options.progress), options)


def _warm_up(path: Path) -> None:
    """Load the compiled replay kernel while the export is read, where its memory events are
    too many to replay interpreted. Their count, not the file's size, says so: a real export
    is mostly kernel launches (6 M of them and 19 memory events: 235 MiB), and loading the
    compiler for a replay of 19 events costs a small input's run twice over."""
    from nsysfrag import interpreted

    if interpreted.interpret(_memory_rows(path)):
        return
    from nsysfrag.models.observed import warm_up

    warm_up()


def _memory_rows(path: Path) -> int:
    """About how many memory events the export at ``path`` holds: its memory table's last
    rowid (one descent of the table's b-tree); 0 where that is not known so cheaply (no such
    table, a view, not a database: the reader says what is wrong)."""
    import sqlite3
    from contextlib import closing

    from nsysfrag.errors import InputError
    from nsysfrag.inputs.nsys.export_file import connect_read_only
    from nsysfrag.inputs.nsys.reader import MEMORY_TABLE

    try:
        with closing(connect_read_only(path)) as con:
            kind = con.execute(
                "SELECT type FROM sqlite_master WHERE name = ?", (MEMORY_TABLE,)
            ).fetchone()
            if kind is None or kind[0] != "table":
                return 0
            (last,) = con.execute(f"SELECT max(rowid) FROM {MEMORY_TABLE}").fetchone()
    except (OSError, InputError, sqlite3.Error, UnicodeDecodeError):
        return 0
    return int(last) if isinstance(last, int) else 0


NSYS_EXPORT = InputFormat(
    name="nsys-export",
    description="an nsys export",
    # Any file no other format claims: the reader says what is wrong with one that is not.
    matches=lambda path: True,
    open=read_export,
    warm_up=_warm_up,
)
