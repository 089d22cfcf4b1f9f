"""What an SQLite file holds, and its integer columns read portably, in row order.

Tables and views by name, their columns, the name of their row order (rowid) if any, and
integer columns as numpy arrays through ``group_concat`` text (the portable path; the compiled
one is ``sqlite_columns``). Nothing here knows nsys.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nsysfrag.events import I64


def table_kinds(con: sqlite3.Connection) -> dict[str, str]:
    """Table and view names -> "table" or "view": a view is as good a source to SELECT from."""
    rows = con.execute(
        "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')"
    ).fetchall()
    return {name: kind for name, kind in rows if isinstance(name, str)}


def row_order(con: sqlite3.Connection, table: str) -> str | None:
    """The name under which ``table``'s rowid (its row order) reads, or None when it has none
    (a view, a WITHOUT ROWID table, or a table that declares all of rowid, _rowid_ and oid as
    columns of its own)."""
    kind = query(con, "SELECT type FROM sqlite_master WHERE name = ?", (table,))
    if not kind or kind[0][0] != "table":
        return None
    declared = {c.lower() for c in column_names(con, table) if isinstance(c, str)}
    name = next((n for n in ("rowid", "_rowid_", "oid") if n not in declared), None)
    if name is None:
        return None
    # SQLite itself says whether the table has rowids: the schema's text may spell WITHOUT
    # ROWID with comments or any spacing between the words.
    try:
        con.execute(f"SELECT {name} FROM {table} LIMIT 0")
    except sqlite3.OperationalError as err:
        if "no such column" in str(err):
            return None
        raise
    return name


def order_by(con: sqlite3.Connection, table: str, alias: str = "") -> str:
    key = row_order(con, table)
    return f" ORDER BY {alias}{key}" if key is not None else ""


def column_names(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info('{table}')").fetchall()}


def has_columns(con: sqlite3.Connection, tables: dict[str, str], table: str, *wanted: str) -> bool:
    """Whether ``table`` exists with the ``wanted`` columns (a damaged export may lack either)."""
    return table in tables and set(wanted) <= column_names(con, table)


def query(con: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    return list(con.execute(sql, tuple(params)).fetchall())


class NotAllIntegers(Exception):
    """A value that is not an integer where ``int_columns`` needs one."""


PAGE_ROWS = 250_000


def int_columns(
    con: sqlite3.Connection,
    expressions: list[str],
    table: str,
    where: str = "1",
    chunked: bool = True,
    on_rows: Callable[[int], None] | None = None,
) -> list[I64]:
    """Integer columns of ``SELECT expressions FROM table WHERE where`` as arrays, in row order.

    Traces run to millions of rows, and a Python tuple per row is what makes the obvious
    ``fetchall`` slow: here SQLite joins each column into one text in C and numpy parses it.
    Chunks of PAGE_ROWS rows keep those texts, and so the peak memory, small; each chunk starts
    after the last rowid of the one before (keyset pagination), so the number of queries follows
    the rows, whatever gaps the rowids have. ``chunked=False`` reads in one statement, for a
    ``where`` with a subquery SQLite would otherwise rebuild per chunk. Every expression must
    yield an integer on every row.
    """
    key = row_order(con, table)
    if key is None:
        return _streamed_int_columns(con, expressions, table, where, on_rows)
    inner = ", ".join(f"{e} AS c{i}" for i, e in enumerate(expressions))
    outer = ", ".join(f"group_concat(c{i})" for i in range(len(expressions)))
    parts: list[list[I64]] = [[] for _ in expressions]
    after: int | None = None
    while True:
        if chunked:
            seek = "" if after is None else f"{key} > {after} AND "
            selection = f"WHERE {seek}({where}) ORDER BY {key} LIMIT {PAGE_ROWS}"
        else:
            selection = f"WHERE {where}"
        row = query(
            con,
            f"SELECT count(*), max(k), {outer}"
            f" FROM (SELECT {key} AS k, {inner} FROM {table} {selection})",
        )[0]
        n = int(row[0])
        if n == 0:
            break
        after = int(row[1])
        texts = list(row[2:])
        del row
        for i, column in enumerate(parts):
            try:
                values = np.fromstring(texts[i] or "", dtype=np.int64, sep=",")
            except ValueError:  # numpy met a value that is not an integer
                raise NotAllIntegers() from None
            texts[i] = None
            if len(values) != n:
                # group_concat skips NULLs and numpy stops at text: columns no longer line up.
                raise NotAllIntegers()
            column.append(values)
        if on_rows is not None:
            on_rows(sum(len(v) for v in parts[0]))
        if not chunked or n < PAGE_ROWS:
            break
    return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in parts]


def _streamed_int_columns(
    con: sqlite3.Connection,
    expressions: list[str],
    table: str,
    where: str,
    on_rows: Callable[[int], None] | None,
) -> list[I64]:
    """:func:`int_columns` for a source without rowids (a view): row tuples in scan order,
    slower but linear. SQLite marks every value that is not an integer as NULL."""
    checked = ", ".join(f"CASE WHEN typeof({e}) = 'integer' THEN {e} END" for e in expressions)
    result = con.execute(f"SELECT {checked} FROM {table} WHERE {where}")
    blocks = []
    while chunk := result.fetchmany(PAGE_ROWS):
        block = np.array([tuple(r) for r in chunk], dtype=object).reshape(len(chunk), -1)
        if any(v is None for v in block.flat):
            raise NotAllIntegers()
        blocks.append(block.astype(np.int64))
        if on_rows is not None:
            on_rows(sum(len(b) for b in blocks))
    whole = np.concatenate(blocks) if blocks else np.zeros((0, len(expressions)), dtype=np.int64)
    return [np.ascontiguousarray(whole[:, i]) for i in range(len(expressions))]


def read_integers(
    con: sqlite3.Connection,
    expressions: list[str],
    table: str,
    where: str,
    required: Sequence[str],
    chunked: bool = True,
    on_rows: Callable[[int], None] | None = None,
) -> list[I64]:
    """:func:`int_columns`, skipping rows whose ``required`` columns hold a NULL or a
    non-integer. The check costs a slower second scan, so only a trace that needs it pays."""
    try:
        return int_columns(con, expressions, table, where, chunked, on_rows)
    except NotAllIntegers:
        valid = " AND ".join(f"typeof({c}) = 'integer'" for c in required)
        return int_columns(con, expressions, table, f"({where}) AND {valid}", chunked, on_rows)
