"""Integer columns of a table read from the database file's own pages, in compiled code.

Even through SQLite's C API (``sqlite_columns``) a row costs two library calls per value, three
times what SQLite itself needs to scan the table. A table's rows are cells of its B-tree's leaf
pages, in rowid order, each a record of varints and big-endian integers (the file format of
sqlite.org/fileformat.html): the tree is walked level by level from the table's root page, each
level's pages read with ``pread`` into a buffer of bounded size that this process owns (never a
map of the file: a file that shrinks while it is read is a short read here, not a signal that
ends the process, and the file's pages never count in the process's memory), and a numba loop
decodes only the columns asked for.

It reads nothing it is not sure of, and every read is checked against the page it lies in: a
page that is not a table B-tree page, a pointer or cell outside its page, a row that spills
onto overflow pages, a record whose column sizes do not add up to its payload exactly (summed
without overflow: each size is checked against the bytes left before it is added), a record
shorter than the columns read, a value that is not an integer, a column whose declared type
SQLite reads or compares differently (REAL affinity turns stored integers into floats, TEXT
affinity compares them as text), rowids out of order, a tree deeper than SQLite follows, a short
read, or another row count than SQLite's own ``count(*)`` all return None, and the caller reads
through SQLite as before (which also makes the error messages).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import numpy.typing as npt

from nsysfrag import interpreted, jit
from nsysfrag.events import I64


# How an output column is made from the record's columns (``Column``).
INTEGER = 0  # the column's value, which must be an integer
INTEGER_OR_MINUS_ONE = 1  # coalesce(column, -1)
FLAGGED = 2  # column | ((other IS NOT NULL) << 62), column an integer
# coalesce(column = 0, 0) + 2 * coalesce(other != 0, 0), each an integer or NULL
CALL_FLAGS = 3

_INTERIOR_TABLE = 5
_LEAF_TABLE = 13
# SQLite's cursor stops at 20 levels (BTCURSOR_MAX_DEPTH) and calls a deeper tree corrupt.
MAX_LEVELS = 19
_FAILED = -1
# Bytes read at once: the buffer, not the table, sets the memory a read needs.
BATCH_BYTES = 1 << 20


class Column:
    """One output column: ``mode`` applied to the record's column ``index`` (and ``other``)."""

    def __init__(self, index: int, mode: int = INTEGER, other: int = 0) -> None:
        self.index, self.mode, self.other = index, mode, other


class _Declined(Exception):
    """Something the decoder is not sure of: SQLite reads the table instead."""


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
    if rows == 0 or interpreted.interpret(rows, _leaves):
        return None
    root = _root_page(con, table)
    if root is None:
        return None
    column, values = where_in if where_in is not None else (-1, [])
    read = {c.index for c in columns} | {c.other for c in columns if c.mode in (FLAGGED, CALL_FLAGS)}
    if not _integer_reads(con, table, read | ({column} if column >= 0 else set())):
        return None
    ids = np.unique(np.asarray(values, dtype=np.int64))
    spec = np.array([[c.index, c.mode, c.other] for c in columns], dtype=np.int64)
    try:
        with _PageFile(path) as file:
            if not 1 <= root <= file.pages:
                return None
            return _read_tree(file, root, spec, column, ids, rows)
    except (OSError, ValueError, _Declined):
        return None


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


