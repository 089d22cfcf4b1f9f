"""Integer columns straight from SQLite's C API into numpy arrays, in compiled code.

The portable path (``sqlite_tables.int_columns``) has SQLite format every value as text and
numpy parse it back, which is half of the time to analyze a large trace. Here a numba loop calls
``sqlite3_step`` / ``sqlite3_column_int64`` on the same libsqlite3 Python's own sqlite3 module
uses, without the GIL, so two row ranges can be read on two cores at once. Anything unusual —
no libsqlite3 to load, an error, a value that is not an integer — returns None and the caller
takes the portable path, which also makes the error messages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from nsysfrag import jit, kernel_cache
from nsysfrag.events import I64


SQLITE_OK = 0
SQLITE_ROW = 100
SQLITE_DONE = 101
SQLITE_INTEGER = 1
_OPEN_READONLY = 0x01
_OPEN_URI = 0x40
CHUNK_ROWS = 262_144


def _load() -> ctypes.CDLL | None:
    """libsqlite3 for ctypes and for compiled code (which also gets its functions, below)."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return None
    kernel_cache.import_numba()  # one thread at a time (kernel_cache._numba_import)
    try:
        import llvmlite.binding as llvm

        # Compiled code names the C functions by symbol, so numba can cache it across runs.
        llvm.load_library_permanently(name)
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.sqlite3_open_v2.argtypes = [
        ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_char_p
    ]
    lib.sqlite3_prepare_v2.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
    ]
    lib.sqlite3_finalize.argtypes = [ctypes.c_void_p]
    lib.sqlite3_step.argtypes = [ctypes.c_void_p]
    lib.sqlite3_close_v2.argtypes = [ctypes.c_void_p]
    from numba import types

    global _step, _column_type, _column_int64
    # Pointers travel as intp: on every platform numba supports a pointer fits one. Module
    # names, made here: numba reads _fill's names when it compiles or loads it, after this.
    _step = types.ExternalFunction("sqlite3_step", types.int32(types.intp))
    _column_type = types.ExternalFunction(
        "sqlite3_column_type", types.int32(types.intp, types.int32)
    )
    _column_int64 = types.ExternalFunction(
        "sqlite3_column_int64", types.int64(types.intp, types.int32)
    )
    return lib


# Loaded on first use: finding the library and loading numba is no small input's business.
_LIB: ctypes.CDLL | None = None
_loaded = False
_step: Any = None
_column_type: Any = None
_column_int64: Any = None


_load_lock = threading.Lock()  # two threads read two row ranges at once


def _library() -> ctypes.CDLL | None:
    global _LIB, _loaded
    with _load_lock:
        if not _loaded:
            _LIB, _loaded = _load(), True
    return _LIB


@jit.njit(cache=True, nogil=True)
def _fill(stmt, out, start, stop):  # type: ignore[no-untyped-def]
    """Step ``stmt`` into rows [start, stop) of ``out``; return the next free row (less than
    ``stop`` once the statement is done), -1 on a non-integer value, -2 on an SQLite error."""
    ncols = out.shape[0]
    i = start
    while i < stop:
        rc = _step(stmt)
        if rc == SQLITE_DONE:
            return i
        if rc != SQLITE_ROW:
            return -2
        for c in range(ncols):
            if _column_type(stmt, c) != SQLITE_INTEGER:  # type: ignore[call-overload]
                return -1
            out[c, i] = _column_int64(stmt, c)  # type: ignore[call-overload]
        i += 1
    return i


def available() -> bool:
    return _library() is not None


def read_int_columns(
    uri: str,
    sql: str,
    ncols: int,
    expected_rows: int,
    on_rows: Callable[[int], None] | None = None,
    into: npt.NDArray[np.int64] | None = None,
) -> list[I64] | None:
    """The integer result columns of ``sql`` on the database ``uri`` names (a ``file:`` URI that
    opens it read-only, from ``export_file.database_uri``), or None (see above).
    ``expected_rows`` sizes the arrays (they grow if it was short). With ``into`` (shape
    ``(ncols, expected_rows)``, e.g. a window of a larger array) the rows go there, and a
    result of any other length is None."""
    lib = _library()
    if lib is None:
        return None
    db = ctypes.c_void_p()
    try:
        if lib.sqlite3_open_v2(
            uri.encode(), ctypes.byref(db), _OPEN_READONLY | _OPEN_URI, None
        ) != SQLITE_OK:
            return None
        stmt = ctypes.c_void_p()
        if lib.sqlite3_prepare_v2(db, sql.encode(), -1, ctypes.byref(stmt), None) != SQLITE_OK:
            return None
        try:
            out = np.empty((ncols, max(expected_rows, 1)), dtype=np.int64) if into is None else into
            filled = 0
            while True:
                if filled == out.shape[1]:  # full: done, or more rows than expected?
                    if into is not None:
                        return [*into] if lib.sqlite3_step(stmt) == SQLITE_DONE else None
                    out = np.concatenate([out, np.empty_like(out)], axis=1)
                stop = min(filled + CHUNK_ROWS, out.shape[1])
                done = int(_fill(stmt.value, out, filled, stop))
                if done < 0:
                    return None
                filled = done
                if on_rows is not None:
                    on_rows(filled)
                if filled < stop:
                    if into is not None and filled != into.shape[1]:
                        return None
                    return [out[c, :filled] for c in range(ncols)]
        finally:
            lib.sqlite3_finalize(stmt)
    finally:
        lib.sqlite3_close_v2(db)
