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


# An nsys export takes at least this many bytes per memory event (the row, its runtime row):
# a file smaller than that many events' worth is replayed interpreted (nsysfrag.interpreted),
# and loading the compiled kernel for it would compile it for nothing.
_BYTES_PER_EVENT = 64


def _warm_up(path: Path) -> None:
    from nsysfrag import interpreted
    from nsysfrag.models.observed import warm_up

    try:
        size = path.stat().st_size
    except OSError:
        return  # the reader says what is wrong with it
    if not interpreted.interpret(size // _BYTES_PER_EVENT):
        warm_up()


NSYS_EXPORT = InputFormat(
    name="nsys-export",
    description="an nsys export",
    # Any file no other format claims: the reader says what is wrong with one that is not.
    matches=lambda path: True,
    open=read_export,
    warm_up=_warm_up,
)
