"""Integer columns of a table read from the database file's own pages, in compiled code.

Even through SQLite's C API (``sqlite_columns``) a row costs two library calls per value, three
times what SQLite itself needs to scan the table. A table's rows are cells of its B-tree's leaf
pages, in rowid order, each a record of varints and big-endian integers (the file format of
sqlite.org/fileformat.html): a numba loop walks the tree from the table's root page over the
file mapped read-only and decodes only the columns asked for. It reads nothing it is not sure
of: a page that is not a table B-tree page, a pointer or cell outside its page, a row that
spills onto overflow pages, a record shorter than the columns read, a value that is not an
integer, rowids out of order, or another row count than SQLite's own ``count(*)`` all return
None, and the caller reads through SQLite as before (which also makes the error messages).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numba
import numpy as np
import numpy.typing as npt

from nsysfrag import interpreted, kernel_cache
from nsysfrag.events import I64

kernel_cache.install()  # before any cache=True kernel: compiled code goes to the user's cache

# How an output column is made from the record's columns (``Column``).
INTEGER = 0  # the column's value, which must be an integer
INTEGER_OR_MINUS_ONE = 1  # coalesce(column, -1)
FLAGGED = 2  # column | ((other IS NOT NULL) << 62), column an integer
# coalesce(column = 0, 0) + 2 * coalesce(other != 0, 0), each an integer or NULL
CALL_FLAGS = 3

_INTERIOR_TABLE = 5
_LEAF_TABLE = 13
_MAX_DEPTH = 64  # a B-tree of 64 levels would hold more rows than any file can
_FAILED = -1


class Column:
    """One output column: ``mode`` applied to the record's column ``index`` (and ``other``)."""

    def __init__(self, index: int, mode: int = INTEGER, other: int = 0) -> None:
        self.index, self.mode, self.other = index, mode, other


def read_columns(
    path: Path,
    con: sqlite3.Connection,
    table: str,
    columns: list[Column],
    rows: int,
    where_in: tuple[int, list[int]] | None = None,
) -> list[I64] | None:
    """The ``columns`` of every row of ``table`` in rowid order, from the file at ``path``
    (the database ``con`` has open, read-only, with no WAL content), or None (see above).
    ``rows`` is SQLite's count of the table's rows. With ``where_in`` (a record column and
    integers) only the rows whose column is one of them: ``WHERE column IN (...)``."""
    # A small table is read sooner through SQLite itself than the decoder compiles.
    if rows == 0 or interpreted.interpret(rows, _scan):
        return None
    root = _root_page(con, table)
    if root is None:
        return None
    column, values = where_in if where_in is not None else (-1, [])
    ids = np.unique(np.asarray(values, dtype=np.int64))
    try:
        # Mapped, not read: only the table's pages are touched, and unmapped when dropped.
        data = np.memmap(path, dtype=np.uint8, mode="r")
        page_size, usable, pages = _geometry(data)
    except (OSError, ValueError):
        return None
    if not 1 <= root <= pages:
        return None
    # Pages no row reaches are never touched: a filtered read costs only the rows it keeps.
    out = np.empty((len(columns), rows), dtype=np.int64)
    spec = np.array([[c.index, c.mode, c.other] for c in columns], dtype=np.int64)
    kept, seen = _scan(data, page_size, usable, pages, root, spec, column, ids, out)
    del data
    if kept < 0 or seen != rows:
        return None
    return [out[c, :kept] for c in range(len(columns))]


def record_columns(con: sqlite3.Connection, table: str) -> dict[str, int] | None:
    """Each column's place in ``table``'s records, by lower-case name (-1: a rowid alias,
    which reads as NULL in the record); None where generated columns (not stored, or stored
    apart) or names differing only in case make places uncertain."""
    index: dict[str, int] = {}
    for position, (_, name, _, _, _, pk, hidden) in enumerate(
        con.execute(f"PRAGMA table_xinfo('{table}')").fetchall()
    ):
        if not isinstance(name, str) or hidden != 0 or name.lower() in index:
            return None
        index[name.lower()] = -1 if pk else position
    return index