def affinity(declared: object) -> str:
    """SQLite's column affinity for a declared type (sqlite.org/datatype3.html, 3.1), in its
    order of rules: INT, then CHAR/CLOB/TEXT, then BLOB or none, then REAL/FLOA/DOUB, else NUMERIC."""
    text = declared.upper() if isinstance(declared, str) else ""
    if "INT" in text:
        return "INTEGER"
    if any(word in text for word in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in text or not text:
        return "BLOB"
    if any(word in text for word in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def _integer_reads(con: sqlite3.Connection, table: str, positions: set[int]) -> bool:
    """Whether SQLite gives the stored integers of the columns at ``positions`` as they are:
    not REAL affinity (read back as floats) nor TEXT (compared with numbers as text)."""
    declared = [row[2] for row in con.execute(f"PRAGMA table_xinfo('{table}')").fetchall()]
    return all(
        0 <= p < len(declared) and affinity(declared[p]) in ("INTEGER", "NUMERIC", "BLOB")
        for p in positions
    )


def _root_page(con: sqlite3.Connection, table: str) -> int | None:
    found = con.execute(
        "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchall()
    return found[0][0] if len(found) == 1 and isinstance(found[0][0], int) else None


class _PageFile:
    """The database file read by page numbers with ``pread``: what it reads is a copy, so a
    file that changes size under it gives a short read (declined), never a fault."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            header = os.pread(self.fd, 100, 0)
            self.page_size, self.usable, self.pages = _geometry(header, os.fstat(self.fd).st_size)
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> _PageFile:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)

    def read(self, numbers: I64, into: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        """Pages ``numbers`` one after another in ``into`` (grown if short); runs of
        consecutive pages are read in one call."""
        size = self.page_size
        need = len(numbers) * size
        buffer = into if len(into) >= need else np.empty(need, dtype=np.uint8)
        view = memoryview(buffer)
        breaks = np.flatnonzero(np.diff(numbers) != 1) + 1
        for first, stop in zip(
            [0, *breaks.tolist()], [*breaks.tolist(), len(numbers)], strict=True
        ):
            at, end = first * size, stop * size
            offset = (int(numbers[first]) - 1) * size
            while at < end:
                got = os.preadv(self.fd, [view[at:end]], offset)
                if got <= 0:
                    raise _Declined("short read: the file shrank")
                at += got
                offset += got
        return buffer


def _geometry(header: bytes, file_bytes: int) -> tuple[int, int, int]:
    """Page size, usable bytes per page, and pages in the database."""
    if len(header) < 100:
        raise ValueError("no header")
    raw = header[16] << 8 | header[17]
    page_size = 65536 if raw == 1 else raw
    if page_size < 512 or page_size & (page_size - 1):
        raise ValueError("page size")
    usable = page_size - header[20]
    if usable < 480:
        raise ValueError("reserved bytes")
    pages = file_bytes // page_size
    counted = int.from_bytes(header[28:32], "big")
    # The header's page count holds while its change counter matches (SQLite 3.7.0 on).
    if counted and header[24:28] == header[92:96]:
        pages = min(pages, counted)
    return page_size, usable, pages


def _read_tree(
    file: _PageFile, root: int, spec: I64, where: int, ids: I64, rows: int
) -> list[I64]:
    """The tree under ``root``, one level at a time: interior levels give the next level's
    page numbers in key order, the last level's leaves the rows."""
    size, usable = file.page_size, file.usable
    batch = max(1, BATCH_BYTES // size)
    buffer = np.empty(batch * size, dtype=np.uint8)
    level = np.array([root], dtype=np.int64)
    visited = 1
    for _ in range(MAX_LEVELS + 1):
        buffer = file.read(level[:1], buffer)
        kind = buffer[100 if level[0] == 1 else 0]
        if kind == _LEAF_TABLE:
            return _read_leaves(file, level, root, spec, where, ids, rows, buffer)
        if kind != _INTERIOR_TABLE:
            raise _Declined("not a table page")
        found: list[I64] = []
        # Each cell holds a 4-byte child and a varint: a page has fewer children than this.
        children = np.empty(batch * (size // 6 + 1), dtype=np.int64)
        for first in range(0, len(level), batch):
            numbers = level[first : first + batch]
            buffer = file.read(numbers, buffer)
            n = _children(buffer, numbers, size, usable, file.pages, root, children)
            if n < 0:
                raise _Declined("damaged interior page")
            found.append(children[:n].copy())
        level = np.concatenate(found)
        visited += len(level)
        if visited > file.pages:  # a cycle: no tree visits a page twice
            raise _Declined("cycle")
    raise _Declined("deeper than SQLite reads")


def _read_leaves(
    file: _PageFile, level: I64, root: int, spec: I64, where: int, ids: I64, rows: int,
    buffer: npt.NDArray[np.uint8],
) -> list[I64]:
    size, usable = file.page_size, file.usable
    batch = max(1, BATCH_BYTES // size)
    # A page holds at most (usable - 8) / 2 cell pointers: the rows one batch can add.
    per_batch = batch * ((usable - 8) // 2)
    # Every row kept: SQLite's count sizes the output. Filtered: it grows with the rows kept,
    # never with the rows the table has. An array per column, not one block: a caller keeps
    # the columns it needs and the others' memory goes, with no copy.
    width = rows if where < 0 else min(rows, per_batch)
    out = tuple(np.empty(width, dtype=np.int64) for _ in range(spec.shape[0]))
    state = np.zeros(3, dtype=np.int64)  # rows kept, rows seen, last rowid
    for first in range(0, len(level), batch):
        numbers = level[first : first + batch]
        if where >= 0 and len(out[0]) - state[0] < min(per_batch, rows - state[1]):
            width = min(rows, max(2 * len(out[0]), state[0] + per_batch))
            out = tuple(_grown(column, int(state[0]), width) for column in out)
        buffer = file.read(numbers, buffer)
        if _leaves(buffer, numbers, size, usable, root, spec, where, ids, out, state) < 0:
            raise _Declined("damaged leaf page")
    kept, seen = int(state[0]), int(state[1])
    if seen != rows:
        raise _Declined("another row count than SQLite's")
    return [column[:kept] for column in out]


def _grown(column: I64, kept: int, width: int) -> I64:
    grown = np.empty(width, dtype=np.int64)
    grown[:kept] = column[:kept]
    return grown


@jit.njit(cache=True, nogil=True)
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


@jit.njit(cache=True, nogil=True)
def _u16(data, pos):  # type: ignore[no-untyped-def]
    return (np.int64(data[pos]) << 8) | np.int64(data[pos + 1])


@jit.njit(cache=True, nogil=True)
def _u32(data, pos):  # type: ignore[no-untyped-def]
    return (_u16(data, pos) << 16) | _u16(data, pos + 2)


@jit.njit(cache=True, nogil=True)
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


@jit.njit(cache=True, nogil=True)
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


@jit.njit(cache=True, nogil=True)
def _is_integer(serial):  # type: ignore[no-untyped-def]
    return 1 <= serial <= 6 or serial == 8 or serial == 9


@jit.njit(cache=True, nogil=True)
def _page_header(data, i, number, page_size, usable, root, pointer_bytes):  # type: ignore[no-untyped-def]
    """Where page ``i`` of the buffer starts and ends (its usable bytes), where its header is,
    and its cell count; cells -1 when the count cannot be SQLite's (more than fit its page, or
    none on a page below the root, which SQLite calls corrupt)."""
    start = i * page_size
    header = start + (100 if number == 1 else 0)
    cells = _u16(data, header + 3)
    end = start + usable
    if cells > (page_size - 8) // 6 or header + pointer_bytes + 2 * cells > end:
        cells = -1
    elif cells == 0 and number != root:
        cells = -1
    return start, end, header, cells


@jit.njit(cache=True, nogil=True)
def _children(data, numbers, page_size, usable, pages, root, out):  # type: ignore[no-untyped-def]
    """The child page numbers of the interior table pages ``numbers`` (read one after another
    into ``data``), in key order, into ``out``; their count, or -1."""
    n = 0
    for i in range(len(numbers)):
        start, end, header, cells = _page_header(data, i, numbers[i], page_size, usable, root, 12)
        if data[header] != _INTERIOR_TABLE or cells < 0 or n + cells + 1 > len(out):
            return _FAILED
        for k in range(cells + 1):
            if k < cells:
                pointer = _u16(data, header + 12 + 2 * k)
                if pointer < 12 or start + pointer + 4 > end:
                    return _FAILED
                child = _u32(data, start + pointer)
            else:
                child = _u32(data, header + 8)
            if child < 1 or child > pages:
                return _FAILED
            out[n] = child
            n += 1
    return n


@jit.njit(cache=True, nogil=True)
def _leaves(data, numbers, page_size, usable, root, spec, where, ids, out, state):  # type: ignore[no-untyped-def]
    """Rows of the leaf table pages ``numbers`` (read one after another into ``data``) into
    ``out`` from index ``state[0]`` on (a tuple of one array per output column, as ``spec``
    says: record column, mode, other column), those whose column ``where`` is one of ``ids``
    (sorted) if ``where`` >= 0. ``state`` is (rows kept, rows seen, last rowid), carried from one call to
    the next; returns the rows kept, or -1."""
    last = max(where, 0)
    for c in range(spec.shape[0]):
        last = max(last, spec[c, 0], spec[c, 2])
    serials = np.zeros(last + 1, dtype=np.int64)
    offsets = np.zeros(last + 1, dtype=np.int64)
    n = state[0]
    seen = state[1]
    previous_rowid = state[2]
    max_local = usable - 35  # a table leaf cell's payload beyond this spills onto overflow pages
    for i in range(len(numbers)):
        start, end, header, cells = _page_header(data, i, numbers[i], page_size, usable, root, 8)
        if data[header] != _LEAF_TABLE or cells < 0:
            return _FAILED
        for k in range(cells):
            pointer = _u16(data, header + 8 + 2 * k)
            if pointer < 8 or pointer >= usable:
                return _FAILED
            p = start + pointer
            payload, p = _varint(data, p, end)
            if p < 0 or payload > max_local:
                return _FAILED
            rowid, p = _varint(data, p, end)
            # Both bounds before the sum: payload <= max_local, so p + payload cannot overflow.
            if p < 0 or payload > end - p or (seen > 0 and rowid <= previous_rowid):
                return _FAILED
            previous_rowid = rowid
            record_end = p + payload
            header_bytes, q = _varint(data, p, record_end)
            if q < 0 or header_bytes > payload or header_bytes < q - p:
                return _FAILED
            header_end = p + header_bytes
            body = header_end
            j = 0
            # Every column's type, as SQLite checks a record it reads to its end: the sizes
            # must add up to the payload exactly. Each size is compared with what is left
            # before it is added, so the sum never exceeds the record (nor wraps).
            while q < header_end:
                if data[q] < 0x80:  # every integer's type: one byte
                    serial = np.int64(data[q])
                    q += 1
                else:
                    serial, q = _varint(data, q, header_end)
                    if q < 0:
                        return _FAILED
                size = _value_size(serial)
                if size < 0 or size > record_end - body:
                    return _FAILED
                if j <= last:
                    serials[j] = serial
                    offsets[j] = body
                body += size
                j += 1
            if j <= last or body != record_end:
                return _FAILED  # fewer columns than read (SQLite gives defaults), or bytes over
            seen += 1
            if where >= 0:
                serial = serials[where]
                if serial == 0:  # NULL IN (...) is not true
                    continue
                if not _is_integer(serial):
                    return _FAILED
                value = _integer(data, offsets[where], serial)
                at = np.searchsorted(ids, value)
                if at == len(ids) or ids[at] != value:
                    continue
            if n >= len(out[0]):
                return _FAILED
            for c in range(spec.shape[0]):
                j = spec[c, 0]
                mode = spec[c, 1]
                serial = serials[j]
                if mode == CALL_FLAGS:
                    other = serials[spec[c, 2]]
                    if (serial != 0 and not _is_integer(serial)) or (
                        other != 0 and not _is_integer(other)
                    ):
                        return _FAILED
                    flags = 0
                    if serial != 0 and _integer(data, offsets[j], serial) == 0:
                        flags = 1
                    if other != 0 and _integer(data, offsets[spec[c, 2]], other) != 0:
                        flags += 2
                    out[c][n] = flags
                    continue
                if serial == 0 and mode == INTEGER_OR_MINUS_ONE:
                    out[c][n] = -1
                    continue
                if not _is_integer(serial):
                    return _FAILED
                value = _integer(data, offsets[j], serial)
                if mode == FLAGGED and serials[spec[c, 2]] != 0:
                    value |= np.int64(1) << 62
                out[c][n] = value
            n += 1
    state[0] = n
    state[1] = seen
    state[2] = previous_rowid
    return n