def _root_page(con: sqlite3.Connection, table: str) -> int | None:
    found = con.execute(
        "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchall()
    return found[0][0] if len(found) == 1 and isinstance(found[0][0], int) else None


def _geometry(data: npt.NDArray[np.uint8]) -> tuple[int, int, int]:
    """Page size, usable bytes per page, and pages in the database."""
    if len(data) < 100:
        raise ValueError("no header")
    raw = int(data[16]) << 8 | int(data[17])
    page_size = 65536 if raw == 1 else raw
    if page_size < 512 or page_size & (page_size - 1):
        raise ValueError("page size")
    usable = page_size - int(data[20])
    if usable < 480:
        raise ValueError("reserved bytes")
    pages = len(data) // page_size
    counted = int.from_bytes(bytes(data[28:32]), "big")
    # The header's page count holds while its change counter matches (SQLite 3.7.0 on).
    if counted and bytes(data[24:28]) == bytes(data[92:96]):
        pages = min(pages, counted)
    return page_size, usable, pages


@numba.njit(cache=True, nogil=True)
def _varint(data, pos, end):  # type: ignore[no-untyped-def]
    """The varint at ``pos`` (before ``end``) and the position after it; position -1 when it
    runs past ``end`` or does not fit 63 bits."""
    value = np.uint64(0)
    for _ in range(8):
        if pos >= end:
            return 0, -1
        byte = data[pos]
        pos += 1
        value = (value << np.uint64(7)) | np.uint64(byte & 0x7F)
        if byte < 0x80:
            return np.int64(value), pos
    if pos >= end or value >= np.uint64(1 << 55):
        return 0, -1
    value = (value << np.uint64(8)) | np.uint64(data[pos])
    return np.int64(value), pos + 1


@numba.njit(cache=True, nogil=True)
def _u16(data, pos):  # type: ignore[no-untyped-def]
    return (np.int64(data[pos]) << 8) | np.int64(data[pos + 1])


@numba.njit(cache=True, nogil=True)
def _u32(data, pos):  # type: ignore[no-untyped-def]
    return (_u16(data, pos) << 16) | _u16(data, pos + 2)


@numba.njit(cache=True, nogil=True)
def _value_size(serial):  # type: ignore[no-untyped-def]
    """Bytes of a value of serial type ``serial``; -1 for the reserved types 10 and 11."""
    if serial < 5:
        return serial
    if serial == 5:
        return 6
    if serial < 8:
        return 8
    if serial < 10:
        return 0
    if serial < 12:
        return -1
    return (serial - 12) // 2


@numba.njit(cache=True, nogil=True)
def _integer(data, pos, serial):  # type: ignore[no-untyped-def]
    """The integer of serial type 1-6, 8 or 9 at ``pos`` (big-endian two's complement)."""
    if serial == 8:
        return np.int64(0)
    if serial == 9:
        return np.int64(1)
    n = _value_size(serial)
    value = np.uint64(0)
    for k in range(n):
        value = (value << np.uint64(8)) | np.uint64(data[pos + k])
    if n < 8 and data[pos] >= 0x80:  # negative: extend the sign
        value -= np.uint64(1) << np.uint64(8 * n)
    return np.int64(value)


@numba.njit(cache=True, nogil=True)
def _is_integer(serial):  # type: ignore[no-untyped-def]
    return 1 <= serial <= 6 or serial == 8 or serial == 9


@numba.njit(cache=True, nogil=True)
def _scan(data, page_size, usable, pages, root, spec, where, ids, out):  # type: ignore[no-untyped-def]
    """Rows of the table B-tree at page ``root`` into ``out`` (one row per output column, as
    ``spec`` says: record column, mode, other column), those whose column ``where`` is one of
    ``ids`` (sorted) if ``where`` >= 0; (rows kept, rows seen), or (-1, -1)."""
    last = max(where, 0)
    for c in range(spec.shape[0]):
        last = max(last, spec[c, 0], spec[c, 2])
    sizes = np.array([_value_size(t) for t in range(12)], dtype=np.int64)
    serials = np.zeros(last + 1, dtype=np.int64)
    offsets = np.zeros(last + 1, dtype=np.int64)
    stack_page = np.zeros(_MAX_DEPTH, dtype=np.int64)
    stack_cell = np.zeros(_MAX_DEPTH, dtype=np.int64)
    depth = 0
    stack_page[0] = root
    stack_cell[0] = 0
    visited = 1
    n = 0
    seen = 0
    previous_rowid = np.int64(0)
    max_local = usable - 35  # a table leaf cell's payload beyond this spills onto overflow pages
    while depth >= 0:
        page = stack_page[depth]
        start = (page - 1) * page_size
        header = start + (100 if page == 1 else 0)
        kind = data[header]
        cells = _u16(data, header + 3)
        if kind == _INTERIOR_TABLE:
            if header + 12 + 2 * cells > start + usable:  # a cell count past its page's end
                return _FAILED, _FAILED
            k = stack_cell[depth]
            if k > cells:
                depth -= 1
                continue
            stack_cell[depth] = k + 1
            if k < cells:
                pointer = _u16(data, header + 12 + 2 * k)
                if pointer < 12 or pointer + 4 > usable:
                    return _FAILED, _FAILED
                child = _u32(data, start + pointer)
            else:
                child = _u32(data, header + 8)
            if child < 1 or child > pages or depth + 1 >= _MAX_DEPTH:
                return _FAILED, _FAILED
            visited += 1
            if visited > pages:  # a cycle: no tree visits a page twice
                return _FAILED, _FAILED
            depth += 1
            stack_page[depth] = child
            stack_cell[depth] = 0
            continue
        if kind != _LEAF_TABLE or header + 8 + 2 * cells > start + usable:
            return _FAILED, _FAILED
        end = start + usable
        for k in range(cells):
            pointer = _u16(data, header + 8 + 2 * k)
            if pointer < 8 or pointer >= usable:
                return _FAILED, _FAILED
            p = start + pointer
            payload, p = _varint(data, p, end)
            if p < 0 or payload > max_local:
                return _FAILED, _FAILED
            rowid, p = _varint(data, p, end)
            if p < 0 or p + payload > end or (seen > 0 and rowid <= previous_rowid):
                return _FAILED, _FAILED
            previous_rowid = rowid
            record_end = p + payload
            header_bytes, q = _varint(data, p, record_end)
            if q < 0 or header_bytes > payload:
                return _FAILED, _FAILED
            header_end = p + header_bytes
            body = header_end
            for j in range(last + 1):
                if q < header_end and data[q] < 0x80:  # every integer's type: one byte
                    serial = np.int64(data[q])
                    q += 1
                else:
                    serial, q = _varint(data, q, header_end)
                    if q < 0:
                        return _FAILED, _FAILED  # a record shorter than the columns read
                size = sizes[serial] if serial < 12 else (serial - 12) // 2
                if size < 0:
                    return _FAILED, _FAILED
                serials[j] = serial
                offsets[j] = body
                body += size
            if body > record_end:
                return _FAILED, _FAILED
            seen += 1
            if where >= 0:
                serial = serials[where]
                if serial == 0:  # NULL IN (...) is not true
                    continue
                if not _is_integer(serial):
                    return _FAILED, _FAILED
                value = _integer(data, offsets[where], serial)
                at = np.searchsorted(ids, value)
                if at == len(ids) or ids[at] != value:
                    continue
            if n >= out.shape[1]:
                return _FAILED, _FAILED
            for c in range(spec.shape[0]):
                j = spec[c, 0]
                mode = spec[c, 1]
                serial = serials[j]
                if mode == CALL_FLAGS:
                    other = serials[spec[c, 2]]
                    if (serial != 0 and not _is_integer(serial)) or (
                        other != 0 and not _is_integer(other)
                    ):
                        return _FAILED, _FAILED
                    flags = 0
                    if serial != 0 and _integer(data, offsets[j], serial) == 0:
                        flags = 1
                    if other != 0 and _integer(data, offsets[spec[c, 2]], other) != 0:
                        flags += 2
                    out[c, n] = flags
                    continue
                if serial == 0 and mode == INTEGER_OR_MINUS_ONE:
                    out[c, n] = -1
                    continue
                if not _is_integer(serial):
                    return _FAILED, _FAILED
                value = _integer(data, offsets[j], serial)
                if mode == FLAGGED and serials[spec[c, 2]] != 0:
                    value |= np.int64(1) << 62
                out[c, n] = value
            n += 1
        depth -= 1
    return n, seen
